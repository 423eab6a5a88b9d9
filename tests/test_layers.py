"""ChannelSlice and PrefixAdd, and rebuilt models, as functions (not shapes), on the current backend.

The residual layers are checked against numpy (values and gradients, three
and more inputs); a model of them trains and round-trips through ``.keras``;
a rebuilt residual chain is checked against a hand-built model with explicit
slicing and zero padding; and the identity plan against the original model,
weights copied over. Backend-neutral: ``tests/test_backends.py`` runs this
file under JAX and PyTorch too.
"""

import keras
import numpy as np
import pytest
from keras import layers as L
from keras import ops

import keras_precrop as kp
from keras_precrop.pai import gradients

_RNG = np.random.default_rng(0)


def _numpy(x):
    return ops.convert_to_numpy(x)


def _grads(layer, inputs, upstream):
    """Values of ``layer(inputs)`` and the gradients of ``sum(upstream * out)``."""
    tensors = [ops.convert_to_tensor(x) for x in inputs]
    weighted = ops.convert_to_tensor(upstream)

    def loss(values):
        return ops.sum(layer(values if len(values) > 1 else values[0]) * weighted)

    _, grads = gradients.value_and_grad(loss, tensors)
    out = layer(tensors if len(tensors) > 1 else tensors[0])
    return _numpy(out), [_numpy(g) for g in grads]


@pytest.mark.parametrize("widths", [(5, 3, 1), (3, 6, 5), (4, 4, 2, 7), (6, 2, 6, 1, 3)])
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


# (2, 16, 16, 32): torch once read a slice size of -1 as "all but the last" (1, 15, 15, k out).
@pytest.mark.parametrize("shape,width", [((2, 5, 7), 3), ((2, 3, 3, 6), 1), ((2, 2, 2, 2, 9), 9),
                                         ((2, 16, 16, 32), 7), ((3, 7), 2)])
def test_channel_slice_values_and_gradients_match_numpy(shape, width):
    x = _RNG.normal(size=shape).astype("float32")
    upstream = _RNG.normal(size=shape[:-1] + (width,)).astype("float32")
    out, (grad,) = _grads(kp.ChannelSlice(width), [x], upstream)
    assert out.shape == shape[:-1] + (width,)
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
        y = L.Lambda(lambda v, pad=pad: ops.pad(v, [[0, 0], [0, 0], [0, 0], [0, pad]]))(y)
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
    np.testing.assert_allclose(_numpy(new(x)), _numpy(hand(x)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["resnet20", "mobilenet_v2_cifar",
                                  *(pytest.param(name, marks=pytest.mark.slow)
                                    for name in ("EfficientNetB0", "NASNetMobile"))])
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
    np.testing.assert_allclose(_numpy(new(x, training=False)), _numpy(model(x, training=False)),
                               rtol=1e-5, atol=1e-5)


def _residual_model():
    """A stream of 6 channels read by a 3-channel slice and written by a 4-channel branch."""
    inputs = keras.Input((8, 8, 3))
    stream = keras.layers.Conv2D(6, 3, padding="same", name="stem")(inputs)
    branch = kp.ChannelSlice(3, name="slice")(stream)
    branch = keras.layers.Conv2D(4, 3, padding="same", name="branch")(branch)
    x = kp.PrefixAdd(name="add")([stream, branch])
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(2, name="fc")(x))


def test_models_with_slices_and_prefix_adds_predict_train_and_round_trip(tmp_path):
    keras.utils.set_random_seed(0)
    model = _residual_model()
    assert model.get_layer("slice").output.shape == (None, 8, 8, 3)
    assert model.get_layer("add").output.shape == (None, 8, 8, 6)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(5, 8, 8, 3)).astype("float32"), rng.integers(0, 2, 5)
    for batch in (1, 2, 5):  # torch once read a slice size of -1 as "all but the last"
        assert tuple(model(x[:batch]).shape) == (batch, 2)
    assert model.predict(x, batch_size=2, verbose=0).shape == (5, 2)

    stem = model.get_layer("stem")
    stream = _numpy(stem(x))
    branch = _numpy(model.get_layer("branch")(stream[..., :3]))
    stream[..., :4] += branch
    expected = _numpy(model.get_layer("fc")(stream.mean(axis=(1, 2))))
    np.testing.assert_allclose(_numpy(model(x)), expected, rtol=1e-5, atol=1e-6)

    model.compile(
        optimizer=keras.optimizers.SGD(0.1), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    before = model.get_layer("branch").kernel.numpy().copy()
    history = model.fit(x, y, batch_size=2, epochs=2, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    assert not np.allclose(before, model.get_layer("branch").kernel.numpy())

    path = tmp_path / "residual.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded.get_layer("slice"), kp.ChannelSlice) and loaded.get_layer("slice").width == 3
    np.testing.assert_allclose(_numpy(loaded(x)), _numpy(model(x)), rtol=1e-6, atol=1e-6)


def test_channel_slice_refuses_bad_widths():
    with pytest.raises(ValueError, match="positive integer"):
        kp.ChannelSlice(0)
    with pytest.raises(ValueError, match="positive integer"):
        kp.ChannelSlice(2.5)
    with pytest.raises(ValueError, match="cannot keep 9 channels of an input with 4"):
        kp.ChannelSlice(9, name="too_wide")(keras.Input((5, 4)))
