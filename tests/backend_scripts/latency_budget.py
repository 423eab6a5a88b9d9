"""A latency budget on the real clock under the current Keras backend: prints one JSON line.

Fits a small latency model of a small CNN (few variants and rounds) with the
library's runner, plans ``latency=0.5`` with it, and runs a timed training
step, by the runtime named after the backend, twice (under torch it updates
the model's weights; under JAX it is stateless, its state held by the step).
Under JAX the runner once timed ``predict_on_batch``, whose per-call overhead
made every budget below half of the original's time infeasible.
"""

import json

import keras
import numpy as np

import keras_precrop as kp

L = keras.layers


def small_cnn():
    keras.utils.set_random_seed(0)
    x = keras.Input((16, 16, 3))
    h = x
    for width in (32, 64, 128):
        h = L.ReLU()(L.BatchNormalization()(L.Conv2D(width, 3, padding="same")(h)))
    return keras.Model(x, L.Dense(10)(L.GlobalAveragePooling2D()(h)), name="small_cnn")


def main():
    model = small_cnn()
    lm = kp.latency_model(model, batch_size=16, variants=6, rounds=2, refine_rounds=0, verbose=0)
    result = {"backend": keras.backend.backend(), "error": lm.error["median"]}
    try:
        plan = kp.plan(model, latency=0.5, latency_model=lm)
        result.update(feasible=True, predicted_ratio=plan.latency / lm.seconds)
    except kp.InfeasibleBudgetError as err:
        result.update(feasible=False, why=str(err))
    before = [w.copy() for w in model.get_weights()]
    step = kp.latency.runner(model, 4, runtime=keras.backend.backend(), training=True)
    step()
    step()
    result["weights_moved"] = any(not np.array_equal(a, b)
                                  for a, b in zip(before, model.get_weights()))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
