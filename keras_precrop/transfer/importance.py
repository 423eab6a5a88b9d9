"""How much each channel of a trained model matters: one score per channel of each width variable.

A channel's score sums, over every layer that produces or consumes it (a
conv's output filter and bias, the BatchNormalization after it, the next
conv's input slice, a depthwise slab, a dense layer's rows behind a
flatten, ...), the magnitude of that layer's weights on the channel. The
layers come from the walk: a channel of a coupled group (a residual stream, a
concatenation's part) is scored by every member of the group, and a channel
read through a flatten or a depthwise multiplier sums all its copies.

Each layer gives two shares, one from the weights that write the channel
(filter, bias, gamma and beta) and one from those that read it, each divided
by its mean over the channels it touches, so every layer weighs alike (a 3x3
conv over 512 inputs would otherwise drown the BatchNormalization and the
conv it feeds).

The magnitude each weight gives its channels is the ranking's, from the one
table of rankings (``criteria.py``: the built-in ones and the user's), called on the
weight's rows, one per channel index along a channel axis (with the loss
gradients in the same layout, per batch, for a ranking that needs data); a
ranking that needs a seed scores every channel at once. For Taylor, ``sum
w * dL/dw`` over the weights that write a channel is the written activation
times its gradient (a conv's output before the BatchNormalization, the
BatchNormalization's output), and over those that read it, the read
activation times the gradient that flows back through that reader, so
weight gradients suffice, on every backend. A ranking that reads
activations (``"activation"``) scores the same axes by the mean magnitude
of the activation each writes or reads instead (``activation.py``), each
activation once per share.

Moving statistics and other non-trainable weights are carried, not scored.
"""

from __future__ import annotations

import numpy as np

from keras_precrop.errors import ArgumentError
from keras_precrop.graph.channels import input_shape
from keras_precrop.graph.handlers import WeightSpec
from keras_precrop.transfer import flow
from keras_precrop.transfer.activation import layer_magnitudes, source
from keras_precrop.transfer.criteria import IMPORTANCE, criterion
from keras_precrop.transfer.selection import families
from keras_precrop.transfer.taylor import DataBatches

__all__ = ["IMPORTANCE", "channel_scores", "grouped"]


def channel_scores(graph, values, importance, gradients=None, seed=0, widths=None):
    """Importance of every original channel of every width variable that is a group.

    Args:
        graph: the walked original model.
        values: ``{id(weight): numpy array}`` of the model's weights.
        importance: a name of the table of rankings (:data:`IMPORTANCE`) or
            a ranking (see ``criteria.py``).
        gradients: for a ranking that needs data: the batches of ``data=``
            (``taylor.data_batches``), which give one ``{id(weight): loss
            gradient}`` per batch for the trainable weights of
            ``graph.model`` (``"taylor"`` takes such a list too) and the
            activations (``"activation"``).
        seed: the seed of a ranking that needs one (``"random"``).
        widths: the widths the scores will cut to; for a ranking that scores
            only some weights (``"bn_scale"``), checked to cut only channels
            those weights touch.

    Returns:
        ``{variable index: float array over its original channels}`` for
        each variable that is not a view (views read their stream's channels).

    Raises:
        ArgumentError: a ranking that reads activations without the
            batches of ``data=``; a ranking that scores only some weights where
            ``widths`` cut a family of channels some of which none of them
            touches; a ranking that returns other than one score per row it
            is given.
    """
    ranking = criterion(importance)
    variables = graph.variables
    groups = [i for i, v in enumerate(variables) if v.kind != "view"]
    offsets = dict(zip(groups, np.cumsum([0] + [variables[i].width for i in groups])))
    total = sum(variables[i].width for i in groups)
    if ranking.needs == "seed":
        flat = _checked(ranking, ranking(np.random.default_rng(seed), total), total)[0]
        return _split(flat, variables, groups, offsets)
    scores, covered = np.zeros(total), np.zeros(total, bool)
    calls = []
    for call, origin_ins, origin_out in _origins(graph, offsets).values():
        unit = flow.unit_variable(graph, call.record)
        calls.append((call, (origin_ins, origin_out, None if unit is None else
                             offsets[unit] + np.arange(variables[unit].width)), _weighed(call, ranking)))
    if ranking.reads == "activations":
        magnitudes = _magnitudes(graph, ranking, gradients, calls)
        for call, origins, weighed in calls:
            _score_activations(call, origins, weighed, (ranking, magnitudes), (scores, covered))
    else:
        for call, origins, weighed in calls:
            _score_layer(call, origins, weighed, (values, ranking, gradients), (scores, covered))
    if ranking.covers is not None and widths is not None:
        _refuse_uncovered(graph, widths, _split(covered, variables, groups, offsets), ranking)
    return _split(scores, variables, groups, offsets)


def _split(flat, variables, groups, offsets):
    """``{variable index: its slice of the flat per-channel array}``."""
    return {i: flat[offsets[i]:offsets[i] + variables[i].width] for i in groups}


def _refuse_uncovered(graph, widths, covered, ranking):
    """Refuse a ranking that scores only some weights (``"bn_scale"``: the normalization scales)
    where the widths cut a family with channels none of those weights touches.

    Such channels would score 0 and go first, whatever they carry.
    """
    variables, uncovered = graph.variables, []
    for root, members in families(variables).items():
        if all(widths[i] >= variables[i].width for i in members):
            continue
        touched = np.zeros(variables[root].width, bool)
        for i in (i for i in members if i in covered):
            width = min(len(covered[i]), len(touched))
            touched[:width] |= covered[i][:width]
        if not touched.all():
            uncovered.append(f"{variables[root].name!r} (layers {variables[root].layers[:3]})")
    if uncovered:
        raise ArgumentError(
            "{importance} ranks channels by " + ranking.covers.replace("{", "{{").replace("}", "}}")
            + ", but the plan cuts channels that none of those weights touches: "
            + ", ".join(uncovered) + ". Rank them by 'l1' or 'taylor' instead.",
            importance=ranking.given)


def _origins(graph, offsets):
    """Each layer's first call with the global ids of its inputs' and first output's channels.

    A channel's id is ``offsets[v] + c``: channel ``c`` of width variable ``v``.
    """
    variables = graph.variables

    def ids(channels):  # every block of a split tensor scores the variable's channels
        v = flow.plain_variable(graph, channels)
        return None if v is None else flow.per_channel(
            graph, channels, offsets[v] + np.arange(variables[v].width), 0)

    def outputs(call, index, ins):
        rec = call.record
        outs = []
        for key in call.outputs:
            channels = graph.tensor_channels[key]
            out = ids(channels)
            if out is None:
                maps = rec.handler.channel_map(rec, call.node)
                out = (flow.through_maps(maps, ins, lambda i, o, c: ins[i][c]) if maps is not None
                       else flow.same_as_input(graph, call, channels, ins))
            outs.append(out)
        return outs

    return flow.propagate(graph, lambda key: ids(graph.tensor_channels[key]), outputs)


def _weighed(call, ranking):
    """``[(weight, {axis: role})]``: the weights of a call's layer the ranking scores, with their
    channel axes (not statistics, weights without channels, frozen weights, those it does not weigh)."""
    rec = call.record
    weights = getattr(rec.layer, "weights", [])  # keras.ops operations have none
    return [(w, roles) for w, roles in zip(weights, rec.handler.channel_axes(rec, call.node))
            if w.trainable and roles and ranking.weighs(rec.layer, w)]


def _score_layer(call, origins, weighed, method, scores):
    """Add one layer's share to the scores of the channels it reads and writes.

    The layer's weights on the channels it writes (kernel filters, bias,
    gamma and beta) add up to one share, those on the channels it reads to
    another, those on the units it creates inside (attention heads) to a
    third; ``origins`` holds the global ids of the call's inputs' channels
    (a list), of its first output's and of its units' (see
    ``flow.role_array``). Each weight of ``weighed`` (:func:`_weighed`) is
    scored by the ranking (``method``: the weights' values, the ranking and
    the gradients of one that needs data); the channels of the weights it
    scores are marked in ``scores[1]``. A ranking that needs data scores
    only the weights that have gradients.
    """
    values, ranking, gradients = method
    scores, covered = scores
    width = input_shape(call.node)[-1]
    sides = {"in": [], "out": [], "unit": []}
    for w, roles in weighed:
        grads = [g[id(w)] for g in gradients or () if id(w) in g]
        value = values[id(w)].astype(np.float64)
        if "group_in" in roles.values():  # all inputs, zero across groups
            spec = grouped(width, value)
            value, grads = spec.block_diagonal(value), [spec.block_diagonal(g) for g in grads]
        for axis, role in roles.items():
            ids = flow.role_array(role, *origins)
            if role == "mid":
                ids = np.repeat(ids, value.shape[axis] // width)
            block = flow.unit_block(role)[1]
            if block > 1:  # a unit's block of entries
                ids = np.repeat(ids, block)
            covered[np.ravel(ids)] = True
            if ranking.needs != "data" or grads:
                sides[flow.side(role)].append((ids, _per_index(ranking, value, grads, axis)))
    for parts in sides.values():
        if parts:
            _accumulate(scores, parts)


def _magnitudes(graph, ranking, batches, calls):
    """The activation magnitudes a ranking that reads activations scores the ``calls`` by (see
    ``activation.py``), from the forward passes of the model ``batches`` (``taylor.DataBatches``) holds."""
    if not isinstance(batches, DataBatches):
        raise ranking.missing_data()
    scored = [(call, weighed) for call, _, weighed in calls if weighed]
    return layer_magnitudes(graph, batches.model, batches.batches, scored)


def _score_activations(call, origins, weighed, method, scores):
    """Add one layer's shares, as :func:`_score_layer` does, from its activations' magnitudes.

    Each source a weight axis of the layer is scored by (its output, an
    input, its units: ``activation.source``) counts once in its side's share,
    however many weights have an axis on it: ``method`` is the ranking and
    ``{id(layer): {source: magnitudes per batch}}``.
    """
    ranking, magnitudes = method
    scores, covered = scores
    sides, done = {"in": [], "out": [], "unit": []}, set()
    for _, roles in weighed:
        for role in roles.values():
            ids = flow.role_array(role, *origins)
            covered[np.ravel(ids)] = True
            if source(role) not in done:
                done.add(source(role))
                rows = ranking(_per_unit(magnitudes[id(call.record.layer)][source(role)], role))
                sides[flow.side(role)].append((ids, _checked(ranking, rows, len(ids))))
    for parts in sides.values():
        if parts:
            _accumulate(scores, parts)


def grouped(width, kernel):
    """The spec of a grouped kernel ``(..., width / groups, filters)`` that reads ``width`` channels."""
    return WeightSpec("kernel_constraint", "kernel", -2, -1, groups=width // kernel.shape[-2])


def _per_index(ranking, value, grads, axis):
    """The ranking's scores per index along ``axis``: one row, or one per batch (Taylor's
    ``sum w * dL/dw``), from the weight's rows (and the gradients' for a ranking that needs data)."""
    rows = _rows(value, axis)
    out = ranking(rows, [_rows(g, axis) for g in grads]) if ranking.needs == "data" else ranking(rows)
    return _checked(ranking, out, len(rows))


def _rows(value, axis):
    """``value`` with one row per index along ``axis``, the rest flattened."""
    return np.moveaxis(value, axis, 0).reshape(value.shape[axis], -1)


def _per_unit(magnitudes, role):
    """``(batches, entries)`` magnitudes of an axis of ``role`` summed over each unit's block of
    entries (``"unit*<g>"``: a key-value head's ``g`` query heads), one column per unit."""
    block = flow.unit_block(role)[1]
    return magnitudes if block == 1 else magnitudes.reshape(len(magnitudes), -1, block).sum(axis=2)


def _checked(ranking, scores, count):
    """A ranking's scores as a float64 array of rows of ``count`` (refused otherwise)."""
    try:
        scores = np.atleast_2d(np.asarray(scores, np.float64))
    except (TypeError, ValueError):
        scores = None
    if scores is None or scores.ndim != 2 or scores.shape[1] != count:
        got = "no array of numbers" if scores is None else f"shape {scores.shape}"
        raise ArgumentError(f"{{importance}} must return {count} scores, one per row it is given "
                            f"(a row of them per batch for a ranking that needs data), got {got}.",
                            importance=ranking.given)
    return scores


def _accumulate(scores, parts):
    """Add one share: ``(channel ids, per-index rows)`` summed per channel, the absolute value
    summed over rows (Taylor's batches), divided by its mean over the channels it touches."""
    channels, where = np.unique(np.concatenate([ids for ids, _ in parts]), return_inverse=True)
    rows = np.concatenate([values for _, values in parts], axis=1)
    per_channel = np.abs([np.bincount(where.ravel(), row, len(channels)) for row in rows]).sum(0)
    mean = per_channel.mean()
    if mean > 0:
        scores[channels] += per_channel / mean
