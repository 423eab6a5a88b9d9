"""How channels flow through grouped-query attention: ``keras.layers.GroupQueryAttention``.

The layer has ``num_query_heads = g x num_key_value_heads`` query heads;
query head ``n`` attends with key-value head ``n // g`` (the layer repeats
each key and value head ``g`` times), so a key-value head and its ``g``
consecutive query heads form a group that goes or stays whole. Under
``attention="heads"`` the unit is such a group: one segment of
``num_key_value_heads`` units, each with ``g x head_dim`` query (and gate)
channels, ``head_dim`` key and value channels and the output projection's
``g x head_dim`` rows; the rebuilt layer keeps the ratio ``g`` (its config
says ``num_key_value_heads = k`` and ``num_query_heads = g x k``). Under
``attention="head_dims"`` the unit is one index of ``head_dim``, the same
in every query and key-value head, as for ``MultiHeadAttention``
(``graph/attention.py``, whose call reading this module shares). Freeing
groups and the query heads within a group in one plan would make the query
costs a product of two widths, which the cost model cannot state: one or
the other per plan (the design note ``docs/design/language-models.md``).

The layer takes query, key and value of one width, so cross-attention ties
the context's stream to the query's. MACs are the four projections' plus the
two attention products (``QK^T`` and ``AV``: query tokens x key tokens x
query heads x ``head_dim`` each).
"""

from __future__ import annotations

import math

from keras_precrop.graph.attention import call_places, projection_reads, read_call
from keras_precrop.graph.channels import Part
from keras_precrop.graph.handler_base import Handler

_PROJECTIONS = ("query", "key", "value", "gate")


class GroupedQueryAttention(Handler):
    """``keras.layers.GroupQueryAttention``: groups (or head dimensions) as units, exact costs.

    The rebuilt layer's config says the new ``num_key_value_heads`` and
    ``num_query_heads`` (or, under ``attention="head_dims"``, the new
    ``head_dim``), so it saves and loads as is.
    """

    def walk(self, ctx, rec, node, ins):
        layer = rec.layer
        places, query, key, value = read_call(ctx, rec, node, ins)
        for other in (key, value):  # the layer takes query, key and value of one width
            ctx.tie(query, other, rec.path)
        per_query, per_kv, unit, per_pair = _units(ctx, rec, layer)
        tensors = node.arguments.keras_tensors
        q_tokens = math.prod(tensors[places["query"]].shape[1:-1])
        kv_tokens = math.prod(tensors[places["value"]].shape[1:-1])
        whole = {"bias": layer.use_bias, "view": False}  # streams read whole, as attention.py's
        ctx.add_kernel(rec, query, per_query, params=1, macs=q_tokens, **whole)
        ctx.add_kernel(rec, key, per_kv, params=1, macs=kv_tokens, **whole)
        ctx.add_kernel(rec, value, per_kv, params=1, macs=kv_tokens, **whole)
        if layer.use_gate:
            ctx.add_kernel(rec, query, per_query, params=1, macs=q_tokens, **whole)
        ctx.add_term(rec, 0, q_tokens * kv_tokens * per_pair, unit)
        ctx.add_kernel(rec, per_query, query, params=1, macs=q_tokens, bias=layer.use_bias)
        outs = [query]  # the output keeps the query's channels (its feature_dim)
        for extra in node.outputs[1:]:  # attention scores: (batch, heads, queries, keys)
            outs.append((Part(ctx.new_segment(extra.shape[-1], f"{rec.path}:scores", fixed=True)),))
        return outs

    def configure(self, rec, config, width):
        if rec.out_kind == "head_dims":
            config["head_dim"] = width(rec.out_segment)
        else:
            kept = width(rec.out_segment)
            config["num_query_heads"] = _group(rec.layer) * kept
            config["num_key_value_heads"] = kept
        return config

    def channel_axes(self, rec, node):
        """Units along the projections' head axis (a query head axis holds ``g`` entries per
        group) or their ``head_dim`` axis; streams along their input and output axes.

        A projection's kernel is ``(channels in, heads, head_dim)``, its bias
        ``(heads, head_dim)``; the output projection's kernel is
        ``(query heads, head_dim, channels out)``.
        """
        layer = rec.layer
        reads = projection_reads(call_places(layer, node, rec.path))
        # A query head axis holds g entries per group; a head_dim axis one per unit.
        axis, block = (2, "") if rec.out_kind == "head_dims" else (1, f"*{_group(layer)}")
        roles = {}
        for name in _PROJECTIONS:
            dense = getattr(layer, f"_{name}_dense", None)
            if dense is None:
                continue
            units = "unit" if name in ("key", "value") else f"unit{block}"
            roles[id(dense.kernel)] = {0: reads[name], axis: units}
            if dense.bias is not None:
                roles[id(dense.bias)] = {axis - 1: units}
        out = layer._output_dense
        roles[id(out.kernel)] = {axis - 1: f"unit_in{block}", 2: "out"}
        if out.bias is not None:
            roles[id(out.bias)] = {-1: "out"}
        return [roles.get(id(w), {}) for w in layer.weights]

    def carried_value(self, rec, new_layer, weight, value):
        """The query projection's carried kernel and bias, rescaled where ``head_dim`` changed
        (queries are scaled by ``1/sqrt(head_dim)``; see ``MultiHeadAttention.carried_value``)."""
        if rec.out_kind != "head_dims" or all(weight is not w for w in rec.layer._query_dense.weights):
            return value
        factor = math.sqrt(new_layer.head_dim / rec.layer.head_dim)
        return (value * factor).astype(value.dtype)


def _group(layer):
    """``g``: the query heads of each key-value head."""
    return layer.num_query_heads // layer.num_key_value_heads


def _units(ctx, rec, layer):
    """The units ``layer`` is pruned by (the walk's ``attention=``), and what each costs.

    Returns:
        ``(query/gate/output channels, key/value channels, the units, the
        attention products' MACs per unit and (query, key) pair)``.
    """
    query_heads, kv_heads, dim = layer.num_query_heads, layer.num_key_value_heads, layer.head_dim
    if ctx.attention == "head_dims":
        dims = ctx.new_output(rec, dim, kind="head_dims")[0]
        return (Part(dims.segment, query_heads),), (Part(dims.segment, kv_heads),), dims, 2 * query_heads
    groups = ctx.new_output(rec, kv_heads, kind="heads")[0]
    g = _group(layer)
    return (Part(groups.segment, g * dim),), (Part(groups.segment, dim),), groups, 2 * g * dim
