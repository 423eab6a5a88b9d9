"""Translation modes: from budgets to integer channel widths.

:func:`solve` is the one entry: budgets by row name (``{"params": ...,
"macs": ..., "latency": ...}``, the rows the cost model names) and a mode.

* ``"exact"`` solves the channel-width program (the SynExp objective over
  the width variables, budgets as exact bilinear costs), rounds to integers
  and repairs greedily so the rebuilt model never exceeds a budget and meets
  the binding one within ~1%.
* ``"paper"`` solves per-layer densities (``solve_densities``) and maps them
  with the paper's rule: a layer keeps ``floor(sqrt(p_l) * C)`` output
  channels (residual readers and writers likewise, each with its own width).
  Its deviation from the budgets is reported, not corrected.
* ``"layerwise"`` is the paper's rule calibrated to the budgets (one scale
  factor on the density program's budgets, then the same integer repair as
  exact mode).
* ``"uniform"`` is the width multiplier every user already has: one factor
  ``r`` for every free width (``info["uniform_ratio"]``), the largest whose
  widths, rounded down onto the grid, meet every budget; then each width
  takes one more grid step where that still fits.

``"auto"`` picks one by the budgets (:func:`auto_mode`). Exact mode is the
optimum of the SynExp proxy over widths, but that proxy is scale-degenerate
once widths may grow: a product ``r_in * r_out`` can trade width between
adjacent groups freely, and a depthwise layer's density counts as much as a
full conv's at a fraction of the cost, so unbounded PreConfig drives
inverted-residual bottlenecks to a few channels and expansions to many
thousands; PreConfig therefore gets ``"layerwise"``, the paper's own method.
Under PreCrop (widths capped at the original) training decides: on CIFAR-10
(``experiments/README.md``, 14 compared pairs) exact mode never lost under a
parameter budget and won at the smallest, while layerwise mode never lost
under a FLOPs budget and won at two of three.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from keras_precrop.budget.costs import LATENCY_ROW, refuse_unknown_costs
from keras_precrop.budget.densities import solve_densities
from keras_precrop.budget.grid import WidthGrid, infeasible_at_minimum, repair
from keras_precrop.budget.kinds import of_row
from keras_precrop.budget.widths import solve_widths
from keras_precrop.errors import InfeasibleBudgetError


def solve(prof, cm, budgets, *, mode="auto", upper=1.0, round_to=1, min_channels=1,
          balance=None, floor=None, floor_on=None, floor_at=None, arguments=None):
    """Integer widths meeting named budgets, by a translation mode.

    Args:
        prof: the :class:`~keras_precrop.budget.costs.ModelProfile` of the model.
        cm: its cost model, with any extra rows (``prof.cost.with_rows``).
        budgets: ``{row name: absolute budget}`` for rows of ``cm``
            (``"params"``, ``"macs"``, ``"latency"``, ...); a row left out is
            unconstrained.
        mode: one of :data:`MODES`, or ``"auto"`` (:func:`auto_mode`).
        upper: cap on width ratios (1.0: PreCrop; ``None``: no cap).
        round_to, min_channels, balance: the width grid (:class:`WidthGrid`).
        floor: exact mode only: no free width below ``floor`` times the
            width ``mode="uniform"`` gives at the same budgets
            (``info["floor_ratio"]`` is that factor times uniform's).
        floor_on: ``"streams"``: the floor holds the residual streams alone
            (``info["floor_on"]``); ``"all"`` or None: every free width.
        floor_at: the budgets of the user's target (``{row: absolute budget}``)
            where ``budgets`` are a calibration's corrected ones: the floor's
            uniform widths are computed at these (``info["floor_at"] =
            "target"``), so that a latency budget lowered round by round does
            not take the floor, and the streams it holds, down with it. None:
            at ``budgets``.
        arguments: ``{row: (argument name, value)}``: how the user gave each
            budget, so that an infeasible one is named as given.

    Returns:
        ``(widths, info, mode)``: a width per variable of ``cm``, the
        solver's diagnostics and the mode that made them (what ``"auto"``
        chose; ``info["auto_mode"]`` says why; ``info["floor"]`` is the
        floor given or picked, if any).

    Raises:
        InfeasibleBudgetError: the narrowest widths on the grid exceed a
            budget, naming it and ``min_channels``/``round_to``; or, with
            ``floor_at``, the narrowest widths the floor allows do
            (``limit``: their cost).
    """
    unknown = sorted(set(budgets) - set(cm.row_names))
    if unknown:
        raise ValueError(f"budgets name rows {unknown}; the cost model has {list(cm.row_names)}")
    refuse_unknown_costs(prof, dict((arguments or {}).get(row, (row, budget))
                                    for row, budget in budgets.items()
                                    if (kind := of_row(row)) is None or kind.counts_macs))
    vector = np.array([budgets.get(row, np.inf) for row in cm.row_names], dtype=np.float64)
    info = {}
    if mode == "auto":
        latency = LATENCY_ROW in cm.row_names and np.isfinite(vector[cm.row_names.index(LATENCY_ROW)])
        mode, floor, floor_on, info["auto_mode"] = auto_mode(
            flops_budget=flops_binds(prof, cm, vector, upper), latency_budget=latency, upper=upper,
            balance=balance, floor=floor, floor_on=floor_on)
    if cm.fixed.all() and np.any(cm.totals(cm.widths) > vector):
        raise InfeasibleBudgetError(
            f"Model {prof.model_name!r} has no prunable channels (inputs, outputs and ignored "
            "layers are fixed); the minimum feasible budget is its current size "
            f"({prof.total_params:,} params, {prof.total_macs:,} MACs).",
            limit={"params": prof.total_params, "macs": prof.total_macs})
    grid = WidthGrid(cm, round_to, min_channels, upper, balance)
    narrowest = cm.totals(grid.narrowest())
    if np.any(narrowest > vector * (1 + 1e-12)):
        raise infeasible_at_minimum(grid, narrowest, vector, arguments or {})
    held = None
    if floor is not None and not cm.fixed.all():
        at = None if floor_at is None else np.array([floor_at.get(row, np.inf) for row in cm.row_names])
        held = _raise_floor(grid, vector, at, floor, floor_on, upper, info)
    if cm.fixed.all():
        widths, found = cm.widths.copy(), {"note": "nothing prunable"}
    else:
        widths, found = MODES[mode](prof, grid, vector, upper)
    found["balance_max"] = float(np.exp(grid.imbalance(widths).max(initial=0.0)))
    if "floor_at" in info:  # which widths the target's floor holds back, for calibration to say
        info["floor_binds"] = [cm.variables[v].name for v in np.flatnonzero(held & (widths <= grid.lo))]
    return widths, {**found, **info}, mode


def _raise_floor(grid, budgets, at, floor, floor_on, upper, info):
    """Raises ``grid``'s narrowest widths to ``floor`` times the uniform plan's at the budgets
    ``at`` (None: at ``budgets``), on the residual streams alone with ``floor_on="streams"``.

    One place computes the floor: a calibration that corrects the latency budget passes the
    target's budgets as ``at``, so the streams stay where the user's target puts them.

    Args:
        grid: the :class:`WidthGrid`, whose lower bounds it raises.
        budgets: the budgets solved for, by the cost model's rows.
        at: the target's budgets, by the same rows, or None.
        floor, floor_on, upper: as :func:`solve` takes them.
        info: the solver's diagnostics, which it adds to: ``floor``, ``floor_ratio`` (the width
            factor the floor holds), ``floor_on`` where given, and ``floor_at = "target"``
            where ``at`` is.

    Returns:
        The mask of the widths the floor holds.

    Raises:
        InfeasibleBudgetError: the floored narrowest widths exceed ``budgets`` (only where ``at``
            is higher than them), with their cost as ``limit``: the fastest plan the floor allows.
    """
    cm = grid.cm
    info["floor"] = floor
    info["floor_ratio"] = floor * _uniform_ratio(grid, budgets if at is None else at, upper)
    held = ~cm.fixed
    if floor_on == "streams":
        info["floor_on"] = floor_on
        held = held & np.array([v.kind == "stream" for v in cm.variables], dtype=bool)
    grid.raise_floor(info["floor_ratio"], only=held)
    if at is None:
        return held
    info["floor_at"] = "target"
    narrowest = cm.totals(grid.narrowest())
    over = {row: float(c) for row, c, b in zip(cm.row_names, narrowest, budgets) if c > b * (1 + 1e-12)}
    if over:
        which = "residual streams" if floor_on == "streams" else "free widths"
        raise InfeasibleBudgetError(
            f"The budgets cannot be met with the {which} held at {{floor}} times the uniform "
            f"plan's widths at the target (width factor {info['floor_ratio']:.3g}): the narrowest "
            "such widths cost "
            f"{', '.join(f'{r} {c:,.6g}' for r, c in over.items())}; a lower floor lets them go "
            "lower.", limit=over, floor=floor, floor_on=floor_on)
    return held


def flops_binds(prof, cm, budgets, upper):
    """Whether the MACs budget (row ``"macs"`` of ``budgets``, by the cost model's rows) binds.

    Alone it does; beside other budgets it does where the density program's
    optimum prices MACs (a positive KKT multiplier): ``precrop(params=0.5,
    flops=1.0)`` is a parameter budget in all but name.
    """
    macs = cm.row_names.index("macs")
    if np.isinf(budgets[macs]):
        return False
    if np.isinf(np.delete(budgets, macs)).all() or cm.fixed.all():
        return True
    try:
        return bool(_LayerwiseRule(prof, cm, upper).densities(budgets).multipliers["flops"] > 0)
    except InfeasibleBudgetError:
        return True  # the mode's own solve says why, as without mode="auto"


# Which widths a floor may hold (plan's floor_on=): every free one, or the residual streams alone.
FLOOR_ON = ("all", "streams")
# The floor mode="auto" sets under a latency budget: the uniform plan's widths, on the residual
# streams alone (``(floor, floor_on)``).
AUTO_LATENCY_FLOOR = (1.0, "streams")


def auto_mode(flops_budget=False, latency_budget=False, upper=1.0, balance=None, floor=None,
              floor_on=None):
    """The translation mode ``mode="auto"`` picks, its floor, and why.

    Args:
        flops_budget: whether a FLOPs budget binds: ``flops=`` or
            ``max_macs=`` alone, or beside other budgets where the density
            program's optimum prices MACs.
        latency_budget: whether a latency budget is given.
        upper: the cap on width ratios, as :func:`plan` takes it.
        balance: the balance factor, as :func:`plan` takes it.
        floor: the floor relative to uniform widths, as :func:`plan` takes it.
        floor_on: which widths ``floor`` holds, as :func:`plan` takes it.

    Returns:
        ``(mode, floor, floor_on, reason)``: ``"exact"`` with ``balance``,
        ``floor`` and ``floor_on`` as given (only the width program can bound
        it); else ``"layerwise"`` where widths may grow (exact PreConfig is
        scale-degenerate); else ``"exact"`` with :data:`AUTO_LATENCY_FLOOR`
        under a latency budget (at equal measured time on CIFAR-10 it kept
        ResNet-20's residual streams, which exact alone starves, and
        MobileNetV2's exact plan, which beat uniform widths); else
        ``"layerwise"`` under a FLOPs budget (where it trained best); else
        ``"exact"`` (parameter budgets, where it trained best).
    """
    if balance is not None or floor is not None:
        given = "balance=" if balance is not None else "floor="
        return "exact", floor, floor_on, f"{given} bounds the width program of exact mode"
    if upper is None or upper > 1:
        return "layerwise", None, None, "widths may grow, and exact mode's proxy is scale-degenerate then"
    if latency_budget:
        return ("exact", *AUTO_LATENCY_FLOOR,
                "a latency budget: at equal measured time on CIFAR-10, exact mode with its residual streams "
                "floored at the uniform widths trained as well as the floor on every width on ResNet-20 "
                "(where exact mode alone starves the streams to 3 channels) and kept exact mode's plan on "
                "MobileNetV2, which trained better than uniform widths there")
    if flops_budget:
        return "layerwise", None, None, ("a FLOPs budget binds: on CIFAR-10 layerwise never trained "
                                         "worse than exact under one and better at two of three budgets")
    return "exact", None, None, ("no FLOPs budget binds: on CIFAR-10 exact never trained worse than "
                                 "layerwise under a parameter budget and better at the smallest")


def _optional(budget):
    """A solver budget: ``None`` for an unset (infinite) one."""
    return None if np.isinf(budget) else float(budget)


def _exact(prof, grid, budgets, upper):
    """Width program, then integer rounding and greedy repair."""
    cm = grid.cm
    problem, bounds = cm.width_problem(grid.lo, upper, grid.balance)
    res = solve_widths(
        problem,
        budgets=dict(zip(cm.row_names, map(_optional, budgets))),
        upper=bounds,
    )
    widths = cm.widths.copy()
    widths[~cm.fixed] = res.widths
    w, steps = repair(grid, grid.round(widths), budgets)
    info = {
        "objective_continuous": float(res.objective),
        **{f"{row}_continuous": cost for row, cost in res.costs.items()},
        "success": bool(res.success),
        "repair_steps": int(steps),
    }
    return w, info


class _LayerwiseRule:
    """The paper's translation: per-layer densities, then sqrt(p) widths.

    Layer densities solve the density program with each layer's own params
    and MACs as alpha/beta (and its predicted time for a latency row; layers
    without kernels, e.g. BN, are charged at their original cost). A group
    takes ``sqrt(p) * C`` channels from the density of the layer that
    produces it (a residual reader's view from the reader's density).
    """

    def __init__(self, prof, cm, upper):
        graph = prof.graph
        self.cm, self.upper = cm, upper
        per_layer = cm.per_layer(cm.widths)
        self.layers = np.unique(cm.obj_layer[np.isin(cm.obj_var, np.flatnonzero(~cm.fixed))])
        self.costs = per_layer[self.layers]  # (layers, rows): params, MACs, extra rows
        self.alpha, self.beta = self.costs[:, 0], self.costs[:, 1]
        self.rest = per_layer.sum(axis=0) - self.costs.sum(axis=0)
        self.names = [graph.layers[i].path for i in self.layers]
        producer = {}
        for k, i in enumerate(self.layers.tolist()):
            for v in graph.produced_variables(graph.layers[i]):
                if not cm.fixed[v]:
                    producer.setdefault(v, k)
        self.var = np.array(sorted(producer), dtype=np.int64)
        self.src = np.array([producer[v] for v in self.var], dtype=np.int64)

    def densities(self, budgets):
        """Solve the density program for absolute model budgets (by the cost model's rows)."""
        effective = dict(zip(self.cm.row_names, budgets - self.rest))
        if any(value <= 0 for value in effective.values()):
            raise InfeasibleBudgetError(
                f"Budget below the cost of layers without kernels ({self.rest[0]:,.0f} "
                f"params, {self.rest[1]:,.0f} MACs); the minimum feasible budget is "
                "above that.")
        columns = dict(zip(self.cm.row_names, self.costs.T))
        return solve_densities(
            columns.pop("params"), columns.pop("macs"),
            params_budget=_optional(effective["params"]),
            flops_budget=_optional(effective["macs"]),
            upper=self.upper,
            rows={name: (cost, _optional(effective[name])) for name, cost in columns.items()},
        )

    def widths(self, p):
        """Continuous widths ``sqrt(p) * C`` (other groups keep their width)."""
        w = self.cm.widths.copy()
        w[self.var] = np.sqrt(p[self.src]) * self.cm.widths[self.var]
        return w


def _paper(prof, grid, budgets, upper):
    """The paper's rule as published: floor(sqrt(p) * C); deviation reported."""
    rule = _LayerwiseRule(prof, grid.cm, upper)
    res = rule.densities(budgets)
    step = grid.unit_step
    widths = np.floor(rule.widths(res.densities) / step) * step
    widths = grid.enforce(np.clip(widths, grid.lo, grid.hi))
    achieved = grid.cm.totals(widths)
    info = {
        "layer_densities_solved": dict(zip(rule.names, map(float, res.densities))),
        "deviation": {
            key: None if np.isinf(b) else float(a / b - 1)
            for key, a, b in zip(grid.cm.row_names, achieved, budgets)
        },
        "success": bool(res.success),
    }
    return widths, info


def _layerwise(prof, grid, budgets, upper):
    """The paper's rule, calibrated to meet the budgets exactly.

    The density program's KKT solution has the form
    ``p_l = min(1 / sum_k mu_k cost_lk, upper)`` (params, MACs and any
    latency row). Its linear cost estimate differs from the realized cost of
    sqrt(p) widths, so the multipliers are chosen against the *realized*
    cost instead: along each direction ``mu = m * d`` bisection on ``m``
    meets the binding budget, and with several budgets the direction ``d``
    (searched on a grid of angles, each budget's price in units of the
    budget) that maximizes the SynExp objective wins. Widths are then
    rounded and repaired like exact mode.
    """
    cm = grid.cm
    rule = _LayerwiseRule(prof, cm, upper)
    finite = ~np.isinf(budgets)
    cap = np.inf if upper is None else upper

    def densities(log_m, direction):
        price = rule.costs @ direction
        with np.errstate(divide="ignore"):
            return np.clip(np.exp(-log_m) / price, 1e-12, cap)

    def ratios(log_m, direction):
        return cm.totals(rule.widths(densities(log_m, direction))) / budgets

    def scale(direction):
        lo, hi = -80.0, 80.0  # log multiplier: small m = dense, large = sparse
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            if np.max(ratios(mid, direction)[finite]) > 1:
                lo = mid
            else:
                hi = mid
        return hi

    directions = _directions(budgets)
    scores = [cm.objective(rule.widths(densities(scale(d), d))) for d in directions] \
        if len(directions) > 1 else [0.0]
    direction = directions[int(np.argmax(scores))]
    p = densities(scale(direction), direction)
    w, steps = repair(grid, grid.round(rule.widths(p)), budgets)
    info = {
        "layer_densities_solved": dict(zip(rule.names, map(float, p))),
        "repair_steps": int(steps),
    }
    return w, info


def _directions(budgets):
    """Price directions for the layerwise rule: a grid on the positive unit sphere.

    One direction per angle (33 per angle for two finite budgets, 9 x 9 for
    three), each budget's component divided by the budget so the grid is
    even whatever the units; unset budgets get 0.
    """
    finite = np.flatnonzero(~np.isinf(budgets))
    k = len(finite)
    steps = {1: 1, 2: 33}.get(k, 9)
    out = []
    for angles in itertools.product(np.linspace(0.0, math.pi / 2, steps), repeat=k - 1):
        sines = np.concatenate([[1.0], np.cumprod(np.sin(angles))])
        unit = sines * np.append(np.cos(angles), 1.0)
        d = np.zeros(len(budgets))
        d[finite] = unit / budgets[finite]
        out.append(d)
    return out


def _uniform(prof, grid, budgets, upper):
    """One width factor ``r`` for every free width: the baseline a user already has.

    Each free width is ``r * C`` rounded down onto the grid (a width
    multiplier, as MobileNet's ``alpha``), with ``r`` the largest factor
    (:func:`_uniform_ratio`) whose widths meet every budget. Then every width
    that may still take one grid step up, without leaving one step of
    ``r * C`` or exceeding a budget, takes it (lowest ``w / C`` first): no
    width within one step of ``r * C`` can grow without exceeding a budget.
    """
    cm = grid.cm
    step = grid.unit_step
    r = _uniform_ratio(grid, budgets, upper)
    w = grid.round_down(r * cm.widths)
    band = np.minimum(np.ceil(r * cm.widths / step - 1e-9) * step, grid.hi)
    steps = 0
    for v in np.argsort(w / cm.widths, kind="stable"):
        if cm.fixed[v] or w[v] + step[v] > band[v]:
            continue
        cand = w.copy()
        cand[v] += step[v]
        cand = grid.enforce(cand)
        if cand[v] > w[v] and _fits(cm, cand, budgets):
            w, steps = cand, steps + 1
    return w, {"uniform_ratio": float(r), "repair_steps": int(steps)}


def _fits(cm, widths, budgets):
    return bool(np.all(cm.totals(widths) <= budgets * (1 + 1e-12)))


def _uniform_ratio(grid, budgets, upper):
    """The largest width factor ``r`` whose widths, every free ``r * C`` rounded down onto the grid,
    meet every budget, by bisection (:func:`solve` has checked that the narrowest widths, ``r = 0``,
    fit)."""
    cm = grid.cm

    def fits(r):
        return _fits(cm, grid.round_down(r * cm.widths), budgets)

    lo, hi = 0.0, 1.0 if upper is None or upper <= 1 else float(upper)
    if upper is None:
        while fits(hi) and hi < 2.0 ** 20:
            lo, hi = hi, 2 * hi
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return hi if fits(hi) else lo


MODES = {"exact": _exact, "layerwise": _layerwise, "paper": _paper, "uniform": _uniform}
