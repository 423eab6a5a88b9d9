"""keras_hub CNN backbones, built from their constructors (no download).

Needs ``pip install --no-deps keras-hub tokenizers`` (plain ``pip install
keras-hub`` pulls a second, CUDA, TensorFlow); skipped without keras_hub.
"""

import keras
import numpy as np
import pytest

keras_hub = pytest.importorskip("keras_hub")

import keras_precrop as kp  # noqa: E402
from tests.conftest import assert_matches_plan, tf_macs  # noqa: E402

M = keras_hub.models
BACKBONES = {
    "ResNetBackbone": lambda: M.ResNetBackbone(
        input_conv_filters=[64], input_conv_kernel_sizes=[7], stackwise_num_filters=[64, 32],
        stackwise_num_blocks=[2, 2], stackwise_num_strides=[1, 2],
        block_type="bottleneck_block", use_pre_activation=True, image_shape=(32, 32, 3)),
    "VGGBackbone": lambda: M.VGGBackbone(
        stackwise_num_repeats=[1, 2], stackwise_num_filters=[16, 32], image_shape=(32, 32, 3)),
    "DenseNetBackbone": lambda: M.DenseNetBackbone(
        stackwise_num_repeats=[2, 2], growth_rate=8, image_shape=(32, 32, 3)),
    "XceptionBackbone": lambda: M.XceptionBackbone(
        stackwise_conv_filters=[[32, 64], [64, 128], [128, 128], [256, 256]],
        stackwise_pooling=[False, True, False, True], image_shape=(71, 71, 3)),
    "ResNetBackbone_basic": lambda: M.ResNetBackbone(
        input_conv_filters=[64], input_conv_kernel_sizes=[3], stackwise_num_filters=[64, 32],
        stackwise_num_blocks=[1, 1], stackwise_num_strides=[1, 2], block_type="basic_block",
        use_pre_activation=False, image_shape=(32, 32, 3)),
    "EfficientNetBackbone": lambda: M.EfficientNetBackbone(
        stackwise_width_coefficients=[1.0, 1.0], stackwise_depth_coefficients=[1.0, 1.0],
        stackwise_kernel_sizes=[3, 3], stackwise_num_repeats=[1, 2],
        stackwise_input_filters=[16, 16], stackwise_output_filters=[16, 24],
        stackwise_expansion_ratios=[1, 4], stackwise_squeeze_and_excite_ratios=[0.25, 0.25],
        stackwise_strides=[1, 2], stackwise_block_types=["v1", "v1"], num_features=64,
        input_shape=(32, 32, 3)),
}


def _csp(stage_type, block_type, **kwargs):
    """A small CSPNet backbone; its ``csp`` and ``cs3`` stages split channels with ``keras.ops.split``."""
    config = dict(stem_filters=16, stem_kernel_size=3, stem_strides=1, stackwise_depth=[1, 1],
                  stackwise_strides=[1, 2], stackwise_num_filters=[16, 32], expand_ratio=[2.0],
                  bottle_ratio=[0.5], block_ratio=[1.0], image_shape=(32, 32, 3))
    config.update(kwargs)
    return lambda: M.CSPNetBackbone(block_type=block_type, stage_type=stage_type, **config)


CSP = {
    **{f"CSPNetBackbone_{stage}_{block}": _csp(stage, block)
       for stage in ("csp", "cs3", "dark")
       for block in ("bottleneck_block", "dark_block", "edge_block")},
    "CSPNetBackbone_csp_grouped": _csp("csp", "bottleneck_block", groups=2, down_growth=True,
                                       cross_linear=True),
    "CSPNetBackbone_cs3_pooled": _csp("cs3", "dark_block", stem_strides=4, stem_pooling="max",
                                      avg_down=True),
}
BACKBONES.update(CSP)

# Backbones the walker refuses, with the layer it names: MobileNet and HGNetV2 nest their
# convolutions inside subclassed layers it cannot see into.
REFUSED = {
    "MobileNetBackbone": (lambda: M.MobileNetBackbone(
        stackwise_expansion=[[16, 24], [48]], stackwise_num_blocks=[2, 1],
        stackwise_num_filters=[[8, 8], [16]], stackwise_kernel_size=[[3, 3], [5]],
        stackwise_num_strides=[[2, 1], [2]], stackwise_se_ratio=[[None, None], [0.25]],
        stackwise_activation=[["relu", "relu"], ["hard_swish"]],
        stackwise_padding=[[1, 1], [2]], output_num_filters=32, depthwise_filters=8,
        depthwise_stride=1, depthwise_residual=False, last_layer_filter=32,
        squeeze_and_excite=0.5, input_num_filters=8, image_shape=(32, 32, 3)),
        "'block_0_0' of class DepthwiseConvBlock"),
    "HGNetV2Backbone": (lambda: M.HGNetV2Backbone(
        depths=[1, 1], embedding_size=16, hidden_sizes=[32, 64], stem_channels=[3, 8, 16],
        hidden_act="relu", use_learnable_affine_block=False,
        stackwise_stage_filters=[(16, 8, 32, 1, 1, 3), (32, 16, 64, 1, 1, 3)],
        apply_downsample=[False, True], use_lightweight_conv_block=[False, True],
        image_shape=(32, 32, 3)),
        "'embedder' of class HGNetV2Embeddings"),
}


@pytest.mark.parametrize("name", sorted(BACKBONES))
def test_backbone_profile_precrop_reconfigure(name):
    backbone = BACKBONES[name]()
    prof = kp.profile(backbone)
    assert prof.total_params == backbone.count_params()
    assert prof.total_macs == tf_macs(backbone)
    for new in (kp.precrop(backbone, params=0.5), kp.precrop(backbone, flops=0.5),
                kp.reconfigure(backbone, params=0.8, flops=1.0)):
        assert_matches_plan(backbone, new.precrop_plan, new)
        assert [layer.name for layer in backbone.layers] == [
            layer.name for layer in new.layers if not isinstance(layer, kp.ChannelSlice)]


@pytest.mark.parametrize("name", sorted(CSP))
def test_pruned_csp_backbone_trains_one_step(name):
    """The pruned backbone under a classifier head takes an optimizer step on random data."""
    keras.utils.set_random_seed(0)
    small = kp.precrop(CSP[name](), params=0.5)
    inputs = keras.Input(small.input.shape[1:])
    logits = keras.layers.Dense(3)(keras.layers.GlobalAveragePooling2D()(small(inputs)))
    model = keras.Model(inputs, logits)
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4,) + tuple(small.input.shape[1:])).astype("float32")
    y = rng.integers(0, 3, size=4)
    before = [keras.ops.convert_to_numpy(w) for w in small.trainable_weights]
    history = model.fit(x, y, batch_size=4, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    after = [keras.ops.convert_to_numpy(w) for w in small.trainable_weights]
    assert any(not np.array_equal(a, b) for a, b in zip(before, after))


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_backbone_refused_names_layer(name):
    build, layer = REFUSED[name]
    with pytest.raises(kp.UnsupportedLayerError, match=layer):
        kp.profile(build())
