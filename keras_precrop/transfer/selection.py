"""Which original channels each width variable keeps, and in which order.

A width variable without a bound (a plain channel group) keeps its
``width`` best channels by score, in their original order; a grouped
convolution's or group normalization's variable (``Variable.multiple``) keeps
as many from each of its ``multiple`` blocks, so every group keeps its own
channels.

A variable with a bound (``residual="prefix"``: a residual stream's writers
and readers' views; a ``ChannelSlice``) uses a prefix of its bound's channels.
Each such *family* (an unbounded variable and all the variables bounded by
it) therefore shares one order of the channels: the family's scores summed,
best first. Permuting a stream this way (in every writer, reader and layer
tied to it alike) leaves the model's function unchanged, and the prefixes
the plan keeps are then its best channels. A member narrower than its bound
already (a model pruned before) reads a prefix of it, so the order only
permutes within the blocks between members' original widths. A family with
a fixed member (a model output, an ignored layer) or a grouped layer keeps
the original order.

Where a variable grows (PreConfig), its new channels come last (of each
block), marked ``-1``.
"""

from __future__ import annotations

import numpy as np

from keras_precrop.errors import ArgumentError


def select(graph, widths, scores):
    """Which original channels each width variable that is a group keeps.

    Args:
        graph: the walked original model.
        widths: the new width of every variable.
        scores: :func:`~keras_precrop.transfer.importance.channel_scores`.

    Returns:
        ``{variable index: int array of the new width}``: the original
        channel each new channel is, ``-1`` for a new one.
    """
    variables = graph.variables
    selection = {}
    for root, members in families(variables).items():
        v = variables[root]
        if members == [root]:
            selection[root] = _best(scores[root], int(widths[root]), v.multiple)
            continue
        order = _family_order(variables, members, scores, root)
        for i in members:
            if variables[i].kind != "view":
                selection[i] = _prefix(order, int(widths[i]), variables[i])
    return selection


def families(variables):
    """``{root: [member indices]}``: each unbounded width variable with those bounded by it.

    A family shares one order of its channels (see the module docstring).
    """
    out = {}
    for i in range(len(variables)):
        root = i
        while variables[root].bound is not None:
            root = variables[root].bound
        out.setdefault(root, []).append(i)
    return out


def _best(score, width, multiple):
    """The ``width`` best channels, in their original order, as many from each of ``multiple`` blocks."""
    blocks = multiple if len(score) % multiple == 0 and width % multiple == 0 else 1
    size, keep = len(score) // blocks, width // blocks
    parts = []
    for b in range(blocks):
        best = np.sort(np.argsort(-score[b * size:(b + 1) * size], kind="stable")[:keep])
        parts += [best + b * size, np.full(keep - len(best), -1)]
    return np.concatenate(parts).astype(np.int64)


def _family_order(variables, members, scores, root):
    """The order of a family's channels: best first within nested blocks (see the module docstring)."""
    width = variables[root].width
    if any(variables[i].fixed for i in members) or variables[root].multiple > 1:
        return np.arange(width)
    groups = [i for i in members if variables[i].kind != "view"]
    total = np.zeros(width)
    for i in groups:
        total[:variables[i].width] += scores[i][:width]
    order, start = [], 0
    for end in sorted({min(variables[i].width, width) for i in groups} | {width}):
        order.append(start + np.argsort(-total[start:end], kind="stable"))
        start = end
    return np.concatenate(order)


def _prefix(order, width, variable):
    """A family member's channels: the first ``width`` of the family's order, new ones ``-1``."""
    keep = np.concatenate([order[:width], np.full(max(0, width - len(order)), -1)]).astype(np.int64)
    if (keep >= variable.width).any():
        raise ArgumentError(
            f"{{weights}} cannot widen {variable.name!r} beyond its {variable.width} channels: "
            "it shares a residual stream that is wider than it, whose other channels carry "
            "trained values. Reconfigure the unpruned model, or start from fresh weights.",
            weights="keep")
    return keep
