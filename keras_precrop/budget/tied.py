"""Width variables that share one ratio: the cost model the solver sees under ``tie=``.

A transformer whose config can say one width per kind of layer (keras_hub's
``ViTBackbone``: one ``hidden_dim``, one ``num_heads``, one ``mlp_dim`` for
every block) can only take plans whose widths agree: every block's MLP as
wide as the others, heads and hidden width in the ratio of its fixed head
size. ``plan(..., tie=[[...], ...])`` asks for that: the variables of each
class keep one ratio (new / original) between them. The solver then works on
a cost model with one variable per class, counted in the class's unit (the
greatest common divisor of its members' widths; each member a fixed multiple
of it), and its widths are spread back to every member. Each member keeps
its own channels (which heads, which neurons survive is still ranked per
layer with ``weights="keep"``); only the counts are tied.

Under a tie the objective is still SynExp's: each member's log ratio is its
class's, so a class counts once per kernel that reads or writes one of its
members, as it should.
"""

from __future__ import annotations

import copy
import dataclasses
import math

import numpy as np

from keras_precrop.errors import ArgumentError


@dataclasses.dataclass(frozen=True)
class Ties:
    """Classes of a cost model's variables that keep one width ratio.

    Attributes:
        cm: the reduced cost model, one variable per class (and per variable
            in none), for :func:`~keras_precrop.budget.modes.solve`.
        index: the reduced variable of each original variable.
        scale: each original variable's width in units of its reduced one.
    """

    cm: object
    index: np.ndarray
    scale: np.ndarray

    def expand(self, widths):
        """The widths of every original variable from the reduced ``widths``."""
        return np.asarray(widths, dtype=np.float64)[self.index] * self.scale


def tied(cm, classes, round_to=1, min_channels=1):
    """The cost model over ``classes`` of ``cm``'s variables, each class keeping one ratio.

    A class of attention heads and channels (a ViT's heads and hidden
    width) moves by whole heads; its channels still keep ``round_to`` and
    ``min_channels``: the class steps by the heads that keep the channels a
    multiple of ``round_to``, and keeps at least the heads that hold
    ``min_channels`` of them.

    Args:
        cm: a :class:`~keras_precrop.budget.costs.CostModel` (its extra
            rows, e.g. latency, are carried over).
        classes: lists of variable indices; a variable in none is its own.
        round_to: the plan's ``round_to``.
        min_channels: the plan's ``min_channels``.

    Returns:
        :class:`Ties`.
    """
    n = len(cm.variables)
    groups = [list(c) for c in classes if len(c) > 1]
    groups += [[v] for v in range(n) if not any(v in c for c in groups)]
    index, scale = np.zeros(n, np.int64), np.ones(n)
    variables = []
    for k, members in enumerate(groups):
        unit = math.gcd(*(int(cm.variables[v].width) for v in members))
        for v in members:
            index[v], scale[v] = k, cm.variables[v].width / unit
        variables.append(_merged([cm.variables[v] for v in members], unit, scale[members],
                                 round_to, min_channels))
    for k, members in enumerate(groups):  # bounds between whole classes only
        bound = cm.bound[members[0]]  # the cost model's: none between two fixed widths
        variables[k] = dataclasses.replace(variables[k], bound=None if bound < 0 else
                                           int(index[bound]))
    reduced = copy.copy(cm)
    reduced.variables = variables
    full_index, full_scale = np.append(index, len(groups)), np.append(scale, 1.0)
    reduced.a, reduced.b = full_index[cm.a], full_index[cm.b]
    reduced.coef = cm.coef * (full_scale[cm.a] * full_scale[cm.b])[:, None]
    reduced.obj_var = index[cm.obj_var]
    reduced.widths = np.array([v.width for v in variables], dtype=np.float64)
    reduced.fixed = np.array([v.fixed for v in variables], dtype=bool)
    reduced.bound = np.array([-1 if v.bound is None else v.bound for v in variables], np.int64)
    reduced.rows = tuple(_tied_row(row, full_index, full_scale) for row in cm.rows)
    return Ties(reduced, index, scale)


def _tied_row(row, index, scale):
    """An extra row (a latency model's) over the reduced variables.

    A row rounds widths up to its block of channels; a class counted in
    units of several channels (a ViT's heads and hidden width) cannot be
    rounded so in its units, so its terms are not rounded: the solver sees
    them continuous, and the plan's prediction, made on the widths spread
    back, rounds as the row says.
    """
    in_units = (scale[row.a] != 1) | (scale[row.b] != 1)
    block = np.where(in_units, 1, np.broadcast_to(row.block, np.shape(row.a)))
    return dataclasses.replace(row, a=index[row.a], b=index[row.b],
                               coef=row.coef * scale[row.a] * scale[row.b], block=block)


def _merged(members, unit, scales, round_to, min_channels):
    """One variable standing for ``members`` (each ``scales`` units wide): ``unit`` wide, fixed
    if any is, heads if any are; heads keep their channel members' ``round_to`` and
    ``min_channels`` in their step and least width (see :func:`tied`)."""
    first = members[0]
    multiple, least = math.lcm(*(v.multiple for v in members)), first.least
    heads = any(v.kind == "heads" for v in members)
    for v, s in zip(members, scales):
        if heads and v.kind != "heads":  # channels that whole heads set, s of them per head
            s = int(s)
            multiple = math.lcm(multiple, round_to // math.gcd(round_to, s))
            least = max(least, -(-max(round_to, min_channels) // s))
    return dataclasses.replace(
        first, name=first.name if len(members) == 1 else f"{first.name}+{len(members) - 1}",
        width=unit, fixed=any(v.fixed for v in members), kind="heads" if heads else first.kind,
        multiple=multiple, least=least, layers=[path for v in members for path in v.layers])


def tie_classes(variables, tie):
    """``tie`` (lists of variable names, as ``plan.variables`` names them) as index lists.

    Raises:
        ArgumentError: naming ``tie`` and the unknown name, a name in two
            lists, or a class joining a view (views follow their stream).
    """
    names = {v.name: i for i, v in enumerate(variables)}
    seen, classes = set(), []
    for group in tie:
        if isinstance(group, str) or len(group) < 2:
            raise ArgumentError("{tie} must be a list of lists of two or more variable names, got "
                                f"{group!r} in it.", tie=tie)
        unknown = [name for name in group if name not in names]
        if unknown:
            raise ArgumentError(f"{{tie}} names no width variable {unknown[0]!r}; the model's are "
                                f"{sorted(names)[:12]}{' ...' if len(names) > 12 else ''}.", tie=tie)
        again = [name for name in group if name in seen]
        if again:
            raise ArgumentError(f"{{tie}} names {again[0]!r} in two lists; join them into one.",
                                tie=tie)
        views = [name for name in group if variables[names[name]].kind == "view"]
        if views:
            raise ArgumentError(f"{{tie}} names the view {views[0]!r}, which follows its stream; "
                                "plan with residual='tie' to have none.", tie=tie)
        seen.update(group)
        classes.append([names[name] for name in group])
    return classes
