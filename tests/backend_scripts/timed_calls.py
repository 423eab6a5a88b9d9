"""The order in which a runner's calls are launched, waited for and timed: one JSON line.

Two tiny CNNs carry a layer that logs ``launch:<model>`` each time the model
runs (inside TensorFlow's compiled step through ``tf.numpy_function``, which
runs at every call; eagerly under torch). They are timed by the library's
runner and interleaved timer with a recording device (the real one, each
``put`` and ``wait`` logged) and a recording clock. Imported by
``tests/test_timing_device.py`` under TensorFlow; run as a script under torch
(``python timed_calls.py [torch_compile]``), it prints the log, whether the
runner's output is the model's own, and with ``torch_compile`` whether the
compiled module computes what the eager one does.
"""

import dataclasses
import json
import sys
import time

import keras
import numpy as np

from keras_precrop.latency import timing

L = keras.layers
SHAPE = (8, 8, 3)
BATCH = 2


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
    """Conv, the logging layer, pooling and a dense head."""
    x = keras.Input(SHAPE)
    h = Launches(log, name)(L.Conv2D(4, 3, padding="same")(x))
    return keras.Model(x, L.Dense(2)(L.GlobalAveragePooling2D()(h)), name=name)


def record(runtime):
    """Times models ``a`` and ``b`` interleaved (2 rounds, one call per sample); the log, and
    whether ``a``'s runner returned the sum (TensorFlow) or the outputs of ``a`` on its batch."""
    log = []
    real = timing.device_of(runtime)

    def put(x):
        log.append("put")
        return real.put(x)

    def wait(y):
        log.append("wait")
        real.wait(y)

    def clock():
        log.append("clock")
        return time.perf_counter()

    device = dataclasses.replace(real, put=put, wait=wait)
    models = {name: tiny(name, log) for name in ("a", "b")}
    log.clear()  # building a model runs its layers once under torch
    fns = {name: timing.runner(m, BATCH, runtime, device=device) for name, m in models.items()}
    timing.interleaved(fns, rounds=2, warmup=1, target_s=0.0, clock=clock)
    events = list(log)
    x = np.random.default_rng(0).standard_normal((BATCH, *SHAPE)).astype("float32")
    expected = float(np.sum(keras.ops.convert_to_numpy(models["a"](x, training=False))))
    got = float(np.sum(keras.ops.convert_to_numpy(fns["a"]())))
    return {"events": events, "output_matches": bool(np.isclose(got, expected, rtol=1e-5)),
            "device": [real.kind, real.name]}


def compiled_matches_eager():
    """Whether ``"torch_compile"``'s runner computes the eager runner's outputs."""
    model = tiny("c", [])
    eager = keras.ops.convert_to_numpy(timing.runner(model, BATCH, "torch")())
    compiled = keras.ops.convert_to_numpy(timing.runner(model, BATCH, "torch_compile")())
    return bool(np.allclose(compiled, eager, rtol=1e-4, atol=1e-5))


def main():
    result = record(keras.backend.backend())
    if "torch_compile" in sys.argv[1:]:
        result["compiled_matches_eager"] = compiled_matches_eager()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
