"""ChannelSlice and PrefixAdd on the current Keras backend: values, gradients, models, save/load.

Backend-neutral: ``tests/test_backends.py`` runs this file under JAX and PyTorch too.
"""

import keras
import numpy as np
import pytest
from keras import ops

from keras_precrop import ChannelSlice, PrefixAdd
from keras_precrop.pai import gradients


def _numpy(x):
    return ops.convert_to_numpy(x)


@pytest.mark.parametrize("shape", [(2, 16, 16, 32), (1, 3, 9), (3, 7)])
def test_channel_slice_keeps_leading_channels_with_their_gradient(shape):
    rng = np.random.default_rng(0)
    x = rng.normal(size=shape).astype("float32")
    weights = rng.normal(size=shape[:-1] + (7,)).astype("float32")
    layer = ChannelSlice(7)
    out = layer(x)
    assert tuple(out.shape) == shape[:-1] + (7,)
    np.testing.assert_array_equal(_numpy(out), x[..., :7])

    weighted = ops.convert_to_tensor(weights)
    value, (grad,) = gradients.value_and_grad(lambda v: ops.sum(layer(v[0]) * weighted), [ops.convert_to_tensor(x)])
    np.testing.assert_allclose(float(_numpy(value)), float((x[..., :7] * weights).sum()), rtol=1e-5)
    expected = np.zeros(shape, "float32")
    expected[..., :7] = weights
    np.testing.assert_array_equal(_numpy(grad), expected)


def test_prefix_add_sums_into_leading_channels_with_their_gradients():
    rng = np.random.default_rng(1)
    narrow, wide, mid = (rng.normal(size=(2, 4, 4, c)).astype("float32") for c in (3, 6, 5))
    weights = rng.normal(size=(2, 4, 4, 6)).astype("float32")
    layer = PrefixAdd()
    expected = wide.copy()
    expected[..., :3] += narrow
    expected[..., :5] += mid
    out = layer([narrow, wide, mid])
    assert tuple(out.shape) == (2, 4, 4, 6)
    np.testing.assert_allclose(_numpy(out), expected, rtol=1e-6)

    tensors = [ops.convert_to_tensor(t) for t in (narrow, wide, mid)]
    weighted = ops.convert_to_tensor(weights)
    _, grads = gradients.value_and_grad(lambda v: ops.sum(layer(v) * weighted), tensors)
    for grad, width in zip(grads, (3, 6, 5)):
        np.testing.assert_array_equal(_numpy(grad), weights[..., :width])


def _residual_model():
    """A stream of 6 channels read by a 3-channel slice and written by a 4-channel branch."""
    inputs = keras.Input((8, 8, 3))
    stream = keras.layers.Conv2D(6, 3, padding="same", name="stem")(inputs)
    branch = ChannelSlice(3, name="slice")(stream)
    branch = keras.layers.Conv2D(4, 3, padding="same", name="branch")(branch)
    x = PrefixAdd(name="add")([stream, branch])
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
    assert isinstance(loaded.get_layer("slice"), ChannelSlice) and loaded.get_layer("slice").width == 3
    np.testing.assert_allclose(_numpy(loaded(x)), _numpy(model(x)), rtol=1e-6, atol=1e-6)


def test_channel_slice_refuses_bad_widths():
    with pytest.raises(ValueError, match="positive integer"):
        ChannelSlice(0)
    with pytest.raises(ValueError, match="positive integer"):
        ChannelSlice(2.5)
    with pytest.raises(ValueError, match="cannot keep 9 channels of an input with 4"):
        ChannelSlice(9, name="too_wide")(keras.Input((5, 4)))
