"""keras-precrop: structured pruning-at-initialization for Keras 3 CNNs.

Public API (everything else is private):

* ``profile(model)``: per-layer parameters, MACs and channel-coupling groups.
* ``solve_densities`` / ``solve_widths``: the SynExp convex programs.
* ``plan`` / ``apply_plan`` / ``precrop`` / ``reconfigure``: PreCrop and PreConfig.
* ``register_handler``: teach the graph walker a custom layer.
* Subpackages ``models`` (model zoo), ``pai`` (unstructured baselines),
  ``data`` and ``train`` (tfds pipelines and ``model.fit`` under strategies).

Names are imported on first use, so ``import keras_precrop`` is cheap and
the command line can configure TensorFlow's logging before TensorFlow loads.
"""

import importlib

__version__ = "0.1.0"

_API = {
    "keras_precrop.costs": ("ModelProfile", "profile"),
    "keras_precrop.graph": ("UnsupportedLayerError", "UnsupportedModelError"),
    "keras_precrop.handlers": ("Handler", "register_handler"),
    "keras_precrop.layers": ("ChannelSlice", "PrefixAdd"),
    "keras_precrop.plan": ("Plan", "PlanMismatchError", "apply_plan", "plan", "precrop",
                           "reconfigure"),
    "keras_precrop.solver": ("InfeasibleBudgetError", "SolveResult", "WidthProblem",
                             "solve_densities", "solve_widths"),
}
_SUBPACKAGES = ("models", "pai", "data", "train")
_WHERE = {name: module for module, names in _API.items() for name in names}

__all__ = sorted(_WHERE) + list(_SUBPACKAGES)


def _require_tensorflow():
    try:
        import tensorflow  # noqa: F401
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError(
            "keras-precrop needs TensorFlow. Install one flavour of it, e.g. "
            "`pip install keras-precrop[cpu]` (CPU only), `keras-precrop[gpu]` "
            "(CUDA) or `keras-precrop[tf]`."
        ) from err


def __getattr__(name):
    if name in _SUBPACKAGES:
        _require_tensorflow()
        value = importlib.import_module(f"keras_precrop.{name}")
    elif name in _WHERE:
        _require_tensorflow()
        value = getattr(importlib.import_module(_WHERE[name]), name)
    else:
        raise AttributeError(f"module 'keras_precrop' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
