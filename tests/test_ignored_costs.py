"""Layers let through with ``ignore=`` still cost what they compute (issue 42, defect 2).

An ignored layer keeps its widths, but its MACs count towards a FLOP budget:
from its shapes where a handler knows the layer, from the backend's own cost
analysis where none does. The references are independent of the walker:
Keras' ``count_params()`` and the convolutions and matmuls of TensorFlow's own
graph of the model (``tests.conftest.tf_macs``). Where the backend cannot
count an ignored layer's MACs (a recurrent layer's loop under TensorFlow),
budgets that count MACs are refused naming the layer, and parameter budgets
still work.
"""

import json
import os

import keras
import pytest
from keras import layers as L
from keras import ops

import keras_precrop as kp
from tests.conftest import assert_matches_plan, run_python, tf_macs


class CustomConv(L.Layer):
    """A 3x3 convolution written with ``keras.ops.conv``: no handler knows it."""

    def __init__(self, filters, **kwargs):
        super().__init__(**kwargs)
        self.filters = filters

    def build(self, input_shape):
        self.kernel = self.add_weight(shape=(3, 3, input_shape[-1], self.filters), name="kernel")

    def call(self, x):
        return ops.conv(x, self.kernel, padding="same")

    def get_config(self):
        return {**super().get_config(), "filters": self.filters}


IGNORED = ["custom", "known"]


def _model():
    """A CNN whose first two convolutions (one custom, one Conv2D) are ignored."""
    keras.utils.set_random_seed(0)
    x = keras.Input((16, 16, 3))
    h = CustomConv(8, name="custom")(x)
    h = L.Conv2D(8, 1, name="known")(h)
    h = L.Conv2D(32, 3, padding="same", activation="relu", name="conv1")(h)
    h = L.Conv2D(32, 3, padding="same", activation="relu", name="conv2")(h)
    h = L.GlobalAveragePooling2D()(h)
    return keras.Model(x, L.Dense(10, name="head")(h))


def test_ignored_layers_count_the_macs_tensorflow_runs():
    model = _model()
    prof = kp.profile(model, ignore=IGNORED)
    assert prof.total_macs == tf_macs(model)
    assert prof.total_params == model.count_params()
    rows = {row.name: row for row in prof.layers}
    assert rows["custom"].macs == 16 * 16 * 8 * 3 * 3 * 3  # and by the closed form
    assert rows["known"].macs == 16 * 16 * 8 * 8
    assert not rows["custom"].prunable and prof.unknown_macs == []


def test_a_flops_budget_holds_on_tensorflows_count_of_the_rebuilt_model():
    model = _model()
    plan = kp.plan(model, flops=0.5, ignore=IGNORED)
    new = kp.apply_plan(model, plan)
    assert_matches_plan(model, plan, new)
    assert tf_macs(new) <= 0.5 * tf_macs(model)
    # The ignored layers keep their widths and their cost.
    assert new.get_layer("custom").filters == 8 and new.get_layer("known").filters == 8


def test_a_shared_ignored_layer_counts_its_macs_on_every_call():
    keras.utils.set_random_seed(0)
    x = keras.Input((8, 8, 4))
    shared = CustomConv(4, name="shared")
    h = L.Conv2D(6, 1, name="mix")(shared(shared(x)))
    model = keras.Model(x, h)
    prof = kp.profile(model, ignore=["shared"])
    assert prof.total_macs == tf_macs(model) == 2 * 8 * 8 * 4 * 36 + 8 * 8 * 4 * 6
    assert prof.total_params == model.count_params()


def _recurrent():
    """An LSTM, which TensorFlow runs in a while loop whose trip count its graph does not state."""
    keras.utils.set_random_seed(0)
    x = keras.Input((10, 4))
    h = L.Bidirectional(L.LSTM(6), name="bidirectional")(x)
    h = L.Dense(32, activation="relu", name="hidden")(h)
    return keras.Model(x, L.Dense(3, name="out")(h))


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="JAX and PyTorch count loops")
@pytest.mark.parametrize("budget", [{"flops": 0.5}, {"max_macs": 10_000}, {"latency": 0.5}])
def test_budgets_counting_macs_refuse_a_layer_whose_macs_are_unknown(budget):
    model = _recurrent()
    prof = kp.profile(model, ignore=["bidirectional"])
    assert prof.unknown_macs == ["bidirectional"]
    assert any("bidirectional" in note for note in prof.notes)
    with pytest.raises(kp.ArgumentError) as err:
        kp.plan(model, ignore=["bidirectional"], **budget)
    message = str(err.value)
    name, value = next(iter(budget.items()))
    assert f"{name}={value!r}" in message and "'bidirectional'" in message
    assert "params=" in message  # the remedy: a parameter budget


def test_a_parameter_budget_works_with_a_layer_whose_macs_are_unknown():
    model = _recurrent()
    plan = kp.plan(model, params=0.9, ignore=["bidirectional"])
    new = kp.apply_plan(model, plan)
    assert new.count_params() == plan.params <= 0.9 * model.count_params()
    assert kp.profile(model, ignore=["bidirectional"]).total_params == model.count_params()


# An ignored layer that only the backend can cost, on one backend (the argument): a strided
# transposed convolution inside it (valid and same padding), and an attention.
_OPAQUE_MACS = """
import json, sys, keras
import keras_precrop as kp

class Upsampler(keras.layers.Layer):  # a weight of its own: not dissolved, so ignore= keeps it whole
    def __init__(self, padding, **kwargs):
        super().__init__(**kwargs)
        self.up = keras.layers.Conv2DTranspose(6, 3, strides=2, padding=padding, use_bias=False)
    def build(self, shape):
        self.scale = self.add_weight(shape=(), initializer="ones")
    def call(self, x):
        return self.up(x) * self.scale

x = keras.Input((5, 5, 4))
out = {p: kp.profile(keras.Model(x, Upsampler(p, name="up")(x)), ignore=["up"]).total_macs
       for p in ("valid", "same")}
s = keras.Input((6, 8))
attention = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4, use_bias=False, name="mha")
profile = kp.profile(keras.Model(s, attention(s, s)), ignore=["mha"])
out["mha"] = None if profile.unknown_macs else profile.total_macs
print(json.dumps(out))
"""


@pytest.mark.parametrize("backend", ["tensorflow", "jax", pytest.param("torch", marks=pytest.mark.slow)])
def test_an_ignored_layer_costed_by_the_backend_is_exact_or_unknown(backend):
    """Every input pixel of a strided transposed convolution times its 3x3x4x6 kernel, as the walker
    counts a ``Conv2DTranspose`` (not the zeros the stride inserts, which JAX's and TensorFlow's
    'valid' estimates counted); an attention's projections, scores and weighted sum exactly, or
    unknown (PyTorch's counter has no formula for CPU attention and counted it 0)."""
    proc = run_python(["-c", _OPAQUE_MACS], env={**os.environ, "KERAS_BACKEND": backend})
    assert proc.returncode == 0, proc.stderr[-3000:]
    counted = json.loads(proc.stdout.strip().splitlines()[-1])
    assert counted["valid"] == counted["same"] == 5 * 5 * (3 * 3 * 4 * 6)
    heads, key_dim, length, features = 2, 4, 6, 8
    attention = (3 * length * features * heads * key_dim + 2 * heads * length * length * key_dim
                 + length * heads * key_dim * features)
    assert counted["mha"] in (None, attention)
