"""A hypothesis strategy for random functional CNNs.

Each example is a small Keras functional model built from a random sequence
of blocks: plain convs (strided or not), residual blocks with identity or
projection shortcuts, concatenations, depthwise and separable convs,
squeeze-excite gates, nested Functional/Sequential sub-models,
``keras.ops`` calls (element-wise, pad, concatenate, reshape, mean), grouped
convolutions (depthwise-style and ``groups = g``), layer and group
normalization and NASNet-like cells (padding, cropping and a projection
feeding adds none of which holds the stream's creator), ending in a pooled or
flattened dense head.
"""

import keras
from hypothesis import strategies as st
from keras import layers as L

BLOCKS = ("conv", "residual", "projection", "concat", "depthwise", "separable",
          "se", "nested_functional", "nested_sequential", "ops", "pool", "grouped",
          "grouped_depthwise", "norms", "op_nodes", "nasnet")


@st.composite
def block_specs(draw):
    """A list of (kind, width, stride) block descriptions."""
    n = draw(st.integers(1, 6))
    return [
        (draw(st.sampled_from(BLOCKS)), draw(st.integers(2, 12)), draw(st.sampled_from((1, 1, 2))))
        for _ in range(n)
    ]


@st.composite
def random_cnns(draw):
    """A random functional CNN (spec kept on ``model.spec`` for debugging)."""
    spec = draw(block_specs())
    head = draw(st.sampled_from(("gap", "flatten")))
    size = draw(st.sampled_from((8, 12, 16)))
    model = build(spec, head, size)
    model.spec = (spec, head, size)
    return model


def build(spec, head, size):
    """Build the model described by ``spec`` (see ``block_specs``)."""
    names = iter(f"l{i}" for i in range(10_000))
    nm = lambda: next(names)  # noqa: E731
    inputs = keras.Input((size, size, 3))
    x = L.Conv2D(8, 3, padding="same", name=nm())(inputs)
    for kind, width, stride in spec:
        if x.shape[1] < 2:
            stride = 1
        channels = x.shape[-1]
        if kind == "conv":
            x = L.Conv2D(width, 3, strides=stride, padding="same", name=nm())(x)
            x = L.BatchNormalization(name=nm())(x)
            x = L.ReLU(name=nm())(x)
        elif kind == "residual":
            y = L.Conv2D(width, 3, padding="same", name=nm())(x)
            y = L.ReLU(name=nm())(y)
            y = L.Conv2D(channels, 3, padding="same", use_bias=False, name=nm())(y)
            y = L.BatchNormalization(name=nm())(y)
            x = L.Add(name=nm())([x, y])
        elif kind == "projection":
            s = L.Conv2D(width, 1, strides=stride, name=nm())(x)
            y = L.Conv2D(width, 3, strides=stride, padding="same", name=nm())(x)
            y = L.Conv2D(width, 3, padding="same", name=nm())(y)
            x = L.Add(name=nm())([y, s])
        elif kind == "concat":
            a = L.Conv2D(width, 1, name=nm())(x)
            b = L.Conv2D(width + 1, 3, padding="same", name=nm())(x)
            x = L.Concatenate(name=nm())([a, b, x])
            x = L.BatchNormalization(name=nm())(x)
        elif kind == "depthwise":
            x = L.DepthwiseConv2D(3, strides=stride, padding="same",
                                  depth_multiplier=1 + (width % 2), name=nm())(x)
            x = L.Conv2D(width, 1, name=nm())(x)
        elif kind == "separable":
            x = L.SeparableConv2D(width, 3, strides=stride, padding="same", name=nm())(x)
        elif kind == "se":
            g = L.GlobalAveragePooling2D(name=nm())(x)
            g = L.Reshape((1, 1, channels), name=nm())(g)
            g = L.Conv2D(max(1, width // 2), 1, activation="relu", name=nm())(g)
            g = L.Conv2D(channels, 1, activation="sigmoid", name=nm())(g)
            x = L.Multiply(name=nm())([x, g])
        elif kind == "nested_functional":
            inner_in = keras.Input(x.shape[1:])
            y = L.Conv2D(width, 3, padding="same", name=nm())(inner_in)
            y = L.BatchNormalization(name=nm())(y)
            x = keras.Model(inner_in, y, name=nm())(x)
        elif kind == "nested_sequential":
            seq = keras.Sequential([
                keras.Input(x.shape[1:]),
                L.Conv2D(width, 1, name=nm()),
                L.ReLU(name=nm()),
            ], name=nm())
            x = seq(x)
        elif kind == "ops":
            x = keras.ops.relu(x) * 0.5 + x
        elif kind == "pool":
            x = L.MaxPooling2D(2, padding="same", name=nm())(x) if stride == 2 else x
        elif kind == "grouped":
            g = next((d for d in (4, 3, 2) if channels % d == 0), 1)
            x = L.Conv2D(g * (1 + width % 3), 3, strides=stride, padding="same", groups=g,
                         name=nm())(x)
        elif kind == "grouped_depthwise":
            x = L.Conv2D(channels * (1 + width % 2), 3, padding="same", groups=channels,
                         name=nm())(x)
        elif kind == "norms":
            x = L.LayerNormalization(name=nm())(L.Conv2D(2 * width, 1, name=nm())(x))
            x = L.GroupNormalization(groups=2, name=nm())(x)
            x = L.Activation("gelu", name=nm())(x)
        elif kind == "op_nodes":
            y = keras.ops.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
            y = L.Conv2D(width, 3, name=nm())(y)
            y = keras.ops.concatenate([y, x], axis=-1)
            gate = keras.ops.mean(y, axis=(1, 2), keepdims=True)
            x = keras.ops.multiply(y, keras.ops.sigmoid(gate))
        elif kind == "nasnet":
            x = _nasnet_cell(x, width, nm)
    if head == "gap":
        x = L.GlobalAveragePooling2D(name=nm())(x)
    else:
        x = L.Flatten(name=nm())(x)
    outputs = L.Dense(5, name=nm())(x)
    return keras.Model(inputs, outputs, name="random_cnn")


def _nasnet_cell(x, width, nm):
    """A NASNet normal cell's channel pattern: ``p`` and ``h`` are added in
    one merge, ``h`` and a separable branch in another (neither holds the
    stream's creator), ``p`` also through padding and cropping."""
    p = L.BatchNormalization(name=nm())(L.Conv2D(width, 1, name=nm())(L.ReLU(name=nm())(x)))
    h = L.Conv2D(width, 1, name=nm())(x)
    a = L.Add(name=nm())([L.AveragePooling2D(3, 1, padding="same", name=nm())(h), p])
    b = L.Add(name=nm())([L.SeparableConv2D(width, 3, padding="same", name=nm())(h), h])
    c = L.Add(name=nm())([L.SeparableConv2D(width, 3, padding="same", name=nm())(p),
                          L.SeparableConv2D(width, 5, padding="same", name=nm())(h)])
    shifted = L.Cropping2D(((1, 0), (1, 0)), name=nm())(
        L.ZeroPadding2D(((0, 1), (0, 1)), name=nm())(p))
    side = L.Conv2D(width, 1, name=nm())(shifted)
    return L.Concatenate(name=nm())([p, a, b, c, side])
