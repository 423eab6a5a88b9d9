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

    The rebuilt layer's config says the new ``num_heads`` (and the new
    ``output_shape`` where it was set), so it saves and loads as is. Per-head
    dimensions (``key_dim``, ``value_dim``) stay as they are.
    """

    def walk(self, ctx, rec, node, ins):
        layer = rec.layer
        places = _places(layer, node, rec.path)
        query, value = ins[places["query"]], ins[places["value"]]
        key = ins[places.get("key", places["value"])]
        for i in places["other"]:  # masks: their last axis is key positions, read whole
            ctx.fix(ins[i])
        heads = ctx.new_output(rec, layer.num_heads, kind="heads")[0]
        k_dim, v_dim = layer.key_dim, layer.value_dim or layer.key_dim
        q_shape, v_shape = node.arguments.keras_tensors[places["query"]].shape, \
            node.arguments.keras_tensors[places["value"]].shape
        q_tokens, kv_tokens = math.prod(q_shape[1:-1]), math.prod(v_shape[1:-1])
        per_k, per_v = (Part(heads.segment, k_dim),), (Part(heads.segment, v_dim),)
        whole = {"bias": layer.use_bias, "view": False}  # streams read whole: see the docstring
        ctx.add_kernel(rec, query, per_k, params=1, macs=q_tokens, **whole)
        ctx.add_kernel(rec, key, per_k, params=1, macs=kv_tokens, **whole)
        ctx.add_kernel(rec, value, per_v, params=1, macs=kv_tokens, **whole)
        if getattr(layer, "_use_gate", False):
            ctx.add_kernel(rec, query, per_v, params=1, macs=q_tokens, **whole)
        pairs = _attention_pairs(layer, q_shape, v_shape, rec.path)
        ctx.add_term(rec, 0, pairs * (k_dim + v_dim), heads)
        out = query if _output_width(layer) is None else _new_output_channels(ctx, rec, layer)
        ctx.add_kernel(rec, per_v, out, params=1, macs=q_tokens, bias=layer.use_bias)
        outs = [out]
        for extra in node.outputs[1:]:  # attention scores: (batch, heads, queries, keys)
            outs.append((Part(ctx.new_segment(extra.shape[-1], f"{rec.path}:scores", fixed=True)),))
        return outs

    def configure(self, rec, config, width):
        config["num_heads"] = width(rec.out_segment)
        if _output_width(rec.layer) is not None:
            new = channels_width(rec.outputs[0][0], width)
            shape = config["output_shape"]
            config["output_shape"] = new if isinstance(shape, int) else (*shape[:-1], new)
        return config

    def channel_axes(self, rec, node):
        """Heads along the projections' head axis; streams along their input and output axes.

        A projection's kernel is ``(channels in, heads, per-head dim)``, its
        bias ``(heads, per-head dim)``; the output projection's kernel is
        ``(heads, value_dim, channels out)``.
        """
        layer, places = rec.layer, _places(rec.layer, node, rec.path)
        reads = {"query": _in_role(places["query"]), "key": _in_role(places.get("key", places["value"])),
                 "value": _in_role(places["value"]), "gate": _in_role(places["query"])}
        roles = {}
        for name in (*_PROJECTIONS, "gate"):
            dense = getattr(layer, f"_{name}_dense", None)
            if dense is not None:
                roles[id(dense.kernel)] = {0: reads[name], 1: "unit"}
                if dense.bias is not None:
                    roles[id(dense.bias)] = {0: "unit"}
        out = layer._output_dense
        roles[id(out.kernel)] = {0: "unit_in", out.kernel.ndim - 1: "out"}
        if out.bias is not None:
            roles[id(out.bias)] = {-1: "out"}
        return [roles.get(id(w), {}) for w in layer.weights]


def _new_output_channels(ctx, rec, layer):
    """The channels an ``output_shape`` sets: created on the first call, shared by the later ones."""
    if rec.calls:
        return rec.outputs[0][0]
    return (Part(ctx.new_segment(_output_width(layer), f"{rec.path}:output")),)


def _in_role(index):
    """The role of a kernel axis reading input ``index`` of the call."""
    return "in" if index == 0 else f"in:{index}"


def _places(layer, node, path):
    """``{"query": i, "value": j[, "key": k], "other": [...]}``: where each input sits in ``ins``."""
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
            "model cannot be walked. Keep it whole with {ignore}.", ignore=[layer.name])
    return places


def _output_width(layer):
    """The channels ``output_shape`` sets, or ``None`` when the output keeps the query's."""
    shape = layer._output_shape
    if shape is None:
        return None
    if isinstance(shape, int):
        return shape
    if len(shape) != 1:
        raise UnsupportedLayerError(
            f"{layer.name}: an output_shape of several axes ({tuple(shape)}) is not supported. "
            "Keep the layer whole with {ignore}.", ignore=[layer.name])
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
            "Keep the layer whole with {ignore}.", ignore=[layer.name])
    groups = math.prod(q_shape[a] for a in range(1, rank - 1) if a not in axes)
    return groups * math.prod(q_shape[a] for a in axes) * math.prod(v_shape[a] for a in axes)
