"""The integer width grid, and the greedy repair that makes widths meet budgets.

Continuous solutions become channel counts here: :class:`WidthGrid` knows
which integer widths each variable may take (multiples of ``round_to`` and
of a grouped layer's group count, between ``min_channels`` and the cap), and
:func:`repair` moves rounded widths one grid step at a time until every
budget holds and no step fits any more.
"""

from __future__ import annotations

import math

import numpy as np

from keras_precrop.errors import InfeasibleBudgetError


def infeasible_at_minimum(grid, cost, budgets, arguments):
    """The error for budgets that even the narrowest widths on the grid exceed.

    Args:
        grid: the :class:`WidthGrid` (its ``min_channels`` and ``round_to``).
        cost: the narrowest widths' cost per row of ``grid.cm``.
        budgets: the budget per row (+inf: unset).
        arguments: ``{row: (argument name, value)}``: how the caller's user
            gave each budget (``{"params": ("params", 0.5)}``), to name it.
    """
    rows = grid.cm.row_names
    over = [k for k in range(len(rows)) if cost[k] > budgets[k] * (1 + 1e-12)]
    named = dict(arguments[rows[k]] for k in over if rows[k] in arguments)
    subject = " and ".join("{" + name + "}" for name in named) or "The budget"
    costs = ", ".join(f"{rows[k]} {cost[k]:,.6g} (budget {budgets[k]:,.6g})" for k in over)
    if grid.min_channels == grid.round_to == 1:  # nothing to lower: what the model itself holds
        narrowest, remedy = ("narrowest widths the model allows (layers kept whole, one attention "
                             "head each, widths tied to them)"), "raise the budget"
    else:
        narrowest = "narrowest widths that {min_channels} and {round_to} allow"
        remedy = "raise the budget or lower min_channels/round_to"
    return InfeasibleBudgetError(
        f"{subject} cannot be met with integer widths: the minimum feasible model, the "
        f"{narrowest}, costs {costs}; {remedy}.", limit={rows[k]: float(cost[k]) for k in over},
        **named, min_channels=grid.min_channels, round_to=grid.round_to)


class WidthGrid:
    """Allowed integer widths per variable: multiples of ``round_to`` in [lo, hi].

    Attention heads (variables of kind ``"heads"``) are whole units: they
    step by one and keep at least one head, whatever ``round_to`` and
    ``min_channels`` say of channels.

    A variable that must stay a multiple of ``m`` (grouped convolutions,
    group normalization) steps by ``lcm(round_to, m)``. With a ``balance``
    factor, the integer repair only takes steps that keep adjacent width
    ratios within it (or no further out of it than they are).
    """

    def __init__(self, cm, round_to, min_channels, upper, balance=None):
        self.cm = cm
        self.round_to, self.min_channels = round_to, min_channels
        self.balance = balance
        self.pairs = cm.balance_pairs()
        # A grouped conv's channels move in multiples of its groups as well.
        heads = np.array([v.kind == "heads" for v in cm.variables], bool)
        step = np.lcm(np.where(heads, 1, round_to),
                      [v.multiple for v in cm.variables]).astype(np.float64)
        self.step = np.where(cm.fixed, 0, step)
        c = cm.widths
        least = [v.least for v in cm.variables]  # whole heads: one, or what a tie's channels ask
        base = np.ceil(np.where(heads, least, max(round_to, min_channels)) / step) * step
        held = np.ceil(cm.held_widths() / step) * step  # a stream holds its kept-whole writers
        self.lo = np.where(cm.fixed, c, np.minimum(c, np.maximum(base, held)))
        cap = np.inf if upper is None else upper
        hi = np.maximum(np.floor(c * cap / step) * step, self.lo)
        if cap >= 1:  # the original width is always allowed
            hi = np.maximum(hi, c)
        self.hi = np.where(cm.fixed, c, hi)

    @property
    def unit_step(self):
        """Each variable's grid step, 1 for a fixed one (whose step is 0): what widths round by."""
        return np.where(self.step > 0, self.step, 1)

    def raise_floor(self, ratio, only=None):
        """No free width below ``ratio`` times its original, rounded down onto the grid.

        :func:`~keras_precrop.budget.modes.solve` uses it for ``floor=``: the
        narrowest widths become those of a width multiplier ``ratio``.

        Args:
            ratio: the width factor of the floor.
            only: a mask of the variables it holds (``floor_on="streams"``:
                the residual streams); None: every free one.
        """
        step = self.unit_step
        floor = np.floor(ratio * self.cm.widths / step + 1e-9) * step
        held = ~self.cm.fixed if only is None else ~self.cm.fixed & only
        self.lo = np.where(held, np.clip(floor, self.lo, self.hi), self.lo)

    def narrowest(self):
        """The smallest widths on the grid (views clipped to their streams)."""
        return self.enforce(self.lo.copy())

    def round(self, x):
        """Nearest allowed widths to continuous widths ``x``, bounds enforced."""
        step = self.unit_step
        w = np.where(self.cm.fixed, self.cm.widths, np.round(x / step) * step)
        return self.enforce(np.clip(w, self.lo, self.hi))

    def round_down(self, x):
        """The allowed widths at or below continuous widths ``x`` (to 1e-9 of a step: ``r * C``
        stays ``r * C`` when exact), bounds enforced; fixed widths kept."""
        step = self.unit_step
        w = np.where(self.cm.fixed, self.cm.widths, np.floor(x / step + 1e-9) * step)
        return self.enforce(np.clip(w, self.lo, self.hi))

    def imbalance(self, w):
        """(..., E) log factor between the width ratios of each adjacent pair at widths ``w``."""
        x = np.log(np.asarray(w, dtype=np.float64) / self.cm.widths)
        return np.abs(x[..., self.pairs[:, 0]] - x[..., self.pairs[:, 1]])

    def keeps_balance(self, candidates, w):
        """(n,) mask of candidate widths that put no pair further out of balance than ``w``."""
        if self.balance is None:
            return np.ones(len(candidates), dtype=bool)
        allowed = np.maximum(self.imbalance(w), math.log(self.balance)) + 1e-9
        return np.all(self.imbalance(candidates) <= allowed, axis=-1)

    def enforce(self, w):
        """Clip views and writers to their stream (in dependency order)."""
        w = w.copy()
        bound = self.cm.bound
        for _ in range(len(w)):
            has = bound >= 0
            target = np.where(has, np.minimum(w, w[np.maximum(bound, 0)]), w)
            if np.array_equal(target, w):
                break
            w = target
        return w


def repair(grid, w, budgets, arguments=None):
    """Greedy integer repair: shrink until feasible, then grow while feasible.

    Each step moves one variable by one grid step (views and writers follow a
    shrinking stream), picking the move with the best objective change per
    unit of (relative) budget; this keeps every budget and fills the binding
    one to within one cheapest step.
    """
    cm = grid.cm
    free = np.flatnonzero(~cm.fixed)
    steps = 0
    while True:
        cost = cm.totals(w)
        over = cost > budgets * (1 + 1e-12)
        if not over.any():
            break
        cand = np.repeat(w[None], len(free), axis=0)
        cand[np.arange(len(free)), free] -= grid.step[free]
        ok = cand[np.arange(len(free)), free] >= grid.lo[free]
        if not ok.any():
            raise infeasible_at_minimum(grid, cm.totals(grid.narrowest()), budgets, arguments or {})
        cand = np.stack([grid.enforce(c) for c in cand[ok]])
        balanced = grid.keeps_balance(cand, w)
        cand = cand[balanced] if balanced.any() else cand
        gain = np.sum(np.where(over, (cost - cm.totals(cand)) / budgets, 0), axis=1)
        loss = cm.objective(w) - cm.objective(cand)
        best = np.argmax(gain / np.maximum(loss, 1e-12))
        w = cand[best]
        steps += 1
    while True:
        cost = cm.totals(w)
        cand = np.repeat(w[None], len(free), axis=0)
        cand[np.arange(len(free)), free] += grid.step[free]
        ok = cand[np.arange(len(free)), free] <= grid.hi[free]
        bounded = cm.bound[free] >= 0
        ok &= ~bounded | (cand[np.arange(len(free)), free] <= w[np.maximum(cm.bound[free], 0)])
        ok &= grid.keeps_balance(cand, w)
        if not ok.any():
            break
        cand = cand[ok]
        new_cost = cm.totals(cand)
        fits = np.all(new_cost <= budgets * (1 + 1e-12), axis=1)
        if not fits.any():
            break
        spend = np.sum((new_cost - cost) / budgets, axis=1)  # an unset budget is inf
        gain = cm.objective(cand) - cm.objective(w)
        score = np.where(fits, gain / np.maximum(spend, 1e-15), -np.inf)
        w = cand[np.argmax(score)]
        steps += 1
    return w, steps
