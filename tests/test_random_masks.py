"""Random masks at weight, filter and channel granularity (``keras_precrop.pai.random_masks``)."""

import math

import numpy as np
import pytest

from keras_precrop import pai
from tests.conftest import count_kept, count_total, grouped_cnn, kernel_mask, mixed_cnn


@pytest.mark.parametrize("builder", ["resnet20", "mixed"])
@pytest.mark.parametrize("granularity", ["weight", "filter", "channel"])
def test_random_masks_hit_layer_densities_within_one_unit(builder, granularity, resnet20):
    model = resnet20 if builder == "resnet20" else mixed_cnn()
    rng = np.random.default_rng(0)
    targets = {p: float(rng.uniform(0.05, 0.9)) for p in pai.prunable_weights(model)}
    masks = pai.random_masks(model, targets, granularity, seed=0)
    shapes = {v.path: tuple(v.shape) for v in model.weights}
    for path, mask in masks.items():
        shape, n = shapes[path], mask.size
        kept = np.count_nonzero(mask)
        depthwise = path in ("dw/kernel", "sep/depthwise_kernel")
        if granularity == "weight":
            assert kept == round(targets[path] * n)
        elif granularity == "filter":
            unit = math.prod(shape[:-2])
            assert abs(kept - targets[path] * n) <= unit / 2 + 1e-9, path
            assert kept % unit == 0
        else:
            unit = math.prod(shape[:-2]) * (shape[-1] if depthwise else max(shape[-2], shape[-1]))
            assert abs(kept - targets[path] * n) <= unit, path
            # Whole channels: the kernel mask is an outer product of channel masks.
            in_axis, out_axis = (-1, -2) if path == "tr/kernel" else (-2, -1)
            if len(shape) == 2:
                in_axis, out_axis = 0, 1
            io = np.moveaxis(mask, (in_axis, out_axis), (-2, -1)).reshape(-1, shape[in_axis], shape[out_axis])
            assert (io == io[0]).all(), path
            rows, cols = io[0].any(axis=1), io[0].any(axis=0)
            np.testing.assert_array_equal(io[0], np.outer(rows, cols))


def test_random_and_random_masks_are_seeded(resnet20):
    a, b, c = (pai.random(resnet20, 0.1, seed=s) for s in (1, 1, 2))
    assert all(np.array_equal(a[p], b[p]) for p in a) and not all(np.array_equal(a[p], c[p]) for p in a)
    assert count_kept(a) == round(0.1 * count_total(a))
    d, e = (pai.random_masks(resnet20, 0.2, "filter", seed=7) for _ in range(2))
    assert all(np.array_equal(d[p], e[p]) for p in d)


@pytest.mark.parametrize("granularity", ["weight", "filter", "channel"])
def test_random_masks_keep_the_density_of_grouped_kernels(granularity):
    model = grouped_cnn()
    masks = pai.random_masks(model, 0.5, granularity=granularity, seed=0)
    grouped = kernel_mask(masks, "grouped")
    assert grouped.shape == (3, 3, 4, 24)
    assert grouped.mean() == pytest.approx(0.5, abs=1 / 24)


def test_channel_masks_are_a_narrower_grouped_conv():
    """Every group keeps the same number of its own inputs and outputs."""
    model = grouped_cnn()
    masks = pai.random_masks(model, 0.5, granularity="channel", seed=1)
    pairs = kernel_mask(masks, "grouped").any(axis=(0, 1))  # (4 inputs in group, 24 outputs)
    per_group = [pairs[:, 6 * j:6 * j + 6] for j in range(4)]
    shapes = {(int(g.any(axis=1).sum()), int(g.any(axis=0).sum())) for g in per_group}
    assert shapes == {(3, 4)}  # 3 x 4 of 4 x 6: half of each group
    for g in per_group:  # an outer product of kept inputs and kept outputs
        np.testing.assert_array_equal(g, g.any(axis=1)[:, None] & g.any(axis=0)[None, :])
    dw = kernel_mask(masks, "dw").any(axis=(0, 1))[0]  # depthwise-style: whole channels
    assert dw.sum() == 8
