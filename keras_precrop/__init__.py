"""keras-precrop: structured pruning-at-initialization for Keras 3 CNNs.

Public API (everything else is private):

* ``profile(model)``: per-layer parameters, MACs and width variables.
* ``solve_densities`` / ``solve_widths``: the SynExp convex programs.
* ``plan`` / ``apply_plan`` / ``precrop`` / ``reconfigure``: PreCrop and PreConfig
  (``weights="keep"``: prune or widen a trained model, keeping its weights).
* ``fine_tune``: train such a model a little, distilled from the original or not.
* ``latency_model`` / ``LatencyModel``: measured time as a budget (``latency=0.5``).
* ``compare``: the modes side by side, uniform width scaling included.
* ``register_handler`` / ``Handler`` / ``WeightSpec``: teach the package a custom layer.
* ``hub``: ``keras_hub`` task models pruned through their backbone, the task
  re-created around it (``kp.hub.precrop(task, params=0.5)``); it does not
  import ``keras_hub``.
* Subpackages ``models`` (model zoo), ``pai`` (unstructured baselines),
  ``data`` and ``train`` (tfds pipelines and ``model.fit`` under strategies,
  from the ``training`` wing).
* Errors with the user's arguments as fields (``ArgumentError`` and its kin).

The wings below this API: ``graph`` (channels, handlers, walk, rebuild),
``budget`` (costs, SynExp solvers, modes), ``latency`` (timing and fitted
latency models), ``transfer`` (kept weights), ``pai`` and ``training``;
``planning`` orchestrates them.

The core needs only Keras, NumPy and SciPy: ``pai``, ``data`` and ``train`` are
imported on first use (``kp.pai``, ``from keras_precrop import data``).
Importing the package registers its Keras-serializable objects
(``ChannelSlice``, ``PrefixAdd``, ``PrunedBackbone``, ``MaskConstraint``, ``SGDWithL2``), so
``keras.models.load_model`` reads rebuilt models, masked models and training
checkpoints.
"""

import importlib

from keras_precrop import _startup

_startup.quiet_command()  # before Keras is imported (see _startup.py)

from keras_precrop import hub, models  # noqa: F401 (hub registers PrunedBackbone)
from keras_precrop.budget import (
    ModelProfile,
    SolveResult,
    WidthProblem,
    profile,
    solve_densities,
    solve_widths,
)
from keras_precrop.comparison import Comparison, compare
from keras_precrop.errors import (
    ArgumentError,
    InfeasibleBudgetError,
    LatencyModelMismatchError,
    PlanMismatchError,
    RebuildMismatchError,
    UnsupportedLayerError,
    UnsupportedModelError,
)
from keras_precrop.graph import ChannelSlice, Handler, PrefixAdd, WeightSpec, register_handler
from keras_precrop.latency import LatencyModel, latency_model
from keras_precrop.planning import Plan, apply_plan, plan, precrop, reconfigure
from keras_precrop.training import constraints, optimizers  # noqa: F401 (registers serializables)
from keras_precrop.training.finetune import fine_tune

__version__ = "0.1.0"

# Imported on first use: they need TensorFlow (data, train) or are large (pai).
_LAZY_SUBPACKAGES = {"data": "keras_precrop.training.data", "pai": "keras_precrop.pai",
                     "train": "keras_precrop.training.train"}


def __getattr__(name):
    """Import the ``data``, ``pai`` and ``train`` subpackages on first use."""
    if name in _LAZY_SUBPACKAGES:
        return importlib.import_module(_LAZY_SUBPACKAGES[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY_SUBPACKAGES))


__all__ = [
    "ArgumentError",
    "ChannelSlice",
    "Comparison",
    "Handler",
    "InfeasibleBudgetError",
    "LatencyModel",
    "LatencyModelMismatchError",
    "ModelProfile",
    "Plan",
    "PlanMismatchError",
    "PrefixAdd",
    "RebuildMismatchError",
    "SolveResult",
    "UnsupportedLayerError",
    "UnsupportedModelError",
    "WeightSpec",
    "WidthProblem",
    "apply_plan",
    "compare",
    "data",
    "fine_tune",
    "hub",
    "latency_model",
    "models",
    "pai",
    "plan",
    "precrop",
    "profile",
    "reconfigure",
    "register_handler",
    "solve_densities",
    "solve_widths",
    "train",
]
