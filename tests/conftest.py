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

import tensorflow as tf  # noqa: E402

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
