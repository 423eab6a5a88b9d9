"""keras-precrop: structured pruning-at-initialization for Keras 3 CNNs.

Public API (everything else is private):

* ``profile(model)``: per-layer parameters, MACs and channel-coupling groups.
* ``solve_densities`` / ``solve_widths``: the SynExp convex programs.
* ``plan`` / ``apply_plan`` / ``precrop`` / ``reconfigure``: PreCrop and PreConfig.
* ``register_handler``: teach the graph walker a custom layer.
* Subpackages ``models`` (model zoo), ``pai`` (unstructured baselines),
  ``data`` and ``train`` (tfds pipelines and ``model.fit`` under strategies).

Importing the package registers its Keras-serializable objects (``ChannelSlice``,
``PrefixAdd``, mask constraints, the optimizer), so ``keras.models.load_model``
reads models that use them.
"""

from keras_precrop import models, pai, train  # noqa: E402
from keras_precrop.costs import ModelProfile, profile  # noqa: E402
from keras_precrop.graph import UnsupportedLayerError, UnsupportedModelError  # noqa: E402
from keras_precrop.handlers import Handler, register_handler  # noqa: E402
from keras_precrop.layers import ChannelSlice, PrefixAdd  # noqa: E402
from keras_precrop.plan import (  # noqa: E402
    Plan,
    PlanMismatchError,
    apply_plan,
    plan,
    precrop,
    reconfigure,
)
from keras_precrop.solver import (  # noqa: E402
    InfeasibleBudgetError,
    SolveResult,
    WidthProblem,
    solve_densities,
    solve_widths,
)

__version__ = "0.1.0"


def __getattr__(name):
    """Imports ``data`` (tf.data pipelines, needs TensorFlow) on first use."""
    if name == "data":
        import importlib

        return importlib.import_module("keras_precrop.data")
    raise AttributeError(f"module 'keras_precrop' has no attribute {name!r}")

__all__ = [
    "ChannelSlice",
    "Handler",
    "InfeasibleBudgetError",
    "ModelProfile",
    "Plan",
    "PlanMismatchError",
    "PrefixAdd",
    "SolveResult",
    "UnsupportedLayerError",
    "UnsupportedModelError",
    "WidthProblem",
    "apply_plan",
    "data",
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
