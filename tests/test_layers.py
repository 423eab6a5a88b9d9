"""ChannelSlice and PrefixAdd, and rebuilt models, as functions (not shapes).

The residual layers are checked against numpy (values and gradients, three
and more inputs); a rebuilt residual chain against a hand-built model with
explicit slicing and zero padding; and the identity plan against the
original model, weights copied over.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import layers as L

import keras_precrop as kp

_RNG = np.random.default_rng(0)


def _grads(layer, inputs, upstream):
    """Values of ``layer(inputs)`` and the gradients of ``sum(upstream * out)``."""
    tensors = [tf.constant(x) for x in inputs]
    with tf.GradientTape() as tape:
        tape.watch(tensors)
        out = layer(tensors if len(tensors) > 1 else tensors[0])
        loss = tf.reduce_sum(out * upstream)
    return out.numpy(), [g.numpy() for g in tape.gradient(loss, tensors)]


@pytest.mark.parametrize("widths", [(5, 3, 1), (4, 4, 2, 7), (6, 2, 6, 1, 3)])
def test_prefix_add_values_and_gradients_match_numpy(widths):
    inputs = [_RNG.normal(size=(2, 3, 3, w)).astype("float32") for w in widths]
    wide = max(widths)
    upstream = _RNG.normal(size=(2, 3, 3, wide)).astype("float32")
    out, grads = _grads(kp.PrefixAdd(), inputs, upstream)
    expected = np.zeros((2, 3, 3, wide), np.float32)
    for x in inputs:
        expected[..., :x.shape[-1]] += x
    np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-6)  # summation order
    for x, g in zip(inputs, grads):  # each input receives its own leading channels
        np.testing.assert_array_equal(g, upstream[..., :x.shape[-1]])


@pytest.mark.parametrize("shape,width", [((2, 5, 7), 3), ((2, 3, 3, 6), 1), ((2, 2, 2, 2, 9), 9)])
def test_channel_slice_values_and_gradients_match_numpy(shape, width):
    x = _RNG.normal(size=shape).astype("float32")
    upstream = _RNG.normal(size=shape[:-1] + (width,)).astype("float32")
    out, (grad,) = _grads(kp.ChannelSlice(width), [x], upstream)
    np.testing.assert_array_equal(out, x[..., :width])
    expected = np.zeros_like(x)
    expected[..., :width] = upstream  # channels not read get no gradient
    np.testing.assert_array_equal(grad, expected)


def _chain(blocks=3):
    x = inputs = keras.Input((8, 8, 3))
    s = L.Conv2D(16, 3, padding="same", name="stem")(x)
    for i in range(blocks):
        y = L.Conv2D(12, 3, padding="same", name=f"a{i}")(s)
        y = L.Conv2D(16, 3, padding="same", name=f"b{i}")(L.ReLU(name=f"r{i}")(y))
        s = L.Add(name=f"add{i}")([s, y])
    out = L.Dense(4, name="head")(L.GlobalAveragePooling2D(name="gap")(s))
    return keras.Model(inputs, out, name="chain")


def _explicit(new, blocks=3):
    """The rebuilt chain written by hand: explicit slices and zero padding."""
    def first(t, k):
        return L.Lambda(lambda v: v[..., :k])(t)

    def reads(name):
        return new.get_layer(name).kernel.shape[-2]

    x = inputs = keras.Input((8, 8, 3))
    s = L.Conv2D(new.get_layer("stem").filters, 3, padding="same", name="stem")(x)
    wide = s.shape[-1]
    for i in range(blocks):
        y = L.Conv2D(new.get_layer(f"a{i}").filters, 3, padding="same",
                     name=f"a{i}")(first(s, reads(f"a{i}")))
        y = L.Conv2D(new.get_layer(f"b{i}").filters, 3, padding="same",
                     name=f"b{i}")(L.ReLU()(y))
        pad = wide - y.shape[-1]
        y = L.Lambda(lambda v, pad=pad: tf.pad(v, [[0, 0], [0, 0], [0, 0], [0, pad]]))(y)
        s = L.Add()([s, y])
    pooled = L.GlobalAveragePooling2D()(s)
    out = L.Dense(4, name="head")(first(pooled, new.get_layer("head").kernel.shape[0]))
    return keras.Model(inputs, out)


def _copy_weights(source, target):
    """Copy the weights of every layer of ``target`` that ``source`` has by name."""
    names = {layer.name for layer in source.layers}
    copied = 0
    for layer in target.layers:
        if layer.weights and layer.name in names:
            layer.set_weights(source.get_layer(layer.name).get_weights())
            copied += 1
    return copied


@pytest.mark.parametrize("params", [0.3, 0.6])
def test_rebuilt_chain_equals_explicit_zero_padding(params):
    model = _chain()
    new = kp.precrop(model, params=params)
    assert any(isinstance(layer, kp.ChannelSlice) for layer in new.layers)
    assert any(isinstance(layer, kp.PrefixAdd) for layer in new.layers)
    hand = _explicit(new)
    assert _copy_weights(new, hand) == 8
    x = _RNG.normal(size=(2, 8, 8, 3)).astype("float32")
    np.testing.assert_allclose(new(x), hand(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["resnet20", "mobilenet_v2_cifar", "EfficientNetB0",
                                  pytest.param("NASNetMobile", marks=pytest.mark.slow)])
def test_identity_plan_with_copied_weights_gives_the_original_outputs(name):
    if name in ("EfficientNetB0", "NASNetMobile"):
        model = getattr(keras.applications, name)(input_shape=(32, 32, 3), weights=None)
    else:
        model = kp.models.get(name)
    plan = kp.plan(model, params=1.0)
    assert all(g["new"] == g["width"] for g in plan.variables)
    new = kp.apply_plan(model, plan)
    assert _copy_weights(model, new) == sum(1 for layer in model.layers if layer.weights)
    x = _RNG.normal(size=(2,) + tuple(model.input_shape[1:])).astype("float32")
    np.testing.assert_allclose(new(x, training=False), model(x, training=False),
                               rtol=1e-5, atol=1e-5)
