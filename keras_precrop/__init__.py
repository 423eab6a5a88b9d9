"""keras-precrop: structured pruning for Keras 3, at initialization or of trained models.

Public API (everything else is private):

* ``profile(model)``: per-layer parameters, MACs and width variables.
* ``solve_densities`` / ``solve_widths``: the SynExp convex programs.
* ``plan`` / ``apply_plan`` / ``precrop`` / ``reconfigure``: PreCrop and PreConfig
  (``weights="keep"``: prune or widen a trained model, keeping its weights).
* ``fine_tune``: train such a model a little, distilled from the original or not.
* ``recalibrate_bn``: re-estimate such a model's batch-normalization statistics
  on a few batches, without training.
* ``GradualPruning``: a ``fit`` callback that prunes a trained model's channels
  gradually towards a plan, then ``finalize()`` rebuilds it smaller.
* ``latency_model`` / ``LatencyModel``: measured time as a budget (``latency=0.5``).
* ``register_runtime``: add a runtime to the one table that ``runtime=`` and ``--runtime`` read.
* ``compare``: the modes side by side, uniform width scaling included.
* ``register_handler`` / ``Handler`` / ``WeightSpec``: teach the package a custom layer.
* ``register_importance``: add a channel ranking to the one table that ``importance=``
  (``weights="keep"``, ``GradualPruning``, ``hub``) and ``--importance`` read.
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

``import keras_precrop`` is light: it imports neither Keras nor TensorFlow,
so that the ``keras-precrop`` command answers ``--help`` and argument errors
at once. Each public name is imported on first use (PEP 562). The core needs
only Keras, NumPy and SciPy; ``data`` and ``train`` need TensorFlow for some
of their work.

The package's Keras-serializable classes (``ChannelSlice``, ``PrefixAdd``,
``PrunedBackbone``, ``MaskConstraint``, ``SGDWithL2``) are registered with
Keras as soon as both are imported, in either order, so after ``import
keras_precrop`` ``keras.models.load_model`` reads rebuilt models, masked
models and training checkpoints.
"""

import importlib
import importlib.util
import sys

__version__ = "0.1.0"

# Public name -> the module that defines it (a module itself where the two are one).
_PUBLIC = {
    **dict.fromkeys(("ModelProfile", "SolveResult", "WidthProblem", "profile", "solve_densities",
                     "solve_widths"), "keras_precrop.budget"),
    **dict.fromkeys(("Comparison", "compare"), "keras_precrop.comparison"),
    **dict.fromkeys(("ArgumentError", "InfeasibleBudgetError", "LatencyModelMismatchError",
                     "PlanMismatchError", "RebuildMismatchError", "UnsupportedLayerError",
                     "UnsupportedModelError"), "keras_precrop.errors"),
    **dict.fromkeys(("ChannelSlice", "Handler", "PrefixAdd", "WeightSpec", "register_handler"),
                    "keras_precrop.graph"),
    **dict.fromkeys(("LatencyModel", "latency_model", "register_runtime"), "keras_precrop.latency"),
    **dict.fromkeys(("apply_plan", "plan", "precrop", "reconfigure"), "keras_precrop.planning"),
    "Plan": "keras_precrop.plans",
    "fine_tune": "keras_precrop.training.finetune",
    "recalibrate_bn": "keras_precrop.training.bn",
    "GradualPruning": "keras_precrop.gradual",
    "register_importance": "keras_precrop.transfer.criteria",
}
# Public subpackages, and where they live.
_SUBPACKAGES = {"data": "keras_precrop.training.data", "hub": "keras_precrop.hub",
                "models": "keras_precrop.models", "pai": "keras_precrop.pai",
                "train": "keras_precrop.training.train"}
# The modules that register Keras-serializable classes when they load.
_SERIALIZABLE = ("keras_precrop.graph.layers", "keras_precrop.hub",
                 "keras_precrop.training.constraints", "keras_precrop.training.optimizers")


def _register_serializables():
    """Import the modules whose classes Keras must know to load what the package saves."""
    for module in _SERIALIZABLE:
        importlib.import_module(module)


def _importing_package_modules():
    """Whether one of the package's own modules is part-way through its import."""
    return any(getattr(getattr(module, "__spec__", None), "_initializing", False)
               for name, module in list(sys.modules.items())
               if name.startswith(f"{__name__}."))


class _AfterKeras:
    """A one-shot import hook: registers the serializable classes once Keras has loaded.

    ``import keras_precrop`` does not import Keras; a user who imports Keras
    afterwards and loads a saved rebuilt model must still find ``PrefixAdd``
    registered. The hook leaves ``sys.meta_path`` at Keras' import. When
    Keras is imported by one of the package's own modules part-way through
    loading, registering then could re-enter that module; the package's next
    public name registers instead (:func:`__getattr__`).
    """

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        """Keras' own spec, its loader wrapped to register the package's layers once Keras is loaded."""
        if name != "keras":
            return None
        sys.meta_path.remove(cls)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            load = spec.loader.exec_module

            def exec_module(module):
                load(module)
                if not _importing_package_modules():
                    _register_serializables()

            spec.loader.exec_module = exec_module
        return spec


def __getattr__(name):
    """Import a public name, a subpackage or a module of the package on first use."""
    if name in _PUBLIC or name in _SUBPACKAGES:
        value = importlib.import_module(_SUBPACKAGES.get(name) or _PUBLIC[name])
        value = getattr(value, name) if name in _PUBLIC else value
    else:
        try:
            value = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as err:
            if err.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    # Keras may have come with that module (see _AfterKeras). Registering while one of the
    # package's modules is part-way through its import (``from keras_precrop import _json`` in
    # it) would re-enter that module; the next public name registers instead.
    if "keras" in sys.modules and not _importing_package_modules():
        _register_serializables()
    globals()[name] = value
    return value


def __dir__():
    """The public API (``__all__``) and the version: not the modules this file imports."""
    return sorted({*__all__, "__version__"})


__all__ = [
    "ArgumentError",
    "ChannelSlice",
    "Comparison",
    "GradualPruning",
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
    "recalibrate_bn",
    "reconfigure",
    "register_handler",
    "register_importance",
    "register_runtime",
    "solve_densities",
    "solve_widths",
    "train",
]

if "keras" in sys.modules:  # Keras came first: register now, as a library import always did
    _register_serializables()
else:
    sys.meta_path.insert(0, _AfterKeras)
