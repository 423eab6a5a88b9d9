"""Shared pytest configuration and the independent MAC reference.

:func:`tf_macs` counts multiply-accumulates from TensorFlow's own traced
inference graph (shapes from TensorFlow, not from the walker), so tests can
check profiles, plans and rebuilt models against it.
"""

import collections
import math
import os
import re

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_precrop as kp  # noqa: E402

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
    a = op.inputs[0].shape.as_list()
    if op.type == "MatMul":
        inner = a[0] if op.get_attr("transpose_a") else a[1]
    else:
        inner = a[-2] if op.get_attr("adj_x") else a[-1]
    return math.prod(out) * inner


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


def _layers(model):
    """Layers of ``model`` with nested models' layers in place, by ``/`` path."""
    for layer in model.layers:
        if isinstance(layer, keras.Model):
            for path, inner in _layers(layer):
                yield f"{layer.name}/{path}", inner
        else:
            yield layer.name, layer


def assert_matches_plan(model, plan, new):
    """Independent evidence that ``new`` is the model ``plan`` describes.

    Keras' own parameter count and the MACs of TensorFlow's traced graph
    equal the plan's totals; every conv/dense layer's ``filters``/``units``
    equals the width the plan reports for it (a depthwise-style grouped conv
    keeps one group per input channel and its multiplier); the output shape
    is the original's.
    """
    assert new.count_params() == plan.params
    assert tf_macs(new) == plan.macs
    rows = {row["name"]: row for row in plan.layers}
    old = dict(_layers(model))
    for path, layer in _layers(new):
        row = rows.get(path)
        key = "filters" if hasattr(layer, "filters") else "units" if hasattr(layer, "units") else None
        if row is None or key is None:
            continue
        groups = getattr(old[path], "groups", 1)
        if groups > 1 and groups == old[path].input.shape[-1]:
            # Depthwise-style: one group per input channel, as many as it receives.
            assert layer.groups == layer.input.shape[-1], path
            assert layer.filters == old[path].filters // groups * layer.groups, path
            continue
        assert getattr(layer, key) == int(row["channels_new"]), path
    assert tuple(new.output.shape) == tuple(model.output.shape)


def assert_budget_use(plan, model, upper, round_to=1, min_channels=1):
    """The budgets hold, and the binding one is used as far as the grid allows.

    ``model`` is the original model and ``upper``/``round_to``/``min_channels``
    the plan's options (they define its width grid). No budget is exceeded,
    and no single width can grow by one grid step (within its bounds)
    without exceeding one: so the binding budget is met within one step's
    cost, and within 1% wherever every step costs less than 1% of it.
    """
    from keras_precrop.plan import _Grid  # the plan's width grid

    cost = kp.profile(model, ignore=plan.ignore, residual=plan.residual).cost
    grid = _Grid(cost, round_to, min_channels, upper)
    budgets = np.array([np.inf if plan.budgets[k] is None else plan.budgets[k]
                        for k in ("params", "macs")])
    w = np.array([g["new"] for g in plan.groups], dtype=np.float64)
    used = cost.totals(w)
    assert np.all(used <= budgets), (used, budgets)
    step_costs = []
    for v in np.flatnonzero(~cost.fixed):
        up = w.copy()
        up[v] += grid.step[v]
        if up[v] > grid.hi[v] or (cost.bound[v] >= 0 and up[v] > w[cost.bound[v]]):
            continue
        grown = cost.totals(up)
        assert np.any(grown > budgets * (1 + 1e-12)), f"{plan.groups[v]['name']} could grow"
        step_costs.append(np.max((grown - used)[np.isfinite(budgets)]
                                 / budgets[np.isfinite(budgets)]))
    binding = np.max(used[np.isfinite(budgets)] / budgets[np.isfinite(budgets)])
    if step_costs and max(step_costs) <= 0.01:
        assert binding >= 0.99, binding
