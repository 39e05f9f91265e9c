"""What one forward pass records: layer activations and per-image statistics, through hooks.

A Recorder attaches hooks to a loaded model, declares the per-image arrays it fills (`specs`), and
after each forward hands them over (`collect`, tensors with a leading batch axis, still on the model's
device). Adding a new per-image statistic means writing one more Recorder; extraction needs no change.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from vitsee.analyses.attention import mean_attention_distance, mean_window_attention_distance, patch_distance_px
from vitsee.models.load import LoadedModel, Point, resnet_blocks, swin_blocks
from vitsee.store import HEADS, ArraySpec, LayerSpec


def _first_tensor(value) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (tuple, list)) and value and isinstance(value[0], torch.Tensor):
        return value[0]
    raise TypeError(f"hooked value is {type(value).__name__}, not a tensor")


class Recorder:
    """Base class: hooks in `attach`, per-image arrays out of `collect`."""

    def __init__(self):
        self._handles: list = []

    def specs(self) -> list[ArraySpec]:
        return []

    def attach(self, loaded: LoadedModel) -> None:
        self.loaded = loaded

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def collect(self) -> dict[str, torch.Tensor]:
        return {}


# fp16 rounding loss (error energy over centred signal energy) above which a layer is named at extraction.
# 1 - CKA(x, fp16(x)) comes out within a factor of about 2 of this ratio (measured: 5.2e-3 -> 5.2e-3,
# 6.6e-4 -> 6.4e-4, 4.2e-3 -> 9.5e-3), so 1e-4 keeps a stored layer's CKA within a few 1e-4 of float32. Plain fp16
# rounding costs ~1e-7; activations near +-2000 in a few channels (pretrained ViTs have them) cost 1e-3 to 1e-2.
FP16_LOSS_LIMIT = 1e-4


def fp16_lossy_layers(loss: dict[str, float]) -> list[str]:
    """Returns the layers whose fp16 rounding loss exceeds FP16_LOSS_LIMIT (inf: values beyond fp16's range)."""
    return [name for name, r in loss.items() if not r <= FP16_LOSS_LIMIT]


def fp16_note(key: str, loss: dict[str, float]) -> str:
    """Returns the one-line warning naming the layers fp16 storage damages, with the way out; '' if none."""
    lossy = fp16_lossy_layers(loss)
    if not lossy:
        return ""
    worst = max(loss[name] for name in lossy)
    names = ", ".join(lossy[:4]) + (f" and {len(lossy) - 4} more" if len(lossy) > 4 else "")
    return (
        f"{key}: float16 storage rounds away up to {worst:.1e} of the signal of {len(lossy)} layer(s) ({names}), "
        f"more than CKA tolerates ({FP16_LOSS_LIMIT:.0e}): extract with --dtype float32"
    )


# Layouts of a stored layer's per-image axes: tokens (T, C), feature maps (C, H, W) or channels-last (H, W, C)
LAYOUTS = ("tokens", "nchw", "nhwc", "flat")


class ActivationRecorder(Recorder):
    """Keeps the activation at each point, cast to the store's dtype on the device (a copy, so in-place
    ops later in the forward cannot change it).

    While `measure_rounding` is set (extraction's dry run), it also sums per layer what storing in fp16 loses:
    the energy of the rounding error ||x - fp16(x)||^2 and the signal energy ||x - mean over images||^2.
    """

    def __init__(self, points: Sequence[Point], dtype: torch.dtype):
        super().__init__()
        self.points = list(points)
        self.dtype = dtype
        self.values: dict[str, torch.Tensor] = {}
        self.measure_rounding = False
        self.rounding: dict[str, torch.Tensor] = {}  # name -> (error energy, centred signal energy), fp64

    def attach(self, loaded: LoadedModel) -> None:
        super().attach(loaded)
        for point in self.points:
            module = loaded.model.get_submodule(point.module)
            if point.kind == "input":
                hook = module.register_forward_pre_hook(self._keep_input(point.name))
            else:
                hook = module.register_forward_hook(self._keep_output(point.name))
            self._handles.append(hook)

    def _keep(self, name: str, value) -> None:
        tensor = _first_tensor(value).detach()
        if tensor.ndim == 4 and self._token_grid(tensor):
            # timm's PatchEmbed hands out (B, H, W, C) in models that keep the grid (dynamic_img_size and
            # friends): store it as tokens (B, H*W, C), like every other layer of a ViT
            tensor = tensor.flatten(1, 2)
        if self.measure_rounding and self.dtype == torch.float16 and tensor.is_floating_point():
            self._add_rounding(name, tensor)
        self.values[name] = tensor.to(self.dtype, copy=True)

    def _add_rounding(self, name: str, tensor: torch.Tensor) -> None:
        if len(tensor) < 2:  # one image has no spread over images to lose
            return
        x = tensor.flatten(1).double()  # (B, F)
        error = x - x.to(torch.float16).double()  # inf where fp16 overflows: that layer is lost for sure
        centred = x - x.mean(dim=0)  # CKA centres over images, so a shared offset is no signal
        sums = torch.stack([error.square().sum(), centred.square().sum()])
        self.rounding[name] = self.rounding.get(name, 0) + sums

    def rounding_loss(self) -> dict[str, float]:
        """Returns per layer the fp16 rounding error energy over the centred signal energy (0 for a float32 store)."""
        out = {}
        for name, (error, signal) in ((n, v.tolist()) for n, v in self.rounding.items()):
            out[name] = float("inf") if error and not signal else (error / signal if signal else 0.0)
        return out

    def _token_grid(self, tensor: torch.Tensor) -> bool:
        grid = getattr(self.loaded, "grid_size", None)
        return self.loaded.family == "vit" and grid is not None and tuple(tensor.shape[1:3]) == tuple(grid)

    def _keep_input(self, name: str):
        return lambda _m, args: self._keep(name, args)

    def _keep_output(self, name: str):
        return lambda _m, _args, out: self._keep(name, out)

    def layer_specs(self, shapes: dict[str, tuple[int, ...]]) -> list[LayerSpec]:
        """Returns the store's LayerSpecs given per-image shapes seen in a dry run."""
        prefix = self.loaded.num_prefix_tokens if self.loaded.family == "vit" else 0
        out = []
        for p in self.points:
            shape = shapes[p.name]
            # token-major layers carry the prefix tokens in front, patch_embed does not
            has_prefix = (
                len(shape) == 2 and self.loaded.grid_size is not None and shape[0] == prefix + _cells(self.loaded)
            )
            layout = layer_layout(self.loaded, p, shape)
            out.append(LayerSpec(p.name, shape, prefix if has_prefix else 0, p.module, p.kind, layout))
        return out

    def collect(self) -> dict[str, torch.Tensor]:
        values, self.values = self.values, {}
        return values


def layer_layout(loaded: LoadedModel, point: Point, shape: tuple[int, ...]) -> str:
    """Returns how a layer's per-image axes are laid out: 'tokens' (T, C), 'nchw' (C, H, W), 'nhwc' (H, W, C) or
    'flat', from timm's output_fmt where the module has one, else from the shape against the model's known grids."""
    if len(shape) == 2:
        return "tokens"
    if len(shape) != 3:
        return "flat"
    fmt = getattr(loaded.model.get_submodule(point.module), "output_fmt", None) if point.kind == "output" else None
    fmt = str(getattr(fmt, "value", fmt or "")).upper()
    if fmt in ("NHWC", "NCHW"):
        return fmt.lower()
    grids = {tuple(loaded.grid_size)} if loaded.grid_size else set()
    grids |= {tuple(st["grid"]) for st in loaded.extra.get("stages", [])}
    first, last = tuple(shape[:2]) in grids, tuple(shape[1:]) in grids
    if first != last:
        return "nhwc" if first else "nchw"
    if not grids and (shape[0] == shape[1]) != (shape[1] == shape[2]):  # a square map beside a channel count
        return "nhwc" if shape[0] == shape[1] else "nchw"
    return "nhwc" if loaded.family == "swin" else "nchw"


def _cells(loaded: LoadedModel) -> int:
    gh, gw = loaded.grid_size
    return gh * gw


class AttentionDistanceRecorder(Recorder):
    """Per image, block and head: mean attention distance in px (plain and renormalised).

    timm fuses attention and never materialises the probabilities, so fusion is turned off for the
    recorded model and the softmax output is read where it enters attn_drop (identity in eval). Each
    (B, H, T, T) map is reduced to (B, H) inside the hook and dropped.
    """

    def __init__(self):
        super().__init__()
        self.plain: list[torch.Tensor | None] = []
        self.renorm: list[torch.Tensor | None] = []

    @staticmethod
    def applies(loaded: LoadedModel) -> bool:
        blocks = _attention_blocks(loaded)
        return bool(blocks) and all(hasattr(b.attn, "attn_drop") and hasattr(b.attn, "fused_attn") for b in blocks)

    def specs(self) -> list[ArraySpec]:
        shape = (self.loaded.num_blocks, self.loaded.num_heads)
        return [ArraySpec("attention_distance", shape), ArraySpec("attention_distance_renorm", shape)]

    def attach(self, loaded: LoadedModel) -> None:
        super().attach(loaded)
        self.plain = [None] * loaded.num_blocks
        self.renorm = [None] * loaded.num_blocks
        for i, block in enumerate(_attention_blocks(loaded)):
            block.attn.fused_attn = False
            if loaded.family == "swin":
                self._handles += self._window_hooks(i, block)
            else:
                self._handles.append(block.attn.attn_drop.register_forward_pre_hook(self._reduce(i)))

    def _reduce(self, i: int):
        loaded = self.loaded

        def hook(_m, args):
            attn = args[0].detach()  # (B, H, T, T)
            self.plain[i], self.renorm[i] = _both_distances(attn, loaded)  # (B, H) each

        return hook

    def _window_hooks(self, i: int, block: nn.Module) -> list:
        """Hooks of a Swin block: its input tells the batch and map size, its window attention the weights."""
        stage = _stage_of(self.loaded, i)
        seen: dict[str, tuple[int, ...]] = {}

        def keep_shape(_m, args):
            seen["shape"] = tuple(args[0].shape)  # (B, H, W, C)

        def reduce(_m, args):
            b, h, w, _ = seen["shape"]
            dist = mean_window_attention_distance(args[0].detach(), b, (h, w), block.window_size, stage["token_px"])
            # no prefix tokens, and every query's weights sum to one: renormalising changes nothing
            self.plain[i] = self.renorm[i] = dist  # (B, H)

        return [block.register_forward_pre_hook(keep_shape), block.attn.attn_drop.register_forward_pre_hook(reduce)]

    def detach(self) -> None:
        super().detach()
        for block in _attention_blocks(self.loaded):
            block.attn.fused_attn = True

    def collect(self) -> dict[str, torch.Tensor]:
        return {
            "attention_distance": _stack_heads(self.plain, self.loaded.num_heads),  # (B, blocks, H)
            "attention_distance_renorm": _stack_heads(self.renorm, self.loaded.num_heads),
        }


def _attention_blocks(loaded: LoadedModel) -> list[nn.Module]:
    """Returns the attention blocks in forward order: a ViT's blocks, every Swin stage's blocks; else none."""
    if loaded.family == "vit":
        return list(loaded.model.blocks)
    if loaded.family == "swin":
        return [loaded.model.get_submodule(name) for name in swin_blocks(loaded.model)]
    return []


def _stage_of(loaded: LoadedModel, block: int) -> dict:
    """Returns the Swin stage record (blocks, heads, window, grid, token_px) that holds the block-th block."""
    for stage in loaded.extra["stages"]:
        if block < stage["blocks"]:
            return stage
        block -= stage["blocks"]
    raise IndexError(block)


def _stack_heads(per_block: list[torch.Tensor], heads: int) -> torch.Tensor:
    """Returns (B, blocks, heads) from per-block (B, H_b): Swin's later stages have more heads, and a block's
    missing heads are NaN (no such head, not a value)."""
    if all(t.shape[1] == heads for t in per_block):
        return torch.stack(per_block, dim=1)
    return torch.stack(
        [torch.nn.functional.pad(t, (0, heads - t.shape[1]), value=float("nan")) for t in per_block], dim=1
    )


def _both_distances(attn: torch.Tensor, loaded: LoadedModel) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns mean_attention_distance(attn) plain and renormalised, (B, H) each, reading the map once.

    The same operations as `attention.mean_attention_distance` in the same order, so the same numbers; the
    weighted distances are shared instead of computed twice (the maps are the largest tensor of the block).
    """
    prefix = loaded.num_prefix_tokens
    gh, gw = loaded.grid_size
    if attn.shape[-1] != prefix + gh * gw:  # let the reference say what does not fit
        return (mean_attention_distance(attn, loaded.grid_size, loaded.patch_size, prefix),) * 2
    spatial = attn[..., prefix:, prefix:].float()  # (B, H, P, P)
    dist = patch_distance_px(loaded.grid_size, loaded.patch_size, device=attn.device)  # (P, P)
    per_query = (spatial * dist).sum(-1)  # (B, H, P)
    renorm = per_query / spatial.sum(-1).clamp_min(torch.finfo(torch.float32).tiny)
    return per_query.mean(-1), renorm.mean(-1)


class SkipRatioRecorder(Recorder):
    """Per image, block and token: ||z|| / ||f(z)|| for the attention and the MLP sublayer of ViT blocks
    (z the residual stream entering the sublayer, f(z) what its branch adds, after layer scale); for
    ResNet blocks ||shortcut|| / ||residual branch|| over the whole map."""

    def __init__(self):
        super().__init__()
        self.attn: list = []
        self.mlp: list = []
        self.block: list = []

    @staticmethod
    def applies(loaded: LoadedModel) -> bool:
        if loaded.family == "vit":
            return all(all(hasattr(b, n) for n in ("norm1", "norm2", "ls1", "ls2")) for b in loaded.model.blocks)
        if loaded.family == "mixer":
            return all(not hasattr(b, "ls1") for b in loaded.model.blocks)  # x + mlp(norm(x)), nothing scaled between
        if loaded.family == "resnet":
            blocks = [loaded.model.get_submodule(b) for b in resnet_blocks(loaded.model)]
            return all(_last_act(b) is not None or isinstance(getattr(b, "drop_path", None), nn.Module) for b in blocks)
        return False

    def specs(self) -> list[ArraySpec]:
        if self.loaded.family in ("vit", "mixer"):
            tokens = self.loaded.num_prefix_tokens + _cells(self.loaded)
            shape = (self.loaded.num_blocks, tokens)
            return [ArraySpec(name, shape) for name in SKIP_STATS[self.loaded.family]]
        return [ArraySpec("skip_ratio_block", (self.loaded.num_blocks,))]

    def attach(self, loaded: LoadedModel) -> None:
        super().attach(loaded)
        n = loaded.num_blocks
        self.attn, self.mlp, self.block = [None] * n, [None] * n, [None] * n
        if loaded.family == "vit":
            for i, block in enumerate(loaded.model.blocks):
                self._vit_block(i, block)
        elif loaded.family == "mixer":
            for i, block in enumerate(loaded.model.blocks):
                self._mixer_block(i, block)
        else:
            for i, name in enumerate(resnet_blocks(loaded.model)):
                self._resnet_block(i, loaded.model.get_submodule(name))

    def _vit_block(self, i: int, block: nn.Module) -> None:
        stream: dict[str, torch.Tensor] = {}

        def keep(key):
            return lambda _m, args: stream.__setitem__(key, args[0].detach())

        def ratio(key, out_list):
            def hook(_m, _args, out):
                out_list[i] = stream.pop(key).norm(dim=-1) / out.detach().norm(dim=-1)  # (B, T)

            return hook

        self._handles += [
            block.norm1.register_forward_pre_hook(keep("attn")),
            block.norm2.register_forward_pre_hook(keep("mlp")),
            block.ls1.register_forward_hook(ratio("attn", self.attn)),
            block.ls2.register_forward_hook(ratio("mlp", self.mlp)),
        ]

    def _mixer_block(self, i: int, block: nn.Module) -> None:
        """x + mlp_tokens(norm1(x)^T)^T, then x + mlp_channels(norm2(x)): per token, the stream against what each
        adds."""
        stream: dict[str, torch.Tensor] = {}

        def keep(key):
            return lambda _m, args: stream.__setitem__(key, args[0].detach())

        def ratio(key, out_list, channel_dim):
            def hook(_m, _args, out):
                out_list[i] = stream.pop(key).norm(dim=-1) / out.detach().norm(dim=channel_dim)  # (B, T)

            return hook

        self._handles += [
            block.norm1.register_forward_pre_hook(keep("tokens")),
            block.norm2.register_forward_pre_hook(keep("channels")),
            block.mlp_tokens.register_forward_hook(ratio("tokens", self.attn, 1)),  # its output is (B, C, T)
            block.mlp_channels.register_forward_hook(ratio("channels", self.mlp, -1)),
        ]

    def _resnet_block(self, i: int, block: nn.Module) -> None:
        last = _last_act(block)
        if last is None:  # pre-activation block: output = shortcut + drop_path(branch)
            self._preact_block(i, block)
            return
        stream: dict[str, torch.Tensor] = {}
        downsample = getattr(block, "downsample", None)

        def keep_input(_m, args):
            stream["shortcut"] = args[0].detach().clone()

        def keep_shortcut(_m, _args, out):
            stream["shortcut"] = out.detach().clone()

        def ratio(_m, args):  # the last activation reads shortcut + branch
            total = args[0].detach()
            shortcut = stream.pop("shortcut")
            branch = total - shortcut
            self.block[i] = shortcut.flatten(1).norm(dim=1) / branch.flatten(1).norm(dim=1)

        self._handles.append(block.register_forward_pre_hook(keep_input))
        if isinstance(downsample, nn.Module):
            self._handles.append(downsample.register_forward_hook(keep_shortcut))
        self._handles.append(last.register_forward_pre_hook(ratio))

    def _preact_block(self, i: int, block: nn.Module) -> None:
        stream: dict[str, torch.Tensor] = {}

        def keep_branch(_m, _args, out):
            stream["branch"] = out.detach().clone()

        def ratio(_m, _args, out):
            branch = stream.pop("branch")
            shortcut = out.detach() - branch
            self.block[i] = shortcut.flatten(1).norm(dim=1) / branch.flatten(1).norm(dim=1)

        self._handles += [block.drop_path.register_forward_hook(keep_branch), block.register_forward_hook(ratio)]

    def collect(self) -> dict[str, torch.Tensor]:
        if self.loaded.family in SKIP_STATS:
            first, second = SKIP_STATS[self.loaded.family]
            return {first: torch.stack(self.attn, dim=1), second: torch.stack(self.mlp, dim=1)}
        return {"skip_ratio_block": torch.stack(self.block, dim=1)}


# the two residual sublayers of a block, per family: (B, blocks, tokens) statistics
SKIP_STATS = {
    "vit": ("skip_ratio_attn", "skip_ratio_mlp"),
    "mixer": ("skip_ratio_token_mixing", "skip_ratio_channel_mixing"),
}


def _last_act(block: nn.Module) -> nn.Module | None:
    """Returns the activation a post-activation ResNet block applies to shortcut + branch (act2/act3)."""
    acts = [m for n, m in block.named_children() if n.startswith("act")]
    return acts[-1] if acts else None


def default_recorders(loaded: LoadedModel, points: Sequence[Point], dtype: torch.dtype) -> list[Recorder]:
    """Returns the recorders extraction attaches: activations, plus every statistic that applies."""
    recorders: list[Recorder] = [ActivationRecorder(points, dtype)]
    for cls in (AttentionDistanceRecorder, SkipRatioRecorder):
        if cls.applies(loaded):
            recorders.append(cls())
    return recorders


# --- head outputs (head-level CKA, paper Fig. 5; engine/analyses/heads.py) ------------------------------------


class HeadOutputRecorder(Recorder):
    """Per image and block: every head's attention output before the projection, softmax(q k^T * scale) v as
    timm computes it (q/k norms included), on the spatial tokens only, (B, heads, tokens, head_dim).

    timm's Attention reshapes attn @ v to (B, N, heads * head_dim) and hands it to `norm` (an Identity unless
    scale_norm) and then `proj`; the input of the first of them is read, so a scale norm or gate is not applied.
    """

    PREFIX = HEADS  # heads/blocks.B: beside acts/ in the model group

    def __init__(self, dtype: torch.dtype, blocks: Sequence[int] | None = None):
        super().__init__()
        self.dtype = dtype
        self.blocks = None if blocks is None else list(blocks)
        self.values: dict[str, torch.Tensor] = {}

    @staticmethod
    def applies(loaded: LoadedModel) -> bool:
        return (
            loaded.family == "vit"
            and loaded.grid_size is not None
            and all(
                hasattr(b, "attn")
                and hasattr(b.attn, "num_heads")
                and isinstance(getattr(b.attn, "proj", None), nn.Module)
                for b in loaded.model.blocks
            )
        )

    @staticmethod
    def name(block: int) -> str:
        return f"{HeadOutputRecorder.PREFIX}blocks.{block}"

    def _chosen(self) -> list[int]:
        return list(range(self.loaded.num_blocks)) if self.blocks is None else self.blocks

    def specs(self) -> list[ArraySpec]:
        heads = self.loaded.num_heads
        head_dim = int(self.loaded.model.blocks[0].attn.head_dim)
        shape = (heads, _cells(self.loaded), head_dim)
        return [ArraySpec(self.name(b), shape, str(self.dtype).removeprefix("torch.")) for b in self._chosen()]

    def attach(self, loaded: LoadedModel) -> None:
        super().attach(loaded)
        for b in self._chosen():
            attn = loaded.model.blocks[b].attn
            entry = attn.norm if isinstance(getattr(attn, "norm", None), nn.Module) else attn.proj
            self._handles.append(entry.register_forward_pre_hook(self._keep(b, attn.num_heads)))

    def _keep(self, block: int, heads: int):
        prefix = self.loaded.num_prefix_tokens

        def hook(_m, args):
            x = args[0].detach()  # (B, N, heads * head_dim), heads major
            b, n, _ = x.shape
            per_head = x.view(b, n, heads, -1)[:, prefix:].permute(0, 2, 1, 3)  # (B, heads, P, head_dim)
            self.values[self.name(block)] = per_head.to(self.dtype, copy=True).contiguous()

        return hook

    def collect(self) -> dict[str, torch.Tensor]:
        values, self.values = self.values, {}
        return values
