"""SynExp solvers: layer densities and channel widths under param/MAC budgets.

Two convex programs from the paper (Sec. 3.3, Appendix A):

* :func:`solve_densities`: maximize ``sum_l log p_l`` subject to
  ``sum_l alpha_l p_l <= B_params``, ``sum_l beta_l p_l <= B_flops`` and
  ``lower_l <= p_l <= upper_l``. Solved exactly from the KKT conditions
  (sorted water-filling; a 1-D root find for two budgets) or with SLSQP as an
  independent check.
* :func:`solve_widths`: the same objective written over log channel-width
  ratios of a whole network (:class:`WidthProblem`); a convex geometric
  program solved with SLSQP in log space.

Besides params and FLOPs, both take further budget rows of the same form
(e.g. a predicted latency, linear in densities or bilinear in widths):
``rows=`` for densities, extra ``WidthProblem.rows`` columns and
``budgets=`` for widths.

Only numpy and scipy are imported so that this module loads fast.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from scipy import optimize

DEFAULT_LOWER = 1e-12
"""Default density floor: ``log p`` needs ``p > 0``; 1e-12 never binds in practice."""

_ACTIVE_RTOL = 1e-6  # a budget is "active" when the cost is within this of it
_FEASIBLE_RTOL = 1e-12  # roundoff allowed when comparing a cost with a budget
_KKT_TOL = 1e-5  # solve_widths succeeds when its KKT residual is at most this
# A log ratio this close to a bound counts as at it in the KKT check (the final budget fill can
# leave an entry that SLSQP put on a bound a few 1e-9 inside it).
_AT_BOUND = 1e-7
_BUDGET_NAMES = ("params", "flops")
_UNITS = {"params": "params", "flops": "MACs"}  # what a row's cost counts, for messages
_MAX_LOG_GROWTH = 64.0  # search limit for uncapped log ratios (e^64 ~ 6e27)


class InfeasibleBudgetError(ValueError):
    """A budget is below the cost of the smallest allowed configuration."""


class SolveResult(dict):
    """Solver output: a dict with attribute access, like ``scipy.optimize.OptimizeResult``."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError as err:
            raise AttributeError(name) from err

    __setattr__ = dict.__setitem__
    __delattr__ = dict.__delitem__

    def __dir__(self):
        return list(self.keys())

    def __repr__(self):
        width = max(map(len, self.keys()), default=0)
        lines = [f"{key.rjust(width)}: {_short(value)}" for key, value in self.items()]
        return "SolveResult(\n  " + "\n  ".join(lines) + "\n)"


def _short(value):
    """One-line summary of a result entry (arrays longer than 6 are summarized)."""
    if isinstance(value, np.ndarray) and value.size > 6:
        return (f"array(shape={value.shape}, min={value.min():.6g}, "
                f"max={value.max():.6g})")
    if isinstance(value, np.ndarray):
        return np.array2string(value, precision=6)
    if isinstance(value, float):
        return f"{value:.10g}"
    return repr(value)


# --------------------------------------------------------------------------
# Input validation
# --------------------------------------------------------------------------


def _vector(name, value, n=None):
    """``value`` as a finite 1-D float array (of length ``n`` when given)."""
    arr = np.asarray(value, dtype=np.float64)
    if arr.ndim == 0 and n is not None:
        arr = np.full(n, float(arr))
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"{name} is empty: give at least one layer")
    if n is not None and arr.size != n:
        raise ValueError(f"{name} has {arr.size} entries but alpha has {n}; lengths must match")
    _check_finite(name, arr)
    return arr


def _check_finite(name, arr, allow_inf=False):
    bad = np.isnan(arr) if allow_inf else ~np.isfinite(arr)
    if bad.any():
        idx = np.unravel_index(np.argmax(bad), arr.shape)
        where = ", ".join(map(str, idx))
        raise ValueError(f"{name}[{where}] is {arr[idx]}; all entries must be finite numbers")


def _check_nonnegative(name, arr):
    if (arr < 0).any():
        idx = np.unravel_index(np.argmax(arr < 0), arr.shape)
        raise ValueError(f"{name}[{', '.join(map(str, idx))}] = {arr[idx]} is negative; "
                         "costs must be >= 0")


def _budget(name, value):
    """A positive finite budget, or None."""
    if value is None:
        return None
    value = float(value)
    if not np.isfinite(value) or value <= 0:
        raise ValueError(f"{name} = {value} must be a finite number > 0")
    return value


def _upper_vector(upper, n, names):
    """``upper`` (scalar, array or None) as a length-``n`` array, +inf meaning no cap."""
    if upper is None:
        return np.full(n, np.inf)
    arr = np.asarray(upper, dtype=np.float64)
    arr = np.full(n, float(arr)) if arr.ndim == 0 else arr
    if arr.shape != (n,):
        raise ValueError(f"upper must be a scalar or have shape ({n},), got {arr.shape}")
    _check_finite("upper", arr, allow_inf=True)
    if (arr == -np.inf).any():
        i = int(np.argmax(arr == -np.inf))
        raise ValueError(f"upper[{i}] ({names(i)}) is -inf; no value is feasible")
    return arr


def _check_bounds_order(lower, upper, names):
    if (lower > upper).any():
        i = int(np.argmax(lower > upper))
        raise ValueError(f"lower[{i}] = {lower[i]} > upper[{i}] = {upper[i]} for {names(i)}; "
                         "the lower bound must not exceed the upper bound")


# --------------------------------------------------------------------------
# Layer densities
# --------------------------------------------------------------------------


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
    alpha = _vector("alpha", alpha)
    n = alpha.size
    _check_nonnegative("alpha", alpha)
    if beta is not None:
        beta = _vector("beta", beta, n)
        _check_nonnegative("beta", beta)
    params_budget = _budget("params_budget", params_budget)
    flops_budget = _budget("flops_budget", flops_budget)
    if flops_budget is not None and beta is None:
        raise ValueError("flops_budget was given without beta (per-layer FLOPs/MACs)")
    named = [("params", alpha, params_budget), ("flops", beta, flops_budget)]
    for name, (coef, budget) in (rows or {}).items():
        if name in _BUDGET_NAMES:
            raise ValueError(f"rows[{name!r}]: give the {name} budget as {name}_budget")
        coef = _vector(f"rows[{name!r}]", coef, n)
        _check_nonnegative(f"rows[{name!r}]", coef)
        named.append((name, coef, _budget(f"rows[{name!r}] budget", budget)))
    if all(b is None for _, _, b in named):
        raise ValueError(
            "solve_densities needs params_budget and/or flops_budget (or a rows budget)")
    if method not in ("auto", "kkt", "slsqp"):
        raise ValueError(f"method={method!r} is unknown; use 'auto', 'kkt' or 'slsqp'")

    layer = lambda i: f"layer {i}"  # noqa: E731 - names for error messages
    lo = _vector("lower", DEFAULT_LOWER if lower is None else lower, n)
    if (lo <= 0).any():
        i = int(np.argmax(lo <= 0))
        raise ValueError(f"lower[{i}] = {lo[i]} must be > 0 (log p needs p > 0)")
    hi = _upper_vector(upper, n, layer)
    if (hi <= 0).any():
        i = int(np.argmax(hi <= 0))
        raise ValueError(f"upper[{i}] = {hi[i]} must be > 0")
    _check_bounds_order(lo, hi, layer)

    given = [(name, coef, b) for name, coef, b in named if b is not None]
    if method == "kkt" and len(given) > 2:
        raise ValueError(f"method='kkt' solves up to two budgets, got {len(given)}; "
                         "use 'slsqp' or 'auto'")
    for name, coef, b in given:
        minimum = float(coef @ lo)
        if b < minimum * (1 - _FEASIBLE_RTOL):
            label = f"{name}_budget" if name in _BUDGET_NAMES else f"rows[{name!r}] budget"
            raise InfeasibleBudgetError(
                f"{label} = {b:.6g} is infeasible: the minimum feasible "
                f"{name} is {minimum:.6g} (every density at its lower bound)")
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
        active[name] = bool(coef @ p >= b * (1 - _ACTIVE_RTOL))
    costs = {name: float(coef @ p) for name, coef, _ in named if coef is not None}
    return SolveResult(
        densities=p,
        objective=float(np.sum(np.log(p))),
        params=costs["params"],
        flops=costs.get("flops"),
        costs=costs,
        active=active,
        multipliers=multipliers,
        success=success,
        message=message,
        method=method,
        nit=nit,
        kkt_residual=_kkt_residual(p, nu, rows, lo, hi),
    )


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
        if rows[1 - k] @ p <= 1.0 + _FEASIBLE_RTOL:
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


# --------------------------------------------------------------------------
# Channel widths
# --------------------------------------------------------------------------


@dataclasses.dataclass(eq=False)
class WidthProblem:
    """Continuous channel-width program: variables are log width ratios x_v = log(w_v / C_v).

    Cost at ratios ``r = exp(x)`` (``r[-1] := 1``)::

        cost[k] = const[k] + sum_t term_coef[t, k] * r[term_vars[t, 0]] * r[term_vars[t, 1]]

    with one column ``k`` per budget row named in ``rows``: by default
    ``k = 0`` params and ``k = 1`` MACs; more rows (e.g. ``"latency"``) add
    columns. ``cost(0)`` are the original totals. The objective
    ``sum_k obj_weight[k] * x[obj_var[k]]`` is the SynExp ``sum_l log p_l``
    up to a constant (a layer's density is the product of its input and
    output ratios). Arrays are converted and checked on
    construction.
    """

    names: list[str]          # (V,) a readable name per variable (a channel group or a residual view)
    widths: np.ndarray        # (V,) original channel counts C_v (float > 0)
    term_coef: np.ndarray     # (T, R) cost of each bilinear term at the ORIGINAL widths, one
    #                           column per row (params, MACs, then extra rows such as latency)
    term_vars: np.ndarray     # (T, 2) int: the (at most two) variables whose ratios multiply
    #                           the term; -1 = no factor
    const: np.ndarray         # (R,) cost of each row that does not depend on any variable
    obj_var: np.ndarray       # (K,) int: objective = sum_k obj_weight[k] * x[obj_var[k]]
    obj_weight: np.ndarray    # (K,) float > 0
    leq: np.ndarray           # (E, 2) int: constraint x[leq[e,0]] <= x[leq[e,1]] + leq_offset[e]
    #                           (a residual view is never wider than its stream; a balance bound)
    lower: np.ndarray         # (V,) lower bounds on x (log ratio), e.g. log(min_channels / C_v)
    rows: tuple = _BUDGET_NAMES  # (R,) names of the cost columns, the budgets' names in solve_widths
    leq_offset: np.ndarray = None  # (E,) float >= 0; None: all 0

    def __post_init__(self):
        self.names = [str(name) for name in self.names]
        v = len(self.names)
        if v == 0:
            raise ValueError("WidthProblem has no variables")
        self.widths = self._array("widths", self.widths, np.float64, (v,))
        if (self.widths <= 0).any():
            i = int(np.argmax(self.widths <= 0))
            raise ValueError(f"WidthProblem.widths[{i}] ({self.names[i]!r}) = {self.widths[i]} "
                             "must be > 0")
        self.rows = tuple(str(row) for row in self.rows)
        if not self.rows or len(set(self.rows)) != len(self.rows):
            raise ValueError(f"WidthProblem.rows must be distinct names, got {self.rows}")
        r = len(self.rows)
        self.term_coef = self._array("term_coef", self.term_coef, np.float64, (-1, r))
        _check_nonnegative("WidthProblem.term_coef", self.term_coef)
        t = len(self.term_coef)
        self.term_vars = self._array("term_vars", self.term_vars, np.int64, (t, 2))
        self._check_index("term_vars", self.term_vars, allow_none=True)
        self.const = self._array("const", self.const, np.float64, (r,))
        _check_nonnegative("WidthProblem.const", self.const)
        self.obj_var = self._array("obj_var", self.obj_var, np.int64, (-1,))
        self._check_index("obj_var", self.obj_var, allow_none=False)
        k = len(self.obj_var)
        self.obj_weight = self._array("obj_weight", self.obj_weight, np.float64, (k,))
        if (self.obj_weight <= 0).any():
            i = int(np.argmax(self.obj_weight <= 0))
            raise ValueError(f"WidthProblem.obj_weight[{i}] = {self.obj_weight[i]} must be > 0")
        self.leq = self._array("leq", self.leq, np.int64, (-1, 2))
        self._check_index("leq", self.leq, allow_none=False)
        if self.leq_offset is None:
            self.leq_offset = np.zeros(len(self.leq))
        self.leq_offset = self._array("leq_offset", self.leq_offset, np.float64, (len(self.leq),))
        _check_nonnegative("WidthProblem.leq_offset", self.leq_offset)
        self.lower = self._array("lower", self.lower, np.float64, (v,))

    @staticmethod
    def _array(name, value, dtype, shape):
        """``value`` as a finite array of ``dtype`` and ``shape`` (-1: any length)."""
        arr = np.asarray(value, dtype=np.float64)
        if arr.size == 0:
            arr = arr.reshape([0 if d == -1 else d for d in shape])
        if arr.ndim != len(shape) or any(d not in (-1, s) for d, s in zip(shape, arr.shape)):
            raise ValueError(f"WidthProblem.{name} has shape {arr.shape}, expected "
                             f"{tuple('any' if d == -1 else d for d in shape)}")
        _check_finite(f"WidthProblem.{name}", arr)
        if dtype is np.int64 and (arr != np.round(arr)).any():
            raise ValueError(f"WidthProblem.{name} must hold integers")
        return arr.astype(dtype)

    def _check_index(self, name, arr, allow_none):
        low = -1 if allow_none else 0
        bad = (arr < low) | (arr >= len(self.names))
        if bad.any():
            idx = np.unravel_index(np.argmax(bad), arr.shape)
            raise ValueError(f"WidthProblem.{name}[{', '.join(map(str, idx))}] = {arr[idx]} is not "
                             f"a variable index in [{low}, {len(self.names)})")

    @property
    def num_variables(self):
        """Number of variables V."""
        return len(self.names)

    @property
    def objective_weights(self):
        """(V,) total objective weight of each variable: the gradient of :meth:`objective`."""
        return np.bincount(self.obj_var, self.obj_weight, minlength=self.num_variables)

    def objective(self, x):
        """SynExp objective ``sum_k obj_weight[k] * x[obj_var[k]]`` at log ratios ``x``."""
        return float(self.obj_weight @ np.asarray(x, dtype=np.float64)[self.obj_var])

    def _term_values(self, x):
        """(T,) ratio product of each term at log ratios ``x``."""
        padded = np.append(np.asarray(x, dtype=np.float64), 0.0)  # index -1 -> log 1
        return np.exp(padded[self.term_vars].sum(axis=1))

    def cost(self, x):
        """Cost of every row (params, MACs, ...) at log ratios ``x`` (shape (V,)), a tuple."""
        total = self.const + self._term_costs(x).sum(axis=0)
        return tuple(map(float, total))

    def _term_costs(self, x):
        """(T, R) cost of each term in each row at log ratios ``x``."""
        return self.term_coef * self._term_values(x)[:, None]

    def cost_jacobian(self, x):
        """(R, V) derivative of the rows' costs with respect to the log ratios ``x``."""
        weighted = self._term_costs(x)
        v = self.num_variables
        index = np.where(self.term_vars < 0, v, self.term_vars)  # -1 -> a dropped bin
        jac = np.empty((len(self.rows), v))
        for k in range(len(self.rows)):
            jac[k] = (np.bincount(index[:, 0], weighted[:, k], minlength=v + 1)
                      + np.bincount(index[:, 1], weighted[:, k], minlength=v + 1))[:v]
        return jac


def solve_widths(problem, *, params_budget=None, flops_budget=None, upper=0.0, method="slsqp",
                 budgets=None):
    """Continuous channel widths that maximize the SynExp objective under budgets.

    In the log ratios ``x`` the objective is linear, the budgets are sums of
    exponentials and ``leq`` constraints are linear: a convex geometric
    program. It is solved with SLSQP (analytic gradients, budgets normalized
    to 1) from a feasible uniformly scaled start; a final uniform shift of
    the solution's free entries (projected onto the bounds and ``leq``)
    meets the binding budget to roundoff. The KKT conditions are then
    checked with SLSQP's multipliers, which decides ``success``.

    Args:
        problem: the :class:`WidthProblem`.
        params_budget: absolute params budget (units of ``const`` and
            ``term_coef[:, 0]``), or None.
        flops_budget: absolute budget in the units of ``term_coef[:, 1]``
            (MACs as built by the library), or None. At least one budget.
        upper: upper bound on ``x``, scalar or (V,); 0.0 never widens a
            variable (PreCrop), None (or +inf entries) means no cap
            (PreConfig).
        method: "slsqp" (or "auto", the same).
        budgets: ``{row name: absolute budget or None}`` for any row of
            ``problem.rows`` (e.g. ``{"latency": 0.01}``); ``params_budget``
            and ``flops_budget`` are the same as ``budgets={"params": ...,
            "flops": ...}``.

    Returns:
        SolveResult with ``log_ratios`` (x), ``ratios`` (exp x), ``widths``
        (continuous channel counts), ``objective``, ``params``, ``flops``
        (MACs; None for a problem without such a row), ``costs`` (dict: the
        cost of every row), ``active`` (dict: budget met with equality to
        1e-6 relative), ``multipliers`` (SLSQP's estimates of the budgets'
        Lagrange multipliers, objective units per param / per MAC / ...),
        ``kkt_residual`` (largest relative violation of stationarity,
        complementary slackness and feasibility), ``success`` (the KKT
        residual is at most 1e-5; SLSQP's own verdict is in ``message``),
        ``message``, ``method`` and ``nit``.

    Raises:
        ValueError: no budget, a budget <= 0, a budget for a row the problem
            does not have or given twice, bad ``upper``, lower > upper,
            ``leq`` constraints that contradict the bounds, or a variable
            with positive objective weight that nothing bounds (no cap and
            no cost under the given budgets).
        InfeasibleBudgetError: a budget below the cost at the lower bounds.
    """
    if not isinstance(problem, WidthProblem):
        raise TypeError(f"problem must be a WidthProblem, got {type(problem).__name__}")
    if method not in ("auto", "slsqp"):
        raise ValueError(f"method={method!r} is unknown for solve_widths; use 'slsqp'")
    budgets = _row_budgets(problem.rows, budgets, params_budget, flops_budget)
    given = np.flatnonzero(np.isfinite(budgets))
    if given.size == 0:
        raise ValueError(
            "solve_widths needs params_budget and/or flops_budget (or budgets={row: value})")
    name = lambda i: repr(problem.names[i])  # noqa: E731 - names for error messages
    hi = _upper_vector(upper, problem.num_variables, name)
    _check_bounds_order(problem.lower, hi, name)

    leq = (problem.leq, problem.leq_offset)
    least = _raise_to_leq(problem.lower, leq)
    greatest = _lower_to_leq(hi, leq)
    if (least > greatest).any():
        i = int(np.argmax(least > greatest))
        raise ValueError(f"the leq constraints force {name(i)} to at least {least[i]:.6g} but its "
                         f"upper bound is {greatest[i]:.6g}; relax the bounds")
    minimum = np.array(problem.cost(least))
    for k in given:
        if budgets[k] < minimum[k] * (1 - _FEASIBLE_RTOL):
            row = problem.rows[k]
            raise InfeasibleBudgetError(
                f"{row}_budget = {budgets[k]:.6g} is infeasible: the minimum "
                f"feasible {_UNITS.get(row, row)} is {minimum[k]:.6g} (every width at its "
                "lower bound)")
    weights = problem.objective_weights
    bounded = _bounded_variables(problem, greatest, given)
    if (~bounded & (weights > 0)).any():
        i = int(np.argmax(~bounded & (weights > 0)))
        raise ValueError(f"variable {name(i)} is unbounded: it has no upper bound and costs "
                         "nothing under the given budgets; give it a finite upper bound")
    if not bounded.all():  # no cost, no objective: keep the original width when allowed
        hi = np.where(bounded, hi, np.maximum(least, 0.0))
        greatest = _lower_to_leq(hi, leq)

    def usage(x):
        return np.array(problem.cost(x))[given] / budgets[given]

    if np.isfinite(greatest).all() and usage(greatest).max() <= 1.0:
        x, nit, success, residual = greatest, 0, True, 0.0
        message = "no budget binds: every variable at its upper bound"
        nu = np.zeros(given.size)
    else:
        x0 = _feasible_start(least, greatest, usage)
        x, nu, lam, nit, message = _widths_slsqp(problem, weights, x0, least, greatest,
                                                 budgets[given], given)
        if not np.isfinite(x).all():  # report the failure at the start, not NaN widths
            x, nu, lam = x0, np.zeros_like(nu), np.zeros_like(lam)
            message = f"SLSQP returned non-finite values ({message}); returning the start point"
        x = _fill_budget(x, least, greatest, leq, usage)
        residual = _width_kkt_residual(problem, x, nu, lam, least, greatest, budgets[given], given)
        success = residual <= _KKT_TOL
        message = f"{message}; KKT residual {residual:.1e}"

    cost = np.array(problem.cost(x))
    costs = dict(zip(problem.rows, map(float, cost)))
    active = {n: False for n in problem.rows}
    multipliers = {n: 0.0 for n in problem.rows}
    for k, nu_k in zip(given, nu):
        active[problem.rows[k]] = bool(cost[k] >= budgets[k] * (1 - _ACTIVE_RTOL))
        multipliers[problem.rows[k]] = float(nu_k / budgets[k])
    ratios = np.exp(x)
    return SolveResult(
        log_ratios=x,
        ratios=ratios,
        widths=ratios * problem.widths,
        objective=problem.objective(x),
        params=costs.get("params"),
        flops=costs.get("flops"),
        costs=costs,
        active=active,
        multipliers=multipliers,
        success=success,
        message=message,
        method="slsqp",
        nit=nit,
        kkt_residual=residual,
    )


def _row_budgets(rows, budgets, params_budget, flops_budget):
    """(R,) absolute budget per row of a WidthProblem, +inf where unset."""
    merged = dict(budgets or {})
    for row, value in (("params", params_budget), ("flops", flops_budget)):
        if value is None:
            continue
        if merged.get(row) is not None:
            raise ValueError(f"the {row} budget is given twice: as {row}_budget and in budgets")
        merged[row] = value
    unknown = sorted(set(merged) - set(rows))
    if any(merged[row] is not None for row in unknown):
        raise ValueError(f"budgets name rows {unknown} that the problem does not have; "
                         f"its rows are {list(rows)}")
    return np.array([_budget(f"{row}_budget", merged.get(row)) or np.inf for row in rows])


def _raise_to_leq(x, leq):
    """Smallest ``z >= x`` with ``z[i] <= z[j] + offset`` for every ``(i, j)``, ``offset`` in ``leq``.

    ``leq`` is ``(pairs, offsets)``; offsets are >= 0, so the propagation
    (Bellman-Ford on a graph without positive cycles) settles in ``len(x)``
    sweeps.
    """
    pairs, offset = leq
    z = x.copy()
    for _ in range(len(z) + 1):
        prev = z.copy()
        np.maximum.at(z, pairs[:, 1], z[pairs[:, 0]] - offset)
        if np.array_equal(prev, z):
            break
    return z


def _lower_to_leq(x, leq):
    """Largest ``z <= x`` with ``z[i] <= z[j] + offset`` for every ``(i, j)``, ``offset`` in ``leq``."""
    pairs, offset = leq
    z = x.copy()
    for _ in range(len(z) + 1):
        prev = z.copy()
        np.minimum.at(z, pairs[:, 0], z[pairs[:, 1]] + offset)
        if np.array_equal(prev, z):
            break
    return z


def _bounded_variables(problem, greatest, given):
    """(V,) mask of variables that cannot grow without limit.

    A variable is bounded when it has a finite (propagated) upper bound, has
    a cost under a given budget, or is ``leq`` a bounded variable.
    """
    costed = problem.term_coef[:, given].sum(axis=1) > 0
    bounded = np.isfinite(greatest)
    for col in (0, 1):
        ids = problem.term_vars[costed, col]
        bounded[ids[ids >= 0]] = True
    for _ in range(problem.num_variables + 1):
        prev = bounded.copy()
        bounded[problem.leq[:, 0]] |= bounded[problem.leq[:, 1]]
        if np.array_equal(prev, bounded):
            break
    return bounded


def _feasible_start(least, greatest, usage):
    """Uniform scaling ``x = clip(s, least, greatest)`` with the largest feasible ``s``.

    ``clip`` keeps ``leq`` (both bounds satisfy it and offsets are >= 0) and the cost grows with
    ``s``, so ``s`` is found by bisection. Uncapped variables are limited to
    ``_MAX_LOG_GROWTH`` above every finite bound.
    """
    def point(s):
        return np.maximum(least, np.minimum(s, greatest))

    def fits(s):
        with np.errstate(over="ignore", invalid="ignore"):
            return bool(usage(point(s)).max() <= 1.0)

    s_lo = float(least.min())
    s_hi = float(np.max(np.where(np.isfinite(greatest), greatest, least)))
    if not np.isfinite(greatest).all():
        s_hi += _MAX_LOG_GROWTH
    return point(_bisect(fits, s_lo, s_hi))


def _bisect(fits, low, high):
    """Largest ``s`` in ``[low, high]`` with ``fits(s)``, for monotone ``fits`` and ``fits(low)``.

    Bisects until the bracket is at roundoff level (absolute 1e-15 for
    ``|s| <= 1``), always returning a point that fits.
    """
    if fits(high):
        return high
    while high - low > 4 * np.finfo(float).eps * max(1.0, abs(low), abs(high)):
        mid = 0.5 * (low + high)
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low


def _widths_slsqp(problem, weights, x0, least, greatest, budgets, given):
    """SLSQP on the width program in log space, budgets normalized to 1."""
    leq, offset = problem.leq, problem.leq_offset
    leq_jac = np.zeros((len(leq), problem.num_variables))
    leq_jac[np.arange(len(leq)), leq[:, 1]] += 1.0
    leq_jac[np.arange(len(leq)), leq[:, 0]] -= 1.0
    scale = 1.0 / budgets

    def constraints(x):
        cost = np.array(problem.cost(x))[given]
        return np.concatenate([1.0 - cost * scale, x[leq[:, 1]] + offset - x[leq[:, 0]]])

    def constraints_jac(x):
        return np.vstack([-problem.cost_jacobian(x)[given] * scale[:, None], leq_jac])

    res = optimize.minimize(
        lambda x: (-float(weights @ x), -weights),
        x0,
        jac=True,
        method="SLSQP",
        bounds=optimize.Bounds(least, greatest),
        constraints=[{"type": "ineq", "fun": constraints, "jac": constraints_jac}],
        options={"ftol": 1e-12, "maxiter": 1000},
    )
    mult = np.maximum(np.asarray(res.multipliers, dtype=np.float64), 0.0)
    return res.x, mult[: len(given)], mult[len(given):], int(res.nit), str(res.message)


def _width_kkt_residual(problem, x, nu, lam, least, greatest, budgets, given):
    """Largest relative KKT violation of log ratios ``x`` with SLSQP's multipliers.

    ``nu``: budget multipliers (budgets normalized to 1); ``lam``: ``leq``
    multipliers. Stationarity: the gradient of the Lagrangian
    ``r = -W + sum_k nu_k J_k / B_k - A^T lam`` must vanish for free
    variables, be <= 0 at an upper bound and >= 0 at a lower bound; each
    entry is divided by the sum of the magnitudes it is made of.
    Complementary slackness: multiplier times slack, relative to
    ``max(1, multiplier)``. Feasibility: budget, ``leq`` and bound excess.
    """
    leq = problem.leq
    weights = problem.objective_weights
    pull = nu @ (problem.cost_jacobian(x)[given] / budgets[:, None])
    push = np.zeros_like(x)
    np.add.at(push, leq[:, 1], lam)
    np.subtract.at(push, leq[:, 0], lam)
    grad = -weights + pull - push
    size = weights + pull + np.bincount(leq.ravel(), np.repeat(lam, 2), minlength=x.size)
    rel = grad / np.where(size > 0, size, 1.0)
    at_upper = x >= greatest - _AT_BOUND
    at_lower = x <= least + _AT_BOUND
    stationarity = np.where(at_upper & at_lower, 0.0, np.where(
        at_upper, np.maximum(rel, 0.0), np.where(at_lower, np.maximum(-rel, 0.0), np.abs(rel))))
    usage = np.array(problem.cost(x))[given] / budgets
    gaps = x[leq[:, 1]] + problem.leq_offset - x[leq[:, 0]]
    terms = [
        stationarity.max(initial=0.0),
        (nu * np.abs(1.0 - usage) / np.maximum(1.0, nu)).max(initial=0.0),
        (lam * np.abs(gaps) / np.maximum(1.0, lam)).max(initial=0.0),
        (usage - 1.0).max(initial=0.0),
        (-gaps).max(initial=0.0),
        np.maximum(least - x, x - greatest).max(initial=0.0),
    ]
    return float(max(terms))


def _fill_budget(x, least, greatest, leq, usage):
    """Shift the free entries of ``x`` uniformly so that the tightest budget is met to roundoff.

    Entries at a bound stay there (unless all are). The shifted point is
    projected onto the bounds and ``leq`` (clip, then lower each ``x[i]`` to
    ``x[j] + offset``), which keeps it feasible and makes the cost monotone in the
    shift, so the largest feasible shift is found by bisection (after
    bracketing it, starting from 1e-9). This removes SLSQP's last bit of
    slack or of constraint violation.
    """
    movable = (x > least + 1e-9) & (x < greatest - 1e-9)
    if not movable.any():
        movable[:] = True

    def point(shift):
        return _lower_to_leq(np.maximum(least, np.minimum(x + shift * movable, greatest)), leq)

    def fits(shift):
        with np.errstate(over="ignore", invalid="ignore"):
            return bool(usage(point(shift)).max() <= 1.0)

    low, high = -1.0 - max(0.0, float(np.max(x - least))), _MAX_LOG_GROWTH  # fits(low)
    up = fits(0.0)
    low, high = (0.0, high) if up else (low, 0.0)
    step = 1e-9 if up else -1e-9
    while low < step < high:
        if fits(step) != up:
            break
        low, high = (step, high) if up else (low, step)
        step *= 8.0
    low, high = (low, min(step, high)) if up else (max(step, low), high)
    return point(_bisect(fits, low, high))
