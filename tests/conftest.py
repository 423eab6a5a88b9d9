"""Shared pytest configuration, references and model builders.

* The independent MAC reference: :func:`tf_macs` counts the convolution and
  matmul ops of TensorFlow's own traced inference graph.
* :func:`random_cnns`: a hypothesis strategy for random functional CNNs.
* Small models for the pruning baselines, the ``resnet20`` fixture and mask
  counts.
* :func:`run_python`: a fresh interpreter on this checkout.

Test modules import these functions from ``tests.conftest`` rather than from
each other.
"""

import collections
import math
import os
import pathlib
import re
import subprocess
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from keras_precrop import models, pai  # noqa: E402

L = keras.layers
REPO = pathlib.Path(__file__).resolve().parents[1]


def run_python(args, env=None, **kwargs):
    """``python ARGS`` in a fresh interpreter that imports this checkout.

    ``env`` replaces the environment (default: this one); this checkout goes
    first on its ``PYTHONPATH``. Returns the ``subprocess.CompletedProcess``
    with text output.
    """
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    kwargs.setdefault("cwd", REPO)
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env,
                          timeout=600, **kwargs)


# -- the independent MAC reference: TensorFlow's traced graph ----------------

_COUNTED_OPS = {
    "Conv2D", "DepthwiseConv2dNative", "Conv2DBackpropInput",
    "MatMul", "BatchMatMulV2", "BatchMatMulV3",
}


def trace_graph(model):
    """The inference graph of ``model`` for one example (batch size 1)."""
    specs = [tf.TensorSpec((1,) + tuple(t.shape[1:]), t.dtype) for t in model.inputs]
    fn = tf.function(lambda *xs: model(list(xs) if len(xs) > 1 else xs[0], training=False))
    return fn.get_concrete_function(*specs).graph


def _op_macs(op):
    """Multiply-accumulates of one conv/matmul op, from its graph shapes."""
    out = op.outputs[0].shape.as_list()
    if op.type in ("Conv2D", "DepthwiseConv2dNative"):
        assert op.get_attr("data_format") == b"NHWC", op.name
        k_h, k_w, c_in, _ = op.inputs[1].shape.as_list()
        per_output = k_h * k_w * (c_in if op.type == "Conv2D" else 1)
        return math.prod(out) * per_output
    if op.type == "Conv2DBackpropInput":  # a transposed conv: work per *input* pixel
        k_h, k_w, c_out, _ = op.inputs[1].shape.as_list()
        return math.prod(op.inputs[2].shape.as_list()) * k_h * k_w * c_out
    a = op.inputs[0].shape.as_list()
    if op.type == "MatMul":
        inner = a[0] if op.get_attr("transpose_a") else a[1]
    else:
        inner = a[-2] if op.get_attr("adj_x") else a[-1]
    return math.prod(out) * inner


def graph_macs(graph):
    """MACs per example by op type; fails on ops it cannot see or count."""
    macs = collections.Counter()
    for op in graph.get_operations():
        assert "PartitionedCall" not in op.type, f"{op.name}: a nested function hides its ops"
        if op.type in _COUNTED_OPS:
            macs[op.type] += _op_macs(op)
        else:
            assert not re.search("Conv|MatMul|Einsum", op.type), f"uncounted op {op.type}"
    return macs


def tf_macs(model):
    """Total MACs per example of ``model`` according to TensorFlow's graph."""
    return sum(graph_macs(trace_graph(model)).values())


# -- random functional CNNs (hypothesis) ---------------------------------------

BLOCKS = ("conv", "residual", "projection", "concat", "depthwise", "separable",
          "se", "nested_functional", "nested_sequential", "ops", "pool")


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
    model = build_cnn(spec, head, size)
    model.spec = (spec, head, size)
    return model


def build_cnn(spec, head, size):
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
    if head == "gap":
        x = L.GlobalAveragePooling2D(name=nm())(x)
    else:
        x = L.Flatten(name=nm())(x)
    outputs = L.Dense(5, name=nm())(x)
    return keras.Model(inputs, outputs, name="random_cnn")


# -- small models and mask counts for the pruning baselines ---------------------


def mlp(seed=0, widths=(5, 7, 6, 3)):
    """Bias-free ReLU MLP: SynFlow has a closed form on it."""
    keras.utils.set_random_seed(seed)
    x = inputs = keras.Input((widths[0],))
    for i, w in enumerate(widths[1:]):
        x = L.Dense(w, use_bias=False, name=f"d{i}")(x)
        if i < len(widths) - 2:
            x = L.ReLU()(x)
    return keras.Model(inputs, x)


def tiny_cnn(dtype="float64", seed=0):
    """Conv (tanh) -> BN -> Flatten -> Dense, smooth so finite differences work."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((5, 5, 2), dtype=dtype)
    x = L.Conv2D(3, 3, padding="same", activation="tanh", dtype=dtype, name="conv")(inputs)
    x = L.BatchNormalization(dtype=dtype, name="bn")(x)
    x = L.Flatten(dtype=dtype)(x)
    x = L.Dense(4, dtype=dtype, name="fc")(x)
    return keras.Model(inputs, x)


def tiny_batch(seed=0, n=6):
    """Inputs and labels for :func:`tiny_cnn`."""
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 5, 5, 2)), rng.integers(0, 4, n)


def mixed_cnn(seed=0):
    """Every kernel layout, plus dropout.

    Conv, depthwise with multiplier 2, separable, transpose, and dense after flatten.
    """
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((8, 8, 3))
    a = L.Conv2D(8, 3, padding="same", name="c1")(inputs)
    a = L.BatchNormalization(name="bn1")(a)
    a = L.ReLU()(a)
    b = L.DepthwiseConv2D(3, padding="same", depth_multiplier=2, name="dw")(a)
    b = L.Conv2D(8, 1, name="pw")(b)
    s = L.Add()([a, b])
    c = L.SeparableConv2D(6, 3, padding="same", name="sep")(s)
    d = L.Concatenate()([s, c])
    d = L.Dropout(0.1)(L.AveragePooling2D(2)(d))  # its seed state is an int variable
    t = L.Conv2DTranspose(5, 3, strides=1, padding="same", name="tr")(d)
    f = L.Flatten()(t)
    out = L.Dense(4, name="fc")(f)
    return keras.Model(inputs, out)


def small_classifier(seed=0):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((8, 8, 3))
    x = L.Conv2D(8, 3, padding="same", use_bias=False, name="c1")(inputs)
    x = L.BatchNormalization(name="bn1")(x)
    x = L.ReLU()(x)
    x = L.Conv2D(8, 3, padding="same", name="c2",
                 kernel_constraint=keras.constraints.MaxNorm(0.5, axis=[0, 1, 2]))(x)
    x = L.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, L.Dense(3, name="fc")(x))


@pytest.fixture(scope="session")
def resnet20():
    """ResNet-20 with seeded weights, shared by the tests that only read it."""
    keras.utils.set_random_seed(0)
    return models.get("resnet20")


def count_kept(masks):
    """Ones over all masks."""
    return int(sum(np.count_nonzero(m) for m in masks.values()))


def count_total(masks):
    """Entries over all masks."""
    return int(sum(np.size(m) for m in masks.values()))


def check_remove_detached(model, masks, exact=True):
    """``pai.remove_detached`` against synaptic flow, the independent reference.

    It must remove some weights and keep every weight that carries flow in the
    linearized network; with ``exact`` it must keep no other.
    """
    cleaned = pai.remove_detached(model, masks)
    flow = pai.synflow_scores(model, masks)
    assert count_kept(cleaned) < count_kept(masks)
    for path in masks:
        if exact:
            expected = (masks[path] > 0) & (flow[path] > 0)
            np.testing.assert_array_equal(cleaned[path] > 0, expected, err_msg=path)
        else:
            assert np.all(cleaned[path] <= masks[path]), path
            assert np.all(cleaned[path][flow[path] > 0] == 1), path
