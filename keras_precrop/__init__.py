"""keras-precrop: structured pruning-at-initialization for Keras 3 CNNs.

Public API (everything else is private):

* ``profile(model)``: per-layer parameters, MACs and width variables.
* ``solve_densities`` / ``solve_widths``: the SynExp convex programs.
* ``plan`` / ``apply_plan`` / ``precrop`` / ``reconfigure``: PreCrop and PreConfig.
* ``latency_model`` / ``LatencyModel``: measured time as a budget (``latency=0.5``).
* ``register_handler`` / ``Handler`` / ``WeightSpec``: teach the package a custom layer.
* Subpackages ``models`` (model zoo), ``pai`` (unstructured baselines),
  ``data`` and ``train`` (tfds pipelines and ``model.fit`` under strategies).

The core needs only Keras, NumPy and SciPy: ``pai``, ``data`` and ``train`` are
imported on first use (``kp.pai``, ``from keras_precrop import data``).
Importing the package registers its Keras-serializable objects
(``ChannelSlice``, ``PrefixAdd``, ``MaskConstraint``, ``SGDWithL2``), so
``keras.models.load_model`` reads rebuilt models, masked models and training
checkpoints.
"""

import importlib

from keras_precrop import _startup

_startup.quiet_command()  # before Keras is imported (see _startup.py)

from keras_precrop import constraints, models, optimizers  # noqa: F401 (registers serializables)
from keras_precrop.channels import UnsupportedLayerError, UnsupportedModelError
from keras_precrop.costs import ModelProfile, profile
from keras_precrop.handlers import Handler, WeightSpec, register_handler
from keras_precrop.latency import LatencyModel, LatencyModelMismatchError, latency_model
from keras_precrop.layers import ChannelSlice, PrefixAdd
from keras_precrop.planning import (
    Plan,
    PlanMismatchError,
    RebuildMismatchError,
    apply_plan,
    plan,
    precrop,
    reconfigure,
)
from keras_precrop.solver import (
    InfeasibleBudgetError,
    SolveResult,
    WidthProblem,
    solve_densities,
    solve_widths,
)

__version__ = "0.1.0"

_LAZY_SUBPACKAGES = ("data", "pai", "train")


def __getattr__(name):
    """Import the ``data``, ``pai`` and ``train`` subpackages on first use."""
    if name in _LAZY_SUBPACKAGES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY_SUBPACKAGES))


__all__ = [
    "ChannelSlice",
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
    "data",
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
