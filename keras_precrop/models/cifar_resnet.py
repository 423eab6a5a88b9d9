"""CIFAR ResNets (He et al. 2016, Sec. 4.2) in the open_lth / Synaptic-Flow layout.

Depth 6n+2: a 3x3 stem conv of ``width`` filters, three stages of ``width``,
``2 * width`` and ``4 * width`` filters with n basic blocks each (the first
block of stages 2 and 3 downsamples with stride 2 and a 1x1 conv + BN
projection shortcut), global average pooling and a linear classifier.

Initialization follows open_lth's ``kaiming_normal``: conv and linear kernels
from an untruncated normal with stddev sqrt(2 / fan_in) (see
``_layers.kaiming_normal``), BN gamma 1 and beta 0, classifier bias 0. (open_lth
itself defaults to BN gamma ~ U(0, 1); gamma 1 is the PyTorch default.)
"""

import keras

from keras_precrop.models import _layers


def cifar_resnet(depth=20, width=16, input_shape=(32, 32, 3), num_classes=10, name=None):
    """Builds a CIFAR ResNet of the given depth and base width.

    Args:
        depth: total number of conv + linear layers, 6n + 2 with n >= 1
            (20, 32, 44, 56, 110, ...).
        width: filters of the stem and of stage 1 (16 for ResNet-20; 32 gives
            the "wide" ResNet-20 of the lottery-ticket papers).
        input_shape: ``(height, width, channels)`` of one image.
        num_classes: number of logits.
        name: model name; defaults to ``resnet{depth}`` (``resnet{depth}_w{width}``
            when width is not 16).

    Returns:
        An uncompiled ``keras.Model`` returning logits.

    Raises:
        ValueError: if depth is not 6n + 2, width is not a positive int, or the
            input shape / class count is invalid.
    """
    if not isinstance(depth, int) or depth < 8 or (depth - 2) % 6:
        raise ValueError(
            f"CIFAR ResNet depth must be 6n + 2 with n >= 1 (20, 32, 44, ...), got {depth!r}."
        )
    if not isinstance(width, int) or isinstance(width, bool) or width < 1:
        raise ValueError(f"CIFAR ResNet width must be a positive int, got {width!r}.")
    input_shape = _layers.check_build_args(input_shape, num_classes)
    if name is None:
        name = f"resnet{depth}" if width == 16 else f"resnet{depth}_w{width}"
    blocks_per_stage = (depth - 2) // 6

    inputs = keras.Input(shape=input_shape, name="input")
    x = _layers.conv_bn(inputs, width, 3, 1, "stem_", _layers.kaiming_normal())
    for stage in range(3):
        filters = width * 2**stage
        for block in range(blocks_per_stage):
            strides = 2 if stage > 0 and block == 0 else 1
            x = _layers.basic_block(
                x, filters, strides, f"stage{stage + 1}_block{block + 1}_", "fan_in"
            )
    outputs = _layers.pool_and_classify(x, num_classes, _layers.kaiming_normal())
    return keras.Model(inputs, outputs, name=name)
