"""Issue 60, item 9: runtimes whose time does not fall with width (ONNX Runtime's blocked
convolutions, PyTorch's spinning threads) are said to be so, and fitted on the plan's grid.

Timing is injected: a synthetic timer computes each model's seconds from its Keras layers
(independently of the library's features), slower where a convolution's output channels are no
multiple of 16, as ONNX Runtime's NCHWc kernels on an AVX-512 CPU measured.
"""

import json
import math
import warnings

import keras
import numpy as np
import pytest
from keras import layers as L

import keras_precrop as kp
from keras_precrop.latency import devices, runtimes
from keras_precrop.latency.calibrate import CalibrationWarning, calibrated
from keras_precrop.latency.fit import LatencyModelWarning
from keras_precrop.latency.timing import Measured

ROW = kp.latency.ROW


def _cnn():
    inputs = keras.Input((16, 16, 3))
    x = inputs
    for i, w in enumerate((16, 32, 32)):
        x = L.Conv2D(w, 3, padding="same", name=f"conv{i}")(x)
        x = L.ReLU(name=f"relu{i}")(x)
    x = L.GlobalAveragePooling2D(name="gap")(x)
    return keras.Model(inputs, L.Dense(10, name="head")(x), name="item9_cnn")


def _blocked_seconds(model):
    """1e-5 s per layer, 1e-9 s per conv MAC, 3x that where the output channels are no multiple
    of 16 (the unblocked kernel): a width of 24 is slower than one of 32."""
    total = 0.0
    for layer in model.layers:
        total += 1e-5
        if type(layer) is L.Conv2D:
            kh, kw, cin, cout = layer.kernel.shape
            macs = kh * kw * cin * cout * math.prod(layer.output.shape[1:-1])
            total += 1e-9 * macs * (1 if cout % 16 == 0 else 3)
    return total


def _timer(seen):
    def timer(models):
        seen.extend(models.values())
        return {label: _blocked_seconds(m) for label, m in models.items()}
    return timer


def test_a_runtime_slower_at_narrower_widths_warns_naming_it_and_the_variants():
    with pytest.warns(LatencyModelWarning, match=r"Runtime 'tf' timed narrower copies of "
                                                 r"'item9_cnn' slower than wider ones \(x0\.75 at "):
        lm = kp.latency_model(_cnn(), batch_size=4, variants=6, rounds=1, refine_rounds=0,
                              verbose=0, timer=_timer([]))
    found = lm.error["not_monotone"]
    assert {"narrower": "x0.75", "wider": "original"} == {k: found[0][k] for k in ("narrower", "wider")}
    # The independent reference: the timer's own seconds of the two models.
    times = {v["label"]: v["seconds"] for v in lm.variants}
    assert found[0]["ratio"] == pytest.approx(times["x0.75"] / times["original"])
    assert found[0]["ratio"] > 1.1
    again = kp.LatencyModel.from_json(lm.to_json())
    assert again.error["not_monotone"] == found


def test_a_monotone_runtime_warns_of_nothing():
    with warnings.catch_warnings():
        warnings.simplefilter("error", LatencyModelWarning)
        lm = kp.latency_model(_cnn(), batch_size=4, variants=6, rounds=1, refine_rounds=0,
                              verbose=0, timer=lambda ms: {k: 1e-5 * len(m.layers) + 1e-9 *
                                                           m.count_params() for k, m in ms.items()})
    assert lm.error["not_monotone"] == []


def test_round_to_fits_on_the_plans_grid_and_is_recorded():
    seen = []
    lm = kp.latency_model(_cnn(), batch_size=4, variants=8, rounds=1, refine_rounds=1,
                          verbose=0, timer=_timer(seen), round_to=16)
    widths = {layer.filters for m in seen for layer in m.layers if type(layer) is L.Conv2D}
    assert widths <= {16, 32}  # every timed conv on the grid (the refinement plans too)
    assert lm.round_to == 16 and kp.LatencyModel.from_json(lm.to_json()).round_to == 16
    assert lm.describe()["round_to"] == 16
    with pytest.raises(kp.ArgumentError, match="round_to"):
        kp.latency_model(_cnn(), round_to=0, timer=_timer([]))


def test_a_plan_hands_its_round_to_to_the_latency_model_it_measures():
    seen = []
    plan = kp.plan(_cnn(), latency=0.6, round_to=16, calibrate=0,
                   latency_model={"timer": _timer(seen), "variants": 6, "rounds": 1,
                                  "refine_rounds": 0, "verbose": 0})
    assert plan.solver["latency_model"]["round_to"] == 16
    assert {layer.filters for m in seen for layer in m.layers if type(layer) is L.Conv2D} <= {16, 32}


def test_a_file_without_round_to_loads_as_any_width():
    lm = kp.latency_model(_cnn(), batch_size=4, variants=6, rounds=1, refine_rounds=0,
                          verbose=0, timer=lambda ms: {k: 1e-5 * len(m.layers) for k, m in ms.items()})
    data = json.loads(lm.to_json())
    del data["round_to"]
    assert kp.LatencyModel.from_json(json.dumps(data)).round_to == 1


@pytest.mark.parametrize("flags,multiple", [({"avx512f", "avx2"}, 16), ({"avx2"}, 8), (set(), 1)])
def test_onnx_names_its_channel_multiple_on_this_cpu(monkeypatch, flags, multiple):
    monkeypatch.setattr(devices, "cpu_flags", lambda: frozenset(flags))
    text = runtimes.not_monotone("onnx")
    assert "NCHWc" in text
    assert (f"round_to={multiple}" in text) == (multiple > 1)
    assert "OMP_WAIT_POLICY=PASSIVE" in runtimes.not_monotone("torch")
    assert "'mine'" in runtimes.not_monotone("mine")  # a runtime the table lacks


def test_calibration_rounds_that_rise_as_the_budget_falls_are_said_naming_the_runtime():
    # The torch rounds: a plan measured 0.77 of the original's time, and the plan at the
    # lower budget calibration moved to measured 0.93.
    answers = iter([Measured(0.77), Measured(0.77), Measured(0.93), Measured(0.93)])  # each round
    # measures far off the latency model's prediction (10.0), so it is timed again, alike

    def solve(budgets):
        return np.array([budgets[ROW]]), {}

    with pytest.warns(CalibrationWarning, match=r"did not fall with the budget \(budget 0\.325 "
                                                r"measured 0\.930 but budget 0\.5 measured 0\.770\)"
                                                r".* runtime 'torch' here: PyTorch's OpenMP threads"):
        _, info = calibrated(solve, lambda w: next(answers), lambda w: 10.0, {ROW: 0.5},
                             target=0.5, rounds=1, runtime="torch")
    calibration = info["latency_calibration"]
    assert calibration["not_monotone"][0]["measured"] == [0.93, 0.77]
    assert not calibration["met"] and calibration["measured"] == pytest.approx(0.77)


def test_monotone_rounds_are_not_said_to_rise():
    answers = iter([Measured(0.77), Measured(0.77), Measured(0.52), Measured(0.52)])  # as above
    with warnings.catch_warnings():
        warnings.simplefilter("error", CalibrationWarning)
        _, info = calibrated(lambda b: (np.array([b[ROW]]), {}), lambda w: next(answers),
                             lambda w: 10.0, {ROW: 0.5}, target=0.5, rounds=1, runtime="onnx")
    assert info["latency_calibration"]["not_monotone"] == []


def test_calibration_keeps_a_plan_that_collapses_no_layer_over_a_less_pruned_one_that_does():
    # Round 1 measures over the target; round 2 (a lower budget) meets it but cuts the stem to
    # one channel; round 3, between them, meets it at 0.44 with every layer whole.
    results = {1: Measured(0.6), 2: Measured(0.47, [("stem_conv", 1, 16)]), 3: Measured(0.44)}

    def solve(budgets):
        b = budgets[ROW]
        return np.array([1.0 if b >= 0.49 else 3.0 if b >= 0.44 else 2.0]), {}

    with warnings.catch_warnings():
        warnings.simplefilter("error", CalibrationWarning)
        widths, info = calibrated(solve, lambda w: results[int(w[0])], lambda w: 10.0,
                                  {ROW: 0.5}, target=0.5, rounds=2)
    calibration = info["latency_calibration"]
    assert [r["measured"] for r in calibration["rounds"]] == pytest.approx([0.6, 0.47, 0.44])
    assert widths[0] == 3.0 and calibration["measured"] == pytest.approx(0.44)
