"""Carrying the surviving channels' trained weights into a rebuilt model.

The rebuilt model is walked too, and every tensor of it gets the original
channel each of its channels stands for: a tensor of a plain width variable
takes the variable's selection (``selection.py``); a tensor built by a layer
that moves channels (a concatenation, a flatten, a depthwise multiplier)
follows the original and the rebuilt layer's channel maps, copy by copy; a
``ChannelSlice`` the rebuild put in front of a reader keeps a prefix of its
input. Each layer's weights are then sliced along the axes its handler names
(``Handler.channel_axes``) to the channels of its first input and output.

New channels (a layer that grows) start from the rebuilt layer's
initializer, except the weights that read them (a kernel's input slice, a
separable conv's pointwise rows), which start at zero: the model computes
what the original did until training moves them.
"""

from __future__ import annotations

import math

import keras
import numpy as np

from keras_precrop.errors import ArgumentError, UnsupportedLayerError
from keras_precrop.graph.channels import input_shape
from keras_precrop.transfer import flow
from keras_precrop.transfer.criteria import Names, criterion
from keras_precrop.transfer.importance import channel_scores, grouped
from keras_precrop.transfer.selection import select


def check_options(weights, importance, data, place="kp.precrop/reconfigure/apply_plan",
                  refit=False):
    """Checks the weight options of ``apply_plan`` and ``precrop`` (and ``GradualPruning``'s ranking).

    Args:
        weights: ``None`` (fresh weights) or ``"keep"``.
        importance: a name of the table of rankings or a ranking
            (``criteria.py``); ``None`` is ``"l1"``.
        data: the batches a ranking that needs data takes, or a refit; for
            nothing else.
        place: where the ranking is to rank (a key of ``criteria.PLACES``):
            the table's need of the ranking decides whether it can.
        refit: whether the kept weights are refit on ``data`` (``refit.py``).

    Returns:
        The :class:`~keras_precrop.transfer.criteria.Importance` to choose
        channels by, or ``None`` for fresh weights.

    Raises:
        ArgumentError: naming the argument at fault.
    """
    if not isinstance(refit, (bool, np.bool_)):
        raise ArgumentError("{refit} must be True (refit the kept weights of every linear "
                            "projection by least squares on data=) or False.", refit=refit)
    if weights is None:
        if refit:
            raise ArgumentError("{refit} refits the weights the cut kept; it needs "
                                "{weights:keep}.", refit=refit)
        if importance is not None or data is not None:
            raise ArgumentError("{importance} and {data:=} choose the channels that keep their "
                                "trained weights; they need {weights:keep}.", importance=importance)
        return None
    if not (isinstance(weights, str) and weights == "keep"):
        raise ArgumentError("{weights} must be None (fresh weights, as PreCrop prescribes) or 'keep' "
                            "(the channels that survive keep their trained weights).", weights=weights)
    ranking = criterion(importance, place)
    if refit and data is None:
        raise ArgumentError("{refit} fits each projection to the original's outputs on "
                            "calibration batches: pass them as {data:=} (batches of inputs x, "
                            "or (x, y) batches: the labels are not read).", refit=refit)
    if ranking.needs == "data" and data is None:
        raise ranking.missing_data()
    if ranking.needs != "data" and data is not None and not refit:
        needing = list(Names(needs=["data"]))
        raise ArgumentError(f"{{data:=}} is for a ranking that needs data ({needing}) or "
                            f"{{refit:True}}; {{importance}} takes none: leave data= out, rank "
                            f"with one of {needing}, or refit.", importance=ranking.given,
                            refit=refit)
    return ranking


def carry_weights(graph, new_model, widths, importance="l1", gradients=None, seed=0, *, new_graph,
                  selection=None):
    """Copy the trained weights of the channels that survive from ``graph.model`` into ``new_model``.

    Each weight's ``trainable`` flag comes along: a weight frozen on its own
    stays frozen (its layer's config, which the rebuild reads, does not say).

    Args:
        graph: the walked original model.
        new_model: the model ``graph.rebuild(graph, widths)`` built; its
            weights are overwritten.
        new_graph: the walk of ``new_model`` (the check of the rebuild made it;
            a model is walked once per call).
        widths: the new width of every variable of ``graph.variables``.
        importance: how channels are chosen (see ``importance.py``).
        gradients: for ``"taylor"``, one ``{id(weight): gradient}`` per batch.
        seed: the seed of ``"random"``.
        selection: the channels to keep, chosen before (gradual pruning's
            last masks); ``None`` ranks them by ``importance`` now.

    Returns:
        ``{variable index: original channel of each new channel (-1: new)}``.
    """
    values = weight_values(graph.model)  # read once
    if selection is None:
        scores = channel_scores(graph, values, importance, gradients, seed, widths)
        selection = select(graph, widths, scores)
    for old_w, new_w, value in carried(graph, new_graph, widths, selection, values):
        new_w.assign(value)
        new_w.trainable = old_w.trainable  # a weight frozen alone (its layer's config does not say)
    return selection


def weight_values(model):
    """``{id(weight): numpy array}`` of every weight of ``model``: what scores and carrying read."""
    return {id(w): keras.ops.convert_to_numpy(w) for w in model.weights}


def carried_indices(graph, new_graph, widths, selection):
    """Each rebuilt weight with the flat index of the original element each of its elements takes.

    Indices count from 1, in float64 (exact to 2**53); 0 marks a new element.
    What gradual pruning's masks and a refit's kept outputs are read from.

    Yields:
        ``(original weight, rebuilt weight, array of the rebuilt weight's shape)``.
    """
    yield from carried(graph, new_graph, widths, selection, _FlatIndices(graph.model.weights),
                       values_of_weights=False)


class _FlatIndices:
    """``{id(weight): its flat indices from 1}`` over ``weights``, each array made when it is read:
    the walk holds one weight's indices at a time, not a float64 for every parameter at once."""

    def __init__(self, weights):
        self._shapes = {id(w): tuple(w.shape) for w in weights}

    def __getitem__(self, key):
        shape = self._shapes[key]
        return np.arange(1, math.prod(shape) + 1, dtype=np.float64).reshape(shape)


def carried(graph, new_graph, widths, selection, values, values_of_weights=True):
    """Each weight of the rebuilt model with the value it takes from the original's.

    The one traversal behind :func:`carry_weights`; gradual pruning carries
    each weight's flat indices through it to learn which elements a rebuild
    keeps (its masks).

    Args:
        graph, new_graph: the walks of the original and the rebuilt model.
        widths: the new width of every variable.
        selection: the original channel of each new channel, per variable
            (:func:`~keras_precrop.transfer.selection.select`).
        values: ``{id(original weight): numpy array}`` to carry.
        values_of_weights: whether ``values`` are the weights' values, which
            a layer's handler may rescale as it carries them
            (:meth:`~keras_precrop.graph.handler_base.Handler.carried_value`:
            attention's queries under fewer dimensions per head); ``False``
            for other arrays of the weights' shapes (flat indices), carried
            as sliced.

    Yields:
        ``(original weight, rebuilt weight, carried numpy value)``.
    """
    old_calls = flow.indexed_calls(graph)
    new_layers = {rec.path: rec.layer for rec in new_graph.layers}
    grows = any(w > v.width for w, v in zip(widths, graph.variables))
    for path, (_, ins, out_sel) in _tensor_selections(graph, new_graph, selection, old_calls).items():
        old = old_calls.get((path, 0))
        if old is None or not getattr(old.record.layer, "weights", None):
            continue
        if not grows and min(a.min(initial=0) for a in (*ins, out_sel)) < 0:
            raise UnsupportedLayerError(  # a channel lost on the way: never carry a guess
                f"{path}: cannot follow the kept channels to carry its weights. Keep its "
                "channels with {ignore}.", ignore=[old.record.path])
        unit = flow.unit_variable(graph, old.record)
        selections = (ins, out_sel, None if unit is None else selection[unit])
        yield from _carried_layer(old, new_layers[path], values, selections, values_of_weights)


def _tensor_selections(graph, new_graph, selection, old_calls):
    """Each rebuilt layer's first call, with the original channels of its inputs and first output."""

    def outputs(call, index, ins):
        rec = call.record
        maps = rec.handler.channel_map(rec, call.node)
        if maps is None and len(ins) == 1 and len(ins[0]) == 1:  # every output reads the one input
            maps = [np.zeros(new_graph.width(new_graph.tensor_channels[call.outputs[0]]), np.int64)]
        old = old_calls.get((rec.path, index))
        if old is None:  # a ChannelSlice the rebuild put in front of a reader
            return [ins[0][maps[0]]]
        _refuse_mixing_new_channels(graph, old, maps, ins)
        return [_selected(graph, selection, old, key, maps, ins) for key in old.outputs]

    return flow.propagate(
        new_graph, lambda key: np.arange(new_graph.width(new_graph.tensor_channels[key])), outputs)


def _selected(graph, selection, old, key, maps, ins):
    """The original channels of the rebuilt counterpart of ``old``'s output tensor ``key``."""
    channels = graph.tensor_channels[key]
    v = flow.plain_variable(graph, channels)
    if v is not None:
        return flow.per_channel(graph, channels, selection[v], graph.variables[v].width)
    old_maps = old.record.handler.channel_map(old.record, old.node)
    if maps is None or old_maps is None:
        return flow.same_as_input(graph, old, channels, ins)

    def value(i, o, c):  # the copy of the same input channel, by its rank among copies
        return _nth(old_maps[i], ins[i][c], _ranks(maps[i])[o])

    return flow.through_maps(maps, ins, value)


def _ranks(m):
    """For each position of ``m``, how many earlier positions hold the same value."""
    order = np.argsort(m, kind="stable")
    ranks = np.empty(len(m), np.int64)
    ranks[order] = np.arange(len(m)) - np.searchsorted(m[order], m[order])
    return ranks


def _nth(m, values, ranks):
    """The position of the ``ranks``-th occurrence of each of ``values`` in ``m`` (``-1``: none)."""
    order = np.argsort(m, kind="stable")
    ordered = m[order]
    pos = np.searchsorted(ordered, values) + ranks
    found = (values >= 0) & (pos < len(m))
    pos = np.where(found, pos, 0)
    found &= ordered[pos] == values
    return np.where(found, order[pos], -1)


def _refuse_mixing_new_channels(graph, old, maps, ins):
    """Refuse new channels into a layer that mixes channels without weights of its own per pair.

    A normalization over the channel axis (LayerNormalization, GroupNormalization, a
    softmax) would see the new channels and change the trained channels' outputs. A
    layer with a kernel that reads its input channels (a convolution applied to its own
    output) does not: the kernel's new input rows start at zero.
    """
    rec = old.record
    reads = any(role in ("in", "group_in") for axes in rec.handler.channel_axes(rec, old.node)
                for role in axes.values())
    if (maps is None and not reads and (ins[0] < 0).any()
            and graph.tensor_channels[old.outputs[0]] == graph.tensor_channels[old.inputs[0]]):
        raise ArgumentError(
            f"{{weights}} cannot widen the channels of {rec.path!r} ({rec.class_name}): it "
            "normalizes over the channel axis, so new channels would change what the trained "
            "ones compute. Keep its width with {ignore}.", weights="keep", ignore=[rec.path])


def _carried_layer(old, new_layer, values, selections, values_of_weights=True):
    """Each weight of ``new_layer`` with the kept slices of the original layer's.

    ``selections`` holds the original channels of the call's inputs (a list),
    of its first output, and of the units the layer creates (``None`` if none);
    ``values_of_weights``: as for :func:`carried`.
    """
    rec = old.record
    width = input_shape(old.node)[-1]
    axes = rec.handler.channel_axes(rec, old.node)
    for w, new_w, roles in zip(rec.layer.weights, new_layer.weights, axes, strict=True):
        carried = _sliced(values[id(w)], new_w, roles, selections, width)
        if values_of_weights:
            carried = rec.handler.carried_value(rec, new_layer, w, carried)
        if carried.shape != tuple(new_w.shape):
            raise UnsupportedLayerError(
                f"{rec.path}: cannot carry its weight {w.name!r} of shape {tuple(w.shape)} over to "
                f"shape {tuple(new_w.shape)}. Keep its channels with {{ignore}}.",
                ignore=[rec.path])
        yield w, new_w, carried


def _sliced(value, new_w, roles, selections, width):
    """``value`` sliced along its channel axes (``roles``) for weight ``new_w``.

    New channels (``-1``) take ``new_w``'s initial value, or zero where they
    are read (a kernel's input rows, an attention output's rows of a new head).
    """
    if not roles:
        return value
    spec = grouped(width, value) if "group_in" in roles.values() else None
    if spec is not None:  # gather over all inputs, zero across groups
        value = spec.block_diagonal(value)
    zero = fresh = np.zeros((1,) * value.ndim, bool)
    for axis, role in roles.items():
        index = flow.role_array(role, *selections)
        # "mid": each input channel's depth_multiplier channels in turn; "unit*<g>": each unit's g.
        m = value.shape[axis] // width if role == "mid" else flow.unit_block(role)[1]
        if m > 1:
            index = np.where(index[:, None] >= 0, index[:, None] * m + np.arange(m), -1).ravel()
        value = np.take(value, np.maximum(index, 0), axis=axis)
        shape = [1] * value.ndim
        shape[axis] = len(index)
        new = (index < 0).reshape(shape)
        if flow.unit_block(role)[0] in ("out", "channel", "unit"):
            fresh = fresh | new
        else:
            zero = zero | new
    if fresh.any():  # a layer that grows: its new channels start from the initializer
        init = keras.ops.convert_to_numpy(new_w)
        value = np.where(fresh, init if spec is None else spec.block_diagonal(init), value)
    value = np.where(zero, 0, value).astype(value.dtype)
    return value if spec is None else spec.group_local(value)
