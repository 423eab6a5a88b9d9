"""SynExp's width program: channel widths of a whole network under budgets.

The density program's objective written over log channel-width ratios
(:class:`WidthProblem`): the objective is linear, the budgets (parameters,
MACs and further rows such as a predicted latency) are sums of exponentials,
and residual views stay within their streams: a convex geometric program,
solved with SLSQP in log space (:func:`solve_widths`).
"""

from __future__ import annotations

import dataclasses

import numpy as np
from scipy import optimize

from keras_precrop.budget._common import (
    ACTIVE_RTOL,
    AT_BOUND,
    BUDGET_NAMES,
    FEASIBLE_RTOL,
    KKT_TOL,
    MAX_LOG_GROWTH,
    UNITS,
    SolveResult,
    budget_value,
    check_bounds_order,
    check_finite,
    check_nonnegative,
    upper_vector,
)
from keras_precrop.errors import InfeasibleBudgetError


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
    rows: tuple = BUDGET_NAMES  # (R,) names of the cost columns, the budgets' names in solve_widths
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
        check_nonnegative("WidthProblem.term_coef", self.term_coef)
        t = len(self.term_coef)
        self.term_vars = self._array("term_vars", self.term_vars, np.int64, (t, 2))
        self._check_index("term_vars", self.term_vars, allow_none=True)
        self.const = self._array("const", self.const, np.float64, (r,))
        check_nonnegative("WidthProblem.const", self.const)
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
        check_nonnegative("WidthProblem.leq_offset", self.leq_offset)
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
        check_finite(f"WidthProblem.{name}", arr)
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
    leq = (problem.leq, problem.leq_offset)
    least, greatest = _width_bounds(problem, upper, budgets, given, leq)

    def usage(x):
        return np.array(problem.cost(x))[given] / budgets[given]

    if np.isfinite(greatest).all() and usage(greatest).max() <= 1.0:
        x, nit, residual = greatest, 0, 0.0
        message = "no budget binds: every variable at its upper bound"
        nu = np.zeros(given.size)
    else:
        x0 = _feasible_start(least, greatest, usage)
        x, nu, lam, nit, message = _widths_slsqp(problem, problem.objective_weights, x0, least,
                                                 greatest, budgets[given], given)
        if not np.isfinite(x).all():  # report the failure at the start, not NaN widths
            x, nu, lam = x0, np.zeros_like(nu), np.zeros_like(lam)
            message = f"SLSQP returned non-finite values ({message}); returning the start point"
        x = _fill_budget(x, least, greatest, leq, usage)
        residual = _width_kkt_residual(problem, x, nu, lam, least, greatest, budgets[given], given)
        message = f"{message}; KKT residual {residual:.1e}"
    return _width_result(problem, x, nu, budgets, given, residual, message, nit)


def _width_bounds(problem, upper, budgets, given, leq):
    """``(least, greatest)`` log ratios the constraints allow, checked against the budgets.

    A variable that nothing bounds and that has no objective weight keeps
    its original width where allowed.
    """
    name = lambda i: repr(problem.names[i])  # noqa: E731 - names for error messages
    hi = upper_vector(upper, problem.num_variables, name)
    check_bounds_order(problem.lower, hi, name)
    least = _raise_to_leq(problem.lower, leq)
    greatest = _lower_to_leq(hi, leq)
    if (least > greatest).any():
        i = int(np.argmax(least > greatest))
        raise ValueError(f"the leq constraints force {name(i)} to at least {least[i]:.6g} but its "
                         f"upper bound is {greatest[i]:.6g}; relax the bounds")
    minimum = np.array(problem.cost(least))
    for k in given:
        if budgets[k] < minimum[k] * (1 - FEASIBLE_RTOL):
            row = problem.rows[k]
            raise InfeasibleBudgetError(
                f"{row}_budget = {budgets[k]:.6g} is infeasible: the minimum "
                f"feasible {UNITS.get(row, row)} is {minimum[k]:.6g} (every width at its "
                "lower bound)", limit=float(minimum[k]))
    weights = problem.objective_weights
    bounded = _bounded_variables(problem, greatest, given)
    if (~bounded & (weights > 0)).any():
        i = int(np.argmax(~bounded & (weights > 0)))
        raise ValueError(f"variable {name(i)} is unbounded: it has no upper bound and costs "
                         "nothing under the given budgets; give it a finite upper bound")
    if not bounded.all():
        hi = np.where(bounded, hi, np.maximum(least, 0.0))
        greatest = _lower_to_leq(hi, leq)
    return least, greatest


def _width_result(problem, x, nu, budgets, given, residual, message, nit):
    """The :class:`SolveResult` of :func:`solve_widths` at log ratios ``x``."""
    cost = np.array(problem.cost(x))
    costs = dict(zip(problem.rows, map(float, cost)))
    active = {n: False for n in problem.rows}
    multipliers = {n: 0.0 for n in problem.rows}
    for k, nu_k in zip(given, nu):
        active[problem.rows[k]] = bool(cost[k] >= budgets[k] * (1 - ACTIVE_RTOL))
        multipliers[problem.rows[k]] = float(nu_k / budgets[k])
    ratios = np.exp(x)
    return SolveResult(
        log_ratios=x, ratios=ratios, widths=ratios * problem.widths, objective=problem.objective(x),
        params=costs.get("params"), flops=costs.get("flops", costs.get("macs")), costs=costs,
        active=active, multipliers=multipliers, success=residual <= KKT_TOL, message=message,
        method="slsqp", nit=nit, kkt_residual=residual)


def _row_budgets(rows, budgets, params_budget, flops_budget):
    """(R,) absolute budget per row of a WidthProblem, +inf where unset.

    ``flops_budget`` is the budget of the row named ``"flops"`` (the paper's
    name) or, in the library's cost models, ``"macs"`` (FLOPs counted as MACs).
    """
    merged = dict(budgets or {})
    flops_row = "flops" if "flops" in rows or "macs" not in rows else "macs"
    for row, value, keyword in (("params", params_budget, "params_budget"),
                                (flops_row, flops_budget, "flops_budget")):
        if value is None:
            continue
        if merged.get(row) is not None:
            raise ValueError(f"the {row} budget is given twice: as {keyword} and in budgets")
        merged[row] = value
    unknown = sorted(set(merged) - set(rows))
    if any(merged[row] is not None for row in unknown):
        raise ValueError(f"budgets name rows {unknown} that the problem does not have; "
                         f"its rows are {list(rows)}")
    return np.array([budget_value(f"{row}_budget", merged.get(row)) or np.inf for row in rows])



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
    ``MAX_LOG_GROWTH`` above every finite bound.
    """
    def point(s):
        return np.maximum(least, np.minimum(s, greatest))

    def fits(s):
        with np.errstate(over="ignore", invalid="ignore"):
            return bool(usage(point(s)).max() <= 1.0)

    s_lo = float(least.min())
    s_hi = float(np.max(np.where(np.isfinite(greatest), greatest, least)))
    if not np.isfinite(greatest).all():
        s_hi += MAX_LOG_GROWTH
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
    at_upper = x >= greatest - AT_BOUND
    at_lower = x <= least + AT_BOUND
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

    low, high = -1.0 - max(0.0, float(np.max(x - least))), MAX_LOG_GROWTH  # fits(low)
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
