"""The order in which a runner's calls are launched, waited for and timed: one JSON line.

Two tiny CNNs carry a layer that logs ``launch:<model>`` each time the model
runs (inside TensorFlow's compiled step through ``tf.numpy_function``, which
runs at every call; eagerly under torch). Where no Python layer runs at each
call (``jax.jit`` runs the layer once, when it traces; ``torch.compile``, LiteRT
and ONNX Runtime run a converted graph, and the host runtimes' models lack the
layer), the launch is logged from outside: the runtime's step builder in
:mod:`keras_precrop.latency.steps` is wrapped so each call of the step it
builds logs ``launch:<model>``. They are timed by the library's runner and
interleaved timer with a recording device (the real one, each ``put`` and
``wait`` logged; ``wait`` only when it is given the output the launch just
returned) and a recording clock. Imported by ``tests/test_timing_device.py``
under TensorFlow; run as a script under JAX or torch
(``python timed_calls.py [torch_compile]``), it prints the log, whether the
runner's output is the model's own, and with ``torch_compile`` whether the
compiled module computes what the eager one does.
"""

import dataclasses
import json
import sys
import time
from unittest import mock

import keras
import numpy as np

from keras_precrop.latency import steps, timing

L = keras.layers
SHAPE = (8, 8, 3)
BATCH = 2
# Each runtime's step builder in ``steps``; OUTSIDE: the runtimes whose launches only the
# wrapped builder logs.
STEPS = {"tf": "tf_step", "jax": "jax_step", "torch": "torch_step",
         "torch_compile": "torch_step", "litert": "litert_step", "onnx": "onnx_step"}
OUTSIDE = ("jax", "torch_compile", "litert", "onnx")


class Launches(L.Layer):
    """The identity; appends ``"launch:<model name>"`` to ``log`` whenever it runs."""

    def __init__(self, log, model_name, **kwargs):
        super().__init__(**kwargs)
        self.append = log.append  # a list attribute would be tracked, i.e. copied, by Keras
        self.event = f"launch:{model_name}"

    def _mark(self, x):
        self.append(self.event)
        return x

    def call(self, x):
        if keras.backend.backend() != "tensorflow":
            return self._mark(x)  # eager: runs at every call
        import tensorflow as tf

        return tf.ensure_shape(tf.numpy_function(self._mark, [x], tf.float32, stateful=True),
                               x.shape)


def tiny(name, log):
    """Conv, the logging layer (none for the host runtimes' converters), pooling and a dense
    head."""
    x = keras.Input(SHAPE)
    h = L.Conv2D(4, 3, padding="same")(x)
    if log is not None:
        h = Launches(log, name)(h)
    return keras.Model(x, L.Dense(2)(L.GlobalAveragePooling2D()(h)), name=name)


def _watched(build, runtime, log, seen):
    """The step builder ``build``, recorded: each step's input in ``seen["inputs"]``, each
    call's output in ``seen["outputs"]``, and for the ``OUTSIDE`` runtimes ``launch:<model>``
    logged as each call starts."""
    def wrapped(model, x, *args, **kwargs):
        seen["inputs"].append(x)
        launch = build(model, x, *args, **kwargs)

        def call():
            if runtime in OUTSIDE:
                log.append(f"launch:{model.name}")
            seen["outputs"].append(launch())
            return seen["outputs"][-1]

        return call

    return wrapped


def _on_host(y):
    """Whether a call's output is host memory already read (a NumPy array, or a list of them)."""
    return all(isinstance(a, np.ndarray) for a in (y if isinstance(y, list) else [y]))


def record(runtime):
    """Times models ``a`` and ``b`` interleaved (2 rounds, one call per sample): the log;
    whether ``a``'s runner returned the sum (TensorFlow) or the outputs of ``a`` on its batch;
    whether every step launched on its runner's ``put`` input; whether every output was host
    memory; and (JAX) the models as ``jax.jit`` traced them, in order."""
    log, traces = [], []
    seen = {"puts": [], "inputs": [], "outputs": []}
    real = timing.device_of(runtime)

    def put(x):
        log.append("put")
        seen["puts"].append(real.put(x))
        return seen["puts"][-1]

    def wait(y):
        launched = bool(seen["outputs"]) and y is seen["outputs"][-1]
        log.append("wait" if launched else "wait:not-the-launched-output")
        real.wait(y)

    def clock():
        log.append("clock")
        return time.perf_counter()

    device = dataclasses.replace(real, put=put, wait=wait)
    layer_log = traces if runtime == "jax" else None if runtime in OUTSIDE else log
    models = {name: tiny(name, layer_log) for name in ("a", "b")}
    log.clear()  # building a model runs its layers once under JAX and torch
    traces.clear()
    step = STEPS[runtime]
    with mock.patch.object(steps, step, _watched(getattr(steps, step), runtime, log, seen)):
        fns = {name: timing.runner(m, BATCH, runtime, device=device) for name, m in models.items()}
        timing.interleaved(fns, rounds=2, warmup=1, target_s=0.0, clock=clock)
        events, traced = list(log), list(traces)
        got = float(np.sum(keras.ops.convert_to_numpy(fns["a"]())))
    x = np.random.default_rng(0).standard_normal((BATCH, *SHAPE)).astype("float32")
    expected = float(np.sum(keras.ops.convert_to_numpy(models["a"](x, training=False))))
    inputs_put = len(seen["inputs"]) == len(seen["puts"]) == 2 and all(
        given is put for given, put in zip(seen["inputs"], seen["puts"]))
    return {"events": events, "traced": traced, "inputs_put": inputs_put,
            "outputs_on_host": all(_on_host(y) for y in seen["outputs"]),
            "output_matches": bool(np.isclose(got, expected, rtol=1e-5, atol=1e-5)),
            "device": [real.kind, real.name]}


def compiled_matches_eager():
    """Whether ``"torch_compile"``'s runner computes the eager runner's outputs."""
    model = tiny("c", [])
    eager = keras.ops.convert_to_numpy(timing.runner(model, BATCH, "torch")())
    compiled = keras.ops.convert_to_numpy(timing.runner(model, BATCH, "torch_compile")())
    return bool(np.allclose(compiled, eager, rtol=1e-4, atol=1e-5))


def main():
    compiled = "torch_compile" in sys.argv[1:]
    result = record("torch_compile" if compiled else keras.backend.backend())
    if compiled:
        result["compiled_matches_eager"] = compiled_matches_eager()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
