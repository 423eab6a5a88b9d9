"""Channel connectivity (``keras_precrop.pai.connectivity``): detached weights and channel groups."""

import keras
import numpy as np
import pytest

from keras_precrop import pai
from tests.conftest import check_remove_detached, count_kept, grouped_cnn, kernel_mask, mixed_cnn

L = keras.layers


def test_channel_masks_align_along_channel_groups(resnet20):
    densities = {p: 0.3 for p in pai.prunable_weights(resnet20)}
    masks = pai.random_masks(resnet20, densities, "channel", seed=2)

    def outs(p):
        return masks[p].any(axis=(0, 1, 2))

    def ins(p):
        return masks[p].any(axis=(0, 1, 3))

    pairs = [
        ("stage1_block1_conv1/kernel", "stage1_block1_conv2/kernel"),  # through BN + ReLU
        ("stem_conv/kernel", "stage1_block2_conv1/kernel"),  # along the residual stream
        ("stage1_block3_conv2/kernel", "stage2_block1_shortcut_conv/kernel"),
    ]
    for writer, reader in pairs:
        w, r = outs(writer), ins(reader)
        assert np.all(w <= r) or np.all(r <= w), (writer, reader)  # nested channel sets


def test_remove_detached_matches_synaptic_flow(resnet20):
    """A kept weight is attached iff it carries synaptic flow in the linearized net.

    Exact on ResNet-20 (32x32 maps, every kernel tap sees real pixels). On the
    small mixed model single spatial positions matter (4x4 maps, a sparse
    Dense after Flatten) while connectivity is tracked per channel, so there
    the removal is only guaranteed to keep every weight that carries flow.
    """
    mixed = mixed_cnn()
    for granularity in ("weight", "channel"):
        check_remove_detached(resnet20, pai.random_masks(resnet20, 0.02, granularity, seed=4))
        check_remove_detached(mixed, pai.random_masks(mixed, 0.08, granularity, seed=4), exact=False)
    # Removing detached weights twice changes nothing.
    once = pai.random_masks(resnet20, 0.02, "channel", remove_detached=True, seed=5)
    assert count_kept(pai.remove_detached(resnet20, once)) == count_kept(once)


def _se_cnn(seed=0):
    """A squeeze-excite gate (Multiply) and a 1-channel spatial gate on conv features."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((6, 6, 3))
    a = L.Conv2D(8, 3, padding="same", name="a")(inputs)
    gate = L.Dense(8, activation="sigmoid", name="gate")(L.GlobalAveragePooling2D(keepdims=True)(a))
    x = L.Multiply(name="se_multiply")([a, gate])
    spatial = L.Conv2D(1, 1, activation="sigmoid", name="spatial")(x)
    x = L.Multiply(name="spatial_multiply")([x, spatial])
    x = L.Conv2D(6, 3, name="b")(x)
    return keras.Model(inputs, L.Dense(2, name="fc")(L.Flatten()(x)))


def test_gated_models_keep_every_weight_that_carries_flow():
    model = _se_cnn()
    for granularity in ("weight", "channel"):
        check_remove_detached(model, pai.random_masks(model, 0.1, granularity, seed=1), exact=False)
    masks = pai.random_masks(model, 0.3, "channel", seed=0)
    # The gate's output channels follow the features it multiplies.
    a_out, gate_out = masks["a/kernel"].any(axis=(0, 1, 2)), masks["gate/kernel"].any(axis=0)
    assert np.all(a_out <= gate_out) or np.all(gate_out <= a_out)


def test_unsupported_layer_is_named():
    inputs = keras.Input((6, 6, 3))
    a = L.Conv2D(4, 3, name="a")(inputs)
    x = L.Permute((2, 1, 3), name="odd_permute")(a)
    model = keras.Model(inputs, L.Dense(2, name="fc")(L.Flatten()(x)))
    with pytest.raises(ValueError, match="odd_permute.*Permute"):
        pai.random_masks(model, 0.5, "channel")
    masks = pai.random_masks(model, 0.5, "weight", seed=0)  # weight level needs no graph
    with pytest.raises(ValueError, match="odd_permute"):
        pai.remove_detached(model, masks)


def test_remove_detached_follows_group_boundaries():
    """Inputs cut from group 0 detach exactly group 0 of the grouped conv."""
    model = grouped_cnn()
    masks = {p: np.ones(v.shape, np.float32) for p, v in pai.prunable_weights(model).items()}
    dw_path = next(p for p in masks if p.startswith("dw/"))
    masks[dw_path][..., 0:4] = 0  # channels 0-3 = group 0's inputs of "grouped"
    kept = pai.remove_detached(model, masks)
    grouped = kernel_mask(kept, "grouped")
    assert not grouped[..., 0:6].any()  # group 0's outputs lost all their inputs
    assert grouped[..., 6:].all()
    head = kernel_mask(kept, "head_conv")
    assert not head[:, :, 0:6, :].any() and head[:, :, 6:, :].all()
