"""The latency wing: measured time as one more budget row.

MACs are not time. On a CPU, batch norm, activations and padding (linear in
channel width) take about half of a CNN's time, and kernels that work on
blocks of channels waste the rest of a partly filled block. This wing
measures that instead of assuming it:

* ``timing``: runs a model on a runtime, times models interleaved.
* ``features``: the per-layer-class features time is fitted on.
* ``model``: :class:`LatencyModel`, the fitted model (JSON, ``predict``).
* ``fit``: :func:`latency_model`, timing width-scaled variants and fitting,
  with refinement rounds planned by an injected planner (the budget wing's
  ``solve`` by default).
* ``calibrate``: re-planning until a plan *measures* within its budget.

It reads the graph and budget wings, never the planning floor above it.
"""

from keras_precrop.errors import LatencyModelMismatchError
from keras_precrop.latency.calibrate import CalibrationWarning, calibrated
from keras_precrop.latency.fit import latency_model, resolve
from keras_precrop.latency.model import ROW, LatencyModel, UnusableLatencyModel, floor_said
from keras_precrop.latency.timing import RUNTIMES, interleaved, runner, time_ratio, to_tflite

__all__ = ["ROW", "RUNTIMES", "CalibrationWarning", "LatencyModel", "LatencyModelMismatchError",
           "UnusableLatencyModel", "calibrated", "floor_said", "interleaved", "latency_model",
           "resolve", "runner", "time_ratio", "to_tflite"]
