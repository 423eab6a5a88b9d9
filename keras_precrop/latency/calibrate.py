"""Calibration: time a latency plan on this machine and re-plan until it measures in budget.

A latency model's prediction of its own plan can be off (a plan shrinks some
layers far more than the timed variants did); :func:`calibrated` corrects the
latency budget by the measured ratio of each round's plan, and once a plan
under the target and one over it are known, searches between them. A budget
is a ceiling, not a licence to return a model far below it: a kept plan that
measures far under the target, or that cuts a layer to a few channels, is
kept with a :class:`CalibrationWarning` saying so, and so is a search whose
rounds measured slower at a lower budget (the runtime's time does not fall
with width here: it names the runtime and the likely cause). A round that measures far off the
latency model's prediction is timed again before it steers the search (a
disturbed timing would send it to a needlessly narrow plan). A plan that cannot meet the
target while ``mode="auto"``'s floor holds the residual streams at the uniform plan's widths (at
the target: the floor does not follow a corrected budget down) ends "not met", the warning naming
the streams held and a lower ``floor=`` as the remedy.
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from keras_precrop.errors import InfeasibleBudgetError
from keras_precrop.latency.model import ROW
from keras_precrop.latency.runtimes import not_monotone

CALIBRATION_SLACK = 0.03  # a measured time ratio this far above the budget meets it (timing noise)
FAR_UNDER = 0.7  # a kept plan measuring under this share of the target is far under it
_CONVERGED = 1e-3  # bracketing budgets closer than this (relative) are one budget
NOT_MONOTONE = 0.1  # a round at a lower budget measuring this much slower: time is not monotone
SURPRISE = 0.25  # a round measuring this far off the latency model's prediction is timed again
AGREE = 0.1  # two timings of one plan this close agree


class CalibrationWarning(UserWarning):
    """A calibrated latency plan that measures far under its target or cuts a layer to a few
    channels: the latency model mispredicts this model's plans."""


def calibrated(solve, measure, predicted, budgets, target, rounds, runtime=None):
    """Widths whose *measured* time ratio meets the latency budget ``target``.

    ``solve(budgets)`` plans, ``measure(widths)`` times the rebuilt model
    against the original (a float; one with a ``narrowed`` attribute, as
    :func:`~keras_precrop.latency.timing.time_ratio` returns, also names the
    layers it cuts to a few channels), ``predicted(widths)`` is the latency
    model's time. After each round the latency row's budget is corrected,
    up to ``rounds`` times, until the measured ratio is within
    ``CALIBRATION_SLACK`` of ``target``, the latency budget no longer binds
    (another budget does) or a corrected budget is infeasible: while every
    plan so far measures on one side of ``target``, the budget is scaled by
    ``target / measured``; once the plans bracket it (the plan measuring
    closest under ``target`` and the one closest over it), the next budget
    is the geometric mean of theirs (a bisection: a measured ratio need not
    fall as the budget does, and a jump by the ratio alone swung between a
    collapsed plan and one over the target). A budget under the narrowest
    plan's predicted time is first raised to that time, once: the fastest
    plan the latency model makes may still measure within ``target``; in
    the first round, the error is raised if it does not.

    Where a round at a lower budget measures more than
    :data:`NOT_MONOTONE` slower than one at a higher budget, the runtime's
    time does not fall with width here: the calibration says so (naming
    ``runtime``, the latency model's runtime, and the likely cause), since
    no search over one budget can be trusted to converge then.

    Returns:
        The plan meeting ``target`` with the largest measured ratio (the
        least pruned), preferring plans that cut no layer to a few channels,
        else the fastest one, and its info with ``latency_calibration``:
        ``target``, ``measured``, ``met``, ``rounds`` (each round's
        ``budget``, as a ratio of the original's predicted time, and
        ``measured`` ratio; ``same_plan_as``: the round, counted from 1,
        whose plan a round repeats, which is not timed again; ``timings``:
        a round timed again because it measured far off the latency
        model's prediction (:func:`_timed`), its ratio their median),
        ``not_monotone`` (pairs of rounds whose measured ratios rose as the
        budget fell) and, where the kept plan measures under ``FAR_UNDER``
        times ``target``, cuts a layer to a few channels or the rounds are
        not monotone, or it is not met while a floor held widths at the uniform plan's of the
        target (the solver's ``floor_at`` and ``floor_binds``: :func:`_held`), ``warning`` (also
        issued as a :class:`CalibrationWarning`).
    """
    budget, history, plans = dict(budgets), [], []
    original = budgets[ROW] / target
    for k in range(rounds + 1):
        try:
            lowest = min((h["budget"] for h in history), default=math.inf) * original
            widths, info, refused = _solve_at_least_narrowest(solve, budget, lowest)
        except InfeasibleBudgetError:
            if k == 0:
                raise
            break
        same = next((j for j, p in enumerate(plans) if np.array_equal(p[1], widths)), None)
        timings = _timed(measure, widths, predicted(widths) / original) if same is None else ()
        ratio = _middle(timings) if same is None else plans[same][0]  # a plan is timed once
        if refused is not None and k == 0 and ratio > target * (1 + CALIBRATION_SLACK):
            raise refused  # the latency model was right: even the narrowest plan is too slow
        history.append({"budget": float(budget[ROW] / original), "measured": float(ratio),
                        **({} if same is None else {"same_plan_as": same + 1}),
                        **({"timings": [float(t) for t in timings]} if len(timings) > 1 else {})})
        plans.append((ratio, widths, info))
        slack = predicted(widths) < budget[ROW] * (1 - 0.01)
        following = _next_budget(history, target)
        if abs(ratio / target - 1) <= CALIBRATION_SLACK or (ratio < target and slack) \
                or following is None:
            break
        budget[ROW] = following * original
    ratio, widths, info, met = _kept(plans, target)
    calibration = {"target": float(target), "measured": float(ratio), "met": met,
                   "rounds": history, "not_monotone": _rising(history)}
    warning = _warning(ratio, target, getattr(ratio, "narrowed", ()) if met else (),
                       calibration["not_monotone"], runtime, None if met else _held(info))
    if warning:
        calibration["warning"] = warning
        warnings.warn(CalibrationWarning(warning), stacklevel=3)
    return widths, {**info, "latency_calibration": calibration}


def _timed(measure, widths, predicted):
    """The plan's measured ratios: one, or where it is :data:`SURPRISE` off the latency model's
    ``predicted`` ratio, a second, and a third where those two disagree (by over :data:`AGREE`).

    One timing disturbed by other work on the machine (a round measured 0.73 of the original's
    time for a plan that measured 0.44 alone) would steer the search to a needlessly narrow
    plan; a surprise the runtime repeats is its real time.
    """
    timings = [measure(widths)]
    if abs(timings[0] / predicted - 1) > SURPRISE:
        timings.append(measure(widths))
        if abs(timings[1] / timings[0] - 1) > AGREE:
            timings.append(measure(widths))
    return timings


def _middle(timings):
    """The median of one to three timings (of two that agree, the first)."""
    return sorted(timings, key=float)[(len(timings) - 1) // 2] if len(timings) != 2 else timings[0]


def _kept(plans, target):
    """The plan calibration keeps, ``(ratio, widths, info, met)``: of the ``(ratio, widths,
    info)`` measured within ``target`` (slack included), the least pruned of those that cut no
    layer to a few channels, else the least pruned; else the fastest."""
    meeting = [p for p in plans if p[0] <= target * (1 + CALIBRATION_SLACK)]
    if not meeting:
        return (*min(plans, key=lambda p: p[0]), False)
    whole = [p for p in meeting if not getattr(p[0], "narrowed", ())]
    return (*max(whole or meeting, key=lambda p: p[0]), True)


def _rising(history):
    """Pairs of rounds (counted from 1) where the one at the lower budget measured more than
    :data:`NOT_MONOTONE` slower: ``{"lower", "higher"}`` each, with their budgets and ratios."""
    found = []
    for i, low in enumerate(history):
        for j, high in enumerate(history):
            if low["budget"] < high["budget"] and low["measured"] > high["measured"] * (1 + NOT_MONOTONE):
                found.append({"lower": i + 1, "higher": j + 1,
                              "budgets": [low["budget"], high["budget"]],
                              "measured": [low["measured"], high["measured"]]})
    return found


def _next_budget(history, target):
    """The next round's latency budget (a ratio of the original's predicted time), or None.

    With rounds measuring on both sides of ``target``: the geometric mean of
    the budgets of the round measuring closest under it (the latest of
    equals) and of the one closest over it; None once those are one budget.
    With rounds on one side only: the budget of the round closest to
    ``target`` scaled by ``target / measured``.
    """
    under = [(h["measured"], i) for i, h in enumerate(history) if h["measured"] <= target]
    over = [(-h["measured"], i) for i, h in enumerate(history) if h["measured"] > target]
    if under and over:
        low, high = history[max(under)[1]]["budget"], history[max(over)[1]]["budget"]
        if abs(math.log(high / low)) < _CONVERGED:
            return None
        return math.sqrt(low * high)
    closest = history[max(under or over)[1]]
    return closest["budget"] * target / closest["measured"]


def _held(info):
    """What held a plan's widths back, from its solver ``info``: ``(problem, remedy)`` where the
    floor was held at the target's uniform widths (``info["floor_at"]``) and held some widths
    there (``info["floor_binds"]``), else None."""
    binds = info.get("floor_binds") if info.get("floor_at") == "target" else None
    if not binds:
        return None
    streams = info.get("floor_on") == "streams"
    named = ", ".join(map(repr, binds[:4])) + (f" and {len(binds) - 4} more" if len(binds) > 4 else "")
    lower = round(0.7 * info["floor"], 2)
    on = ', floor_on="streams"' if streams else ""
    return (f"the {'residual streams' if streams else 'widths'} were held at floor={float(info['floor'])!r} "
            f"times the uniform plan's widths at the target (width factor "
            f"{info['floor_ratio']:.3f}; held there: {named}) whatever budget the rounds tried",
            f" A lower floor lets them go lower (floor={lower:g}{on}: {lower:.0%} of the uniform "
            "widths), at the risk of starving them; or plan for another runtime= or round_to= "
            "on which the time falls with width.")


def _warning(ratio, target, narrowed, rising, runtime, held=None):
    """What is wrong with a kept plan measuring ``ratio`` of the original's time for the
    budget ``target``, whose measurement names the ``narrowed`` layers ``(name, kept,
    original)``, after rounds that measured ``rising`` (:func:`_rising`) on ``runtime``, with a
    not-met plan's widths ``held`` back (:func:`_held`); None if nothing is."""
    problems = []
    if held:
        problems.append(f"it measures {ratio:.3f} of the original's time, over the target "
                        f"latency={target:g}: {held[0]}")
    if rising:
        pairs = ", ".join(f"budget {p['budgets'][0]:.3g} measured {p['measured'][0]:.3f} but budget "
                          f"{p['budgets'][1]:.3g} measured {p['measured'][1]:.3f}" for p in rising[:2])
        problems.append(f"the rounds' measured time did not fall with the budget ({pairs}), "
                        f"so no budget search converges on runtime {runtime!r} here: "
                        f"{not_monotone(runtime)}")
    if ratio < FAR_UNDER * target:
        problems.append(f"it measures {ratio:.3f} of the original's time, far under the target "
                        f"latency={target:g} ({ratio / target:.0%} of it)")
    if narrowed:
        cut = ", ".join(f"{name!r} from {before} to {after}" for name, after, before in narrowed[:5])
        more = f" and {len(narrowed) - 5} more" if len(narrowed) > 5 else ""
        problems.append(f"it measures {ratio:.3f} of the original's time and cuts layers to a few "
                        f"channels: {cut}{more}")
    if not problems:
        return None
    refit = (" The latency model mispredicts this model's plans: fit it with more variants and "
             "refinement (kp.latency_model(model, variants=20, refine_rounds=2)), or give more "
             "calibrate= rounds." if len(problems) > bool(rising) + bool(held) else "")
    return ("The calibrated latency plan is kept, but " + "; ".join(problems) + "." + refit
            + (held[1] if held else ""))


def _solve_at_least_narrowest(solve, budget, lowest):
    """``solve(budget)``; a latency budget the narrowest plan exceeds is raised to its time.

    Only where the latency row alone is infeasible, and only if ``lowest``
    (the lowest latency budget planned so far; ``inf`` before the first
    round) was above that time, so the narrowest plan is planned once.

    Returns:
        The widths, their info, and the :class:`InfeasibleBudgetError` that
        the budget raised (None if it was not raised).
    """
    try:
        return (*solve(budget), None)
    except InfeasibleBudgetError as err:
        floor = (err.limit or {}).get(ROW)
        if floor is None or set(err.limit) != {ROW} or floor * (1 + 1e-6) >= lowest:
            raise
        budget[ROW] = floor * (1 + 1e-6)
        return (*solve(budget), err)
