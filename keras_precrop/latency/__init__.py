"""The latency wing: measured time as one more budget row.

MACs are not time. On a CPU, batch norm, activations and padding (linear in
channel width) take about half of a CNN's time, and kernels that work on
blocks of channels waste the rest of a partly filled block. This wing
measures that instead of assuming it:

* ``runtimes``: the table of runtimes a model can be timed on
  (:data:`RUNTIMES`; :func:`register_runtime` adds one); ``devices``: where
  each computes; ``steps``: how the built-in ones run a model.
* ``timing``: runs a model on a runtime, times models interleaved.
* ``features``: the per-layer-class features time is fitted on.
* ``model``: :class:`LatencyModel`, the fitted model (JSON, ``predict``).
* ``fit``: :func:`latency_model`, timing width-scaled variants and fitting,
  with refinement rounds planned by an injected planner (the budget wing's
  ``solve`` by default).
* ``calibrate``: re-planning until a plan *measures* within its budget.

It reads the graph and budget wings, never the planning floor above it.
Each name below is imported on first use (PEP 562), so the command line reads
the runtime table for ``--help`` without loading Keras.
"""

import importlib

# Public name -> the module of this wing that defines it.
_PUBLIC = {
    **dict.fromkeys(("CalibrationWarning", "calibrated"), "calibrate"),
    **dict.fromkeys(("LatencyModelWarning", "latency_model", "resolve"), "fit"),
    **dict.fromkeys(("ROW", "LatencyModel", "LatencyModelMismatchError", "UnusableLatencyModel",
                     "floor_said"), "model"),  # the mismatch error: keras_precrop.errors' own
    **dict.fromkeys(("RUNTIMES", "Runtime", "register_runtime"), "runtimes"),
    **dict.fromkeys(("interleaved", "runner", "time_ratio"), "timing"),
    "to_tflite": "steps",
}


def __getattr__(name):
    """A public name, or a module of this wing, imported on first use."""
    if name not in _PUBLIC:
        try:
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as err:
            if err.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = globals()[name] = getattr(importlib.import_module(f"{__name__}.{_PUBLIC[name]}"), name)
    return value


def __dir__():
    return sorted(set(globals()) | set(_PUBLIC))


__all__ = ["ROW", "RUNTIMES", "CalibrationWarning", "LatencyModel", "LatencyModelMismatchError",
           "LatencyModelWarning", "Runtime", "UnusableLatencyModel", "calibrated", "floor_said",
           "interleaved", "latency_model", "register_runtime", "resolve", "runner", "time_ratio", "to_tflite"]
