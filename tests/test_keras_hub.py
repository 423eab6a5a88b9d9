"""keras_hub CNN backbones, built from their constructors (no download).

Needs ``pip install --no-deps keras-hub tokenizers`` (plain ``pip install
keras-hub`` pulls a second, CUDA, TensorFlow); skipped without keras_hub.
"""

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
