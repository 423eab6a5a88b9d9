"""Building blocks shared by the model-zoo builders.

Every helper names its layers from a prefix, so the layers of a zoo model have
readable, stable names (``stem_conv``, ``stage1_block1_bn1``, ...) that users
can find in before/after tables.
"""

import math

import keras

from keras_precrop.errors import ArgumentError

# PyTorch's BatchNorm2d defaults (eps=1e-5, running-stat momentum 0.1, i.e.
# Keras momentum 0.9), because every reference architecture here is PyTorch.
_BN_EPSILON = 1e-5
_BN_MOMENTUM = 0.9


def kaiming_normal(mode="fan_in"):
    """Returns a fresh initializer matching ``torch.nn.init.kaiming_normal_``.

    PyTorch draws from an *untruncated* normal with stddev sqrt(2 / fan), while
    ``keras.initializers.HeNormal`` truncates at two standard deviations (and
    rescales), so the reference distribution is
    ``VarianceScaling(2.0, mode, "untruncated_normal")``. A new instance is
    returned per call: a Keras initializer fixes its seed at construction, so a
    shared instance would give same-shaped kernels identical values.

    Args:
        mode: ``"fan_in"`` (PyTorch's default) or ``"fan_out"``.
    """
    return keras.initializers.VarianceScaling(2.0, mode, "untruncated_normal")


def check_build_args(input_shape, num_classes, min_size=1):
    """Validates the arguments every builder takes and returns the shape as a tuple.

    Args:
        input_shape: ``(height, width, channels)`` of one image.
        num_classes: number of classifier outputs.
        min_size: smallest height/width the architecture can reduce without
            running out of pixels.

    Raises:
        ArgumentError: naming the offending argument (a flag on the command line).
        ValueError: the image data format is not channels_last.
    """
    if keras.config.image_data_format() != "channels_last":
        raise ValueError(
            "keras_precrop.models builds channels_last models, but "
            f"keras.config.image_data_format() is "
            f"{keras.config.image_data_format()!r}; call "
            "keras.config.set_image_data_format('channels_last') first."
        )
    shape = tuple(input_shape)
    if len(shape) != 3 or not all(_is_positive_int(d) for d in shape):
        raise ArgumentError("{input_shape:subject} must be (height, width, channels) of positive "
                            "ints{got}.", input_shape=input_shape)
    if shape[0] < min_size or shape[1] < min_size:
        raise ArgumentError("{input_shape} is too small for this architecture: height and width "
                            f"must be at least {min_size}.", input_shape=shape)
    if not _is_positive_int(num_classes):
        raise ArgumentError("{num_classes:subject} must be a positive int{got}.", num_classes=num_classes)
    return shape


def _is_positive_int(value):
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def conv_bn(
    x,
    filters,
    kernel_size,
    strides,
    prefix,
    kernel_initializer,
    suffix="",
    activation="relu",
    use_bias=False,
):
    """Applies conv -> BatchNorm -> optional activation with PyTorch padding.

    Convolutions behave like PyTorch's ``padding=kernel_size // 2``: stride 1
    uses ``padding="same"`` (symmetric for odd kernels); a strided conv gets an
    explicit ``ZeroPadding2D`` and ``padding="valid"``, because Keras' "same"
    pads asymmetrically (bottom/right) when the stride is 2, which shifts the
    sampling grid relative to PyTorch.

    Args:
        x: input tensor.
        filters: output channels, or ``None`` for a depthwise conv
            (channel multiplier 1).
        kernel_size: square kernel size.
        strides: square stride.
        prefix: layer-name prefix, e.g. ``"stage1_block1_"``.
        kernel_initializer: a fresh initializer instance for the kernel.
        suffix: layer-name suffix, e.g. ``"1"`` gives ``conv1``, ``bn1``.
        activation: ``"relu"``, ``"relu6"`` or ``None``.
        use_bias: whether the conv has a bias (initialized to zeros).

    Returns:
        The output tensor.
    """
    padding = "same"
    if strides > 1:
        x = keras.layers.ZeroPadding2D(kernel_size // 2, name=f"{prefix}pad{suffix}")(x)
        padding = "valid"
    if filters is None:
        x = keras.layers.DepthwiseConv2D(
            kernel_size,
            strides=strides,
            padding=padding,
            use_bias=use_bias,
            depthwise_initializer=kernel_initializer,
            name=f"{prefix}conv{suffix}",
        )(x)
    else:
        x = keras.layers.Conv2D(
            filters,
            kernel_size,
            strides=strides,
            padding=padding,
            use_bias=use_bias,
            kernel_initializer=kernel_initializer,
            name=f"{prefix}conv{suffix}",
        )(x)
    x = keras.layers.BatchNormalization(
        epsilon=_BN_EPSILON, momentum=_BN_MOMENTUM, name=f"{prefix}bn{suffix}"
    )(x)
    if activation == "relu":
        x = keras.layers.ReLU(name=f"{prefix}relu{suffix}")(x)
    elif activation == "relu6":
        x = keras.layers.ReLU(max_value=6.0, name=f"{prefix}relu{suffix}")(x)
    elif activation is not None:
        raise ValueError(f"Unsupported activation {activation!r}; use 'relu', 'relu6' or None.")
    return x


def basic_block(x, filters, strides, prefix, initializer_mode):
    """Applies a ResNet basic block: two 3x3 conv-BN pairs plus a shortcut.

    ``relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))``; the shortcut is a
    1x1 strided conv + BN where the shape changes and the identity otherwise.
    This is the block of both the CIFAR (He et al. / open_lth) and the
    torchvision ImageNet ResNets.

    Args:
        x: input tensor.
        filters: output channels of the block.
        strides: stride of ``conv1`` and of the projection shortcut.
        prefix: layer-name prefix, e.g. ``"stage2_block1_"``.
        initializer_mode: Kaiming-normal mode of the conv kernels.

    Returns:
        The output tensor.
    """
    y = conv_bn(x, filters, 3, strides, prefix, kaiming_normal(initializer_mode), suffix="1")
    y = conv_bn(
        y, filters, 3, 1, prefix, kaiming_normal(initializer_mode), suffix="2", activation=None
    )
    shortcut = x
    if strides != 1 or x.shape[-1] != filters:
        shortcut = keras.layers.Conv2D(
            filters,
            1,
            strides=strides,
            use_bias=False,
            kernel_initializer=kaiming_normal(initializer_mode),
            name=f"{prefix}shortcut_conv",
        )(x)
        shortcut = keras.layers.BatchNormalization(
            epsilon=_BN_EPSILON, momentum=_BN_MOMENTUM, name=f"{prefix}shortcut_bn"
        )(shortcut)
    x = keras.layers.Add(name=f"{prefix}add")([y, shortcut])
    return keras.layers.ReLU(name=f"{prefix}out_relu")(x)


def pool_and_classify(x, num_classes, kernel_initializer, bias_initializer="zeros"):
    """Applies global average pooling (``pool``) and a linear layer (``classifier``).

    The classifier returns logits (no softmax), as the PyTorch references do.
    """
    x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    return keras.layers.Dense(
        num_classes,
        kernel_initializer=kernel_initializer,
        bias_initializer=bias_initializer,
        name="classifier",
    )(x)


def torch_linear_initializers(fan_in):
    """Returns (kernel, bias) initializers matching ``torch.nn.Linear``'s default.

    PyTorch draws the weight from ``kaiming_uniform_(a=sqrt(5))``, i.e.
    U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (= VarianceScaling(1/3, fan_in, uniform)),
    and the bias from the same interval.
    """
    bound = 1.0 / math.sqrt(fan_in)
    return (
        keras.initializers.VarianceScaling(1.0 / 3.0, "fan_in", "uniform"),
        keras.initializers.RandomUniform(-bound, bound),
    )
