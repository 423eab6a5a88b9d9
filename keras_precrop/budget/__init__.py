"""The budget wing: costs of widths, the SynExp programs and the translation modes.

* ``kinds``: the kinds of budget (params, FLOPs, latency) and their argument names.
* ``costs``: the bilinear cost model (params, MACs, extra rows such as a
  predicted latency), ``profile(model)`` and the budgets' argument checks.
* ``densities`` / ``widths``: the SynExp density and width programs.
* ``grid``: integer widths and the greedy repair.
* ``modes``: exact, layerwise, paper and uniform translations, and
  :func:`~keras_precrop.budget.modes.solve`, the one entry with budgets by
  row name.

It reads the graph wing and knows nothing of timing or plans. Its names load
on first use (PEP 562), so that the command line reads ``kinds`` to build its
parser without importing NumPy.
"""

import importlib

# Public name -> the module of this wing that defines it.
_PUBLIC = {
    "SolveResult": "_common", "CostModel": "costs", "CostRow": "costs", "ModelProfile": "costs",
    "profile": "costs", "solve_densities": "densities", "MODES": "modes", "auto_mode": "modes",
    "solve": "modes", "WidthProblem": "widths", "solve_widths": "widths",
}


def __getattr__(name):
    """Import a public name from its module on first use."""
    if name not in _PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_PUBLIC[name]}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_PUBLIC))


__all__ = ["MODES", "CostModel", "CostRow", "ModelProfile", "SolveResult", "WidthProblem",
           "auto_mode", "profile", "solve", "solve_densities", "solve_widths"]
