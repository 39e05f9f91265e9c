"""The paper's training interventions, applied around timm's modules: residual adds removed from ViT blocks
(Fig. 8) and CLS or GAP classifiers (Fig. 10, 11) built through timm's own keyword arguments.

A block loses its skips by a forward replacement on that block instance: the same submodules in the same
order, so the state-dict keys stay timm's and `timm.create_model(NAME, **kwargs).load_state_dict(...)` still
loads the weights; only the adds go.
"""

from __future__ import annotations

import re
import types

from torch import nn

from vitsee.errors import VitseeError

SUBLAYERS = ("attn", "mlp")
POOLS = ("cls", "avg")
# what timm's vision_transformer.Block holds; its forward is x + dp1(ls1(attn(norm1(x)))), then the MLP alike
_BLOCK_PARTS = ("norm1", "attn", "ls1", "drop_path1", "norm2", "mlp", "ls2", "drop_path2")


def residual_blocks(model: nn.Module) -> list[str]:
    """Returns the module paths of the model's pre-norm transformer blocks whose skips can be removed."""
    return [name for name, m in model.named_modules() if name and all(hasattr(m, p) for p in _BLOCK_PARTS)]


def parse_no_skip(text: str | None) -> list[str]:
    """Returns the `--no-skip` targets of a comma list, blanks dropped (`blocks.3,blocks.5.mlp`)."""
    return [t.strip() for t in (text or "").split(",") if t.strip()]


def resolve_no_skip(model: nn.Module, targets: list[str], model_name: str) -> list[str]:
    """Returns the sublayers `BLOCK.attn` / `BLOCK.mlp` the targets name, in block order; a target the model
    does not have is a VitseeError."""
    blocks = residual_blocks(model)
    if targets and not blocks:
        raise VitseeError(
            f"--no-skip {','.join(targets)}: {model_name} has no transformer blocks with attn/mlp residuals "
            "(vitsee removes the skips of ViT-like blocks): drop --no-skip or train a ViT"
        )
    chosen: set[str] = set()
    for target in targets:
        match = re.fullmatch(r"(.+?)(?:\.(attn|mlp))?", target)
        block, sub = match.group(1), match.group(2)
        if block not in blocks:
            shown = f"{blocks[0]} ... {blocks[-1]}" if len(blocks) > 2 else ", ".join(blocks)
            raise VitseeError(
                f"--no-skip {target}: {model_name} has no block '{block}'; its blocks are {shown} "
                "(add .attn or .mlp to remove one of the two skips)"
            )
        chosen.update([f"{block}.{sub}"] if sub else [f"{block}.{s}" for s in SUBLAYERS])
    order = {f"{b}.{s}": (i, j) for i, b in enumerate(blocks) for j, s in enumerate(SUBLAYERS)}
    return sorted(chosen, key=order.__getitem__)


def _forward_without_skips(self, x, **kwargs):
    # timm's Block.forward with the adds of the sublayers in self._vitsee_no_skip left out
    y = self.drop_path1(self.ls1(self.attn(self.norm1(x), **kwargs)))
    x = y if "attn" in self._vitsee_no_skip else x + y
    y = self.drop_path2(self.ls2(self.mlp(self.norm2(x))))
    return y if "mlp" in self._vitsee_no_skip else x + y


def remove_skips(model: nn.Module, sublayers: list[str]) -> nn.Module:
    """Returns the model with the residual adds of the given `BLOCK.attn` / `BLOCK.mlp` removed (in place)."""
    by_block: dict[str, set[str]] = {}
    for name in sublayers:
        block, _, sub = name.rpartition(".")
        by_block.setdefault(block, set()).add(sub)
    for block, subs in by_block.items():
        module = model.get_submodule(block)
        module._vitsee_no_skip = frozenset(subs)
        module.forward = types.MethodType(_forward_without_skips, module)
    return model


def pool_kwargs(pool: str | None, family: str, model_name: str) -> dict:
    """Returns the timm create_model kwargs of a `--pool` choice: a class token or GAP, as timm builds them."""
    if pool is None:
        return {}
    if pool not in POOLS:
        raise VitseeError(f"unknown --pool '{pool}': use cls (a class token) or avg (global average pooling)")
    if family != "vit":
        raise VitseeError(
            f"--pool {pool} chooses a ViT's classifier token or GAP; {model_name} is a {family} model that pools "
            "its own way: drop --pool"
        )
    if pool == "avg":
        return {"class_token": False, "global_pool": "avg"}
    return {"class_token": True, "global_pool": "token"}
