"""Calibration: time a latency plan on this machine and re-plan until it measures in budget.

A latency model's prediction of its own plan can be off (a plan shrinks some
layers far more than the timed variants did); :func:`calibrated` corrects the
latency budget by the measured ratio of each round's plan.
"""

from __future__ import annotations

import math

from keras_precrop.errors import InfeasibleBudgetError
from keras_precrop.latency.model import ROW

CALIBRATION_SLACK = 0.03  # a measured time ratio this far above the budget meets it (timing noise)


def calibrated(solve, measure, predicted, budgets, target, rounds):
    """Widths whose *measured* time ratio meets the latency budget ``target``.

    ``solve(budgets)`` plans, ``measure(widths)`` times the rebuilt model
    against the original, ``predicted(widths)`` is the latency model's
    time. After each round the latency row's budget is scaled by ``target /
    measured`` (a multiplicative correction of the latency model's bias near
    the plan), up to ``rounds`` times, until the measured ratio is within
    ``CALIBRATION_SLACK`` of ``target``, the latency budget no longer binds
    (another budget does) or a corrected budget is infeasible. A budget under
    the narrowest plan's predicted time is first raised to that time, once:
    the fastest plan the latency model makes may still measure within
    ``target`` (the model can overrate narrow plans); in the first round, the
    error is raised if it does not. Returns the
    plan meeting ``target`` with the largest measured ratio (the least
    pruned), else the fastest one, and the rounds in its info.
    """
    budget, history, plans = dict(budgets), [], []
    original = budgets[ROW] / target
    for k in range(rounds + 1):
        try:
            previous = history[-1]["budget"] * original if history else math.inf
            widths, info, refused = _solve_at_least_narrowest(solve, budget, previous)
        except InfeasibleBudgetError:
            if k == 0:
                raise
            break
        ratio = measure(widths)
        if refused is not None and k == 0 and ratio > target * (1 + CALIBRATION_SLACK):
            raise refused  # the latency model was right: even the narrowest plan is too slow
        history.append({"budget": float(budget[ROW] / original), "measured": float(ratio)})
        plans.append((ratio, widths, info))
        slack = predicted(widths) < budget[ROW] * (1 - 0.01)
        if abs(ratio / target - 1) <= CALIBRATION_SLACK or (ratio < target and slack):
            break
        budget[ROW] *= target / ratio
    meeting = [p for p in plans if p[0] <= target * (1 + CALIBRATION_SLACK)]
    ratio, widths, info = max(meeting, key=lambda p: p[0]) if meeting else min(plans, key=lambda p: p[0])
    return widths, {**info, "latency_calibration": {
        "target": float(target), "measured": float(ratio), "met": bool(meeting), "rounds": history}}


def _solve_at_least_narrowest(solve, budget, previous):
    """``solve(budget)``; a latency budget the narrowest plan exceeds is raised to its time.

    Only where the latency row alone is infeasible, and only if ``previous``
    (the latency budget planned last; ``inf`` before the first round) was
    above that time, so the narrowest plan is planned once.

    Returns:
        The widths, their info, and the :class:`InfeasibleBudgetError` that
        the budget raised (None if it was not raised).
    """
    try:
        return (*solve(budget), None)
    except InfeasibleBudgetError as err:
        floor = (err.limit or {}).get(ROW)
        if floor is None or set(err.limit) != {ROW} or floor * (1 + 1e-6) >= previous:
            raise
        budget[ROW] = floor * (1 + 1e-6)
        return (*solve(budget), err)
