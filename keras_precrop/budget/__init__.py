"""The budget wing: costs of widths, the SynExp programs and the translation modes.

* ``costs``: the bilinear cost model (params, MACs, extra rows such as a
  predicted latency) and ``profile(model)``.
* ``densities`` / ``widths``: the SynExp density and width programs.
* ``grid``: integer widths and the greedy repair.
* ``modes``: exact, layerwise, paper and uniform translations, and
  :func:`~keras_precrop.budget.modes.solve`, the one entry with budgets by
  row name.

It reads the graph wing and knows nothing of timing or plans.
"""

from keras_precrop.budget._common import SolveResult
from keras_precrop.budget.costs import CostModel, CostRow, ModelProfile, profile
from keras_precrop.budget.densities import solve_densities
from keras_precrop.budget.modes import MODES, auto_mode, solve
from keras_precrop.budget.widths import WidthProblem, solve_widths

__all__ = ["MODES", "CostModel", "CostRow", "ModelProfile", "SolveResult", "WidthProblem",
           "auto_mode", "profile", "solve", "solve_densities", "solve_widths"]
