"""Mean attention distance: the paper's reference values and a plain-loop reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vitsee.analyses.attention import mean_attention_distance, uniform_attention_distance_px


def _reference(
    attn: np.ndarray, grid: tuple[int, int], patch: tuple[int, int], prefix: int, renormalise: bool
) -> np.ndarray:
    B, H, T, _ = attn.shape
    gh, gw = grid
    centres = [(r * patch[0], c * patch[1]) for r in range(gh) for c in range(gw)]
    out = np.zeros((B, H))
    for b in range(B):
        for h in range(H):
            per_query = []
            for q in range(gh * gw):
                row = attn[b, h, prefix + q, prefix:]
                d = sum(
                    row[k] * np.hypot(centres[q][0] - centres[k][0], centres[q][1] - centres[k][1])
                    for k in range(gh * gw)
                )
                per_query.append(d / row.sum() if renormalise else d)
            out[b, h] = np.mean(per_query)
    return out


def test_uniform_attention_on_14x14_grid_of_16px_patches_is_116_px():
    attn = torch.zeros(1, 3, 197, 197)
    attn[..., 1:] = 1 / 196  # the CLS column is zero
    d = mean_attention_distance(attn, grid_size=14, patch_size=16)
    assert d.shape == (1, 3)
    assert d[0, 0].item() == pytest.approx(116.5, abs=0.05)
    assert uniform_attention_distance_px(14, 16) == pytest.approx(116.49, abs=0.01)


def test_identity_attention_is_zero():
    attn = torch.eye(197).expand(2, 4, 197, 197)
    assert torch.all(mean_attention_distance(attn, 14, 16) == 0)


def test_attention_on_cls_counts_as_zero_unless_renormalised():
    attn = torch.zeros(1, 1, 17, 17)
    attn[..., 0] = 0.5  # half on CLS
    attn[..., 1:] = 0.5 / 16
    plain = mean_attention_distance(attn, 4, 16)
    renorm = mean_attention_distance(attn, 4, 16, renormalise=True)
    assert plain.item() == pytest.approx(0.5 * uniform_attention_distance_px(4, 16), rel=1e-5)
    assert renorm.item() == pytest.approx(uniform_attention_distance_px(4, 16), rel=1e-5)


@pytest.mark.parametrize("prefix", [0, 1, 5])
def test_random_attention_matches_a_plain_loop_on_a_rectangular_grid(prefix):
    g = torch.Generator().manual_seed(prefix)
    grid, patch = (3, 4), (14, 10)
    T = prefix + 12
    attn = torch.randn(2, 3, T, T, generator=g).softmax(-1)
    for renormalise in (False, True):
        got = mean_attention_distance(attn, grid, patch, num_prefix_tokens=prefix, renormalise=renormalise).numpy()
        want = _reference(attn.numpy().astype(np.float64), grid, patch, prefix, renormalise)
        np.testing.assert_allclose(got, want, rtol=1e-5)


def test_a_token_count_that_does_not_fit_the_grid_is_an_error():
    with pytest.raises(ValueError, match="17 tokens"):
        mean_attention_distance(torch.zeros(1, 1, 17, 17), 14, 16)
