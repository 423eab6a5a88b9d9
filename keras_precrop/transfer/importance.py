"""How much each channel of a trained model matters: one score per channel of each width variable.

A channel's score sums, over every layer that produces or consumes it (a
conv's output filter and bias, the BatchNormalization after it, the next
conv's input slice, a depthwise slab, a dense layer's rows behind a
flatten, ...), the magnitude of that layer's weights on the channel. The
layers come from the walk: a channel of a coupled group (a residual stream, a
concatenation's part) is scored by every member of the group, and a channel
read through a flatten or a depthwise multiplier sums all its copies.

Each layer gives two shares, one from the weights that write the channel
(filter, bias, gamma, beta) and one from those that read it, each divided by
its mean over the channels it touches, so every layer weighs alike (a 3x3
conv over 512 inputs would otherwise drown the BatchNormalization and the
conv it feeds).

* ``"l1"``: the L1 norm of the weights (the default: needs no data);
* ``"l2"``: their L2 norm;
* ``"taylor"``: first-order Taylor, ``|sum activation x gradient|`` per
  batch (over examples and positions), summed over the batches. A layer is
  linear in the weights that write a channel, so ``sum w * dL/dw`` over them
  is the written activation times its gradient (a conv's output before the
  BatchNormalization, the BatchNormalization's output); over the weights
  that read it, it is the read activation times the gradient that flows
  back through that reader. Weight gradients suffice, on every backend;
* ``"bn_scale"``: the magnitude of the scale (``gamma``) of the
  normalization layers that write the channel (network slimming's ranking:
  a BatchNormalization's output is ``gamma`` times a unit-variance channel,
  so ``|gamma|`` is its size); the plan must cut only channels such a
  scale writes, else the channels would rank at random, so that is refused;
* ``"random"``: seeded random scores, the control of an experiment.

Moving statistics and other non-trainable weights are carried, not scored.
"""

from __future__ import annotations

import numpy as np

from keras_precrop.errors import ArgumentError
from keras_precrop.graph.channels import input_shape
from keras_precrop.graph.handlers import WeightSpec
from keras_precrop.transfer import flow
from keras_precrop.transfer.selection import families

IMPORTANCE = ("l1", "l2", "taylor", "bn_scale", "random")


def channel_scores(graph, values, importance, gradients=None, seed=0, widths=None):
    """Importance of every original channel of every width variable that is a group.

    Args:
        graph: the walked original model.
        values: ``{id(weight): numpy array}`` of the model's weights.
        importance: one of :data:`IMPORTANCE`.
        gradients: for ``"taylor"``: one ``{id(weight): loss gradient}`` per
            batch, for the trainable weights of ``graph.model``.
        seed: the seed of ``"random"``.
        widths: the widths the scores will cut to; for ``"bn_scale"``,
            checked to cut only channels a normalization scale writes.

    Returns:
        ``{variable index: float array over its original channels}`` for
        each variable that is not a view (views read their stream's channels).

    Raises:
        ArgumentError: ``"bn_scale"`` where ``widths`` cut a family of
            channels some of which no normalization scale writes.
    """
    variables = graph.variables
    groups = [i for i, v in enumerate(variables) if v.kind != "view"]
    offsets = dict(zip(groups, np.cumsum([0] + [variables[i].width for i in groups])))
    total = sum(variables[i].width for i in groups)
    if importance == "random":
        return _split(np.random.default_rng(seed).random(total), variables, groups, offsets)
    scores, scaled = np.zeros(total), np.zeros(total, bool)
    for call, origin_in, origin_out in _origins(graph, offsets).values():
        _score_layer(call, origin_in, origin_out, values, (importance, gradients), (scores, scaled))
    if importance == "bn_scale" and widths is not None:
        _refuse_unscaled(graph, widths, _split(scaled, variables, groups, offsets))
    return _split(scores, variables, groups, offsets)


def _split(flat, variables, groups, offsets):
    """``{variable index: its slice of the flat per-channel array}``."""
    return {i: flat[offsets[i]:offsets[i] + variables[i].width] for i in groups}


def _refuse_unscaled(graph, widths, scaled):
    """Refuse ``"bn_scale"`` where the widths cut a family with channels no scale writes.

    Such channels would score 0 and go first, whatever they carry.
    """
    variables, unscaled = graph.variables, []
    for root, members in families(variables).items():
        if all(widths[i] >= variables[i].width for i in members):
            continue
        covered = np.zeros(variables[root].width, bool)
        for i in (i for i in members if i in scaled):
            width = min(len(scaled[i]), len(covered))
            covered[:width] |= scaled[i][:width]
        if not covered.all():
            unscaled.append(f"{variables[root].name!r} (layers {variables[root].layers[:3]})")
    if unscaled:
        raise ArgumentError(
            "{importance} ranks channels by the scale (gamma) of the normalization layer that "
            "writes them, but the plan cuts channels that no such scale writes: "
            + ", ".join(unscaled) + ". Rank them by 'l1' or 'taylor' instead.",
            importance="bn_scale")


def _origins(graph, offsets):
    """Each layer's first call with the global ids of its first input's and output's channels.

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


def _score_layer(call, origin_in, origin_out, values, method, scores):
    """Add one layer's share to the scores of the channels it reads and writes.

    The layer's weights on the channels it writes (kernel filters, bias,
    gamma and beta) add up to one share, those on the channels it reads to
    another: for Taylor, ``sum w * dL/dw`` over a channel's output weights is
    the channel's ``sum activation x gradient``. ``"bn_scale"`` takes a
    normalization's ``gamma`` alone and marks its channels in ``scores[1]``.
    """
    rec = call.record
    importance, gradients = method
    scores, scaled = scores
    width = input_shape(call.node)[-1]
    sides = {"in": [], "out": []}
    weights = getattr(rec.layer, "weights", [])  # keras.ops operations have none
    for w, roles in zip(weights, rec.handler.channel_axes(rec, call.node)):
        grads = [g[id(w)] for g in gradients or () if id(w) in g]
        if not w.trainable or not roles or (importance == "taylor" and not grads):
            continue  # statistics, weights without channels, frozen weights
        if importance == "bn_scale" and w is not getattr(rec.layer, "gamma", None):
            continue
        value = values[id(w)].astype(np.float64)
        if "group_in" in roles.values():  # all inputs, zero across groups
            spec = grouped(width, value)
            value, grads = spec.block_diagonal(value), [spec.block_diagonal(g) for g in grads]
        for axis, role in roles.items():
            ids = origin_out if role == "out" else origin_in
            if role == "mid":
                ids = np.repeat(origin_in, value.shape[axis] // width)
            sides["out" if role == "out" else "in"].append(
                (ids, _per_index(value, grads, axis, importance)))
    for parts in sides.values():
        if parts:
            _accumulate(scores, parts)
            if importance == "bn_scale":
                scaled[np.concatenate([ids for ids, _ in parts]).ravel()] = True


def grouped(width, kernel):
    """The spec of a grouped kernel ``(..., width / groups, filters)`` that reads ``width`` channels."""
    return WeightSpec("kernel_constraint", "kernel", -2, -1, groups=width // kernel.shape[-2])


def _per_index(value, grads, axis, importance):
    """Per index along ``axis``: the L1 or L2 norm of the rest of the weight (one row), or its
    ``sum w * dL/dw`` per batch (a row per batch)."""
    rows = np.moveaxis(value, axis, 0).reshape(value.shape[axis], -1)
    if importance in ("l1", "bn_scale"):
        return np.abs(rows).sum(1)[None]
    if importance == "l2":
        return np.sqrt(np.square(rows).sum(1))[None]
    return np.stack([(rows * np.moveaxis(g, axis, 0).reshape(rows.shape)).sum(1) for g in grads])


def _accumulate(scores, parts):
    """Add one share: ``(channel ids, per-index rows)`` summed per channel, the absolute value
    summed over rows (Taylor's batches), divided by its mean over the channels it touches."""
    channels, where = np.unique(np.concatenate([ids for ids, _ in parts]), return_inverse=True)
    rows = np.concatenate([values for _, values in parts], axis=1)
    per_channel = np.abs([np.bincount(where.ravel(), row, len(channels)) for row in rows]).sum(0)
    mean = per_channel.mean()
    if mean > 0:
        scores[channels] += per_channel / mean
