"""Models whose inputs are a dict (keras_hub's text backbones take ``{"token_ids": ...,
"padding_mask": ...}``): planned, rebuilt and kept-weight-copied with their inputs still a dict.

A model with an open sequence length is planned on a copy at a defined size
(``subject.with_inputs``); that copy once passed a list where the model's inputs
are a dict, and Keras refused it with its own ``ValueError``. A nested model with
dict inputs is rebuilt with dict inputs too.
"""

import keras
import numpy as np

import keras_precrop as kp
from tests.conftest import model_fingerprint
from tests.test_keep_weights import randomize

L = keras.layers
_RNG = np.random.default_rng(0)


def _dict_model(length=None):
    """Two sequence inputs in a dict, summed after their own projections, then an MLP head."""
    tokens, extra = keras.Input((length, 8), name="tokens"), keras.Input((length, 8), name="extra")
    h = L.Add(name="add")([L.Dense(16, name="d1")(tokens), L.Dense(16, name="d2")(extra)])
    out = L.Dense(4, name="head")(L.Dense(32, activation="relu", name="mlp")(h))
    return keras.Model({"tokens": tokens, "extra": extra}, out)


def _batch(length):
    return {name: _RNG.normal(size=(2, length, 8)).astype("float32") for name in ("tokens", "extra")}


def test_an_open_length_dict_model_is_planned_and_rebuilt_with_dict_inputs():
    model = _dict_model()
    randomize(model)
    before = model_fingerprint(model)
    plan = kp.plan(model, params=0.5)
    new = kp.apply_plan(model, plan)
    assert sorted(new.input) == ["extra", "tokens"]
    assert new.count_params() == plan.params <= 0.5 * model.count_params()
    assert new(_batch(7)).shape == (2, 7, 4)
    same = kp.apply_plan(model, kp.plan(model, params=1.0), weights="keep")
    x = _batch(5)  # another length than the planning copy's
    np.testing.assert_allclose(same(x), model(x), atol=1e-5)
    assert model_fingerprint(model) == before


def test_a_nested_model_with_dict_inputs_is_rebuilt_with_dict_inputs():
    tokens, extra = keras.Input((6, 8), name="A"), keras.Input((6, 8), name="B")
    inner = _dict_model(6)
    outer = keras.Model([tokens, extra], L.Dense(3, name="top")(inner({"tokens": tokens, "extra": extra})))
    randomize(outer)
    same = kp.apply_plan(outer, kp.plan(outer, params=1.0), weights="keep")
    assert sorted(same.get_layer(inner.name).input) == ["extra", "tokens"]
    x = [_RNG.normal(size=(2, 6, 8)).astype("float32") for _ in range(2)]
    np.testing.assert_allclose(same(x), outer(x), atol=1e-5)
    small = kp.precrop(outer, params=0.5)
    assert small.count_params() == small.precrop_plan.params <= 0.5 * outer.count_params()
