"""The unstructured baselines on grouped convolutions (ResNeXt/ConvNeXt style)."""

import keras
import numpy as np
import pytest
from keras import layers as L

from keras_precrop import pai


def _model():
    x = inputs = keras.Input((8, 8, 3))
    x = L.Conv2D(16, 3, padding="same", name="stem")(x)
    x = L.Conv2D(16, 3, padding="same", groups=16, name="dw")(x)  # depthwise-style
    x = L.Conv2D(24, 3, padding="same", groups=4, name="grouped")(x)  # 4 in, 6 out per group
    x = L.Conv2D(6, 1, name="head_conv")(x)
    out = L.Dense(3, name="head")(L.GlobalAveragePooling2D()(x))
    return keras.Model(inputs, out)


def _kernel(masks, name):
    return next(m for p, m in masks.items() if p.startswith(f"{name}/kernel"))


@pytest.mark.parametrize("granularity", ["weight", "filter", "channel"])
def test_random_masks_keep_the_density_of_grouped_kernels(granularity):
    model = _model()
    masks = pai.random_masks(model, 0.5, granularity=granularity, seed=0)
    grouped = _kernel(masks, "grouped")
    assert grouped.shape == (3, 3, 4, 24)
    assert grouped.mean() == pytest.approx(0.5, abs=1 / 24)


def test_channel_masks_are_a_narrower_grouped_conv():
    """Every group keeps the same number of its own inputs and outputs."""
    model = _model()
    masks = pai.random_masks(model, 0.5, granularity="channel", seed=1)
    pairs = _kernel(masks, "grouped").any(axis=(0, 1))  # (4 inputs in group, 24 outputs)
    per_group = [pairs[:, 6 * j:6 * j + 6] for j in range(4)]
    shapes = {(int(g.any(axis=1).sum()), int(g.any(axis=0).sum())) for g in per_group}
    assert shapes == {(3, 4)}  # 3 x 4 of 4 x 6: half of each group
    for g in per_group:  # an outer product of kept inputs and kept outputs
        np.testing.assert_array_equal(g, g.any(axis=1)[:, None] & g.any(axis=0)[None, :])
    dw = _kernel(masks, "dw").any(axis=(0, 1))[0]  # depthwise-style: whole channels
    assert dw.sum() == 8


def test_remove_detached_follows_group_boundaries():
    """Inputs cut from group 0 detach exactly group 0 of the grouped conv."""
    model = _model()
    masks = {p: np.ones(v.shape, np.float32) for p, v in pai.prunable_weights(model).items()}
    dw_path = next(p for p in masks if p.startswith("dw/"))
    masks[dw_path][..., 0:4] = 0  # channels 0-3 = group 0's inputs of "grouped"
    kept = pai.remove_detached(model, masks)
    grouped = _kernel(kept, "grouped")
    assert not grouped[..., 0:6].any()  # group 0's outputs lost all their inputs
    assert grouped[..., 6:].all()
    head = _kernel(kept, "head_conv")
    assert not head[:, :, 0:6, :].any() and head[:, :, 6:, :].all()


def test_synflow_scores_grouped_kernels():
    model = _model()
    masks = pai.synflow(model, 0.3, iterations=5, verbose=0)
    total = sum(m.size for m in masks.values())
    assert sum(m.sum() for m in masks.values()) == round(0.3 * total)
    assert _kernel(masks, "grouped").shape == (3, 3, 4, 24)
