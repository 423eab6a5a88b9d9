"""The MACs of an opaque layer, by the backend's own cost analysis.

A layer the walker cannot see into (one let through with ``ignore=``, or
registered ``"fixed"``) keeps its channels, but its work still counts
towards a FLOP budget. Its handler cannot say what that work is, so the
layer is run once on inputs of its recorded shapes (one example), under the
backend's own accounting of multiply-accumulates:

* TensorFlow: the ops of a ``tf.function`` graph, each costed by the flops
  statistic TensorFlow registers for its op type (``Conv2D``, ``MatMul``,
  ``DepthwiseConv2dNative``, ...; two FLOPs per MAC); a transposed
  convolution (``Conv2DBackpropInput``), whose registered estimate is
  inexact for ``"valid"`` padding, from its shapes.
* JAX: the ``conv_general_dilated`` and ``dot_general`` equations of the
  layer's jaxpr, costed from their shapes (a ``scan`` times its length).
* PyTorch: ``torch.utils.flop_counter.FlopCounterMode``; an op that
  multiplies (a matmul, a convolution, an attention) without a formula
  there, as CPU attention has none, makes the cost unknown.

A transposed convolution counts every input pixel times the whole kernel,
as the walker's own count of ``Conv2DTranspose`` does (not the zeros a
strided one inserts).

Anything these cannot account for exactly (a convolution or matmul op type
without a registered cost, a loop whose trip count the graph does not
state, a call that fails on concrete inputs) gives ``None``: the cost is
unknown, and the budgets that count MACs or time refuse the model naming the
layer. A trace never guesses.
"""

from __future__ import annotations

import math
import re

import keras

_COSTLY = re.compile("Conv|MatMul|Einsum")  # TF op types that multiply-accumulate
_TF_CONTROL_FLOW = ("While", "StatelessWhile", "If", "StatelessIf", "Case", "StatelessCase")
_TF_TRANSPOSED = ("Conv2DBackpropInput", "Conv3DBackpropInputV2")
# aten ops that multiply-accumulate (matmuls, convolutions, attention), by name.
_TORCH_COSTLY = re.compile(r"mm|matmul|conv(?!ert)|attention|einsum|linear|dot")


def measured_macs(op, node, concrete=None):
    """MACs per example of the call ``node`` of operation ``op``, or ``None`` if unknown.

    Args:
        op: a layer or ``keras.ops`` operation of the walked graph.
        node: one of its call nodes: the call's arguments and their shapes.
        concrete: ``{id(KerasTensor): shape for one example}`` of tensors whose
            sizes the graph leaves open but an earlier measured call gave; the
            outputs of this call that the graph leaves open are added, from
            one call on zeros (so a block kept whole after a reshape to ``-1``
            is counted).
    """
    measure = {"tensorflow": _tf_macs, "jax": _jax_macs, "torch": _torch_macs}.get(
        keras.backend.backend())
    concrete = {} if concrete is None else concrete
    tensors = node.arguments.keras_tensors
    shapes = [concrete.get(id(t), (1, *tuple(t.shape)[1:])) for t in tensors]
    if measure is None or any(d is None for s in shapes for d in s):
        return None

    def call(*xs):
        args, kwargs = node.arguments.fill_in({id(t): x for t, x in zip(tensors, xs)})
        if isinstance(op, keras.layers.Layer):
            kwargs = {**kwargs, "training": False}  # inference: no noise, no statistics update
        return op(*args, **kwargs)

    specs = [(s, t.dtype) for s, t in zip(shapes, tensors)]
    try:
        macs = measure(call, specs)
    except Exception:  # a call the backend cannot run or cost: unknown, never guessed
        return None
    if any(d is None for t in node.outputs for d in tuple(t.shape)[1:]):
        concrete.update(_output_shapes(call, specs, node.outputs))
    return None if macs is None else int(macs)


def _output_shapes(call, specs, outputs):
    """``{id(output): shape}`` of ``call`` run once on zeros of ``specs``, or ``{}`` where it
    cannot run (the outputs' sizes stay open; the MACs measured are kept)."""
    try:
        values = keras.tree.flatten(call(*[keras.ops.zeros(s, d) for s, d in specs]))
    except Exception:  # a call that cannot run on zeros: the sizes stay open, never guessed
        return {}
    return {id(t): tuple(v.shape) for t, v in zip(outputs, values)}


def _tf_macs(call, specs):
    """MACs of ``call`` in its ``tf.function`` graph, by TensorFlow's registered flops."""
    import tensorflow as tf
    from tensorflow.python.framework import ops as tf_ops
    from tensorflow.python.util import deprecation

    graph = tf.function(call).get_concrete_function(
        *[tf.TensorSpec(shape, dtype) for shape, dtype in specs]).graph
    with deprecation.silence():
        return _tf_graph_macs(graph, tf_ops)


def _tf_graph_macs(graph, tf_ops):
    """MACs of the ops of ``graph`` (nested function calls included), or ``None``."""
    total = 0
    for op in graph.get_operations():
        if "PartitionedCall" in op.type:
            inner = _tf_graph_macs(graph._get_function(op.get_attr("f").name).graph, tf_ops)
            if inner is None:
                return None
            total += inner
        elif op.type in _TF_CONTROL_FLOW:
            return None  # a loop's trip count or a branch taken is not in the graph
        elif op.type in _TF_TRANSPOSED:
            total += _tf_transposed_macs(op)
        elif op.type == "Einsum":  # TensorFlow registers no flops for it
            total += _tf_einsum_macs(op)
        elif _COSTLY.search(op.type):
            flops = tf_ops.get_stats_for_node_def(graph, op.node_def, "flops").value
            if flops is None:
                return None
            total += flops // 2
    return total


def _tf_transposed_macs(op):
    """MACs of a transposed convolution op: its input's pixels (``out_backprop``) times its kernel."""
    kernel, pixels = op.inputs[1].shape, op.inputs[2].shape
    channels = 1 if op.get_attr("data_format").decode().startswith("NC") else -1
    return math.prod(pixels) // pixels[channels] * math.prod(kernel)


def _tf_einsum_macs(op):
    """MACs of an ``Einsum`` op: the product of every label's size (an ellipsis's axes aligned
    from the right, as einsum broadcasts them)."""
    sizes = {}
    for spec, tensor in zip(op.get_attr("equation").decode().split("->")[0].split(","), op.inputs):
        shape = tensor.shape.as_list()
        named = spec.replace("...", "")
        elided = [f"...{i}" for i in range(len(shape) - len(named), 0, -1)]
        sizes.update(zip(elided + list(named) if spec.startswith("...") else list(named) + elided,
                         shape))
    return math.prod(sizes.values())


def _jax_macs(call, specs):
    """MACs of ``call`` from the convolutions and dot products of its jaxpr."""
    import jax

    closed = jax.make_jaxpr(call)(*[jax.ShapeDtypeStruct(s, d) for s, d in specs])
    return _jaxpr_macs(closed.jaxpr)


def _jaxpr_macs(jaxpr):
    """MACs of the equations of ``jaxpr`` (sub-jaxprs included), or ``None``."""
    total = 0
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name == "conv_general_dilated":
            lhs, rhs = eqn.invars[0].aval.shape, eqn.invars[1].aval.shape
            numbers = eqn.params["dimension_numbers"]
            if any(d > 1 for d in eqn.params["lhs_dilation"] or ()):  # transposed: input x kernel
                total += math.prod(lhs) // lhs[numbers.lhs_spec[1]] * math.prod(rhs)
            else:
                total += math.prod(eqn.outvars[0].aval.shape) * math.prod(rhs) // rhs[numbers.rhs_spec[0]]
        elif name == "dot_general":
            (contract, _), _ = eqn.params["dimension_numbers"]
            lhs = eqn.invars[0].aval.shape
            total += math.prod(eqn.outvars[0].aval.shape) * math.prod(lhs[i] for i in contract)
        for sub in _subjaxprs(eqn.params):
            inner = _jaxpr_macs(sub)
            if inner is None or (inner and name in ("while", "cond")):
                return None  # a trip count or the branch taken is not in the jaxpr
            total += inner * (eqn.params["length"] if name == "scan" else 1)
    return total


def _subjaxprs(params):
    """The jaxprs among an equation's parameters (``pjit``, ``custom_jvp_call``, ``scan``, ...)."""
    for value in params.values():
        for item in value if isinstance(value, (tuple, list)) else (value,):
            inner = getattr(item, "jaxpr", item)
            if hasattr(inner, "eqns"):
                yield inner


def _torch_macs(call, specs):
    """MACs of ``call`` as ``torch.utils.flop_counter`` counts them (two FLOPs per MAC), or
    ``None`` where it ran an op that multiplies and that the counter has no formula for."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.flop_counter import FlopCounterMode, flop_registry

    class _Ops(TorchDispatchMode):
        """Records the aten ops a call runs."""

        def __init__(self):
            super().__init__()
            self.ran = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ran.add(func._overloadpacket)
            return func(*args, **(kwargs or {}))

    xs = [keras.ops.zeros(shape, dtype) for shape, dtype in specs]
    with torch.no_grad(), FlopCounterMode(display=False) as counter, _Ops() as ops:
        call(*xs)
    if any(_TORCH_COSTLY.search(str(op)) and op not in flop_registry for op in ops.ran):
        return None
    return counter.get_total_flops() // 2
