"""Plans: from budgets to integer channel widths, and back to a model.

A :class:`Plan` is the bridge between solving and rebuilding: it records the
width chosen for every width variable (a channel group or a residual view;
see ``channels.py`` for the vocabulary), the per-layer costs
and densities it implies, and how the budgets were met. Plans are plain JSON,
so a plan computed once (on a laptop, say) can be applied later to a model
built inside a TPU or GPU strategy scope with :func:`apply_plan`.

Three translation modes:

* ``mode="exact"`` solves the channel-width program (the SynExp objective over
  the width variables, budgets as exact bilinear costs), rounds to integers and
  repairs greedily so the rebuilt model never exceeds a budget and meets the
  binding one within ~1%.
* ``mode="paper"`` solves per-layer densities (``solve_densities``) and maps
  them with the paper's rule: a layer keeps ``floor(sqrt(p_l) * C)`` output
  channels (residual readers and writers likewise, each with its own width).
  Its deviation from the budgets is reported, not corrected.
* ``mode="layerwise"`` is the paper's rule calibrated to the budgets (one
  scale factor on the density program's budgets, then the same integer
  repair as exact mode).
* ``mode="uniform"`` is the width multiplier every user already has: one
  factor ``r`` for every free width (``plan.solver["uniform_ratio"]``), the
  largest whose widths, rounded down onto the grid, meet every budget; then
  each width takes one more grid step where that still fits.

The default, ``mode="auto"``, picks one of the first two by the budgets
(:func:`auto_mode`). Exact mode is the optimum of the SynExp proxy over widths,
but that proxy is scale-degenerate once widths may grow: a product
``r_in * r_out`` can trade width between adjacent groups freely, and a
depthwise layer's density counts as much as a full conv's at a fraction of the
cost, so unbounded PreConfig drives inverted-residual bottlenecks to a few
channels and expansions to many thousands; PreConfig therefore gets
``"layerwise"``, the paper's own method. Under PreCrop (widths capped at the
original) training decides: on CIFAR-10 (``experiments/README.md``, 14
compared pairs) exact mode never lost under a parameter budget and won at the
smallest, while layerwise mode never lost under a FLOPs budget and won at two
of three.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os

import numpy as np

from keras_precrop import _json
from keras_precrop import costs as _costs
from keras_precrop import latency as _latency
from keras_precrop import solver as _solver
from keras_precrop import verify as _verify
from keras_precrop.graph import walk
from keras_precrop.rebuild import rebuild


class PlanMismatchError(ValueError):
    """A plan does not fit the model it is applied to."""


class RebuildMismatchError(PlanMismatchError):
    """The rebuilt model disagrees with its plan's per-layer prediction."""


_OLD_KEYS = {"groups": "variables"}  # JSON keys of older plans -> Plan fields


@dataclasses.dataclass
class Plan(_json.JsonDataclass):
    """Channel widths for a model, with the costs they imply.

    Attributes:
        model_name: name of the model the plan was made for.
        mode: ``"exact"``, ``"layerwise"``, ``"paper"`` or ``"uniform"`` (what ``"auto"``
            chose, with the reason in ``solver["auto_mode"]``).
        residual: residual semantics used (``"prefix"`` or ``"tie"``).
        ignore: layer names whose channels were kept fixed.
        variables: per width variable: name, kind, original and new width,
            fixed (older plans call this key ``"groups"``; they load too).
        layers: per layer: name, class, input and output channels, params/MACs
            before and after, density.
        original: ``{"params", "macs"}`` of the original model.
        predicted: ``{"params", "macs"}`` of the rebuilt model (exact integers).
        budgets: absolute ``{"params", "macs"}`` targets (``None`` if unset).
        solver: diagnostics (objective, continuous optimum, deviation, ...).

    With a latency model, ``original``, ``predicted`` and ``budgets`` also
    hold ``"latency"`` (seconds per batch, as the latency model predicts) and
    ``solver["latency_model"]`` says what was timed.
    """

    model_name: str
    mode: str
    residual: str
    ignore: list
    variables: list
    layers: list
    original: dict
    predicted: dict
    budgets: dict
    solver: dict

    @property
    def params(self):
        """Parameters of the rebuilt model (== ``profile(new).total_params``)."""
        return self.predicted["params"]

    @property
    def macs(self):
        """MACs per example of the rebuilt model."""
        return self.predicted["macs"]

    @property
    def latency(self):
        """Predicted seconds per batch of the rebuilt model (None without a latency model)."""
        return self.predicted.get("latency")

    @property
    def widths(self):
        """``{variable name: new width}``."""
        return {v["name"]: v["new"] for v in self.variables}

    @classmethod
    def from_dict(cls, data):
        """A plan from :meth:`to_dict`'s data (older plans' keys included)."""
        return super().from_dict({_OLD_KEYS.get(k, k): v for k, v in data.items()})

    def summary(self, print_fn=print, only_changed=False, show_all_hint="only_changed=False"):
        """Print a before/after table of layers, then totals vs. budgets.

        Each layer shows its input and output channels, parameters and MACs,
        as ``before -> after`` where they change. Layers without parameters
        or MACs (activations, adds, pooling) are left out. With a latency
        model, the totals include the predicted time.

        Args:
            print_fn: where each line goes.
            only_changed: leave out layers whose parameters did not change;
                a note under the table says how many were left out.
            show_all_hint: how the caller shows every layer, for that note
                (the command line passes its ``--all`` flag).
        """
        rows = [("Layer (type)", "In channels", "Out channels", "Params", "MACs", "Density")]
        hidden = 0
        for layer in self.layers:
            if not (layer["params"] or layer["macs"]):
                continue
            if only_changed and layer["params_new"] == layer["params"]:
                hidden += 1
                continue
            rows.append((
                f"{layer['name']} ({layer['class_name']})",
                # Plans written before input channels were recorded lack them.
                _change(layer.get("channels_in", "?"), layer.get("channels_in_new", "?")),
                _change(layer["channels"], layer["channels_new"]),
                _change(f"{layer['params']:,}", f"{layer['params_new']:,}"),
                _change(f"{layer['macs']:,}", f"{layer['macs_new']:,}"),
                "" if layer["density"] is None else f"{layer['density']:.3f}",
            ))
        auto = ', picked by mode="auto"' if "auto_mode" in self.solver else ""
        print_fn(f'Plan ({self.mode}{auto}, residual={self.residual}): "{self.model_name}"')
        for line in _costs._table(rows) + _costs._not_shown(hidden, "unchanged layer{s}",
                                                            show_all_hint):
            print_fn(line)
        totals = [("params", "Params", "{:,.0f}"), ("macs", "MACs", "{:,.0f}")]
        if "latency" in self.predicted:
            timed = self.solver["latency_model"]
            what = "training step" if timed["training"] else "inference"
            totals.append(("latency", f"Latency ({what}, {timed['runtime']}, batch "
                           f"{timed['batch_size']}, predicted; ms)", "{:,.3f}"))
        for key, label, fmt in totals:
            scale = 1e3 if key == "latency" else 1
            before, after = self.original[key], self.predicted[key]
            budget = self.budgets.get(key)
            text = (f"{label}: {fmt.format(before * scale)} -> {fmt.format(after * scale)} "
                    f"({after / before:.1%})")
            if budget is not None:
                text += f"   budget {fmt.format(budget * scale)} ({budget / before:.1%})"
            print_fn(text)
        calibration = self.solver.get("latency_calibration")
        if calibration:
            print_fn(f"Latency measured: {calibration['measured']:.1%} of the original's time "
                     f"(target {calibration['target']:.1%}, {len(calibration['rounds'])} "
                     f"round{'s' * (len(calibration['rounds']) > 1)}"
                     f"{'' if calibration['met'] else '; NOT met'})")


def _change(before, after):
    """A table cell: ``before -> after``, or one value if it did not change."""
    return before if before == after else f"{before} -> {after}"


def _spelled(name, value):
    """``name=value`` as the user wrote the argument (numpy scalars as numbers)."""
    if isinstance(value, np.generic):
        value = value.item()
    return f"{name}={value!r}"


# The budget arguments: (ratio keyword, what the ratio is of, absolute keyword, its unit).
# Latency has only a ratio, of the time the latency model predicts for the original.
_BUDGET_ARGS = (("params", "parameters", "max_params", "parameters"),
                ("flops", "FLOPs", "max_macs", "MACs"),
                ("latency", "predicted time", None, None))
_LATENCY = 2


def _resolve_budget(kind, ratio, absolute, original, can_grow):
    """Absolute budget from a ratio of the original or an absolute value.

    Args:
        kind: 0 for the parameter budget, 1 for the FLOP/MAC budget, 2
            (``_LATENCY``) for the time budget, which has no absolute form.
        ratio: the ratio argument (``params`` / ``flops`` / ``latency``) or None.
        absolute: the absolute argument (``max_params`` / ``max_macs``) or None.
        original: the original model's parameters / MACs (1.0 for latency,
            whose original time is known only once a latency model is fitted).
        can_grow: whether widths may exceed the original (PreConfig); if
            not, a budget above the original is refused, since it would
            silently return the model unchanged.

    Returns:
        The budget (params and MACs as float integers; latency as the ratio
        times ``original``), or None when neither argument is given.

    Raises:
        TypeError, ValueError: naming the argument as the user passed it
            (``flops=0``), so the command line can translate it to its flag.
    """
    ratio_name, ratio_unit, absolute_name, absolute_unit = _BUDGET_ARGS[kind]
    if ratio is not None and absolute is not None:
        raise ValueError(f"Give either {_spelled(ratio_name, ratio)} (a ratio) or "
                         f"{_spelled(absolute_name, absolute)} (an absolute count), not both.")
    if ratio is None and absolute is None:
        return None
    is_ratio = ratio is not None
    name, value = (ratio_name, ratio) if is_ratio else (absolute_name, absolute)
    what = (f"ratio of the original model's {ratio_unit} (e.g. 0.5)" if is_ratio
            else f"number of {absolute_unit}")
    if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
        raise TypeError(f"{_spelled(name, value)} must be a {what}.")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{_spelled(name, value)} must be a positive, finite {what}.")
    if not can_grow and (value > 1 if is_ratio else value > original):
        size = (f"{value:.0%} of the original model's {ratio_unit}" if is_ratio
                else f"more than the original model's {original:,} {absolute_unit}")
        raise ValueError(
            f"{_spelled(name, value)} asks for {size}, but PreCrop only removes channels: "
            "the model would come back unchanged. Use reconfigure (PreConfig) to let "
            "layers grow.")
    budget = float(value) * original if is_ratio else float(value)
    if kind == _LATENCY:
        return budget  # seconds, not a count
    # Params and MACs are integers: round away float noise (0.9999999999999999 * 393).
    return float(math.floor(budget * (1 + 1e-12)))


def plan(model, params=None, flops=None, *, max_params=None, max_macs=None,
         mode="auto", upper=1.0, round_to=1, min_channels=1, ignore=(),
         residual="prefix", latency=None, latency_model=None, balance=None, calibrate=None):
    """Choose new channel widths for ``model`` under parameter/FLOP budgets.

    Args:
        model: a functional or Sequential Keras model with a defined input shape.
        params: parameter budget as a ratio of the model's parameters.
        flops: FLOP (= MAC) budget as a ratio of the model's MACs.
        max_params: absolute parameter budget (instead of ``params``).
        max_macs: absolute MAC budget (instead of ``flops``).
        mode: ``"exact"`` (width program, integer repair), ``"layerwise"``
            (the paper's densities and sqrt rule, calibrated to the budgets),
            ``"paper"`` (the paper's rule as published, budgets not
            enforced; the deviation is in ``plan.solver``), ``"uniform"``
            (one width factor for every layer, ``plan.solver["uniform_ratio"]``:
            the width-multiplier baseline) or ``"auto"``:
            the one :func:`auto_mode` picks for these budgets (``plan.mode``
            says which, ``plan.solver["auto_mode"]`` why).
        upper: cap on each width ratio: 1.0 prunes only (PreCrop); ``None``
            lets widths grow (PreConfig).
        round_to: widths are multiples of this (e.g. 8 for accelerators).
        min_channels: no width variable is narrower than this.
        ignore: layer names whose channels stay fixed.
        residual: ``"prefix"`` (PreCrop residual rule) or ``"tie"``.
        latency: time budget as a ratio of the original model's time as
            ``latency_model`` predicts it (e.g. 0.5).
        latency_model: a :class:`~keras_precrop.latency.LatencyModel` fitted
            on this model (or a path to its JSON, or a dict of
            :func:`~keras_precrop.latency_model` options); None with
            ``latency`` set measures one now (about a minute). Given without
            ``latency``, the plan only reports the predicted time.
        balance: exact mode only (``"auto"`` picks it): a factor >= 1 by
            which the width ratios (new / original) of adjacent widths may
            differ at most: a kernel's input and output, a residual view
            and its stream. The SynExp objective alone can put a 3-channel
            layer between two 50-channel ones; ``balance=2`` forbids such
            bottlenecks (integer rounding may exceed it slightly;
            ``plan.solver["balance_max"]`` reports the largest factor of
            every plan).
        calibrate: rounds of measured feedback for a ``latency`` budget. A
            latency model's prediction of its own plan can be off (its
            features cannot express every kernel's cost), so each round
            rebuilds the plan, times it against the original (interleaved,
            as the latency model was timed) and, unless the measured time
            ratio is within 3% of ``latency``, solves again with the latency
            budget scaled by ``latency / measured``. The plan that meets
            ``latency`` closest from below is kept (else the fastest), and
            ``plan.solver["latency_calibration"]`` lists the rounds. None:
            2 when the latency model is measured in this call (on this
            machine, with its ``timer``), else 0: a latency model loaded
            from a file may describe another device.

    Returns:
        A :class:`Plan`.

    Raises:
        ValueError: for a budget that is not a positive finite number, both
            forms of one budget, no budget, or (with ``upper <= 1``, i.e.
            PreCrop) a budget above the original model, which could only
            return the model unchanged; the message names the argument as
            passed (``params=1.5``).
        TypeError: for a budget that is not a number.
        InfeasibleBudgetError: for a budget below the smallest allowed model.
    """
    if mode not in _MODES and mode != "auto":
        raise ValueError(f"{_spelled('mode', mode)} is unknown; use one of "
                         f"{sorted(_MODES) + ['auto']}.")
    for name, value in (("round_to", round_to), ("min_channels", min_channels)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{_spelled(name, value)} must be a positive integer.")
    if upper is not None and (isinstance(upper, bool) or not isinstance(upper, (int, float, np.number))
                              or not math.isfinite(upper) or upper <= 0):
        raise ValueError(f"{_spelled('upper', upper)} must be a positive ratio or None.")
    if balance is not None:
        if isinstance(balance, bool) or not isinstance(balance, (int, float, np.number)) \
                or not math.isfinite(balance) or balance < 1:
            raise ValueError(f"{_spelled('balance', balance)} must be a factor >= 1 (e.g. 2) "
                             "or None.")
        if mode not in ("exact", "auto"):
            raise ValueError(f"{_spelled('balance', balance)} needs mode='exact' (the width "
                             f"program); {_spelled('mode', mode)} sets widths by its own rule.")
    can_grow = upper is None or upper > 1
    # Checked before profiling and timing, so a bad latency= fails at once.
    latency_ratio = _resolve_budget(_LATENCY, latency, None, 1.0, can_grow)
    measured_here = latency_model is None or isinstance(latency_model, dict)
    if calibrate is None:
        calibrate = 2 if latency_ratio is not None and measured_here else 0
    if isinstance(calibrate, bool) or not isinstance(calibrate, (int, np.integer)) or calibrate < 0:
        raise ValueError(f"{_spelled('calibrate', calibrate)} must be a number of rounds >= 0.")
    if calibrate and latency_ratio is None:
        raise ValueError(f"{_spelled('calibrate', calibrate)} calibrates a latency budget; "
                         "give latency= too.")
    prof = _costs.profile(model, ignore=ignore, residual=residual)
    budgets = np.array([
        np.inf if b is None else b for b in (
            _resolve_budget(0, params, max_params, prof.total_params, can_grow),
            _resolve_budget(1, flops, max_macs, prof.total_macs, can_grow))])
    if np.all(np.isinf(budgets)) and latency_ratio is None:
        raise ValueError("Give at least one budget: params=, flops=, latency=, max_params= or "
                         "max_macs=.")
    cm = prof.cost
    timed = {}
    if latency_ratio is not None or latency_model is not None:
        lm = _latency.resolve(latency_model, model, residual=residual, ignore=tuple(ignore))
        named = (f"latency_model={os.fspath(latency_model)!r}"
                 if isinstance(latency_model, (str, os.PathLike)) else "latency_model")
        cm = cm.with_rows([lm.cost_row(prof.graph, named)])
        budgets = np.append(budgets, np.inf if latency_ratio is None
                            else latency_ratio * cm.totals(cm.widths)[2])
        timed = {"latency_model": lm.describe()}
    chosen = {}
    if mode == "auto":
        mode, why = auto_mode(flops_budget=_flops_binds(prof, cm, budgets, upper), upper=upper,
                              balance=balance)
        chosen = {"auto_mode": why}
    grid = _Grid(cm, round_to, min_channels, upper, balance)
    if cm.fixed.all():
        if np.any(cm.totals(cm.widths) > budgets):
            raise _solver.InfeasibleBudgetError(
                f"Model {model.name!r} has no prunable channels (inputs, outputs and "
                "ignored layers are fixed); the minimum feasible budget is its "
                f"current size ({prof.total_params:,} params, {prof.total_macs:,} MACs).")
        widths, info = cm.widths.copy(), {"note": "nothing prunable"}
    else:
        def solve(b):
            return _MODES[mode](prof, grid, b, upper)

        if calibrate:
            options = latency_model if isinstance(latency_model, dict) else {}
            ratio = _latency.time_ratio(lm, model, verbose=options.get("verbose", 1),
                                        timer=options.get("timer"))
            widths, info = _calibrated(solve, lambda w: ratio(rebuild(prof.graph, w.astype(int))),
                                       lambda w: cm.totals(w)[2], budgets, latency_ratio, calibrate)
        else:
            widths, info = solve(budgets)
    info["balance_max"] = float(np.exp(grid.imbalance(widths).max(initial=0.0)))
    return _make_plan(prof, cm, widths, budgets, mode, residual, list(ignore),
                      {**info, **timed, **chosen})


def _flops_binds(prof, cm, budgets, upper):
    """Whether the FLOPs budget (``budgets[1]``) binds the plan.

    Alone it does; beside other budgets it does where the density program's
    optimum prices MACs (a positive KKT multiplier): ``precrop(params=0.5,
    flops=1.0)`` is a parameter budget in all but name.
    """
    if np.isinf(budgets[1]):
        return False
    if np.isinf(np.delete(budgets, 1)).all() or cm.fixed.all():
        return True
    try:
        return bool(_LayerwiseRule(prof, cm, upper).densities(budgets).multipliers["flops"] > 0)
    except _solver.InfeasibleBudgetError:
        return True  # the mode's own solve says why, as without mode="auto"


def auto_mode(flops_budget=False, upper=1.0, balance=None):
    """The translation mode ``mode="auto"`` picks, and why.

    Args:
        flops_budget: whether a FLOPs budget binds: ``flops=`` or
            ``max_macs=`` alone, or beside other budgets where the density
            program's optimum prices MACs.
        upper: the cap on width ratios, as :func:`plan` takes it.
        balance: the balance factor, as :func:`plan` takes it.

    Returns:
        ``(mode, reason)``: ``"exact"`` with ``balance`` (only the width
        program can bound it); else ``"layerwise"`` where widths may grow
        (exact PreConfig is scale-degenerate) or under a FLOPs budget
        (where it trained best on CIFAR-10); else ``"exact"`` (parameter
        and latency budgets; the former is where it trained best).
    """
    if balance is not None:
        return "exact", "balance= bounds the width program of exact mode"
    if upper is None or upper > 1:
        return "layerwise", "widths may grow, and exact mode's proxy is scale-degenerate then"
    if flops_budget:
        return "layerwise", ("a FLOPs budget binds: on CIFAR-10 layerwise never trained worse than exact "
                             "under one and better at two of three budgets")
    return "exact", ("no FLOPs budget binds: on CIFAR-10 exact never trained worse than layerwise "
                     "under a parameter budget and better at the smallest")


class _Grid:
    """Allowed integer widths per variable: multiples of ``round_to`` in [lo, hi].

    A variable that must stay a multiple of ``m`` (grouped convolutions,
    group normalization) steps by ``lcm(round_to, m)``. With a ``balance``
    factor, the integer repair only takes steps that keep adjacent width
    ratios within it (or no further out of it than they are).
    """

    def __init__(self, cm, round_to, min_channels, upper, balance=None):
        self.cm = cm
        self.balance = balance
        self.pairs = cm.balance_pairs()
        # A grouped conv's channels move in multiples of its groups as well.
        step = np.lcm(round_to, [v.multiple for v in cm.variables]).astype(np.float64)
        self.step = np.where(cm.fixed, 0, step)
        c = cm.widths
        base = np.ceil(max(round_to, min_channels) / step) * step
        self.lo = np.where(cm.fixed, c, np.minimum(c, base))
        cap = np.inf if upper is None else upper
        hi = np.maximum(np.floor(c * cap / step) * step, self.lo)
        if cap >= 1:  # the original width is always allowed
            hi = np.maximum(hi, c)
        self.hi = np.where(cm.fixed, c, hi)

    def round(self, x):
        """Nearest allowed widths to continuous widths ``x``, bounds enforced."""
        step = np.where(self.step > 0, self.step, 1)
        w = np.where(self.cm.fixed, self.cm.widths, np.round(x / step) * step)
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


_CALIBRATION_SLACK = 0.03  # a measured time ratio this far above the budget meets it (timing noise)


def _calibrated(solve, measure, predicted, budgets, target, rounds):
    """Widths whose *measured* time ratio meets the latency budget ``target``.

    ``solve(budgets)`` plans, ``measure(widths)`` times the rebuilt model
    against the original, ``predicted(widths)`` is the latency model's
    time. After each round the latency row's budget is scaled by ``target /
    measured`` (a multiplicative correction of the latency model's bias near
    the plan), up to ``rounds`` times, until the measured ratio is within
    ``_CALIBRATION_SLACK`` of ``target``, the latency budget no longer binds
    (another budget does) or a corrected budget is infeasible. Returns the
    plan meeting ``target`` with the largest measured ratio (the least
    pruned), else the fastest one, and the rounds in its info.
    """
    budget, history, plans = budgets.copy(), [], []
    original = budgets[2] / target  # the latency row is the third; its budget is target x original
    for k in range(rounds + 1):
        try:
            widths, info = solve(budget)
        except _solver.InfeasibleBudgetError:
            if k == 0:
                raise
            break
        ratio = measure(widths)
        history.append({"budget": float(budget[2] / original), "measured": float(ratio)})
        plans.append((ratio, widths, info))
        slack = predicted(widths) < budget[2] * (1 - 0.01)
        if abs(ratio / target - 1) <= _CALIBRATION_SLACK or (ratio < target and slack):
            break
        budget[2] *= target / ratio
    meeting = [p for p in plans if p[0] <= target * (1 + _CALIBRATION_SLACK)]
    ratio, widths, info = max(meeting, key=lambda p: p[0]) if meeting else min(plans, key=lambda p: p[0])
    return widths, {**info, "latency_calibration": {
        "target": float(target), "measured": float(ratio), "met": bool(meeting), "rounds": history}}


def _optional(budget):
    """A solver budget: ``None`` for an unset (infinite) one."""
    return None if np.isinf(budget) else float(budget)


def _repair(grid, w, budgets):
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
            raise _solver.InfeasibleBudgetError(
                "Budget cannot be met with integer widths at the minimum "
                f"widths (params {cost[0]:,.0f}, MACs {cost[1]:,.0f}); raise the "
                "budget or lower min_channels/round_to.")
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


def _exact(prof, grid, budgets, upper):
    """Width program, then integer rounding and greedy repair."""
    cm = grid.cm
    problem, bounds = cm.width_problem(grid.lo, upper, grid.balance)
    res = _solver.solve_widths(
        problem,
        budgets=dict(zip(problem.rows, map(_optional, budgets))),
        upper=bounds,
    )
    widths = cm.widths.copy()
    widths[~cm.fixed] = res.widths
    w, steps = _repair(grid, grid.round(widths), budgets)
    info = {
        "objective_continuous": float(res.objective),
        **{f"{name}_continuous": res.costs[row]
           for name, row in zip(cm.row_names, problem.rows)},
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
        """Solve the density program for absolute model budgets."""
        effective = budgets - self.rest
        if np.any(effective <= 0):
            raise _solver.InfeasibleBudgetError(
                f"Budget below the cost of layers without kernels ({self.rest[0]:,.0f} "
                f"params, {self.rest[1]:,.0f} MACs); the minimum feasible budget is "
                "above that.")
        return _solver.solve_densities(
            self.alpha, self.beta,
            params_budget=_optional(effective[0]),
            flops_budget=_optional(effective[1]),
            upper=self.upper,
            rows={name: (self.costs[:, k], _optional(effective[k]))
                  for k, name in enumerate(self.cm.row_names[2:], start=2)},
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
    step = np.where(grid.step > 0, grid.step, 1)
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
    w, steps = _repair(grid, grid.round(rule.widths(p)), budgets)
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
    (bisection) whose widths meet every budget. Then every width that may
    still take one grid step up, without leaving one step of ``r * C`` or
    exceeding a budget, takes it (lowest ``w / C`` first): no width within one
    step of ``r * C`` can grow without exceeding a budget.
    """
    cm = grid.cm
    step = np.where(grid.step > 0, grid.step, 1)

    def widths(r):
        w = np.where(cm.fixed, cm.widths, np.floor(r * cm.widths / step + 1e-9) * step)
        return grid.enforce(np.clip(w, grid.lo, grid.hi))

    def fits(w):
        return bool(np.all(cm.totals(w) <= budgets * (1 + 1e-12)))

    if not fits(widths(0.0)):
        cost = cm.totals(widths(0.0))
        raise _solver.InfeasibleBudgetError(
            "Budget cannot be met with integer widths at the minimum widths "
            f"(params {cost[0]:,.0f}, MACs {cost[1]:,.0f}); raise the budget or lower "
            "min_channels/round_to.")
    lo, hi = 0.0, 1.0 if upper is None or upper <= 1 else float(upper)
    if upper is None:
        while fits(widths(hi)) and hi < 2.0 ** 20:
            lo, hi = hi, 2 * hi
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if fits(widths(mid)) else (lo, mid)
    if fits(widths(hi)):
        lo = hi
    w = widths(lo)
    band = np.minimum(np.ceil(lo * cm.widths / step - 1e-9) * step, grid.hi)
    steps = 0
    for v in np.argsort(w / cm.widths, kind="stable"):
        if cm.fixed[v] or w[v] + step[v] > band[v]:
            continue
        cand = w.copy()
        cand[v] += step[v]
        cand = grid.enforce(cand)
        if cand[v] > w[v] and fits(cand):
            w, steps = cand, steps + 1
    return w, {"uniform_ratio": float(lo), "repair_steps": int(steps)}


_MODES = {"exact": _exact, "layerwise": _layerwise, "paper": _paper, "uniform": _uniform}


def _make_plan(prof, cm, widths, budgets, mode, residual, ignore, info):
    widths = np.asarray(widths, dtype=np.float64)
    before = cm.per_layer(cm.widths)
    after = cm.per_layer(widths)
    density = cm.layer_densities(widths)
    has_kernel = set(cm.obj_layer.tolist())
    names = {v.name: i for i, v in enumerate(cm.variables)}

    def channels(variables, w):
        return "/".join(str(int(w[names[v]])) for v in variables) or "-"

    layers = []
    for i, layer in enumerate(prof.layers):
        layers.append({
            "name": layer.name, "class_name": layer.class_name,
            "channels": channels(layer.out_variables, cm.widths),
            "channels_new": channels(layer.out_variables, widths),
            "channels_in": channels(layer.in_variables, cm.widths),
            "channels_in_new": channels(layer.in_variables, widths),
            "params": int(round(before[i, 0])), "params_new": int(round(after[i, 0])),
            "macs": int(round(before[i, 1])), "macs_new": int(round(after[i, 1])),
            "density": float(density[i]) if i in has_kernel else None,
        })
    total = cm.totals(widths)
    info = dict(info, objective=float(cm.objective(widths)))
    extra = cm.row_names[2:]  # e.g. latency: seconds, not counts
    return Plan(
        model_name=prof.model_name, mode=mode, residual=residual, ignore=ignore,
        variables=[{"name": v.name, "kind": v.kind, "width": int(v.width),
                    "new": int(widths[i]), "fixed": bool(v.fixed)}
                   for i, v in enumerate(cm.variables)],
        layers=layers,
        original={"params": prof.total_params, "macs": prof.total_macs,
                  **dict(zip(extra, map(float, cm.totals(cm.widths)[2:])))},
        predicted={"params": int(round(total[0])), "macs": int(round(total[1])),
                   **dict(zip(extra, map(float, total[2:])))},
        budgets={k: None if np.isinf(b) else float(b) for k, b in zip(cm.row_names, budgets)},
        solver=info,
    )


def apply_plan(model, plan):
    """Build a freshly initialized copy of ``model`` with the plan's widths.

    Call it inside ``strategy.scope()`` to create the pruned model's variables
    there. The model must be the architecture the plan was made for (same
    layer names and original widths); otherwise :class:`PlanMismatchError`.
    The rebuilt model is walked afresh and checked against the plan (each
    layer's parameters, MACs and output width, and the totals); a model that
    disagrees is never returned: :class:`RebuildMismatchError` names the
    first layer that differs.
    """
    graph = walk(model, ignore=plan.ignore, residual=plan.residual)
    variables = graph.variables
    planned = {v["name"]: v for v in plan.variables}
    names = [v.name for v in variables]
    if set(names) != set(planned):
        extra, missing = sorted(set(planned) - set(names)), sorted(set(names) - set(planned))
        raise PlanMismatchError(
            f"Plan for {plan.model_name!r} does not fit model {model.name!r}: "
            f"width variables only in the plan {extra[:5]}, only in the model {missing[:5]}.")
    for v in variables:
        if planned[v.name]["width"] != v.width:
            raise PlanMismatchError(
                f"Width variable {v.name!r} has {v.width} channels in model {model.name!r} "
                f"but {planned[v.name]['width']} in the plan.")
    widths = [planned[n]["new"] for n in names]
    new = rebuild(graph, widths)
    mismatch = _verify.first_mismatch(new, graph, widths, plan)
    if mismatch is not None:
        raise RebuildMismatchError(
            f"Model {model.name!r} rebuilt from plan for {plan.model_name!r} "
            f"disagrees with the plan: {mismatch}.")
    return new


def precrop(model, params=None, flops=None, **options):
    """PreCrop: a smaller, freshly initialized model meeting the budgets.

    Args:
        model: functional or Sequential Keras model with a defined input shape.
        params: parameter budget as a ratio of the original, in (0, 1]
            (e.g. 0.5); a larger budget is an error, since PreCrop only
            removes channels (:func:`reconfigure` lets layers grow).
        flops: FLOP budget as a ratio of the original, in (0, 1].
        **options: see :func:`plan` (``latency``, ``latency_model``,
            ``max_params``, ``max_macs``, ``mode``, ``round_to``,
            ``min_channels``, ``ignore``, ``residual``); e.g.
            ``precrop(model, latency=0.5)`` halves the predicted time.

    Returns:
        A new ``keras.Model``; its ``.precrop_plan`` attribute holds the plan.
    """
    options.setdefault("upper", 1.0)
    the_plan = plan(model, params, flops, **options)
    new = apply_plan(model, the_plan)
    new.precrop_plan = the_plan
    return new


def reconfigure(model, params=None, flops=None, **options):
    """PreConfig: re-distribute widths (layers may widen) under the budgets.

    Same arguments as :func:`precrop`, with no cap on widths by default
    (``upper=None``), for which ``mode="auto"`` picks ``"layerwise"`` (see
    the module docstring for why); e.g. ``reconfigure(model, params=0.8,
    flops=1.0)`` or ``reconfigure(model, params=0.8, latency=1.0)``. A latency model is
    fitted on narrower copies of the model, so widths beyond the original
    are extrapolated.
    """
    options.setdefault("upper", None)
    return precrop(model, params, flops, **options)
