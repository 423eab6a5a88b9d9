"""Random masks at weight, filter and channel granularity (``keras_precrop.pai.random_masks``)."""

import math

import numpy as np
import pytest

from keras_precrop import pai
from tests.conftest import count_kept, count_total, mixed_cnn


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
