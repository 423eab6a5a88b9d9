"""Calibration: time a latency plan on this machine and re-plan until it measures in budget.

A latency model's prediction of its own plan can be off (a plan shrinks some
layers far more than the timed variants did); :func:`calibrated` corrects the
latency budget by the measured ratio of each round's plan.
"""

from __future__ import annotations

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
    (another budget does) or a corrected budget is infeasible. Returns the
    plan meeting ``target`` with the largest measured ratio (the least
    pruned), else the fastest one, and the rounds in its info.
    """
    budget, history, plans = dict(budgets), [], []
    original = budgets[ROW] / target
    for k in range(rounds + 1):
        try:
            widths, info = solve(budget)
        except InfeasibleBudgetError:
            if k == 0:
                raise
            break
        ratio = measure(widths)
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
