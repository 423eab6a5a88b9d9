"""Channel-level connectivity of masked CNNs: detached weights and channel groups.

A masked weight is *detached* when no path of unmasked weights joins it to
both the model input and the model output; it then never affects a
prediction but still counts as a kept parameter (Vysogorets & Kempe, 2021,
whose removal the PreCrop paper follows in its granularity experiment).
:func:`remove_detached` finds them by propagating, per channel, "reached from
the input" forward and "reaches the output" backward through the masks, call
by call over the walked graph (``keras_precrop.graph.walk``). Each layer is
described by its handler (``keras_precrop.handlers``): kernels by the layer's
maskable weights (``weight_specs``), every other layer by the input channel
each output channel comes from (``channel_map``); a layer without such a map
(softmax, layer normalization, an opaque block) joins every input channel to
every output channel. :func:`channel_priorities` shares one random priority
per channel group of the same walk.

Limits (each raises ``ValueError`` naming the layer rather than guessing):

* The models the graph walker reads: functional or Sequential (nested ones
  are walked in place) with defined input shapes, channels_last layers with a
  handler (``keras_precrop.register_handler`` teaches a custom one). A
  grouped convolution connects each group's inputs to that group's outputs
  (a block-diagonal channel matrix, ``WeightSpec.block_diagonal``).
* Connectivity is tracked per channel, not per spatial position, and biases
  or BN shifts (constant signals) do not make a channel "reached": a masked
  bias is kept when its channel reaches the output.
"""

import keras
import numpy as np

from keras_precrop.graph import walker as _graph
from keras_precrop.pai import common
from keras_precrop.pai.masks import check_masks


def _walk(model, residual):
    """The walked graph of ``model``, with errors saying who needed it."""
    try:
        return _graph.walk(model, residual=residual)
    except ValueError as err:
        raise ValueError(
            "The channel connectivity analysis (remove_detached, channel-granular "
            f"random masks) cannot read model {getattr(model, 'name', model)!r}: {err}"
        ) from err


def _is_softmax(layer):
    return getattr(layer, "activation", None) is keras.activations.softmax


# -- masks of a kernel layer as channel connection matrices -----------------


def _layer_masks(layer, masks):
    """``{variable name: (spec, bool mask, path)}`` of a layer's maskable weights (ones if unmasked)."""
    specs = common.weight_specs(layer)
    return {
        v.name: (specs[v.name], np.asarray(masks.get(v.path, np.ones(v.shape)), bool), v.path)
        for v in getattr(layer, "weights", ())  # a keras.ops operation has none
        if v.name in specs
    }


def _connections(spec, mask):
    """Boolean (in, out) matrix: is any weight between the two channels kept.

    For a depthwise kernel the matrix is (in, multiplier).
    """
    moved = np.moveaxis(mask, (spec.in_axis, spec.out_axis), (-2, -1))
    return spec.block_diagonal(moved.reshape(-1, *moved.shape[-2:]).any(axis=0))


def _kernels(layer, masks):
    """The (spec, mask, path) of the kernels a layer applies, in order."""
    return [w for w in _layer_masks(layer, masks).values() if w[0].kind in ("kernel", "depthwise")]


def _forward_kernel(spec, mask, alive):
    conn = _connections(spec, mask)
    if spec.kind == "depthwise":
        return (alive[:, None] & conn).ravel()
    return (alive[:, None] & conn).any(axis=0)


def _backward_kernel(spec, mask, useful):
    conn = _connections(spec, mask)
    if spec.kind == "depthwise":
        return (conn & useful.reshape(conn.shape)).any(axis=1)
    return (conn & useful[None, :]).any(axis=1)


def _keep_kernel(spec, mask, alive, useful):
    """The mask with weights whose input is unreached or output useless removed."""
    rows = np.asarray(alive)[:, None]
    cols = useful.reshape(-1, mask.shape[spec.out_axis]) if spec.kind == "depthwise" else useful[None, :]
    return mask & common.spread(spec, spec.group_local(rows & cols), mask.ndim)


def _channel_scale(layer, masks):
    """The mask of a per-channel scale (BN gamma) as a channel filter, or ``None``."""
    for spec, mask, path in _layer_masks(layer, masks).values():
        if spec.kind == "scale" and path in masks:
            return mask
    return None


# -- channel flow of the other layers ----------------------------------------


def _channel_maps(call):
    """The call's channel maps (see ``Handler.channel_map``); ``None``: all to all."""
    return call.record.handler.channel_map(call.record, call.node)


def _pieces(call, sizes):
    """Whether the call's channel maps describe its several outputs concatenated (a split)."""
    maps = _channel_maps(call)
    return len(sizes) > 1 and maps is not None and maps[0].size == sum(sizes)


def _spread(out, sizes):
    """A call's per-channel vector for each of its outputs, or ``None`` where it does not fit.

    A vector over all outputs concatenated (a split's) is cut into their
    pieces; otherwise each output of the vector's size gets all of it.
    """
    if len(sizes) > 1 and out.size == sum(sizes):
        return np.split(out, np.cumsum(sizes)[:-1])
    return [out if s == out.size else None for s in sizes]


def _gather(maps, ins, size):
    """Per output channel: does any input channel it comes from hold ``True``."""
    if maps is None:
        return np.full(size, any(x.any() for x in ins))
    out = np.zeros(maps[0].size, bool)
    for x, m in zip(ins, maps):
        out |= (m >= 0) & x[np.maximum(m, 0)]
    return out


def _scatter(maps, ins, out):
    """Per input channel: does any output channel that comes from it hold ``True``."""
    if maps is None:
        return [np.full(x.shape, out.any()) for x in ins]
    result = []
    for x, m in zip(ins, maps):
        back = np.zeros(x.shape, bool)
        np.logical_or.at(back, m[m >= 0], out[m >= 0])
        result.append(back)
    return result


def remove_detached(model, masks):
    """Returns ``masks`` with the weights that no longer join input to output removed.

    Args:
        model: the built model the masks belong to.
        masks: ``{weight path: 0/1 array}`` (e.g. from :func:`random_masks`).

    Returns:
        A new dict with the same keys; each mask keeps a subset of its ones.

    Raises:
        ValueError: for masks that do not fit the model, or a model outside
            the supported class (see the module docstring).
    """
    checked = check_masks(model, masks)
    masks = {p: m for p, (_, _, _, m) in checked.items()}
    graph = _walk(model, "prefix")
    size = {}
    alive = {}
    for k in graph.inputs:
        size[k] = graph.width(graph.tensor_channels[k])
        alive[k] = np.ones(size[k], bool)
    for call in graph.calls:
        for k in call.outputs:
            size[k] = graph.width(graph.tensor_channels[k])
        sizes = [size[k] for k in call.outputs]
        out = _forward(call, [alive[k] for k in call.inputs], masks, sizes[0])
        for k, a in zip(call.outputs, _spread(out, sizes)):
            alive[k] = np.full(size[k], out.any()) if a is None else a
    useful = {k: np.ones(size[k], bool) for k in graph.outputs}
    kept = {p: np.zeros(m.shape, bool) for p, m in masks.items()}
    for call in reversed(graph.calls):
        us = [useful.get(k, np.zeros(size[k], bool)) for k in call.outputs]
        if _pieces(call, [u.size for u in us]):
            out_useful = np.concatenate(us)
        else:
            out_useful = np.zeros(us[0].size, bool)
            for u in us:
                out_useful |= u if u.size == out_useful.size else u.any()
        in_alive = [alive[k] for k in call.inputs]
        for k, u in zip(call.inputs, _backward(call, in_alive, out_useful, masks, kept)):
            useful[k] = useful.get(k, np.zeros(size[k], bool)) | u
    seen = {p for call in graph.calls for (_, _, p) in _layer_masks(call.record.layer, {}).values()}
    return {
        p: (kept[p] if p in seen else np.asarray(m, bool)).astype(np.float32)
        for p, m in masks.items()
    }


def _forward(call, ins, masks, size):
    """Channels of the call's output reached from the model input."""
    layer = call.record.layer
    kernels = _kernels(layer, masks)
    if kernels:
        alive = ins[0]
        for spec, mask, _ in kernels:
            alive = _forward_kernel(spec, mask, alive)
        return alive if not _is_softmax(layer) else np.full(alive.shape, alive.any())
    alive = _gather(_channel_maps(call), ins, size)
    scale = _channel_scale(layer, masks)
    return alive if scale is None else alive & scale


def _backward(call, ins_alive, out_useful, masks, kept):
    """Channels of each call input that reach the output; records kept weights."""
    layer = call.record.layer
    kernels = _kernels(layer, masks)
    if kernels:
        if _is_softmax(layer):
            out_useful = np.full(out_useful.shape, out_useful.any())
        # Forward alive of each kernel's input, then walk the kernels backwards.
        alive_in = [ins_alive[0]]
        for spec, mask, _ in kernels[:-1]:
            alive_in.append(_forward_kernel(spec, mask, alive_in[-1]))
        useful = out_useful
        for (spec, mask, path), alive in zip(reversed(kernels), reversed(alive_in)):
            if path in kept:
                kept[path] |= _keep_kernel(spec, mask, alive, useful)
            useful = _backward_kernel(spec, mask, useful)
        for spec, mask, path in _layer_masks(layer, masks).values():
            if spec.kind == "bias" and path in kept:
                kept[path] |= mask & out_useful
        return [useful]
    maps = _channel_maps(call)
    reached = _gather(maps, ins_alive, out_useful.size)
    for spec, mask, path in _layer_masks(layer, masks).values():
        if path in kept:  # BN gamma needs a reached channel, beta only a useful one
            kept[path] |= mask & (out_useful & reached if spec.kind == "scale" else out_useful)
    scale = _channel_scale(layer, masks)
    return _scatter(maps, ins_alive, out_useful if scale is None else out_useful & scale)


# -- channel groups ----------------------------------------------------------


def channel_priorities(model, rng):
    """Random per-channel priorities shared by every tensor of a channel group.

    The groups are the walker's with residual streams tied
    (``residual="tie"``): tensors tied channel by channel through batch norm,
    activations, pooling, depthwise convs and residual ``Add`` merges share
    one random permutation, so layers that keep their highest-priority
    channels keep nested, aligned channel sets: layer l's kept output
    channels are the ones layer l + 1 reads, as in PreCrop's channel pruning.
    Priorities follow each layer's channel map (a depthwise conv's
    multiplied channels, a flatten's repeats, a concatenation's blocks).

    Returns:
        ``{path: (input priorities, output priorities)}`` for each kernel of
        the model (for a separable conv the pointwise kernel's input is the
        depthwise output), priorities being float arrays, larger kept first.
    """
    graph = _walk(model, "tie")
    ranks = {}

    def of_groups(channels):
        """Priorities of a descriptor, one permutation per group."""
        parts = []
        for p in channels:
            root = graph.find(p.segment)
            if root not in ranks:  # one per unit of the group's variable, tiled per scale
                unit = graph.variables[graph.group_variable(root)].width
                ranks[root] = rng.permutation(unit).astype(np.float64)
            parts.append(np.tile(ranks[root], p.mult * graph.scale(p.segment)))
        return np.concatenate(parts)

    prio = {k: of_groups(graph.tensor_channels[k]) for k in graph.inputs}
    first_calls = {}
    for call in graph.calls:
        first_calls.setdefault(id(call.record), call)
        maps = _channel_maps(call)
        followed = None if maps is None else _follow(maps, [prio[k] for k in call.inputs])
        sizes = [graph.width(graph.tensor_channels[k]) for k in call.outputs]
        pieces = [None] * len(sizes) if followed is None else _spread(followed, sizes)
        for k, p in zip(call.outputs, pieces):
            prio[k] = of_groups(graph.tensor_channels[k]) if p is None else p
    out = {}
    for call in first_calls.values():  # a shared layer's first call sets its priorities
        layer = call.record.layer
        kernels = _kernels(layer, {})
        if not kernels:
            continue
        p_in, p_out = prio[call.inputs[0]], prio[call.outputs[0]]
        for spec, mask, path in kernels:
            if spec.kind == "depthwise":
                multiplier = mask.shape[spec.out_axis]
                out[path] = (p_in, None)
                p_in = np.repeat(p_in, multiplier)
            else:
                out[path] = (p_in, p_out)
        for spec, _, path in _layer_masks(layer, {}).values():
            if spec.kind == "bias":
                out[path] = (None, p_out)
    return out


def _follow(maps, ins):
    """Output priorities taken through channel maps, or ``None`` if some channel has no source."""
    result = np.full(maps[0].size, np.nan)
    for x, m in sorted(zip(ins, maps), key=lambda xm: -xm[0].size):  # broadcast inputs last
        take = (m >= 0) & np.isnan(result)
        result[take] = x[m[take]]
    return None if np.isnan(result).any() else result
