"""The user's model is left as it was, and nothing keeps it alive (issue 42, defects 8 and 9).

Each public call traces and walks the model once and hands that walk down
(plan -> rebuild -> check -> kept weights); no module keeps a model, its
trace or its walk. Checked against independent references: a ``weakref`` to
the user's model, to one of its layers and to the rebuilt model (dead after
``del`` and ``gc.collect()``), the process's resident memory after repeated
calls, and a fingerprint of everything a user can see of their model
(weights, names, ``trainable`` flags, Keras' call nodes, ``get_config()``)
taken before and after each call.
"""

import ctypes
import gc
import os
import sys
import weakref

import keras
import numpy as np
import pytest
from keras import layers as L
from keras import ops

import keras_precrop as kp
from keras_precrop.errors import UnsupportedLayerError
from keras_precrop.graph import trace, walker
from tests.conftest import model_fingerprint

# -- models as users write them ---------------------------------------------------


class Block(L.Layer):
    """conv-BN-relu + shortcut: a composite layer, dissolved by the trace."""

    def __init__(self, filters, **kwargs):
        super().__init__(**kwargs)
        self.conv = L.Conv2D(filters, 3, padding="same", name="conv")
        self.bn = L.BatchNormalization(name="bn")

    def call(self, x, training=None):
        return ops.relu(x + self.bn(self.conv(x), training=training))


class Net(keras.Model):
    """A subclassed model of blocks."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.stem = L.Conv2D(8, 3, padding="same", name="stem")
        self.blocks = [Block(8, name="block1"), Block(8, name="block2")]
        self.head = L.Dense(5, name="head")

    def call(self, x, training=None):
        x = self.stem(x)
        for block in self.blocks:
            x = block(x, training=training)
        return self.head(ops.mean(x, axis=(1, 2)))


class Branchy(keras.Model):
    """A Python ``if`` on a tensor's value, after a layer has been called: no trace can run it."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.conv = L.Conv2D(4, 3, name="conv")
        self.head = L.Dense(3, name="head")

    def build(self, input_shape):
        self.conv.build(input_shape)
        self.head.build((None, 4))

    def call(self, x):
        x = self.conv(x)
        if ops.mean(x) > 0:
            x = ops.relu(x)
        return self.head(ops.mean(x, axis=(1, 2)))


def _functional():
    """A functional model holding composites, a ``keras.ops`` add and a frozen layer."""
    x = keras.Input((12, 12, 3))
    h = L.Conv2D(8, 3, padding="same", name="stem")(x)
    h = Block(8, name="block1")(h)
    h = ops.relu(h + L.Conv2D(8, 1, name="side")(h))
    model = keras.Model(x, L.Dense(5, name="head")(L.GlobalAveragePooling2D()(h)), name="functional")
    model.get_layer("side").trainable = False
    return model


def _sequential():
    return keras.Sequential([keras.Input((12, 12, 3)), L.Conv2D(8, 3, name="c1"),
                             L.BatchNormalization(name="bn"), L.ReLU(), L.Conv2D(8, 3, name="c2"),
                             L.GlobalAveragePooling2D(), L.Dense(5, name="head")], name="sequential")


def _subclassed():
    model = Net(name="net")
    model(np.zeros((1, 12, 12, 3), "float32"))
    model.blocks[1].bn.trainable = False
    return model


MODELS = {"functional": _functional, "sequential": _sequential, "subclassed": _subclassed}


def _randomize(model):
    rng = np.random.default_rng(0)
    for w in model.weights:
        value = rng.standard_normal(w.shape).astype("float32") * 0.3
        w.assign(np.abs(value) + 0.5 if "variance" in w.path else value)
    return model


def _operations(model):
    """Every layer of ``model`` (nested ones too) and every op of its functional graphs."""
    found = {}
    for layer in model._flatten_layers(include_self=True, recursive=True):
        found[id(layer)] = layer
        graph = layer._functional if isinstance(layer, keras.Sequential) else layer
        for op in getattr(graph, "_operations", ()):
            found.setdefault(id(op), op)
    return found.values()


def _fingerprint(model):
    """What a user can see of ``model`` (``conftest.model_fingerprint``), with the call nodes of
    every operation of its functional graphs too (``keras.ops`` nodes, which are not layers)."""
    return {**model_fingerprint(model),
            "operations": sorted((op.name, type(op).__name__, getattr(op, "trainable", None),
                                  len(op._inbound_nodes), len(op._outbound_nodes))
                                 for op in _operations(model))}


def _dead(ref):
    gc.collect()
    return ref() is None


# -- defect 8: the model is left as it was -------------------------------------------------


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_every_call_leaves_the_model_as_it_was(kind):
    model = _randomize(MODELS[kind]())
    before = _fingerprint(model)
    x = np.random.default_rng(1).standard_normal((2, 12, 12, 3)).astype("float32")
    outputs = keras.ops.convert_to_numpy(model(x, training=False))
    kp.profile(model)
    the_plan = kp.plan(model, params=0.5)
    assert _fingerprint(model) == before
    kp.apply_plan(model, the_plan, weights="keep")
    kp.precrop(model, flops=0.5)
    kp.reconfigure(model, params=0.9, weights="keep")
    kp.compare(model, params=0.5, modes=["uniform"])
    assert _fingerprint(model) == before
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(model(x, training=False)), outputs)


def test_a_failed_trace_leaves_the_model_as_it_was():
    model = Branchy(name="branchy")
    model.build((None, 8, 8, 3))
    model(np.ones((1, 8, 8, 3), "float32"))
    before = _fingerprint(model)
    with pytest.raises(UnsupportedLayerError, match="branchy"):
        kp.profile(model)
    with pytest.raises(UnsupportedLayerError, match="branchy"):
        kp.precrop(model, params=0.5)
    assert _fingerprint(model) == before
    assert len(model.conv._inbound_nodes) == 0  # the failed trace called it; its node is gone


def test_the_traced_graph_still_computes_the_model_after_its_nodes_leave_the_layers():
    """The trace's nodes live in the traced graph alone, which still runs as the model does."""
    model = _randomize(_subclassed())
    traced = trace.traced(model)
    assert all(len(op._inbound_nodes) == 0 for op in _operations(model))
    x = np.random.default_rng(2).standard_normal((2, 12, 12, 3)).astype("float32")
    np.testing.assert_allclose(keras.ops.convert_to_numpy(traced.functional(x, training=False)),
                               keras.ops.convert_to_numpy(model(x, training=False)), atol=1e-5)


# -- one walk per call, handed down ---------------------------------------------------------


def _count_traces_and_walks(monkeypatch):
    """Patches the trace and the walk to record the model each ran on (traced, walked)."""
    traced, walked = [], []
    real_trace, real_init = trace._trace, walker.ModelGraph.__init__
    monkeypatch.setattr(trace, "_trace", lambda m, ignore: traced.append(m) or real_trace(m, ignore))

    def init(self, model, walk):
        walked.append(model)
        real_init(self, model, walk)

    monkeypatch.setattr(walker.ModelGraph, "__init__", init)
    return traced, walked


@pytest.mark.parametrize("kind", ["functional", "subclassed"])
def test_precrop_keeping_weights_traces_and_walks_the_model_once(kind, monkeypatch):
    """Plan, rebuild, check and kept weights share one walk of the model; the rebuilt model is
    walked once, for the check and the weights together."""
    model = MODELS[kind]()
    traced, walked = _count_traces_and_walks(monkeypatch)
    new = kp.precrop(model, params=0.5, weights="keep")
    assert [m is model for m in traced] == [True, False] and traced[1] is new
    assert [m is model for m in walked] == [True, False] and walked[1] is new


def test_compare_traces_and_walks_the_model_once(monkeypatch):
    model = _subclassed()
    traced, walked = _count_traces_and_walks(monkeypatch)
    comparison = kp.compare(model, params=0.5)
    assert len(comparison.rows) >= 3
    assert traced == [model] and walked == [model]


# -- defect 9: nothing keeps the model alive -------------------------------------------------


@pytest.mark.parametrize("kind", ["functional", *(pytest.param(kind, marks=pytest.mark.slow)
                                                   for kind in ("sequential", "subclassed"))])
def test_results_keep_neither_the_model_nor_its_layers_alive(kind):
    model = MODELS[kind]()
    model_ref = weakref.ref(model)
    layer_ref = weakref.ref(next(op for op in _operations(model) if isinstance(op, L.Conv2D)))
    the_plan = kp.plan(model, params=0.5)
    kept = kp.precrop(model, params=0.5, weights="keep")
    applied = kp.apply_plan(model, the_plan)
    comparison = kp.compare(model, params=0.5, modes=["uniform"])
    del model
    assert _dead(model_ref) and _dead(layer_ref)  # while every result is still held
    assert kept.count_params() == the_plan.params == applied.count_params()
    assert comparison.row("uniform")["params"] <= the_plan.original["params"]
    kept_ref, applied_ref = weakref.ref(kept), weakref.ref(applied)
    del kept, applied
    assert _dead(kept_ref) and _dead(applied_ref)


def test_a_profile_holds_its_model_until_it_is_dropped():
    """A profile documents that it holds the walked model (``profile.graph``), no longer."""
    model = _subclassed()
    model_ref = weakref.ref(model)
    prof = kp.profile(model)
    del model
    assert prof.graph.model is model_ref()
    del prof
    assert _dead(model_ref)


def _resident_mib():
    """The process's resident memory, after handing freed heap pages back to the system."""
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _dense_model(units):
    """A model whose weights are mostly one Dense kernel (16 * 16 * 8 x ``units``)."""
    x = keras.Input((16, 16, 3))
    h = L.Conv2D(8, 3, padding="same", name="c1")(x)
    h = L.Flatten()(h + L.Conv2D(8, 3, padding="same", name="c2")(h))
    return keras.Model(x, L.Dense(10, name="head")(L.Dense(units, activation="relu", name="fc")(h)))


def _memory_growth(units, calls):
    """MiB the process grew over ``calls`` precrops of new models (after one to warm up), in the
    window of two that grew least, and the MiB of one model's weights.

    A leak grows both windows by ``calls`` models; a one-time step (the
    allocator or a thread pool settling, seen under load somewhere between the
    4th and 16th call) grows one. The smaller window tells them apart.
    """
    def once():
        model = _dense_model(units)
        size = sum(np.prod(w.shape) * 4 for w in model.weights) / 2**20
        kp.precrop(model, params=0.5, weights="keep")
        return size

    size = once()
    levels = [_resident_mib()]
    for _ in range(2):
        for _ in range(calls):
            once()
        levels.append(_resident_mib())
    return min(b - a for a, b in zip(levels, levels[1:])), size


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc and glibc's malloc_trim")
def test_memory_returns_to_its_level_after_repeated_precrops():
    """A leak keeps every model (here ~8 MiB each, 64 MiB over 8 calls, in each of two windows);
    one model's worth of allocator noise is allowed."""
    growth, size = _memory_growth(units=1024, calls=8)
    assert size > 7
    assert growth < size, f"{growth:.1f} MiB more after 8 calls of {size:.1f} MiB models"


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc and glibc's malloc_trim")
def test_memory_returns_to_its_level_after_many_precrops_of_big_models():
    growth, size = _memory_growth(units=8192, calls=20)
    assert growth < size, f"{growth:.1f} MiB more after 20 calls of {size:.1f} MiB models"
