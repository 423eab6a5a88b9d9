"""ImageNet ResNets with basic blocks (ResNet-18/34) in the torchvision layout.

7x7/2 stem conv (64) + BN + ReLU + 3x3/2 max pool, four stages of 64, 128, 256
and 512 filters (stages 2-4 start with a stride-2 block and a 1x1 conv + BN
projection shortcut), global average pooling and a linear classifier. Strided
convs and the max pool pad explicitly, as PyTorch does, so a 224x224 input
gives torchvision's sizes 112 -> 56 -> 56 -> 28 -> 14 -> 7 and its MACs.

Initialization follows torchvision: conv kernels Kaiming-normal (untruncated,
gain sqrt(2)) in fan_out mode, BN gamma 1 and beta 0, and the classifier keeps
``torch.nn.Linear``'s default U(-1/sqrt(512), 1/sqrt(512)) for kernel and bias.
"""

import keras

from keras_precrop.models import _layers

_STAGE_FILTERS = (64, 128, 256, 512)


def imagenet_resnet(
    blocks_per_stage=(2, 2, 2, 2), input_shape=(224, 224, 3), num_classes=1000, name="resnet18"
):
    """Builds a basic-block ImageNet ResNet.

    Layers are named ``stem_{pad,conv,bn,relu}``, ``stem_pool_pad``, ``stem_pool``,
    ``stage{s}_block{b}_{conv,bn,relu}{1,2}``, ``stage{s}_block{b}_shortcut_{conv,bn}``,
    ``stage{s}_block{b}_add``, ``stage{s}_block{b}_out_relu``, ``pool`` and
    ``classifier``.

    Args:
        blocks_per_stage: basic blocks in each of the four stages;
            ``(2, 2, 2, 2)`` is ResNet-18 and ``(3, 4, 6, 3)`` ResNet-34.
        input_shape: ``(height, width, channels)`` of one image.
        num_classes: number of logits.
        name: model name.

    Returns:
        An uncompiled ``keras.Model`` returning logits.

    Raises:
        ValueError: if ``blocks_per_stage`` is not four positive ints or the
            input shape / class count is invalid.
    """
    blocks_per_stage = tuple(blocks_per_stage)
    if len(blocks_per_stage) != len(_STAGE_FILTERS) or not all(
        isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in blocks_per_stage
    ):
        raise ValueError(
            "blocks_per_stage must be four positive ints, e.g. (2, 2, 2, 2), "
            f"got {blocks_per_stage!r}."
        )
    input_shape = _layers.check_build_args(input_shape, num_classes)

    inputs = keras.Input(shape=input_shape, name="input")
    x = _layers.conv_bn(inputs, 64, 7, 2, "stem_", _layers.kaiming_normal("fan_out"))
    # Zero padding equals PyTorch's -inf max-pool padding here: inputs are post-ReLU (>= 0).
    x = keras.layers.ZeroPadding2D(1, name="stem_pool_pad")(x)
    x = keras.layers.MaxPooling2D(3, strides=2, name="stem_pool")(x)
    for stage, (filters, blocks) in enumerate(zip(_STAGE_FILTERS, blocks_per_stage), start=1):
        for block in range(1, blocks + 1):
            strides = 2 if stage > 1 and block == 1 else 1
            x = _layers.basic_block(x, filters, strides, f"stage{stage}_block{block}_", "fan_out")
    kernel_init, bias_init = _layers.torch_linear_initializers(x.shape[-1])
    outputs = _layers.pool_and_classify(x, num_classes, kernel_init, bias_init)
    return keras.Model(inputs, outputs, name=name)
