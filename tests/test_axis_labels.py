"""Axis labels never share a cell, and the cursor's label is always there (issue 13, point 9)."""

from __future__ import annotations

import random

import pytest

from vitsee.tui.widgets.axis_labels import AxisLabels, layout_axis_labels

VIT = ["patch_embed"] + [f"blocks.{i}" for i in range(12)] + ["norm"]
SKIP = [f"blocks.{i}.{part}" for i in range(12) for part in ("attn", "mlp")]
RESNET = ["stem"] + [f"layer{s}.{b}" for s in range(1, 5) for b in range(3)]


def occupied(axis: AxisLabels, gap: int) -> list[tuple[int, int, int]]:
    """Returns (line, first, one past last) of each placed label, widened by the gap, found independently."""
    if axis.vertical:  # upright labels are one column each: they may stand side by side
        return [(0, x, x + 1) for _, x, _ in axis.placed]
    return [(0, x, x + len(text) + gap) for _, x, text in axis.placed]


def assert_apart(axis: AxisLabels, width: int, gap: int) -> None:
    spans = sorted(occupied(axis, gap), key=lambda s: s[1])
    for (_, _, end), (_, start, _) in zip(spans, spans[1:]):
        assert end <= start, f"labels touch or overlap: {axis.placed}"
    for _, x, text in axis.placed:
        assert 0 <= x and x + (1 if axis.vertical else len(text)) <= width
    # what is drawn is every placed label whole: nothing was written over another
    for _index, x, text in axis.placed:
        drawn = (
            "".join(axis.line_text(k, width)[x] for k in range(len(text)))
            if axis.vertical
            else axis.line_text(0, width)[x : x + len(text)]
        )
        assert drawn == text


@pytest.mark.parametrize("labels", [VIT, SKIP, RESNET, [f"c{i}" for i in range(40)]])
@pytest.mark.parametrize("cell", [1, 2, 3, 5, 9])
def test_no_two_labels_share_a_cell_and_the_cursor_label_is_shown(labels, cell):
    rng = random.Random(len(labels) * 31 + cell)
    width = len(labels) * cell
    for _ in range(12):
        cursor = rng.randrange(len(labels))
        for centred in (False, True):
            for max_lines in (1, 12):
                positions = [i * cell + (cell // 2 if centred else 0) for i in range(len(labels))]
                axis = layout_axis_labels(
                    labels, positions, width, cursor, centred=centred, max_lines=max_lines, max_chars=12
                )
                assert_apart(axis, width, gap=1)
                shown = axis.text_of(cursor)
                assert shown is not None, f"cursor {labels[cursor]} left out at cell width {cell}"
                assert shown == labels[cursor] or len(shown) < len(labels[cursor])


def test_labels_that_fit_are_all_shown_as_they_are():
    axis = layout_axis_labels(VIT, [i * 12 for i in range(len(VIT))], 12 * len(VIT), cursor=4)
    assert [text for _, _, text in axis.placed] == VIT


def test_a_long_first_label_no_longer_hides_the_next_blocks():
    # the CKA x axis of the issue: 'patch_embed' over 4-character cells used to cover b.0 and b.1
    labels = ["patch_embed"] + [f"blocks.{i}" for i in range(6)] + ["norm"]
    axis = layout_axis_labels(labels, [i * 4 for i in range(8)], 32, cursor=0, max_chars=8)
    texts = [axis.text_of(i) for i in range(8)]
    assert texts[1:7] == [f"b.{i}" for i in range(6)]
    assert texts[0] is not None and texts[0].startswith("pa")


def test_a_module_path_is_thinned_rather_than_cut_where_its_tail_tells_it_apart():
    # the cross-model columns at 80x24: 'l1.0' cut to 'l1…' could be any block of layer1
    labels = ["maxpool", "layer1.0", "layer2.0", "layer3.0", "layer4.0"]
    for cursor in range(5):
        axis = layout_axis_labels(labels, [i * 4 for i in range(5)], 20, cursor, max_chars=12)
        texts = [text for _, _, text in axis.placed]
        assert axis.text_of(cursor) is not None
        assert all(t == "maxpool" or t.startswith("max") or t in {"l1.0", "l2.0", "l3.0", "l4.0"} for t in texts)


def test_abbreviation_is_one_rule_for_every_label():
    axis = layout_axis_labels(SKIP, [i * 8 for i in range(len(SKIP))], 8 * len(SKIP), cursor=3)
    texts = [text for _, _, text in axis.placed]
    assert len(texts) == len(SKIP)
    # 'blocks.3.attn' does not fit 7 cells; all are cut the same way, and still tell every sublayer apart
    assert texts[:4] == ["0.attn", "0.mlp", "1.attn", "1.mlp"]


def test_narrow_cells_thin_to_every_kth_and_keep_the_cursor():
    labels = [f"blocks.{i}" for i in range(24)]
    for cursor in range(24):
        axis = layout_axis_labels(labels, list(range(24)), 24, cursor, max_chars=8)
        shown = [i for i, _, _ in axis.placed]
        assert cursor in shown and len(shown) >= 4
        others = [i for i in shown if i != cursor]
        steps = {b - a for a, b in zip(others, others[1:])}
        assert all(step % min(steps) == 0 for step in steps)  # a regular grid, a hole where the cursor is


def test_free_lines_allow_vertical_labels_that_show_every_layer():
    labels = [f"blk{i}" for i in range(10)]  # no short form tells them apart in 1 cell
    flat = layout_axis_labels(labels, [i * 2 for i in range(10)], 20, cursor=5)
    assert not flat.vertical and len(flat.placed) < 10
    upright = layout_axis_labels(labels, [i * 2 for i in range(10)], 20, cursor=5, max_lines=4)
    assert upright.vertical and upright.lines == 4 and len(upright.placed) == 10
    assert [upright.line_text(k, 20)[10] for k in range(4)] == list("blk5")


def test_a_line_plot_axis_keeps_both_ends_and_the_marked_label():
    labels = ["patch_embed"] + [f"blocks.{i}" for i in range(6)] + ["norm"]
    positions = [round(i * 103 / 7) // 2 for i in range(8)]
    axis = layout_axis_labels(labels, positions, 52, cursor=1, centred=True, keep_ends=True)
    assert_apart(axis, 52, gap=1)
    assert {0, 1, 7} <= {i for i, _, _ in axis.placed}


def test_model_names_are_shortened_alike_and_never_read_alike():
    from vitsee.output.labels import model_labels

    stem = "demo-{}-digits32-r1a2b3c4d-s0"
    vit = f"vit_tiny_patch16_224@file:{stem.format('vit_tiny_patch16_224')}"
    resnet = f"resnet18@file:{stem.format('resnet18')}"
    keys = [vit, resnet, f"{vit}-init", f"{resnet}-init"]
    # a weights file is named by what its file name has that the others' do not: 'init'
    assert model_labels(keys, 40) == ["vit_tiny_patch16_224", "resnet18", "vit_tiny_patch16_224 init", "resnet18 init"]
    assert model_labels(keys, 16) == ["vit_tiny", "resnet18", "vit_tiny init", "resnet18 init"]
    # initialised alike: the words say nothing; pretrained against random: they do
    assert model_labels(["test_vit@random:0", "test_resnet@random:0"], 12) == ["test_vit", "test_resnet"]
    assert model_labels(["vit_tiny_patch16_224.augreg_in21k", "vit_tiny_patch16_224@random:0"], 12) == [
        "vit_tiny",
        "vit_tiny r0",
    ]
    many = [f"vit_base_patch16_224@random:{seed}" for seed in range(12)]
    assert len(set(model_labels(many, 6))) == 12  # too narrow for any form: the shortest that tells them apart
