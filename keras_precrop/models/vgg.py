"""VGG with BatchNorm for CIFAR, in the open_lth ``cifar_vgg`` layout.

Each number in the plan is a 3x3 conv (with bias) -> BN -> ReLU block, each
``"M"`` a 2x2 max pool. open_lth's VGG-16 plan has four pools (32 -> 2 pixels),
then ``AvgPool2d(2)`` and ``Linear(512, classes)``. On 32x32 inputs that pool
is exactly global average pooling, which is what this builder uses, so the
classifier stays ``Linear(512, classes)`` for any input size >= 16.

Initialization follows open_lth's ``kaiming_normal``: conv and linear kernels
from an untruncated normal with stddev sqrt(2 / fan_in); biases 0 (PyTorch
leaves them at its uniform default); BN gamma 1, beta 0.
"""

import keras

from keras_precrop.models import _layers

VGG16_PLAN = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512)
"""open_lth's VGG-16 plan: conv widths, ``"M"`` for a 2x2 max pool (``vgg``'s default)."""


def vgg(plan=VGG16_PLAN, input_shape=(32, 32, 3), num_classes=10, name="vgg16"):
    """Builds a CIFAR VGG from a plan of conv widths and ``"M"`` (max pool) markers.

    Layers are named ``block{b}_conv{i}``, ``block{b}_bn{i}``, ``block{b}_relu{i}``
    and ``block{b}_pool``, where a block is the run of convs between pools
    (both counted from 1), then ``pool`` and ``classifier``.

    Args:
        plan: sequence of positive ints (conv filters) and ``"M"``.
        input_shape: ``(height, width, channels)`` of one image.
        num_classes: number of logits.
        name: model name.

    Returns:
        An uncompiled ``keras.Model`` returning logits.

    Raises:
        ValueError: if the plan has an invalid entry or no conv, or the input
            is too small for its pools.
    """
    plan = tuple(plan)
    for spec in plan:
        if spec != "M" and not (isinstance(spec, int) and not isinstance(spec, bool) and spec > 0):
            raise ValueError(
                f"VGG plan entries must be positive ints or 'M', got {spec!r} in {plan!r}."
            )
    if all(spec == "M" for spec in plan):
        raise ValueError(f"VGG plan {plan!r} has no conv layer.")
    input_shape = _layers.check_build_args(
        input_shape, num_classes, min_size=2 ** plan.count("M")
    )

    inputs = keras.Input(shape=input_shape, name="input")
    x = inputs
    block, conv = 1, 1
    for spec in plan:
        if spec == "M":
            x = keras.layers.MaxPooling2D(2, name=f"block{block}_pool")(x)
            block, conv = block + 1, 1
        else:
            x = _layers.conv_bn(
                x, spec, 3, 1, f"block{block}_", _layers.kaiming_normal(),
                suffix=str(conv), use_bias=True,
            )
            conv += 1
    outputs = _layers.pool_and_classify(x, num_classes, _layers.kaiming_normal())
    return keras.Model(inputs, outputs, name=name)
