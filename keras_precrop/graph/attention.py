"""How channels flow through attention: ``keras.layers.MultiHeadAttention`` by whole heads.

A head is the unit attention is pruned by: its query and key slices
(``key_dim`` channels each), its value slice and the output projection's
rows that read it (``value_dim`` each), and a gated layer's gate slice, go
or stay together. So the layer creates one segment of ``num_heads`` units
(kind ``"heads"``: counted in heads, never rounded to a channel multiple), and
every per-head cost is that segment times its per-head dimension (a
:class:`~keras_precrop.graph.channels.Part` with ``mult``). The inputs'
channels are read by the projections like any kernel's: the query stream
(the layer's output keeps the query's channels unless ``output_shape``
says otherwise), and the value and key streams, which cross-attention takes
from other tensors. Under ``residual="prefix"`` every stream is read whole,
never through a narrower view: the output keeps the query's channels (it
is added back into the query's stream), and only a layer's first input
could be sliced. Attention masks are read whole.

Under ``attention="head_dims"`` (a walk option) the unit is instead one
index of the per-head dimension: the layer keeps all its heads, and index
``i`` of every head's query, key and value slices and the output
projection's rows that read them go or stay together, the same indices in
every head, so the rebuilt layer is a ``MultiHeadAttention`` with a smaller
``key_dim`` (= ``value_dim``). This is the layout Torch-Pruning's
``prune_head_dims`` gives; keeping the heads keeps every attention pattern
and narrows each. It needs ``value_dim == key_dim`` (query/key and
value/output then share one width); a layer with another ``value_dim`` is
refused by name.

MACs are those of every projection plus the two attention products
(``QK^T`` and ``AV``: tokens of query x tokens of key x heads x head
dimension each, per independent attention group when ``attention_axes``
leaves some axes out), which grow with the square of the sequence length.
"""

from __future__ import annotations

import inspect
import math

import keras

from keras_precrop.errors import UnsupportedLayerError
from keras_precrop.graph.channels import Part, channels_width
from keras_precrop.graph.handler_base import Handler

_PROJECTIONS = ("query", "key", "value")
# What an attention layer prunes (the walk's ``attention=``): whole heads, or each head's dimension.
ATTENTION = ("heads", "head_dims")


def tensor_arguments(layer, node):
    """The name of the ``call`` argument behind each tensor of ``node.arguments.keras_tensors``.

    A self-attention call ``mha(x, x)`` passes one tensor twice; its two
    places are told apart by the argument each fills.
    """
    args, kwargs = node.arguments.args, node.arguments.kwargs
    params = [p for p in inspect.signature(layer.call).parameters if p not in ("self",)]
    labels = ([keras.tree.map_structure(lambda _, name=name: name, a) for name, a in zip(params, args)],
              {k: keras.tree.map_structure(lambda _, k=k: k, v) for k, v in kwargs.items()})
    values = keras.tree.flatten((list(args), kwargs))
    names = keras.tree.flatten(labels)
    found = [n for n, v in zip(names, values) if isinstance(v, keras.KerasTensor)]
    if len(found) != len(node.arguments.keras_tensors):  # pragma: no cover - a Keras change
        raise UnsupportedLayerError(f"{layer.name}: cannot tell its tensor arguments apart.")
    return found


class MultiHeadAttention(Handler):
    """``keras.layers.MultiHeadAttention`` (and subclasses): heads as units, exact costs.

    The rebuilt layer's config says the new ``num_heads`` (or, under
    ``attention="head_dims"``, the new ``key_dim`` and ``value_dim``) and the
    new ``output_shape`` where it was set, so it saves and loads as is.
    """

    def walk(self, ctx, rec, node, ins):
        layer = rec.layer
        places, query, key, value = read_call(ctx, rec, node, ins)
        per_k, per_v, unit, per_pair = _units(ctx, rec, layer)
        q_shape, v_shape = node.arguments.keras_tensors[places["query"]].shape, \
            node.arguments.keras_tensors[places["value"]].shape
        q_tokens, kv_tokens = math.prod(q_shape[1:-1]), math.prod(v_shape[1:-1])
        whole = {"bias": layer.use_bias, "view": False}  # streams read whole: see the docstring
        ctx.add_kernel(rec, query, per_k, params=1, macs=q_tokens, **whole)
        ctx.add_kernel(rec, key, per_k, params=1, macs=kv_tokens, **whole)
        ctx.add_kernel(rec, value, per_v, params=1, macs=kv_tokens, **whole)
        if getattr(layer, "_use_gate", False):
            ctx.add_kernel(rec, query, per_v, params=1, macs=q_tokens, **whole)
        pairs = _attention_pairs(layer, q_shape, v_shape, rec.path)
        ctx.add_term(rec, 0, pairs * per_pair, unit)
        out = query if _output_width(rec) is None else _new_output_channels(ctx, rec, layer)
        ctx.add_kernel(rec, per_v, out, params=1, macs=q_tokens, bias=layer.use_bias)
        outs = [out]
        for extra in node.outputs[1:]:  # attention scores: (batch, heads, queries, keys)
            outs.append((Part(ctx.new_segment(extra.shape[-1], f"{rec.path}:scores", fixed=True)),))
        return outs

    def configure(self, rec, config, width):
        if rec.out_kind == "head_dims":
            config["key_dim"] = config["value_dim"] = width(rec.out_segment)
        else:
            config["num_heads"] = width(rec.out_segment)
        if _output_width(rec) is not None:
            new = channels_width(rec.outputs[0][0], width)
            shape = config["output_shape"]
            config["output_shape"] = new if isinstance(shape, int) else (*shape[:-1], new)
        return config

    def channel_axes(self, rec, node):
        """Heads along the projections' head axis; streams along their input and output axes.

        A projection's kernel is ``(channels in, heads, per-head dim)``, its
        bias ``(heads, per-head dim)``; the output projection's kernel is
        ``(heads, value_dim, channels out)``. Under ``attention="head_dims"``
        the units are along the per-head dimension, the same in every head.
        """
        layer, places = rec.layer, call_places(rec.layer, node, rec.path)
        unit = 2 if rec.out_kind == "head_dims" else 1  # a projection's dim axis / head axis
        reads = projection_reads(places)
        roles = {}
        for name in (*_PROJECTIONS, "gate"):
            dense = getattr(layer, f"_{name}_dense", None)
            if dense is not None:
                roles[id(dense.kernel)] = {0: reads[name], unit: "unit"}
                if dense.bias is not None:
                    roles[id(dense.bias)] = {unit - 1: "unit"}
        out = layer._output_dense
        roles[id(out.kernel)] = {unit - 1: "unit_in", out.kernel.ndim - 1: "out"}
        if out.bias is not None:
            roles[id(out.bias)] = {-1: "out"}
        return [roles.get(id(w), {}) for w in layer.weights]


    def carried_value(self, rec, new_layer, weight, value):
        """The query projection's carried kernel and bias, rescaled where ``key_dim`` changed.

        The layer scales queries by ``1/sqrt(key_dim)``: with fewer dimensions
        per head a rebuilt layer would sharpen every attention pattern. The
        kept query weights are scaled by ``sqrt(new / old key_dim)`` so the
        rebuilt layer computes what the original does on the kept dimensions
        (and what a masked model does while :class:`GradualPruning` runs).
        """
        if rec.out_kind != "head_dims" or all(weight is not w for w in rec.layer._query_dense.weights):
            return value
        factor = math.sqrt(new_layer.key_dim / rec.layer.key_dim)
        return (value * factor).astype(value.dtype)


def _units(ctx, rec, layer):
    """The units ``layer`` is pruned by (the walk's ``attention=``), and what each costs.

    Returns:
        ``(query/key channels, value/output channels, the units, the attention
        products' MACs per unit and (query, key) pair)``.
    """
    heads, k_dim, v_dim = layer.num_heads, layer.key_dim, layer.value_dim or layer.key_dim
    if ctx.attention == "head_dims":
        if v_dim != k_dim:
            raise UnsupportedLayerError(
                f"{rec.path}: attention='head_dims' narrows key_dim and value_dim together, but "
                f"this {type(layer).__name__} has key_dim={k_dim} and value_dim={v_dim}. Prune its "
                "whole heads (attention='heads') or keep it whole with {ignore}.", ignore=[rec.path])
        dims = ctx.new_output(rec, k_dim, kind="head_dims")[0]
        per = (Part(dims.segment, heads),)
        return per, per, dims, 2 * heads
    unit = ctx.new_output(rec, heads, kind="heads")[0]
    return (Part(unit.segment, k_dim),), (Part(unit.segment, v_dim),), unit, k_dim + v_dim


def _new_output_channels(ctx, rec, layer):
    """The channels an ``output_shape`` sets: created on the first call, shared by the later ones."""
    if rec.calls:
        return rec.outputs[0][0]
    return (Part(ctx.new_segment(_output_width(rec), f"{rec.path}:output")),)


def read_call(ctx, rec, node, ins):
    """``(places, query, key, value)`` of an attention call: where each input sits
    (:func:`call_places`) and the channels of each stream; masks (every other tensor) are fixed,
    their last axis being key positions, read whole."""
    places = call_places(rec.layer, node, rec.path)
    for i in places["other"]:
        ctx.fix(ins[i])
    return places, *(ins[places[name]] for name in ("query", "key", "value"))


def projection_reads(places):
    """The role of each projection's input axis (query, key, value, gate) for a call's ``places``."""
    return {"query": input_role(places["query"]), "key": input_role(places["key"]),
            "value": input_role(places["value"]), "gate": input_role(places["query"])}


def input_role(index):
    """The role of a kernel axis reading input ``index`` of the call."""
    return "in" if index == 0 else f"in:{index}"


def call_places(layer, node, path):
    """``{"query": i, "value": j, "key": k, "other": [...]}``: where each input sits in ``ins`` (the
    key at the value's place when the call gives none)."""
    names = tensor_arguments(layer, node)
    places = {"other": []}
    for i, name in enumerate(names):
        if name in _PROJECTIONS and name not in places:
            places[name] = i
        else:
            places["other"].append(i)
    if "query" not in places or "value" not in places:
        raise UnsupportedLayerError(
            f"{path}: a {type(layer).__name__} call whose query or value is not a tensor of the "
            "model cannot be walked. Keep it whole with {ignore}.", ignore=[path])
    places.setdefault("key", places["value"])  # no key given: the value is the key
    return places


def _output_width(rec):
    """The channels ``output_shape`` sets, or ``None`` when the output keeps the query's."""
    shape = rec.layer._output_shape
    if shape is None:
        return None
    if isinstance(shape, int):
        return shape
    if len(shape) != 1:
        raise UnsupportedLayerError(
            f"{rec.path}: an output_shape of several axes ({tuple(shape)}) is not supported. "
            "Keep the layer whole with {ignore}.", ignore=[rec.path])
    return shape[-1]


def _attention_pairs(layer, q_shape, v_shape, path):
    """How many (query position, key position) pairs the attention products sum over.

    Axes of ``attention_axes`` attend to each other; the others (beyond the
    batch) are independent groups, equal in query and key.
    """
    rank = len(q_shape)
    axes = layer._attention_axes
    axes = tuple(range(1, rank - 1)) if axes is None else tuple(a % (rank + 1) for a in axes)
    if any(not 0 < a < rank - 1 for a in axes):
        raise UnsupportedLayerError(
            f"{path}: attention_axes {layer._attention_axes} include the batch or channel axis. "
            "Keep the layer whole with {ignore}.", ignore=[path])
    groups = math.prod(q_shape[a] for a in range(1, rank - 1) if a not in axes)
    return groups * math.prod(q_shape[a] for a in axes) * math.prod(v_shape[a] for a in axes)
