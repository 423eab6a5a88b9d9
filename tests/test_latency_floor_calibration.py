"""Issue 60, item 9: calibration lowers a latency budget the latency model under-predicts, but the
residual streams that ``mode="auto"`` floors stay at the uniform plan's widths *at the target*.

Timing is injected: a synthetic clock computes each model's seconds from its Keras layers
(convolution MACs, elementwise work of the layers on the streams, a constant per layer),
independently of the library's features; the latency model is fitted on it, and calibration's
measurement is that clock times a constant factor, so every plan measures slower than predicted
(as ONNX Runtime's and PyTorch's did on ResNet-20) and calibration lowers the budget round by
round. Before the fix the floor followed the lowered budget and the streams with it.
"""

import math
import warnings

import numpy as np
import pytest
from keras import layers as L

import keras_precrop as kp
import keras_precrop.planning as planning
from keras_precrop.latency.calibrate import CalibrationWarning
from keras_precrop.latency.timing import Measured, narrowed

TARGET = 0.5
ELEMENTWISE = (L.Add, L.BatchNormalization, L.ReLU, L.Activation)


def _seconds(model):
    """1e-5 s per layer, 1e-9 s per conv MAC and 1e-7 s per element an elementwise layer writes
    (what makes the streams, which many of them write, worth cutting to a latency model)."""
    total = 0.0
    for layer in model.layers:
        total += 1e-5
        if type(layer) is L.Conv2D:
            kh, kw, cin, cout = layer.kernel.shape
            total += 1e-9 * kh * kw * cin * cout * math.prod(layer.output.shape[1:-1])
        elif isinstance(layer, ELEMENTWISE):
            total += 1e-7 * math.prod(layer.output.shape[1:])
    return total


@pytest.fixture(scope="module")
def fitted():
    """ResNet-20 at 16x16, its latency model fitted on the synthetic clock, and the uniform plan
    at the target (the independent reference for the streams' floor)."""
    model = kp.models.cifar_resnet(20, input_shape=(16, 16, 3))
    lm = kp.latency_model(model, batch_size=4, variants=8, rounds=1, refine_rounds=0, verbose=0,
                          timer=lambda models: {k: _seconds(m) for k, m in models.items()})
    uniform = kp.plan(model, latency=TARGET, latency_model=lm, mode="uniform")
    return model, lm, uniform


def _under_predicting(monkeypatch, factor, seen):
    """Calibration's clock: every candidate measures ``factor`` times its synthetic time ratio
    (the candidates it times are appended to ``seen``)."""
    def time_ratio(lm, model, verbose=1, timer=None):
        def ratio(candidate):
            seen.append(candidate)
            return Measured(factor * _seconds(candidate) / _seconds(model), narrowed(model, candidate))
        return ratio
    monkeypatch.setattr(kp.latency, "time_ratio", time_ratio)


def _streams(uniform):
    """``{stream writer: the uniform plan's width rounded down, before its extra grid step}``:
    ``floor(r * C)`` of the uniform factor ``r`` at the target."""
    r = uniform.solver["uniform_ratio"]
    return {v["name"]: int(np.floor(r * v["width"] + 1e-9)) for v in uniform.variables
            if v["kind"] == "stream"}


def _stream_widths(candidate, streams):
    return {name: candidate.get_layer(name).filters for name in streams}


def test_every_calibrated_round_keeps_the_streams_at_the_uniform_widths_of_the_target(
        fitted, monkeypatch):
    model, lm, uniform = fitted
    seen = []
    _under_predicting(monkeypatch, 1.6, seen)
    plan = kp.plan(model, latency=TARGET, latency_model=lm, calibrate=2)
    calibration = plan.solver["latency_calibration"]
    assert calibration["rounds"][0]["measured"] > TARGET * 1.1  # the model under-predicts ...
    assert min(r["budget"] for r in calibration["rounds"]) < 0.8 * TARGET  # ... so budgets fall
    floor = _streams(uniform)
    assert len(seen) >= 2 and len(floor) == 3
    for candidate in seen:  # every round's plan, as calibration timed it
        widths = _stream_widths(candidate, floor)
        assert all(widths[name] >= floor[name] for name in floor), (widths, floor)
    assert calibration["met"] and calibration["measured"] <= TARGET * 1.03
    assert plan.solver["floor_at"] == "target"
    assert plan.solver["floor_ratio"] == pytest.approx(uniform.solver["uniform_ratio"])
    kept = kp.apply_plan(model, plan)
    assert 1.6 * _seconds(kept) / _seconds(model) == pytest.approx(calibration["measured"])


def test_a_floor_that_follows_the_lowered_budget_cuts_the_streams(fitted, monkeypatch):
    """The scenario above is one where it matters: with the floor computed at each round's
    corrected budget (as before the fix), a round's plan cuts a stream below the target's
    uniform width."""
    model, lm, uniform = fitted
    seen = []
    _under_predicting(monkeypatch, 1.6, seen)
    solve = planning.solve
    monkeypatch.setattr(planning, "solve", lambda *a, floor_at=None, **k: solve(*a, **k))
    kp.plan(model, latency=TARGET, latency_model=lm, calibrate=2)
    floor = _streams(uniform)
    cut = [_stream_widths(c, floor) for c in seen]
    assert any(w[name] < floor[name] for w in cut for name in floor), cut


def test_a_target_the_floored_streams_cannot_meet_is_not_met_and_names_floor(fitted, monkeypatch):
    model, lm, uniform = fitted
    seen = []
    _under_predicting(monkeypatch, 6.0, seen)
    with pytest.warns(CalibrationWarning) as caught:
        plan = kp.plan(model, latency=TARGET, latency_model=lm, calibrate=2)
    calibration = plan.solver["latency_calibration"]
    assert not calibration["met"] and calibration["measured"] > TARGET * 1.03
    floor = _streams(uniform)
    assert all(_stream_widths(c, floor)[n] >= floor[n] for c in seen for n in floor)
    # The fastest plan the floor allows was tried: the streams at the floor, the rest narrowest.
    assert sorted(plan.solver["floor_binds"]) == sorted(floor)
    message = calibration["warning"]
    assert message in [str(w.message) for w in caught]
    assert "over the target latency=0.5" in message
    assert "residual streams were held at floor=1.0 times the uniform plan's widths at the target" \
        in message
    assert 'floor=0.7, floor_on="streams"' in message and "runtime=" in message
    # The remedy it names lets the streams go lower, and so the plan faster.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CalibrationWarning)
        lower = kp.plan(model, latency=TARGET, latency_model=lm, calibrate=2, floor=0.7,
                        floor_on="streams")
    assert lower.solver["latency_calibration"]["measured"] < calibration["measured"]


def test_without_calibration_the_floor_is_at_the_budget_as_before(fitted):
    model, lm, uniform = fitted
    plan = kp.plan(model, latency=TARGET, latency_model=lm, calibrate=0)
    assert "floor_at" not in plan.solver and "floor_binds" not in plan.solver
    assert plan.solver["floor_ratio"] == pytest.approx(uniform.solver["uniform_ratio"])
    floor = _streams(uniform)
    assert all(plan.widths[name] >= floor[name] for name in floor)
