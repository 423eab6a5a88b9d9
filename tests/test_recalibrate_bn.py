"""``recalibrate_bn`` re-estimates batch-normalization statistics and nothing else (issue 45).

References: each BatchNormalization layer's inputs computed here, batch by
batch, by calling the convolutions alone and normalizing in NumPy with the
batch's own mean and variance (training mode, as the layers run during the
recalibration), then the mean and variance of all those inputs at once
(``np.mean`` / ``np.var``); every variable's value, every layer's and
variable's ``trainable`` flag and every momentum read before the call.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_precrop as kp
from keras_precrop.errors import ArgumentError, DataError

L = keras.layers
RNG = np.random.default_rng(0)
X = RNG.normal(1.5, 2.0, size=(40, 6, 6, 3)).astype("float32")
Y = RNG.integers(0, 3, 40)
STATS = ("moving_mean", "moving_variance")
numpy = keras.ops.convert_to_numpy  # a tensor or variable of any backend


def _cnn():
    """A CNN with a BatchNormalization layer at the top and one in a nested model, both with
    made-up statistics; the first is frozen."""
    keras.utils.set_random_seed(0)
    inner = keras.Sequential([keras.Input((6, 6, 4)), L.Conv2D(5, 3, padding="same", name="conv2"),
                              L.BatchNormalization(momentum=0.9, name="bn2")], name="block")
    x = keras.Input((6, 6, 3))
    h = L.ReLU()(L.BatchNormalization(name="bn1")(L.Conv2D(4, 3, padding="same", name="conv1")(x)))
    model = keras.Model(x, L.Dense(3, name="out")(L.GlobalAveragePooling2D()(inner(h))))
    rng = np.random.default_rng(1)  # every call builds the same model
    for layer in (model.get_layer("bn1"), inner.get_layer("bn2")):
        for name in ("gamma", "beta", *STATS):
            variable = getattr(layer, name)
            variable.assign(rng.uniform(0.5, 2.0, size=variable.shape))
    model.get_layer("bn1").trainable = False
    return model


def _bn_inputs(model, batches):
    """``{layer name: its inputs over all of batches}``, computed layer by layer with NumPy's
    training-mode normalization of bn1."""
    bn1, inner = model.get_layer("bn1"), model.get_layer("block")
    ones, twos = [], []
    for x in batches:
        h = numpy(model.get_layer("conv1")(x))
        mean, var = h.mean((0, 1, 2)), h.var((0, 1, 2))
        a = numpy(bn1.gamma) * (h - mean) / np.sqrt(var + bn1.epsilon) + numpy(bn1.beta)
        ones.append(h)
        twos.append(numpy(inner.get_layer("conv2")(np.maximum(a, 0))))
    return {"bn1": np.concatenate(ones), "bn2": np.concatenate(twos)}


def _state(model):
    """Every variable's value, every layer's and variable's flag, and the momenta."""
    layers = model._flatten_layers(include_self=True, recursive=True)
    return ({v.path: numpy(v) for v in model.variables},
            [(layer.name, layer.trainable) for layer in layers] + [(v.path, v.trainable)
                                                                   for v in model.variables],
            [getattr(layer, "momentum", None) for layer in layers])


def _batch_norms(model):
    return {"bn1": model.get_layer("bn1"), "bn2": model.get_layer("block").get_layer("bn2")}


def test_the_statistics_are_those_of_the_layers_inputs_and_nothing_else_changes():
    model = _cnn()
    values, flags, momenta = _state(model)
    # 40 rows in batches of 16: 16, 16 and 8 rows, every example counted once.
    expected = _bn_inputs(model, [X[:16], X[16:32], X[32:]])
    assert kp.recalibrate_bn(model, (X, Y), batches=5, batch_size=16) is model
    changed = set()
    for name, layer in _batch_norms(model).items():
        np.testing.assert_allclose(numpy(layer.moving_mean), expected[name].mean((0, 1, 2)),
                                   rtol=1e-5, atol=1e-6, err_msg=name)
        np.testing.assert_allclose(numpy(layer.moving_variance), expected[name].var((0, 1, 2)),
                                   rtol=1e-5, atol=1e-6, err_msg=name)
        changed |= {getattr(layer, stat).path for stat in STATS}
    after = _state(model)
    assert after[1:] == (flags, momenta)
    for path, value in values.items():
        if path in changed:
            assert not np.allclose(after[0][path], value), path
        else:
            np.testing.assert_array_equal(after[0][path], value, err_msg=path)


def test_a_dataset_is_read_for_at_most_batches_batches():
    model, arrays = _cnn(), _cnn()
    data = tf.data.Dataset.from_tensor_slices((X, Y)).batch(16)  # 3 batches; 2 are read
    kp.recalibrate_bn(model, data, batches=2)
    kp.recalibrate_bn(arrays, X[:32], batches=2, batch_size=16)
    expected = _bn_inputs(_cnn(), [X[:16], X[16:32]])
    for (name, layer), twin in zip(_batch_norms(model).items(), _batch_norms(arrays).values()):
        np.testing.assert_allclose(numpy(layer.moving_variance), expected[name].var((0, 1, 2)),
                                   rtol=1e-5, atol=1e-6, err_msg=name)
        for stat in STATS:
            np.testing.assert_allclose(numpy(getattr(layer, stat)), numpy(getattr(twin, stat)),
                                       rtol=1e-6)


def test_an_x_y_pair_without_labels_is_read_as_its_inputs():
    model, twin = _cnn(), _cnn()
    twin.set_weights(model.get_weights())
    kp.recalibrate_bn(model, (X, None), batches=2, batch_size=10)
    kp.recalibrate_bn(twin, X, batches=2, batch_size=10)
    for (name, layer), other in zip(_batch_norms(model).items(), _batch_norms(twin).values()):
        for stat in STATS:
            np.testing.assert_array_equal(numpy(getattr(layer, stat)), numpy(getattr(other, stat)),
                                          err_msg=name)


def test_a_generator_of_inputs_alone_is_read_too():
    model = _cnn()
    kp.recalibrate_bn(model, (X[i:i + 10] for i in range(0, 40, 10)), batches=4)
    expected = _bn_inputs(_cnn(), [X[i:i + 10] for i in range(0, 40, 10)])
    for name, layer in _batch_norms(model).items():
        np.testing.assert_allclose(numpy(layer.moving_mean), expected[name].mean((0, 1, 2)),
                                   rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("kwargs, argument", [
    ({"batches": 0}, "batches"), ({"batches": 2.0}, "batches"), ({"batches": True}, "batches"),
    ({"batches": None}, "batches"),
    ({"batch_size": 0}, "batch_size"),
    ({"data": RNG.normal(size=(8, 5, 5, 3)).astype("float32")}, "data"),
    ({"data": "images"}, "data"), ({"data": X[:0]}, "data"),
])
def test_bad_arguments_are_refused_by_name_and_the_model_is_unchanged(kwargs, argument):
    model = _cnn()
    values, flags, momenta = _state(model)
    with pytest.raises(ArgumentError, match=f"^{argument}[= ]") as err:
        kp.recalibrate_bn(model, **{"data": X, **kwargs})
    assert err.value.argument == argument
    assert argument != "data" or isinstance(err.value, DataError)
    after = _state(model)
    assert after[1:] == (flags, momenta)
    for path, value in values.items():
        np.testing.assert_array_equal(after[0][path], value, err_msg=path)


def test_a_model_without_batch_normalization_is_refused():
    x = keras.Input((6, 6, 3))
    model = keras.Model(x, L.Dense(3)(L.GlobalAveragePooling2D()(L.Conv2D(4, 3)(x))), name="plain")
    with pytest.raises(ArgumentError, match="model= .'plain'. has no BatchNormalization"):
        kp.recalibrate_bn(model, X)
    with pytest.raises(ArgumentError, match="model must be a keras.Model"):
        kp.recalibrate_bn(L.BatchNormalization(), X)
