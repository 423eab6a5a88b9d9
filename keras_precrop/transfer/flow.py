"""Following channels through a walked graph, one integer array per tensor.

Both halves of keeping weights label every channel of every tensor: the
importance scores with the channel's width variable and index in it (on the
original graph), the copy with the original channel each channel of the
rebuilt model stands for (on the rebuilt graph). :func:`propagate` visits the
calls in topological order; :func:`through_maps` follows the layers that move
channels (concatenations, flattens, depthwise multipliers, prefix adds) with
their handler's ``channel_map``.
"""

from __future__ import annotations

import numpy as np

from keras_precrop.errors import UnsupportedLayerError


def propagate(graph, start, outputs):
    """An integer array per tensor of ``graph``, computed call by call.

    Args:
        graph: a walked model (``graph.walker.ModelGraph``).
        start: ``start(key)``: the array of a model input's tensor key.
        outputs: ``outputs(call, index, ins)``: the arrays of a call's output
            tensors, from its input tensors' arrays ``ins``; ``index`` counts
            the layer's earlier calls.

    Returns:
        ``{layer path: (first call, arrays of its inputs, array of its first
        output)}``: each layer's first call, where its weights are read.
    """
    arrays = {key: start(key) for key in graph.inputs}
    first = {}
    for (path, index), call in indexed_calls(graph).items():
        ins = [arrays[key] for key in call.inputs]
        outs = outputs(call, index, ins)
        arrays.update(zip(call.outputs, outs))
        if index == 0:
            first[path] = (call, ins, outs[0])
    return first


# Which array a weight axis of each role (``Handler.channel_axes``) is indexed by.
_UNIT_ROLES = ("unit", "unit_in")


def unit_block(role):
    """``(role, block)``: a unit role ``"unit*<g>"`` / ``"unit_in*<g>"`` is an axis of ``g``
    consecutive entries per unit (a grouped-query layer's query heads of each key-value head);
    every other role is its own entry per channel, ``block`` 1."""
    base, _, block = role.partition("*")
    return base, int(block or 1)


def role_array(role, ins, out, unit):
    """The channels along a weight axis of ``role``: of an input, the output or the layer's units.

    Args:
        role: ``"out"``; ``"in"``, ``"group_in"``, ``"mid"``, ``"channel"``
            (the first input's channels); ``"in:<i>"`` (input ``i``'s, e.g.
            an attention layer's key and value); ``"unit"``/``"unit_in"``
            (the units the layer creates inside, e.g. attention heads,
            written and read; with ``*<g>``, ``g`` entries per unit: the
            array is the units', one entry per unit).
        ins, out: the arrays of the call's inputs and first output.
        unit: the array of the layer's own units (``None`` if it has none).
    """
    role = unit_block(role)[0]
    if role == "out":
        return out
    if role in _UNIT_ROLES:
        return unit
    if role.startswith("in:"):
        return ins[int(role[3:])]
    return ins[0]


def side(role):
    """Whether an axis of ``role`` writes (``"out"``), reads (``"in"``) or is the layer's units."""
    role = unit_block(role)[0]
    return "unit" if role in _UNIT_ROLES else "out" if role == "out" else "in"


def unit_variable(graph, rec):
    """The width variable of the units layer ``rec`` creates (attention heads), or ``None``."""
    if rec.out_segment is None:
        return None
    return graph.group_variable(rec.out_segment)


def indexed_calls(graph):
    """``{(layer path, index of the call): call}`` of every call of ``graph``, in topological order."""
    out, counts = {}, {}
    for call in graph.calls:
        path = call.record.path
        counts[path] = counts.get(path, -1) + 1
        out[(path, counts[path])] = call
    return out


def through_maps(maps, ins, value):
    """An output array from a call's channel maps (see ``Handler.channel_map``).

    Each output channel ``o`` reads channel ``maps[i][o]`` of input ``i``;
    the widest input that it reads from decides (a prefix add's narrower
    writers and a broadcast gate agree with it, or say less).

    Args:
        maps: one int array per input, of the output's width (``-1``: none).
        ins: the inputs' arrays.
        value: ``value(i, o, c)``: the output's entries at positions ``o``
            that read channels ``c`` of input ``i``.
    """
    out = np.full(len(maps[0]), -1, np.int64)
    done = np.zeros(len(maps[0]), bool)
    for i in sorted(range(len(ins)), key=lambda i: -len(ins[i])):
        o = np.flatnonzero((maps[i] >= 0) & ~done)
        out[o] = value(i, o, maps[i][o])
        done[o] = True
    return out


def plain_variable(graph, channels):
    """The width variable of a plain descriptor (one part, no multiplier), else ``None``."""
    if len(channels) == 1 and channels[0].mult == 1:
        return graph.group_variable(channels[0].segment)
    return None


def per_channel(graph, channels, array, step):
    """A plain descriptor's array from its variable's ``array`` (one entry per unit channel).

    A variable counts its group in units (see ``ModelGraph.scale``): a tensor
    that a split cuts into pieces is ``scale`` blocks of the variable's
    channels, each piece some of those blocks. Every block keeps the same
    channels of the variable, so the pieces of a pruned tensor are the
    pieces of the original, pruned: block ``b`` holds ``array + b * step``
    (``-1``, a new channel, stays ``-1``).
    """
    scale = graph.scale(channels[0].segment)
    return np.concatenate([np.where(array >= 0, array + b * step, -1) for b in range(scale)])


def same_as_input(graph, call, channels, ins):
    """The first input's array, for a layer whose output channels are its input's (no channel map)."""
    if channels != graph.tensor_channels[call.inputs[0]]:
        raise UnsupportedLayerError(
            f"{call.record.path}: cannot follow its channels to carry weights (its handler has no "
            "channel map). Keep its channels with {ignore}.", ignore=[call.record.path])
    return ins[0]
