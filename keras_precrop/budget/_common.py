"""What both SynExp solvers share: the result record, tolerances and input checks.

Only numpy is imported, so the solvers load fast.
"""

from __future__ import annotations

import numpy as np

DEFAULT_LOWER = 1e-12
"""Default density floor: ``log p`` needs ``p > 0``; 1e-12 never binds in practice."""

ACTIVE_RTOL = 1e-6  # a budget is "active" when the cost is within this of it
FEASIBLE_RTOL = 1e-12  # roundoff allowed when comparing a cost with a budget
KKT_TOL = 1e-5  # solve_widths succeeds when its KKT residual is at most this
# A log ratio this close to a bound counts as at it in the KKT check (the final budget fill can
# leave an entry that SLSQP put on a bound a few 1e-9 inside it).
AT_BOUND = 1e-7
BUDGET_NAMES = ("params", "flops")
UNITS = {"params": "params", "flops": "MACs", "macs": "MACs"}  # what a row's cost counts, for messages
MAX_LOG_GROWTH = 64.0  # search limit for uncapped log ratios (e^64 ~ 6e27)


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


def vector(name, value, n=None):
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
    check_finite(name, arr)
    return arr


def check_finite(name, arr, allow_inf=False):
    bad = np.isnan(arr) if allow_inf else ~np.isfinite(arr)
    if bad.any():
        idx = np.unravel_index(np.argmax(bad), arr.shape)
        where = ", ".join(map(str, idx))
        raise ValueError(f"{name}[{where}] is {arr[idx]}; all entries must be finite numbers")


def check_nonnegative(name, arr):
    if (arr < 0).any():
        idx = np.unravel_index(np.argmax(arr < 0), arr.shape)
        raise ValueError(f"{name}[{', '.join(map(str, idx))}] = {arr[idx]} is negative; "
                         "costs must be >= 0")


def budget_value(name, value):
    """A positive finite budget, or None."""
    if value is None:
        return None
    value = float(value)
    if not np.isfinite(value) or value <= 0:
        raise ValueError(f"{name} = {value} must be a finite number > 0")
    return value


def upper_vector(upper, n, names):
    """``upper`` (scalar, array or None) as a length-``n`` array, +inf meaning no cap."""
    if upper is None:
        return np.full(n, np.inf)
    arr = np.asarray(upper, dtype=np.float64)
    arr = np.full(n, float(arr)) if arr.ndim == 0 else arr
    if arr.shape != (n,):
        raise ValueError(f"upper must be a scalar or have shape ({n},), got {arr.shape}")
    check_finite("upper", arr, allow_inf=True)
    if (arr == -np.inf).any():
        i = int(np.argmax(arr == -np.inf))
        raise ValueError(f"upper[{i}] ({names(i)}) is -inf; no value is feasible")
    return arr


def check_bounds_order(lower, upper, names):
    if (lower > upper).any():
        i = int(np.argmax(lower > upper))
        raise ValueError(f"lower[{i}] = {lower[i]} > upper[{i}] = {upper[i]} for {names(i)}; "
                         "the lower bound must not exceed the upper bound")

