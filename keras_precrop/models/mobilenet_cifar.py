"""MobileNetV2 (Sandler et al. 2018) adapted to 32x32 CIFAR inputs.

The usual CIFAR adaptation keeps the ImageNet architecture but removes two
downsamplings: the stem conv and the first stride-2 stage (t=6, c=24, n=2) use
stride 1, so a 32x32 input reaches the head at 4x4 instead of 1x1. Everything
else (and therefore the parameter count) equals torchvision's
``mobilenet_v2(num_classes=...)``.

Initialization follows torchvision's MobileNetV2: conv kernels Kaiming-normal
(untruncated, gain sqrt(2)) in fan_out mode, classifier kernel N(0, 0.01),
biases 0, BN gamma 1 and beta 0.
"""

import keras

from keras_precrop.models import _layers

# (expansion t, output channels c, repeats n, first stride s), CIFAR strides.
_CIFAR_STAGES = (
    (1, 16, 1, 1),
    (6, 24, 2, 1),  # stride 2 on ImageNet
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
)


def _make_divisible(value, divisor=8):
    """Rounds a scaled channel count to a multiple of ``divisor`` (MobileNet rule).

    Rounds to the nearest multiple but never more than 10% below ``value``.
    """
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    if rounded < 0.9 * value:
        rounded += divisor
    return rounded


def _inverted_residual(x, expansion, filters, strides, prefix):
    """Applies expand 1x1 -> depthwise 3x3 -> project 1x1 (+ Add when shapes allow)."""
    in_channels = x.shape[-1]
    y = x
    if expansion != 1:
        y = _layers.conv_bn(
            y, in_channels * expansion, 1, 1, f"{prefix}expand_",
            _layers.kaiming_normal("fan_out"), activation="relu6",
        )
    # Keras' depthwise kernel is (3, 3, C, 1), whose Keras fan_in (9 * C) is
    # PyTorch's fan_out of the (C, 1, 3, 3) weight, so "fan_in" here matches
    # torchvision's kaiming_normal_(mode="fan_out").
    y = _layers.conv_bn(
        y, None, 3, strides, f"{prefix}dw_", _layers.kaiming_normal("fan_in"), activation="relu6"
    )
    y = _layers.conv_bn(
        y, filters, 1, 1, f"{prefix}project_", _layers.kaiming_normal("fan_out"), activation=None
    )
    if strides == 1 and in_channels == filters:
        y = keras.layers.Add(name=f"{prefix}add")([x, y])
    return y


def mobilenet_v2_cifar(
    input_shape=(32, 32, 3), num_classes=10, alpha=1.0, name="mobilenet_v2_cifar"
):
    """Builds MobileNetV2 for CIFAR-sized inputs.

    Layers are named ``stem_*``, ``stage{s}_block{b}_{expand,dw,project}_{conv,bn,relu}``,
    ``stage{s}_block{b}_add``, ``head_{conv,bn,relu}``, ``pool`` and ``classifier``.

    Args:
        input_shape: ``(height, width, channels)`` of one image.
        num_classes: number of logits.
        alpha: width multiplier; channel counts are ``alpha`` times the paper's,
            rounded to multiples of 8. The 1280-channel head only grows
            (for ``alpha > 1``), as in the paper.
        name: model name.

    Returns:
        An uncompiled ``keras.Model`` returning logits.

    Raises:
        ValueError: if ``alpha`` is not a positive finite number or the input
            shape / class count is invalid.
    """
    is_number = isinstance(alpha, (int, float)) and not isinstance(alpha, bool)
    if not is_number or not 0 < alpha < float("inf"):
        raise ValueError(f"alpha must be a positive finite number, got {alpha!r}.")
    input_shape = _layers.check_build_args(input_shape, num_classes)

    inputs = keras.Input(shape=input_shape, name="input")
    x = _layers.conv_bn(
        inputs, _make_divisible(32 * alpha), 3, 1, "stem_",
        _layers.kaiming_normal("fan_out"), activation="relu6",
    )
    for stage, (expansion, channels, repeats, first_stride) in enumerate(_CIFAR_STAGES, start=1):
        for block in range(1, repeats + 1):
            x = _inverted_residual(
                x, expansion, _make_divisible(channels * alpha),
                first_stride if block == 1 else 1, f"stage{stage}_block{block}_",
            )
    x = _layers.conv_bn(
        x, _make_divisible(1280 * max(1.0, alpha)), 1, 1, "head_",
        _layers.kaiming_normal("fan_out"), activation="relu6",
    )
    outputs = _layers.pool_and_classify(
        x, num_classes, keras.initializers.RandomNormal(stddev=0.01)
    )
    return keras.Model(inputs, outputs, name=name)
