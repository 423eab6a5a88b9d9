"""A ``Lambda`` layer let through with ``ignore=`` (issue 42, defect 13).

The rebuild copies a ``Lambda`` with its own function object instead of a
config round-trip, which Keras refuses in its safe mode; Keras' safe mode must
stay on for the user's process (references: the original model's outputs,
Keras' own refusal to load a Python lambda from a ``.keras`` file).
"""

import keras
import numpy as np
import pytest
from keras.src.saving import serialization_lib

import keras_precrop as kp
from tests.conftest import L, model_fingerprint


def _lambda_model(spatial=8):
    scale = 3.0  # a closure: a marshalled function would need it carried too
    x = keras.Input((spatial, spatial, 3), name="img")
    h = L.Conv2D(6, 3, padding="same", name="c0")(x)
    h = L.Lambda(lambda t: t * scale - 1.0, name="the_lambda")(h)
    h = L.Conv2D(16, 1, name="c1")(h)
    h = L.GlobalAveragePooling2D(name="gap")(h)
    return keras.Model(x, L.Dense(3, name="head")(h))


def test_ignored_lambda_is_rebuilt_from_its_function_and_safe_mode_stays_on(tmp_path):
    model = _lambda_model()
    before, fingerprint = serialization_lib.in_safe_mode(), model_fingerprint(model)
    x = np.random.default_rng(0).normal(size=(2, 8, 8, 3)).astype("float32")

    same = kp.precrop(model, params=1.0, ignore=["the_lambda"], weights="keep")
    np.testing.assert_allclose(same(x), model(x), rtol=1e-5, atol=1e-5)
    small = kp.precrop(model, params=0.7, ignore=["the_lambda"])
    assert small.count_params() <= 0.7 * model.count_params()
    lam = small.get_layer("the_lambda")
    h = np.ones((1, 8, 8, 6), "float32")
    np.testing.assert_allclose(lam(h), 3.0 * h - 1.0)

    assert serialization_lib.in_safe_mode() == before
    assert model_fingerprint(model) == fingerprint
    # Keras' own rules for the saved file: it saves, and loads only when the user opts in.
    path = tmp_path / "small.keras"
    small.save(path)
    with pytest.raises(ValueError, match="safe_mode"):
        keras.models.load_model(path)
    loaded = keras.models.load_model(path, safe_mode=False)
    np.testing.assert_allclose(loaded(x), small(x), rtol=1e-6)
    assert serialization_lib.in_safe_mode() == before


def test_lambda_in_a_model_of_undefined_spatial_size():
    """The copy at the probe size and the copy back to the model's size take the function too."""
    x = keras.Input((None, None, 3), name="img")
    inner = _lambda_model()
    h = L.Conv2D(6, 3, padding="same", name="c0")(x)
    h = inner.get_layer("the_lambda")(h)
    out = L.Dense(3, name="head")(L.GlobalAveragePooling2D(name="gap")(L.Conv2D(16, 1, name="c1")(h)))
    model = keras.Model(x, out)
    same = kp.precrop(model, params=1.0, ignore=["the_lambda"], weights="keep")
    assert same.input_shape == (None, None, None, 3)
    data = np.random.default_rng(1).normal(size=(2, 12, 10, 3)).astype("float32")
    np.testing.assert_allclose(same(data), model(data), rtol=1e-5, atol=1e-5)
