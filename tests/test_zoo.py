"""The zoo's numbers (engine/zoo/summaries.py) against straightforward references: the alignment by loops, the monotone
path by brute force over every non-decreasing map, intervals by explicit bootstrap replicates, families by table."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from vitsee import stats
from vitsee.zoo import summaries as zoo
from vitsee.errors import VitseeError


def _alignment_by_loops(m: np.ndarray) -> float:
    la, lb = m.shape
    rows = sum(max(m[i, j] for j in range(lb)) for i in range(la)) / la
    cols = sum(max(m[i, j] for i in range(la)) for j in range(lb)) / lb
    return (rows + cols) / 2


class TestBestMatch:
    def test_equals_the_mean_of_row_and_column_maxima_by_loops(self):
        rng = np.random.default_rng(0)
        for shape in [(1, 1), (3, 5), (7, 4), (12, 12)]:
            m = rng.uniform(-0.1, 1, size=shape)
            assert zoo.best_match_alignment(m) == pytest.approx(_alignment_by_loops(m), abs=1e-15)

    def test_is_symmetric_and_one_for_a_model_with_itself(self):
        from vitsee.analyses.cka import minibatch_cka

        rng = np.random.default_rng(1)
        feats = [rng.normal(size=(48, d)) for d in (5, 9, 13)]
        feats.append(feats[0] @ rng.normal(size=(5, 7)))
        m = minibatch_cka(feats, batch_size=16)  # a model's CKA with itself: unit diagonal, no cell above 1
        assert zoo.best_match_alignment(m) == pytest.approx(1.0, abs=1e-12)
        other = rng.uniform(size=(4, 6))
        assert zoo.best_match_alignment(other) == zoo.best_match_alignment(other.T)

    def test_skips_non_finite_layers_and_works_over_leading_axes(self):
        m = np.array([[0.2, 0.9, 0.1], [np.nan, np.nan, np.nan], [0.5, 0.3, 0.4]])
        # the NaN layer of A is left out: rows (0.9 + 0.5) / 2, columns (0.5 + 0.9 + 0.4) / 3
        assert zoo.best_match_alignment(m) == pytest.approx((0.7 + 0.6) / 2)
        stack = np.stack([m, m[::-1]])
        np.testing.assert_allclose(zoo.best_match_alignment(stack), [0.65, 0.65])
        assert np.isnan(zoo.best_match_alignment(np.full((2, 2), np.nan)))

    def test_the_layer_summary_reads_one_cell_and_an_unknown_summary_is_refused(self):
        m = np.arange(12.0).reshape(3, 4)
        assert zoo.summarise(m, "layer") == 11.0 and zoo.summarise(m, "layer", 0, 2) == 2.0
        with pytest.raises(VitseeError, match="unknown zoo summary 'mean': choose from best_match, layer"):
            zoo.summarise(m, "mean")


def _brute_force_path(m: np.ndarray) -> tuple[float, tuple[int, ...]]:
    """The best total over every non-decreasing map rows -> columns, and among the best the smallest read from the
    last row backwards (the documented tie rule)."""
    la, lb = m.shape
    best, chosen = -np.inf, None
    for f in itertools.combinations_with_replacement(range(lb), la):  # every non-decreasing f, as a sorted tuple
        total = sum(m[i, j] for i, j in enumerate(f))
        if total > best or (total == best and f[::-1] < chosen[::-1]):
            best, chosen = total, f
    return best, chosen


class TestCorrespondence:
    @pytest.mark.parametrize("shape", [(1, 4), (4, 1), (3, 3), (5, 6), (6, 4), (7, 7)])
    def test_the_monotone_path_is_the_best_non_decreasing_map_found_by_brute_force(self, shape):
        rng = np.random.default_rng(shape[0] * 10 + shape[1])
        for _ in range(5):
            m = rng.uniform(size=shape)
            path = zoo.monotone_match(m)
            total, want = _brute_force_path(m)
            assert np.all(np.diff(path) >= 0)
            assert m[np.arange(shape[0]), path].sum() == pytest.approx(total, abs=1e-12)
            assert tuple(path) == want

    def test_ties_go_to_the_shallowest_columns_read_from_the_last_row_back(self):
        rng = np.random.default_rng(3)
        for _ in range(20):  # small integers: many exact ties, sums exact in floating point
            m = rng.integers(0, 3, size=(5, 5)).astype(float)
            assert tuple(zoo.monotone_match(m)) == _brute_force_path(m)[1]

    def test_the_path_keeps_order_where_the_argmax_does_not(self):
        m = np.array(
            [
                [0.1, 0.2, 0.9],  # the first layer's raw best is the last column,
                [0.8, 0.3, 0.1],  # the next two's the first:
                [0.2, 0.7, 0.3],
            ]
        )  # no order-keeping map gives all three their best
        np.testing.assert_array_equal(zoo.argmax_match(m), [2, 0, 1])
        path = zoo.monotone_match(m)
        np.testing.assert_array_equal(path, [0, 0, 1])  # 0.1 + 0.8 + 0.7 = 1.6, the best non-decreasing total

    def test_non_finite_layers_are_avoided_or_add_nothing(self):
        m = np.array([[0.9, np.nan, 0.1], [0.2, np.nan, 0.8], [np.nan, np.nan, np.nan]])
        np.testing.assert_array_equal(zoo.argmax_match(m), [0, 2, -1])
        path = zoo.monotone_match(m)
        assert 1 not in path[:2] and np.all(np.diff(path) >= 0) and tuple(path[:2]) == (0, 2)

    def test_relative_depths_run_from_zero_to_one(self):
        np.testing.assert_allclose(zoo.relative_depth(5), [0, 0.25, 0.5, 0.75, 1])
        np.testing.assert_array_equal(zoo.relative_depth(1), [0.0])
        c = zoo.correspondence(np.array([[0.9, 0.1, 0.0], [0.1, 0.2, 0.8]]), "A", "B", ["a0", "a1"], ["b0", "b1", "b2"])
        np.testing.assert_allclose(c.depth_a, [0, 1])
        np.testing.assert_allclose(c.depth_b_path, [0, 1])
        np.testing.assert_allclose(c.depth_b_argmax, [0, 1])
        with pytest.raises(VitseeError, match="does not match 2 layers of A x 2 of B"):
            zoo.correspondence(np.zeros((2, 3)), "A", "B", ["a0", "a1"], ["b0", "b1"])


class TestClusterOrder:
    def test_two_groups_come_out_contiguous_and_the_order_is_scipys(self):
        from scipy.cluster import hierarchy
        from scipy.spatial.distance import squareform

        group = np.array([0, 1, 0, 1, 0, 1])  # interleaved in the store's order
        rng = np.random.default_rng(4)
        s = np.where(group[:, None] == group[None, :], 0.9, 0.2) + rng.uniform(0, 0.05, size=(6, 6))
        s = (s + s.T) / 2
        np.fill_diagonal(s, 1.0)
        order = zoo.cluster_order(s)
        assert sorted(order) == list(range(6))
        assert {tuple(group[order[:3]]), tuple(group[order[3:]])} == {(0, 0, 0), (1, 1, 1)}
        d = 1 - s
        np.fill_diagonal(d, 0)
        want = hierarchy.leaves_list(hierarchy.linkage(squareform(d), "average", optimal_ordering=True))
        assert order == want.tolist() and zoo.cluster_order(s) == order  # deterministic

    def test_small_or_odd_matrices(self):
        assert zoo.cluster_order(np.ones((1, 1))) == [0] and zoo.cluster_order(np.eye(2)) == [0, 1]
        s = np.array([[1, 1.0000001, np.nan], [1.0000001, 1, 0.1], [np.nan, 0.1, 1]])
        assert sorted(zoo.cluster_order(s)) == [0, 1, 2]  # above-1 and missing similarities do not break it
        with pytest.raises(VitseeError, match="square models x models"):
            zoo.cluster_order(np.ones((2, 3)))


FAMILY_TABLE = [
    ("vit_base_patch16_224.augreg_in21k", "ViT"),
    ("vit_tiny_patch16_224@random:0", "ViT"),
    ("vit_small_patch14_reg4_dinov2.lvd142m", "ViT"),
    ("vit_tiny_r_s16_p8_224", "ViT"),
    ("test_vit3", "ViT"),
    ("flexivit_small", "ViT"),
    ("samvit_base_patch16", "ViT"),
    ("vitamin_small_224", "other"),
    ("deit_tiny_distilled_patch16_224", "DeiT"),
    ("deit3_small_patch16_224", "DeiT"),
    ("swin_tiny_patch4_window7_224", "Swin"),
    ("swinv2_cr_tiny_ns_224", "Swin"),
    ("mixer_b16_224.goog_in21k", "Mixer"),
    ("gmixer_24_224", "Mixer"),
    ("resmlp_12_224", "ResMLP"),
    ("gmlp_s16_224", "gMLP"),
    ("resnet50.a1_in1k", "ResNet"),
    ("resnet18@/tmp/w.safetensors", "ResNet"),
    ("test_resnet", "ResNet"),
    ("resnext50_32x4d", "ResNet"),
    ("seresnext26d_32x4d", "ResNet"),
    ("wide_resnet50_2", "ResNet"),
    ("resnetv2_50x1_bit.goog_in21k", "ResNetV2/BiT"),
    ("resnetv2_152x2_bit", "ResNetV2/BiT"),
    ("convnext_tiny", "ConvNeXt"),
    ("convnextv2_atto", "ConvNeXt"),
    ("test_convnext2", "ConvNeXt"),
    ("efficientnet_b0", "EfficientNet"),
    ("tf_efficientnetv2_s", "EfficientNet"),
    ("test_efficientnet", "EfficientNet"),
    ("regnety_016", "RegNet"),
    ("regnetz_b16", "RegNet"),
    ("beit_base_patch16_224", "BEiT"),
    ("beitv2_base_patch16_224", "BEiT"),
    ("eva02_tiny_patch14_224", "EVA"),
    ("eva_giant_patch14_224", "EVA"),
    ("cait_xxs24_224", "CaiT"),
    ("pit_ti_224", "PiT"),
    ("maxvit_tiny_tf_224", "MaxViT"),
    ("coatnet_0_rw_224", "CoAtNet"),
    ("xcit_tiny_12_p16_224", "XCiT"),
    ("mobilenetv3_small_100", "MobileNet"),
    ("tf_mobilenetv3_small_100", "MobileNet"),
    ("densenet121", "DenseNet"),
    ("vgg16", "VGG"),
    ("inception_v3", "Inception"),
    ("dla34", "other"),
    ("", "other"),
]


class TestFamilies:
    @pytest.mark.parametrize("name, family", FAMILY_TABLE)
    def test_the_family_of_a_name(self, name, family):
        assert zoo.architecture_family(name) == family

    def test_a_name_that_says_nothing_takes_its_analysis_family(self):
        assert zoo.architecture_family("vitsee_tiny_swin", "swin") == "Swin"
        assert zoo.architecture_family("my_net@random:0", "other") == "other"
        assert zoo.family_of_record({"name": "deit_tiny_patch16_224", "family": "vit"}) == "DeiT"
        assert zoo.family_of_record({"name": "vitsee_tiny_mixer", "family": "mixer"}) == "Mixer"

    @pytest.mark.parametrize(
        "module, family",
        [
            ("deit", "DeiT"),
            ("beit", "BEiT"),
            ("cait", "CaiT"),
            ("pit", "PiT"),
            ("swin_transformer", "Swin"),
            ("swin_transformer_v2", "Swin"),
            ("swin_transformer_v2_cr", "Swin"),
            ("convnext", "ConvNeXt"),
            ("regnet", "RegNet"),
            ("resnetv2", "ResNetV2/BiT"),
            ("resnet", "ResNet"),
            ("densenet", "DenseNet"),
            ("vgg", "VGG"),
            ("xcit", "XCiT"),
            ("levit", "LeViT"),
            ("crossvit", "CrossViT"),
            ("vision_transformer_hybrid", "ViT"),
        ],
    )
    def test_every_timm_model_of_a_one_family_module_gets_that_family(self, module, family):
        import timm
        from timm.models import _registry

        # timm's own names: other test modules register tiny models of their own (vitsee_tiny_deit_distilled, ...)
        names = [
            n
            for n in timm.list_models()
            if _registry._model_to_module.get(n) == module and not n.startswith(("vitsee_", "test_"))
        ]
        assert names
        wrong = [n for n in names if zoo.architecture_family(n) != family]
        assert not wrong, wrong[:5]


def _per_batch_hsic(rng, n_batches=12, m=8, dims=(6, 9, 4, 7, 5)):
    """Returns (batch HSIC (B, L, L), HSIC sums (L, L), the MinibatchCKA) of random related layers."""
    import torch

    from vitsee.analyses.cka import MinibatchCKA

    acc = MinibatchCKA(len(dims), "cpu", batch_slots=n_batches)
    base = rng.normal(size=(n_batches * m, 6))
    for b in range(n_batches):
        rows = base[b * m : (b + 1) * m]
        acc.update(
            [torch.as_tensor(rows @ rng.normal(size=(6, d)) + 0.5 * rng.normal(size=(m, d))) for d in dims], slot=b
        )
    return acc.batch_hsic.numpy().copy(), acc.hsic_sums.numpy().copy(), acc


class TestIntervals:
    def test_the_layer_summary_interval_is_that_cka_cells_bootstrap_interval(self):
        rng = np.random.default_rng(5)
        batch, sums, acc = _per_batch_hsic(rng)
        columns = [("A", "a0"), ("A", "a1"), ("B", "b0"), ("B", "b1"), ("B", "b2")]
        z = zoo.zoo_from_hsic(sums, columns, batch_hsic=batch, summary="layer", level=0.9, replicates=400, seed=7)
        cell = acc.statistics(0.9, 400, [7, 0])
        assert z.ci_low[0, 1] == pytest.approx(cell["ci_low"][1, 4], abs=1e-12)
        assert z.ci_high[0, 1] == pytest.approx(cell["ci_high"][1, 4], abs=1e-12)
        assert z.values[0, 1] == pytest.approx(acc.result()[1, 4], abs=1e-12)
        assert z.layers == {"A": "a1", "B": "b2"} and "0.9 percentile bootstrap over 12 batches" in z.interval

    def test_the_best_match_interval_equals_explicit_bootstrap_replicates(self):
        rng = np.random.default_rng(6)
        batch, sums, _ = _per_batch_hsic(rng)
        columns = [("A", "a0"), ("A", "a1"), ("B", "b0"), ("B", "b1"), ("B", "b2")]
        z = zoo.zoo_from_hsic(sums, columns, batch_hsic=batch, level=0.8, replicates=300, seed=3)
        draws = stats.bootstrap_indices(len(batch), 300, [3, 0])
        reps = []
        for draw in draws:  # each replicate: its batches' HSIC summed, CKA finished, the alignment of the A x B block
            h = batch[draw].sum(axis=0)
            cka = h / np.sqrt(np.outer(np.diag(h), np.diag(h)))
            reps.append(_alignment_by_loops(cka[:2, 2:]))
        low, high = np.quantile(reps, [0.1, 0.9])
        assert z.ci_low[0, 1] == pytest.approx(low, abs=1e-12) and z.ci_high[0, 1] == pytest.approx(high, abs=1e-12)
        assert z.ci_low[0, 1] <= z.values[0, 1] <= z.ci_high[0, 1]
        cka = sums / np.sqrt(np.outer(np.diag(sums), np.diag(sums)))
        assert z.values[0, 1] == pytest.approx(_alignment_by_loops(cka[:2, 2:]), abs=1e-12)
        assert z.values[0, 0] == pytest.approx(1.0, abs=1e-12) and z.values[1, 0] == z.values[0, 1]

    def test_without_per_batch_terms_there_is_no_interval_and_it_says_why(self):
        rng = np.random.default_rng(7)
        _, sums, _ = _per_batch_hsic(rng)
        z = zoo.zoo_from_hsic(sums, [("A", "a0"), ("A", "a1"), ("B", "b0"), ("B", "b1"), ("B", "b2")])
        assert np.isnan(z.ci_low).all() and z.interval.startswith("none")


def test_a_zoo_from_a_cached_cka_result_summarises_each_pairs_view(tiny_store):
    """The zoo of a store's cached CKA equals the summaries of the per-pair views computed one pair at a time."""
    from conftest import RESNET, VIT
    from vitsee.analyses import driver as an
    from vitsee.analyses.cka import cka_block, run_cka
    from vitsee.store import Store, copy_store

    with Store.writer(copy_store(tiny_store, tiny_store.parent / "zoo-cka.h5")) as s:
        result = run_cka(s, an.AnalyzeConfig(batch_size=16, shuffles=0, device="cpu", ci=0, permutations=0))
        records = [s.model_info(k) for k in s.models]
    z = zoo.zoo_from_cka(result, families=[zoo.family_of_record(r) for r in records])
    assert z.models == [VIT, RESNET] and z.families == ["ViT", "ResNet"]
    block, rows, cols = cka_block(result, VIT, RESNET)
    assert z.values[0, 1] == z.values[1, 0] == zoo.best_match_alignment(block)
    assert z.values[0, 0] == pytest.approx(1.0, abs=1e-12) and z.values[1, 1] == pytest.approx(1.0, abs=1e-12)
    c = z.correspondences[(VIT, RESNET)]
    assert c.rows == rows and c.cols == cols and tuple(c.path) == _brute_force_path(block)[1]
    np.testing.assert_array_equal(z.correspondences[(RESNET, VIT)].argmax, zoo.argmax_match(block.T))
    exported = z.as_json()
    assert (
        exported["models"] == z.models and exported["summary"] == "best_match" and len(exported["correspondences"]) == 2
    )
    assert exported["ci_low"] == [[None, None], [None, None]]
    with pytest.raises(VitseeError, match="no layer 'blocks.99' in"):
        zoo.zoo_from_cka(result, summary="layer", layers={VIT: "blocks.99"})
