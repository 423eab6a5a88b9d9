"""SynExp's density program: layer densities under parameter/FLOP budgets.

Maximize ``sum_l log p_l`` subject to ``sum_l alpha_l p_l <= B_params``,
``sum_l beta_l p_l <= B_flops`` (and further rows of the same form, e.g. a
predicted latency) and ``lower_l <= p_l <= upper_l`` (the paper's Sec. 3.3
and Appendix A). Solved exactly from the KKT conditions (sorted
water-filling; a 1-D root find for two budgets) or with SLSQP as an
independent check.
"""

from __future__ import annotations

import numpy as np
from scipy import optimize

from keras_precrop.budget._common import (
    ACTIVE_RTOL,
    BUDGET_NAMES,
    DEFAULT_LOWER,
    FEASIBLE_RTOL,
    SolveResult,
    budget_value,
    check_bounds_order,
    check_nonnegative,
    upper_vector,
    vector,
)
from keras_precrop.errors import InfeasibleBudgetError


def solve_densities(alpha, beta=None, *, params_budget=None, flops_budget=None,
                    upper=1.0, lower=None, method="auto", rows=None):
    """Layer densities that maximize the SynExp objective under budgets.

    Solves ``max sum_l log p_l`` s.t. ``sum_l alpha_l p_l <= params_budget``,
    ``sum_l beta_l p_l <= flops_budget`` and ``lower_l <= p_l <= upper_l``.
    The KKT solution is ``p_l = clip(1 / (mu1 alpha_l + mu2 beta_l), lower_l,
    upper_l)`` with multipliers ``mu1, mu2 >= 0``.

    Args:
        alpha: (N,) per-layer cost in the params budget (parameter counts), >= 0.
        beta: (N,) per-layer cost in the flops budget, >= 0. The library
            passes MACs here; the argument keeps the paper's name "FLOPs".
            Without ``flops_budget`` it is only used to report ``flops``.
        params_budget: absolute budget in the units of ``alpha``, or None.
        flops_budget: absolute budget in the units of ``beta`` (MACs when
            called by the library), or None. At least one budget is required.
        upper: cap on each density, scalar or (N,). 1.0 is PreCrop (pruning
            only); None means no cap (PreConfig, layers may grow).
        lower: floor on each density, scalar or (N,); default
            ``DEFAULT_LOWER`` (1e-12), a tiny positive floor that keeps
            ``log p`` finite and never binds for sane budgets.
        method: "kkt" (exact closed form / root find), "slsqp"
            (``scipy.optimize.minimize``; an independent check, slower) or
            "auto" ("kkt" for up to two budgets, else "slsqp").
        rows: further budgets, ``{name: (cost per layer (N,), budget)}``
            (e.g. ``{"latency": (seconds per layer, seconds)}``); a budget
            of None leaves the row unconstrained (only reported).

    Returns:
        SolveResult with ``densities``, ``objective`` (sum log p), ``params``,
        ``flops`` (None without beta), ``costs`` (dict: cost of every row,
        ``rows`` included), ``active`` (dict: does each budget hold
        with equality, to 1e-6 relative), ``multipliers`` (dict with mu1, mu2,
        the Lagrange multipliers of the params / flops budgets in
        ``1 / p_l = mu1 alpha_l + mu2 beta_l``, and one per row; 0 for an
        absent or slack budget), ``success``, ``message``, ``method``, ``nit`` and
        ``kkt_residual`` (largest relative violation of stationarity,
        complementary slackness and primal/dual feasibility).

    Raises:
        ValueError: NaN/inf, negative costs, mismatched lengths, empty input,
            no budget, a budget <= 0, lower > upper, an unknown method, "kkt"
            with more than two budgets, or a layer that costs nothing under
            the given budgets while ``upper`` is None (its density would be
            unbounded).
        InfeasibleBudgetError: a budget below ``sum(cost * lower)``.
    """
    named = _named_rows(alpha, beta, params_budget, flops_budget, rows)
    if method not in ("auto", "kkt", "slsqp"):
        raise ValueError(f"method={method!r} is unknown; use 'auto', 'kkt' or 'slsqp'")
    n = named[0][1].size
    lo, hi = _density_bounds(lower, upper, n)
    given = [(name, coef, b) for name, coef, b in named if b is not None]
    if method == "kkt" and len(given) > 2:
        raise ValueError(f"method='kkt' solves up to two budgets, got {len(given)}; "
                         "use 'slsqp' or 'auto'")
    _check_feasible(given, lo)
    rows = np.stack([coef / b for _, coef, b in given])  # normalized: budgets are 1
    free = ~rows.any(axis=0)
    if np.isinf(hi[free]).any():
        i = int(np.flatnonzero(free & np.isinf(hi))[0])
        raise ValueError(f"layer {i} costs nothing under the given budgets and upper is None, "
                         "so its density is unbounded; give it a finite upper bound")
    if method == "slsqp" or len(given) > 2:
        method = "slsqp"
        p, nu, nit, success, message = _densities_slsqp(rows, lo, hi)
    else:
        method = "kkt"
        p, nu, nit = _densities_kkt(rows, lo, hi)
        success, message = True, "KKT conditions solved exactly"
    multipliers = {name: 0.0 for name, _, _ in named}
    active = {name: False for name, _, _ in named}
    for (name, coef, b), nu_k in zip(given, nu):
        multipliers[name] = float(nu_k) / b
        active[name] = bool(coef @ p >= b * (1 - ACTIVE_RTOL))
    costs = {name: float(coef @ p) for name, coef, _ in named if coef is not None}
    return SolveResult(
        densities=p, objective=float(np.sum(np.log(p))), params=costs["params"],
        flops=costs.get("flops"), costs=costs, active=active, multipliers=multipliers,
        success=success, message=message, method=method, nit=nit,
        kkt_residual=_kkt_residual(p, nu, rows, lo, hi))


def _named_rows(alpha, beta, params_budget, flops_budget, rows):
    """``[(name, cost per layer, budget or None)]``: params, flops, then ``rows``, checked."""
    alpha = vector("alpha", alpha)
    n = alpha.size
    check_nonnegative("alpha", alpha)
    if beta is not None:
        beta = vector("beta", beta, n)
        check_nonnegative("beta", beta)
    params_budget = budget_value("params_budget", params_budget)
    flops_budget = budget_value("flops_budget", flops_budget)
    if flops_budget is not None and beta is None:
        raise ValueError("flops_budget was given without beta (per-layer FLOPs/MACs)")
    named = [("params", alpha, params_budget), ("flops", beta, flops_budget)]
    for name, (coef, budget) in (rows or {}).items():
        if name in BUDGET_NAMES:
            raise ValueError(f"rows[{name!r}]: give the {name} budget as {name}_budget")
        coef = vector(f"rows[{name!r}]", coef, n)
        check_nonnegative(f"rows[{name!r}]", coef)
        named.append((name, coef, budget_value(f"rows[{name!r}] budget", budget)))
    if all(b is None for _, _, b in named):
        raise ValueError(
            "solve_densities needs params_budget and/or flops_budget (or a rows budget)")
    return named


def _density_bounds(lower, upper, n):
    """``(lo, hi)``: the (n,) density floors and caps, checked (+inf: no cap)."""
    layer = lambda i: f"layer {i}"  # noqa: E731 - names for error messages
    lo = vector("lower", DEFAULT_LOWER if lower is None else lower, n)
    if (lo <= 0).any():
        i = int(np.argmax(lo <= 0))
        raise ValueError(f"lower[{i}] = {lo[i]} must be > 0 (log p needs p > 0)")
    hi = upper_vector(upper, n, layer)
    if (hi <= 0).any():
        i = int(np.argmax(hi <= 0))
        raise ValueError(f"upper[{i}] = {hi[i]} must be > 0")
    check_bounds_order(lo, hi, layer)
    return lo, hi


def _check_feasible(given, lo):
    """Raises :class:`InfeasibleBudgetError` for a budget below its row's cost at ``lo``."""
    for name, coef, b in given:
        minimum = float(coef @ lo)
        if b < minimum * (1 - FEASIBLE_RTOL):
            label = f"{name}_budget" if name in BUDGET_NAMES else f"rows[{name!r}] budget"
            raise InfeasibleBudgetError(
                f"{label} = {b:.6g} is infeasible: the minimum feasible "
                f"{name} is {minimum:.6g} (every density at its lower bound)", limit=minimum)


def _water_fill(w, lo, hi):
    """Exact solution of ``max sum log p`` s.t. ``w @ p <= 1``, ``lo <= p <= hi``.

    ``p_l = clip(m / w_l, lo_l, hi_l)`` where the level ``m`` solves
    ``g(m) = sum_l clip(m, w_l lo_l, w_l hi_l) = 1``. ``g`` is piecewise linear
    and nondecreasing with breakpoints ``w lo`` and ``w hi``: evaluate it at
    every sorted breakpoint with prefix sums, find the segment that crosses 1
    and solve the linear piece. Layers with ``w_l = 0`` get ``hi_l``.

    Returns:
        (p, level); level is +inf when the budget is slack at ``p = hi``.
    """
    p = hi.copy()
    on = w > 0
    wl, lo_on, hi_on = w[on], lo[on], hi[on]
    low = wl * lo_on
    up = wl * hi_on
    if up.sum() <= 1.0:
        return p, np.inf
    low_sorted = np.sort(low)
    up_sorted = np.sort(up[np.isfinite(up)])
    breaks = np.sort(np.concatenate([low_sorted, up_sorted]))
    low_cum = np.concatenate([[0.0], np.cumsum(low_sorted)])
    up_cum = np.concatenate([[0.0], np.cumsum(up_sorted)])
    n_low = np.searchsorted(low_sorted, breaks, side="right")  # layers above their floor
    n_up = np.searchsorted(up_sorted, breaks, side="right")  # layers at their cap
    g = (low_cum[-1] - low_cum[n_low]) + up_cum[n_up] + breaks * (n_low - n_up)
    k = int(np.searchsorted(g, 1.0))  # first breakpoint with g >= 1
    if k == 0:  # budget equals sum(w lo): everything at its floor
        level = breaks[0]
    else:
        level = breaks[k - 1] + (1.0 - g[k - 1]) / (n_low[k - 1] - n_up[k - 1])
    p[on] = np.clip(level / wl, lo_on, hi_on)
    return p, level


def _densities_kkt(rows, lo, hi):
    """Exact KKT solution for one or two normalized budget rows.

    Returns (p, nu, nit) with ``nu`` the multipliers of the normalized
    constraints ``rows @ p <= 1``.
    """
    if len(rows) == 1:
        p, level = _water_fill(rows[0], lo, hi)
        return p, np.array([1.0 / level]), 1

    # Two budgets. If the optimum under one budget alone satisfies the other,
    # it is optimal (the other multiplier is 0). Otherwise both bind, and the
    # optimum is the single-budget optimum of a combined row
    # w(t) = (1 - t) rows[0] + t rows[1] for the t in (0, 1) at which both
    # rows cost the same (then both equal 1).
    single = []
    for k in (0, 1):
        if np.isinf(hi[(rows[k] == 0) & (rows[1 - k] > 0)]).any():
            single.append(None)  # unbounded with this budget alone
            continue
        p, level = _water_fill(rows[k], lo, hi)
        if rows[1 - k] @ p <= 1.0 + FEASIBLE_RTOL:
            nu = np.zeros(2)
            nu[k] = 1.0 / level
            return p, nu, 1
        single.append(p)

    diff = rows[0] - rows[1]
    nit = 0

    def gap(t):
        nonlocal nit
        nit += 1
        return diff @ _water_fill((1 - t) * rows[0] + t * rows[1], lo, hi)[0]

    # gap < 0 at t = 0 (flops over budget) and > 0 at t = 1. An unbounded end
    # has gap -> -inf / +inf; step inward until the sign is right.
    t_lo, t_hi = 0.0, 1.0
    if single[0] is None:
        t_lo = 0.5
        while gap(t_lo) >= 0:
            t_lo *= 0.5
    if single[1] is None:
        step = 0.5
        while gap(1.0 - step) <= 0:
            step *= 0.5
        t_hi = 1.0 - step
    t = optimize.brentq(gap, t_lo, t_hi, xtol=1e-300, rtol=4 * np.finfo(float).eps, maxiter=500)
    w = (1 - t) * rows[0] + t * rows[1]
    p, level = _water_fill(w, lo, hi)
    return p, np.array([1 - t, t]) / level, nit


def _densities_slsqp(rows, lo, hi):
    """SLSQP on the densities problem, in two well-conditioned passes.

    1. Log densities ``x = log p``: the Hessian of the Lagrangian is the
       identity at the optimum whatever the scale of the costs, so SLSQP's
       quasi-Newton matrix (which starts as the identity) is right from the
       start. Start: every layer an equal share of every budget (feasible).
       Loose tolerance: the exponential constraints make SLSQP's merit
       function flat near the optimum.
    2. Scaled densities ``y = p / p1`` around the pass-1 solution ``p1``
       (pulled strictly inside the budgets): the constraints are linear, so
       their linearization is exact, and the Hessian of ``-sum log y`` at
       ``y = 1`` is again the identity, so its first step is nearly exact.

    Layers that cost nothing sit at ``hi``. Lower bounds are passed to SLSQP
    only when they may bind (they triple its time per iteration): if
    ``lo_l * max_k rows[k, l] < 1 / n`` for every layer, the multipliers sum
    to at most ``n`` and no floor can bind.
    """
    p = hi.copy()
    on = rows.any(axis=0)
    if not on.any():
        return p, np.zeros(len(rows)), 0, True, "no layer has a cost: every density at its cap"
    r, lo_on, hi_on = rows[:, on], lo[on], hi[on]
    share = np.clip(1.0 / (on.sum() * r.sum(axis=0)), lo_on, hi_on)
    may_bind = np.any(lo_on * r.max(axis=0) * on.sum() >= 1.0)
    log_floors = np.log(lo_on) if may_bind else np.full_like(lo_on, -np.inf)
    first = optimize.minimize(
        lambda x: (-np.sum(x), -np.ones(x.size)),
        np.log(share),
        jac=True,
        method="SLSQP",
        bounds=optimize.Bounds(log_floors, np.log(hi_on)),
        constraints=[{"type": "ineq", "fun": lambda x: 1.0 - r @ np.exp(x),
                      "jac": lambda x: -r * np.exp(x)}],
        options={"ftol": 1e-8, "maxiter": 1000},
    )
    p1 = np.clip(np.exp(first.x), lo_on, hi_on)
    p1 = np.maximum(lo_on, p1 * min(1.0, (1.0 - 1e-9) / np.max(r @ p1)))
    a = r * p1  # constraint rows in y
    second = optimize.minimize(
        lambda y: (-np.sum(np.log(y)), -1.0 / y),
        np.ones(p1.size),
        jac=True,
        method="SLSQP",
        bounds=optimize.Bounds(np.where(may_bind, lo_on / p1, -np.inf), hi_on / p1),
        constraints=[{"type": "ineq", "fun": lambda y: 1.0 - a @ y, "jac": lambda y: -a}],
        options={"ftol": 1e-11, "maxiter": 1000},
    )
    p[on] = np.clip(second.x * p1, lo_on, hi_on)
    nu = np.maximum(np.asarray(second.multipliers, dtype=np.float64), 0.0)
    return p, nu, int(first.nit) + int(second.nit), bool(second.success), str(second.message)


def _kkt_residual(p, nu, rows, lo, hi):
    """Largest relative KKT violation of densities ``p`` with multipliers ``nu``.

    Stationarity with bounds: ``p`` must equal ``clip(1 / (nu @ rows), lo, hi)``
    (relative error). Complementary slackness: each budget's relative slack,
    weighted by its share of the price ``nu @ rows @ p``. Feasibility: budget
    and bound excess (relative); dual feasibility: negative multipliers.
    """
    price = nu @ rows
    with np.errstate(divide="ignore"):
        target = np.clip(1.0 / price, lo, hi)
    stationarity = np.abs(p - target) / p
    usage = rows @ p
    share = nu * usage / max(float(nu @ usage), np.finfo(float).tiny)
    slackness = share * np.abs(1.0 - usage)
    feasibility = np.concatenate([usage - 1.0, np.maximum(lo - p, p - hi) / p])
    terms = [stationarity.max(), slackness.max(), feasibility.max(), (-nu).max(), 0.0]
    return float(np.nan_to_num(max(terms), nan=np.inf))

