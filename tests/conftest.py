"""Shared pytest configuration, references and model builders.

* The independent MAC reference: :func:`tf_macs` counts the convolution and
  matmul ops of TensorFlow's own traced inference graph.
* :func:`assert_matches_plan` and :func:`assert_budget_use`: a rebuilt model
  against its plan, by Keras', TensorFlow's and the layers' own numbers.
* :func:`random_cnns`: a hypothesis strategy for random functional CNNs.
* Small models for the pruning baselines, the ``resnet20`` fixture and mask
  counts.
* :func:`run_python`: a fresh interpreter on this checkout.

Test modules import these functions from ``tests.conftest`` rather than from
each other.
"""

import collections
import hashlib
import json
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
from hypothesis import strategies as st  # noqa: E402

from keras_precrop import models, pai, profile  # noqa: E402
from keras_precrop.budget.grid import WidthGrid as _Grid  # noqa: E402  (the plan's width grid)
from keras_precrop.graph import trace  # noqa: E402  (names of traced layers)

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


def git(repo, *argv):
    """``git argv`` run in ``repo``; returns its standard output, stripped (raises on failure)."""
    return subprocess.run(["git", "-C", str(repo), *argv], check=True, capture_output=True,
                          text=True).stdout.strip()


def git_init(repo):
    """A new git repository at ``repo`` that commits as a test author, whatever the machine's config."""
    repo.mkdir(parents=True, exist_ok=True)
    git(repo, "init", "-q")
    for key, value in {"user.name": "test", "user.email": "test@example.com",
                       "commit.gpgsign": "false"}.items():
        git(repo, "config", key, value)
    return repo


# -- the independent MAC reference: TensorFlow's traced graph ----------------

_COUNTED_OPS = {
    "Conv2D", "DepthwiseConv2dNative", "Conv2DBackpropInput",
    "MatMul", "BatchMatMulV2", "BatchMatMulV3", "Einsum",
}


def trace_graph(model):
    """The inference graph of ``model`` for one example (batch size 1).

    TensorFlow is imported here, not with this module, so the backend-neutral
    test files also run under JAX and PyTorch without it (tests/test_backends.py).
    """
    import tensorflow as tf

    if getattr(model, "inputs", None):
        specs = [tf.TensorSpec((1,) + tuple(t.shape[1:]), t.dtype) for t in model.inputs]
    else:  # a subclassed model: the shape it was built with, traced by TF itself
        shape = next(iter(model._build_shapes_dict.values()))
        specs = [tf.TensorSpec((1,) + tuple(shape[1:]), "float32")]
    fn = tf.function(lambda *xs: model(list(xs) if len(xs) > 1 else xs[0], training=False))
    return fn.get_concrete_function(*specs).graph


def _op_macs(op):
    """Multiply-accumulates of one conv/matmul op, from its graph shapes.

    A grouped convolution's kernel holds ``c_in / groups`` input channels, so
    the same formula counts it.
    """
    out = op.outputs[0].shape.as_list()
    if op.type in ("Conv2D", "DepthwiseConv2dNative"):
        assert op.get_attr("data_format") == b"NHWC", op.name
        k_h, k_w, c_in, _ = op.inputs[1].shape.as_list()
        per_output = k_h * k_w * (c_in if op.type == "Conv2D" else 1)
        return math.prod(out) * per_output
    if op.type == "Conv2DBackpropInput":  # a transposed conv: work per *input* pixel
        k_h, k_w, c_out, _ = op.inputs[1].shape.as_list()
        return math.prod(op.inputs[2].shape.as_list()) * k_h * k_w * c_out
    if op.type == "Einsum":  # one MAC per combination of every index of the operands
        return _einsum_macs(op)
    a = op.inputs[0].shape.as_list()
    if op.type == "MatMul":
        inner = a[0] if op.get_attr("transpose_a") else a[1]
    else:
        inner = a[-2] if op.get_attr("adj_x") else a[-1]
    return math.prod(out) * inner


def _einsum_macs(op):
    """A two-operand einsum's MACs: the product of the sizes of every index it names, an
    ellipsis's axes aligned from the right as einsum broadcasts them (``"...a,ab->...b"``)."""
    inputs = op.get_attr("equation").decode().replace(" ", "").split("->")[0].split(",")
    assert len(inputs) == 2 and all("..." not in s.strip(".") for s in inputs), inputs
    sizes = {}
    for spec, tensor in zip(inputs, op.inputs):
        shape = tensor.shape.as_list()
        named = spec.replace("...", "")
        elided = [f"...{i}" for i in range(len(shape) - len(named), 0, -1)]
        for label, size in zip(elided + list(named) if spec.startswith("...") else
                               list(named) + elided, shape):
            sizes[label] = max(sizes.get(label, 1), size)
    return math.prod(sizes.values())


def graph_macs(graph, macs=None):
    """MACs per example by op type; fails on ops it cannot see or count.

    Nested functions (Keras compiles grouped convolutions on CPU with XLA,
    which appears as a ``StatefulPartitionedCall``) are counted inside.
    """
    macs = collections.Counter() if macs is None else macs
    for op in graph.get_operations():
        if "PartitionedCall" in op.type:
            graph_macs(graph._get_function(op.get_attr("f").name).graph, macs)
        elif op.type in _COUNTED_OPS:
            macs[op.type] += _op_macs(op)
        else:
            assert not re.search("Conv|MatMul|Einsum", op.type), f"uncounted op {op.type}"
    return macs


def tf_macs(model):
    """Total MACs per example of ``model`` according to TensorFlow's graph."""
    return sum(graph_macs(trace_graph(model)).values())


# -- a rebuilt model against its plan ------------------------------------------


def layers_by_path(model):
    """Layers of ``model`` with nested models' layers in place, by ``/`` path.

    A subclassed model or one holding composite layers is read through its
    trace, whose layers are named by their place (``block1_conv1``).
    """
    traced = trace.traced(model)
    for layer in traced.functional.layers:
        name = traced.name(layer)
        if isinstance(layer, keras.Model):
            for path, inner in layers_by_path(layer):
                yield f"{name}/{path}", inner
        else:
            yield name, layer


def assert_matches_plan(model, plan, new):
    """Independent evidence that ``new`` is the model ``plan`` describes.

    Keras' own parameter count and the MACs of TensorFlow's traced graph
    (the walker's count of the rebuilt model on other backends) equal the
    plan's totals; every conv/dense layer's ``filters``/``units``
    equals the width the plan reports for it (a depthwise-style grouped conv
    keeps one group per input channel and its multiplier); the output shape
    is the original's.
    """
    assert new.count_params() == plan.params
    if keras.backend.backend() == "tensorflow":
        assert tf_macs(new) == plan.macs
    else:  # no TensorFlow graph to trace: the walker's count of the rebuilt model
        assert profile(new).total_macs == plan.macs
    rows = {row["name"]: row for row in plan.layers}
    old = dict(layers_by_path(model))
    for path, layer in layers_by_path(new):
        row = rows.get(path)
        key = "filters" if hasattr(layer, "filters") else "units" if hasattr(layer, "units") else None
        if row is None or key is None:
            continue
        groups = getattr(old[path], "groups", 1)
        if groups > 1 and old[path].kernel.shape[-2] == 1:  # (a traced layer has no .input)
            # Depthwise-style: one group per input channel, as many as it receives.
            assert layer.groups == layer.input.shape[-1], path
            assert layer.filters == old[path].filters // groups * layer.groups, path
            continue
        assert getattr(layer, key) == int(row["channels_new"]), path
    if getattr(model, "inputs", None):
        shapes = [keras.tree.map_structure(lambda t: tuple(t.shape), m.output) for m in (new, model)]
    else:  # a subclassed model: compare one forward pass
        x = np.zeros((1,) + tuple(new.inputs[0].shape[1:]), "float32")
        shapes = [keras.tree.map_structure(lambda t: tuple(t.shape), m(x)) for m in (new, model)]
    assert shapes[0] == shapes[1]


def assert_equals_zeroed_head_dims(model, small, name, dropped, x):
    """``small`` computes what ``model`` does with the per-head dimensions ``dropped`` of its
    attention layer ``name`` zeroed in the query, key and value projections (kernels ``(in, heads,
    dim)``, biases ``(heads, dim)``): an independent reference for a head-dimension cut."""
    reference = keras.models.clone_model(model)
    reference.set_weights(model.get_weights())
    layer = reference.get_layer(name)
    for dense in (layer._query_dense, layer._key_dense, layer._value_dense):
        for w in dense.weights:
            array = keras.ops.convert_to_numpy(w)
            array[..., dropped] = 0
            w.assign(array)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(small(x)),
                               keras.ops.convert_to_numpy(reference(x)), atol=1e-5)


def assert_budget_use(plan, model, upper, round_to=1, min_channels=1):
    """The budgets hold, and the binding one is used as far as the grid allows.

    ``model`` is the original model and ``upper``/``round_to``/``min_channels``
    the plan's options (they define its width grid). No budget is exceeded,
    and no single width can grow by one grid step (within its bounds)
    without exceeding one: so the binding budget is met within one step's
    cost, and within 1% wherever every step costs less than 1% of it.
    """
    cost = profile(model, ignore=plan.ignore, residual=plan.residual).cost
    grid = _Grid(cost, round_to, min_channels, upper)
    budgets = np.array([np.inf if plan.budgets[k] is None else plan.budgets[k]
                        for k in ("params", "macs")])
    w = np.array([g["new"] for g in plan.variables], dtype=np.float64)
    used = cost.totals(w)
    assert np.all(used <= budgets), (used, budgets)
    step_costs = []
    for v in np.flatnonzero(~cost.fixed):
        up = w.copy()
        up[v] += grid.step[v]
        if up[v] > grid.hi[v] or (cost.bound[v] >= 0 and up[v] > w[cost.bound[v]]):
            continue
        grown = cost.totals(up)
        assert np.any(grown > budgets * (1 + 1e-12)), f"{plan.variables[v]['name']} could grow"
        step_costs.append(np.max((grown - used)[np.isfinite(budgets)]
                                 / budgets[np.isfinite(budgets)]))
    binding = np.max(used[np.isfinite(budgets)] / budgets[np.isfinite(budgets)])
    if step_costs and max(step_costs) <= 0.01:
        assert binding >= 0.99, binding


# -- random functional CNNs (hypothesis) ---------------------------------------

BLOCKS = ("conv", "residual", "projection", "concat", "depthwise", "separable",
          "se", "nested_functional", "nested_sequential", "ops", "pool", "grouped",
          "grouped_depthwise", "norms", "op_nodes", "nasnet")
# ``keras.ops.split`` of the channel axis (CSP-style): drawn only where a strategy asks for them.
SPLITS = ("split_equal", "split_unequal")


@st.composite
def block_specs(draw, blocks=BLOCKS, max_blocks=6):
    """A list of (kind, width, stride) block descriptions, kinds drawn from ``blocks``."""
    n = draw(st.integers(1, max_blocks))
    return [
        (draw(st.sampled_from(blocks)), draw(st.integers(2, 12)), draw(st.sampled_from((1, 1, 2))))
        for _ in range(n)
    ]


@st.composite
def random_cnns(draw, blocks=BLOCKS, max_blocks=6):
    """A random functional CNN (spec kept on ``model.spec`` for debugging).

    Its blocks: plain convs (strided or not), residual blocks with identity or
    projection shortcuts, concatenations, depthwise and separable convs,
    squeeze-excite gates, nested Functional/Sequential sub-models,
    ``keras.ops`` calls (element-wise, pad, concatenate, mean), grouped
    convolutions (depthwise-style and ``groups = g``), layer and group
    normalization and NASNet-like cells (padding, cropping and a projection
    feeding adds none of which holds the stream's creator), ending in a pooled
    or flattened dense head. ``blocks`` chooses the kinds (``BLOCKS + SPLITS``
    adds channel splits), ``max_blocks`` the most blocks.
    """
    spec = draw(block_specs(blocks, max_blocks))
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
        elif kind in SPLITS:
            x = _split_block(x, width, kind == "split_equal", nm)
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


def _split_block(x, width, equal, nm):
    """CSP-style: a conv's channels split in two; an equal split's second half goes through a
    residual conv block, an unequal split's larger piece through a conv; concatenated back, the
    unequal pieces in reverse order (a shuffle)."""
    if equal:
        first, second = keras.ops.split(L.Conv2D(2 * width, 1, name=nm())(x), 2, axis=-1)
        y = L.Conv2D(width, 3, padding="same", activation="relu", name=nm())(second)
        return L.Concatenate(name=nm())([first, L.Add(name=nm())([y, second])])
    first, second = keras.ops.split(L.Conv2D(width + 3, 1, name=nm())(x), [width // 2 + 1], axis=-1)
    y = L.Conv2D(width, 3, padding="same", name=nm())(second)
    return L.Concatenate(name=nm())([y, first])


# -- random subclassed models of composite layers (hypothesis) -----------------


class ResidualBlock(L.Layer):
    """conv-BN-relu-conv plus the block's input: a user's composite layer."""

    def __init__(self, filters, **kwargs):
        super().__init__(**kwargs)
        self.conv1 = L.Conv2D(filters, 3, padding="same", name="conv1")
        self.bn1 = L.BatchNormalization(name="bn1")
        self.conv2 = None  # as wide as the block's input: made in build

    def build(self, input_shape):
        self.conv2 = L.Conv2D(input_shape[-1], 3, padding="same", name="conv2")

    def call(self, x, training=None):
        y = keras.ops.relu(self.bn1(self.conv1(x), training=training))
        return keras.ops.relu(x + self.conv2(y))


class SqueezeExcite(L.Layer):
    """A squeeze-excite gate written with ``keras.ops``: mean, two dense layers, multiply.

    (The gate is kept 4-D: ``gate[:, None, None, :]`` is a ``GetItem`` op, which the walker
    refuses by name.)
    """

    def __init__(self, squeeze, **kwargs):
        super().__init__(**kwargs)
        self.squeeze = L.Dense(squeeze, activation="relu", name="squeeze")
        self.excite = None  # as wide as the block's input: made in build

    def build(self, input_shape):
        self.excite = L.Dense(input_shape[-1], activation="sigmoid", name="excite")

    def call(self, x, training=None):
        return x * self.excite(self.squeeze(keras.ops.mean(x, axis=(1, 2), keepdims=True)))


class DepthwiseBlock(L.Layer):
    """Depthwise conv, BN, relu, then a pointwise conv to ``filters``."""

    def __init__(self, filters, **kwargs):
        super().__init__(**kwargs)
        self.depthwise = L.DepthwiseConv2D(3, padding="same", name="depthwise")
        self.bn = L.BatchNormalization(name="bn")
        self.pointwise = L.Conv2D(filters, 1, name="pointwise")

    def call(self, x, training=None):
        return self.pointwise(keras.ops.relu(self.bn(self.depthwise(x), training=training)))


class SplitBlock(L.Layer):
    """``keras.ops.split`` inside a composite: ``2 * filters`` channels, one half through a conv."""

    def __init__(self, filters, **kwargs):
        super().__init__(**kwargs)
        self.expand = L.Conv2D(2 * filters, 1, name="expand")
        self.conv = L.Conv2D(filters, 3, padding="same", name="conv")

    def call(self, x, training=None):
        first, second = keras.ops.split(self.expand(x), 2, axis=-1)
        return keras.ops.concatenate([first, self.conv(second)], axis=-1)


class Stage(L.Layer):
    """Blocks inside a block: a nested composite."""

    def __init__(self, blocks, **kwargs):
        super().__init__(**kwargs)
        self.blocks = blocks

    def call(self, x, training=None):
        for block in self.blocks:
            x = block(x, training=training)
        return x


class RandomNet(keras.Model):
    """A subclassed model: a stem, a composite body (a ``Stage`` of blocks) and a dense head."""

    def __init__(self, body, **kwargs):
        super().__init__(**kwargs)
        self.stem = L.Conv2D(8, 3, padding="same", name="stem")
        self.body = body
        self.head = L.Dense(5, name="head")

    def call(self, x, training=None):
        x = self.body(self.stem(x), training=training)
        return self.head(keras.ops.mean(x, axis=(1, 2)))


COMPOSITES = ("residual", "se", "depthwise", "split", "stage", "functional")


def _composite(kind, width, channels, name):
    """One composite block of ``kind`` on ``channels`` input channels, and its output channels.

    ``stage`` is a ``Stage`` of a residual and an SE block; ``functional`` a functional
    ``keras.Model`` of conv-BN-relu built for any spatial size.
    """
    if kind == "residual":
        return ResidualBlock(width, name=name), channels
    if kind == "se":
        return SqueezeExcite(max(1, width // 2), name=name), channels
    if kind == "depthwise":
        return DepthwiseBlock(width, name=name), width
    if kind == "split":
        return SplitBlock(width, name=name), 2 * width
    if kind == "stage":
        return Stage([ResidualBlock(width, name="res"), SqueezeExcite(2, name="se")],
                     name=name), channels
    inner = keras.Input((None, None, channels))
    y = L.Conv2D(width, 3, padding="same", name="conv")(inner)
    return keras.Model(inner, L.ReLU(name="relu")(L.BatchNormalization(name="bn")(y)), name=name), width


@st.composite
def random_subclassed(draw, max_blocks=4):
    """A built subclassed ``RandomNet`` of random composite blocks (spec on ``model.spec``)."""
    spec = [(draw(st.sampled_from(COMPOSITES)), draw(st.integers(2, 12)))
            for _ in range(draw(st.integers(1, max_blocks)))]
    size = draw(st.sampled_from((8, 12)))
    blocks, channels = [], 8  # the stem's
    for i, (kind, width) in enumerate(spec):
        block, channels = _composite(kind, width, channels, f"block{i}")
        blocks.append(block)
    model = RandomNet(Stage(blocks, name="body"), name="random_net")
    model(np.zeros((1, size, size, 3), "float32"))
    model.spec = (spec, size)
    return model


# -- what a user can see of their model -----------------------------------------


def model_fingerprint(model):
    """Everything a user can see of ``model``, to compare before and after a call.

    Returns:
        ``{"weights": sha256 of every variable's path and bytes, "variables": (path, trainable) of
        each, "layers": (name, class, trainable) of every layer (nested too), "nodes": (name,
        inbound, outbound) call-node counts of every layer, "config": get_config() as JSON (None
        for a subclassed model without one)}``.
    """
    digest = hashlib.sha256()
    for w in model.weights:
        digest.update(w.path.encode() + np.ascontiguousarray(keras.ops.convert_to_numpy(w)).tobytes())
    layers = list(model._flatten_layers(include_self=True, recursive=True))
    try:
        config = json.dumps(model.get_config(), sort_keys=True, default=repr)
    except NotImplementedError:
        config = None
    return {"weights": digest.hexdigest(),
            "variables": [(w.path, w.trainable) for w in model.variables],
            "layers": [(layer.name, type(layer).__name__, layer.trainable) for layer in layers],
            "nodes": [(layer.name, len(layer._inbound_nodes), len(layer._outbound_nodes))
                      for layer in layers],
            "config": config}


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


def saved_trained_model(path, seed=0):
    """``small_classifier`` trained one step with SGD momentum and saved to ``path`` (.keras, optimizer
    state included, as ``model.fit`` leaves it); returns the model."""
    model = small_classifier(seed)
    model.compile(keras.optimizers.SGD(0.1, momentum=0.9), "sparse_categorical_crossentropy")
    rng = np.random.default_rng(seed)
    model.fit(rng.normal(size=(4, 8, 8, 3)), rng.integers(0, 3, 4), epochs=1, verbose=0)
    model.save(path)
    return model


def grouped_cnn():
    """Grouped convolutions (ResNeXt/ConvNeXt style): depthwise-style, then 4 in / 6 out per group."""
    x = inputs = keras.Input((8, 8, 3))
    x = L.Conv2D(16, 3, padding="same", name="stem")(x)
    x = L.Conv2D(16, 3, padding="same", groups=16, name="dw")(x)  # depthwise-style
    x = L.Conv2D(24, 3, padding="same", groups=4, name="grouped")(x)  # 4 in, 6 out per group
    x = L.Conv2D(6, 1, name="head_conv")(x)
    out = L.Dense(3, name="head")(L.GlobalAveragePooling2D()(x))
    return keras.Model(inputs, out)


def kernel_mask(masks, name):
    """The mask of layer ``name``'s kernel."""
    return next(m for p, m in masks.items() if p.startswith(f"{name}/kernel"))


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
