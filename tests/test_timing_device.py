"""Timing that waits for the device, latency models that know their device, the launch floor.

Issue 44. The runner is given a recording device and the interleaved timer a
recording clock (``tests/backend_scripts/timed_calls.py``): every timed call
must read the clock, launch, wait for its work and read the clock again, and
each input must reach the device once, before anything is timed, and be the
one the step computes on. Under JAX and torch this runs in a subprocess (Keras
picks its backend once per process); LiteRT and ONNX Runtime, which run on the
host CPU, run in process and return their output read to the host.
"""

import dataclasses
import json
import re
import shutil
import subprocess
import warnings

import keras
import numpy as np
import pytest

import keras_precrop as kp
from keras_precrop.latency import runtimes, timing
from tests.backend_scripts import timed_calls
from tests.test_backends import REPO, _check, _run
from tests.test_latency import FORMAT_1, _small_cnn, _synthetic_seconds, _timer

SCRIPT = str(REPO / "tests" / "backend_scripts" / "timed_calls.py")
LAUNCH = 2e-4  # seconds per layer call of a launch-bound device (small CNNs on a GPU)


def _assert_each_timed_call_is_waited_for(result):
    """Puts first (one per runner), then warm-ups, then samples ``clock launch wait clock``."""
    events = result["events"]
    first_clock = events.index("clock")
    assert events[:first_clock].count("put") == 2  # one per model, both before timing
    assert "put" not in events[first_clock:]
    for i, event in enumerate(events):
        if event.startswith("launch"):
            assert events[i + 1] == "wait", events  # nothing happens before the work is done
    timed = " ".join(events[first_clock:])
    samples = re.findall(r"clock (launch:(\w) wait) clock", timed)
    # 2 calibration samples, then 2 rounds of 2 models, the start rotated
    assert [model for _, model in samples] == ["a", "b", "a", "b", "b", "a"]
    assert timed == " ".join(f"clock {call} clock" for call, _ in samples)
    assert result["output_matches"]
    assert result["inputs_put"]  # each step computes on its runner's device-resident batch


def _in_subprocess(backend, tmp_path, *args, timeout=1800):
    """``timed_calls.py ARGS`` run under ``backend``; its JSON result."""
    out = _check(_run(backend, [SCRIPT, *args], tmp_path, timeout=timeout))
    return json.loads(out.strip().splitlines()[-1])


def test_tf_runner_puts_the_input_once_and_waits_for_every_timed_call():
    result = timed_calls.record("tf")
    _assert_each_timed_call_is_waited_for(result)
    assert result["events"][:2] == ["put", "put"]  # before the warm-up calls


@pytest.mark.slow
def test_torch_runner_puts_the_input_once_and_waits_for_every_timed_call(tmp_path):
    result = _in_subprocess("torch", tmp_path)
    _assert_each_timed_call_is_waited_for(result)
    assert result["device"][0] == "cpu"  # the suite's torch is a CPU build


def test_jax_runner_puts_the_input_once_waits_for_every_call_and_traces_once(tmp_path):
    """The launch is logged outside ``jax.jit`` (inside, the model runs only when traced); the
    wait is ``block_until_ready`` on the output the jitted call returned."""
    result = _in_subprocess("jax", tmp_path)
    _assert_each_timed_call_is_waited_for(result)
    assert result["events"][:2] == ["put", "put"]  # before the warm-up calls
    assert result["traced"] == ["launch:a", "launch:b"]  # once each: no timed call retraces
    assert not result["outputs_on_host"]  # the waits got device arrays, not host copies
    assert result["device"][0] == "cpu"  # JAX_PLATFORMS=cpu


@pytest.mark.parametrize("runtime", ["litert", "onnx"])
def test_host_runtimes_take_the_input_once_and_read_every_output_before_the_clock(runtime):
    if timing.missing(runtime):
        pytest.skip(timing.missing(runtime))
    result = timed_calls.record(runtime)
    _assert_each_timed_call_is_waited_for(result)  # the output is read inside each launch
    assert result["outputs_on_host"]
    assert result["device"][0] == "cpu"


@pytest.mark.slow
def test_torch_compile_runner_waits_for_every_call_and_computes_the_eager_outputs(tmp_path):
    """torch.compile's inductor builds C++ kernels on the CPU: minutes on 2 cores."""
    result = _in_subprocess("torch", tmp_path, "torch_compile", timeout=1200)
    _assert_each_timed_call_is_waited_for(result)
    assert result["compiled_matches_eager"]


def test_torch_compile_is_refused_without_a_cpp_compiler(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no compiler on it
    monkeypatch.delenv("CXX", raising=False)
    with pytest.raises(kp.ArgumentError, match=r"runtime='torch_compile' builds its kernels "
                                               r"with a C\+\+ compiler.*runtime='torch'"):
        runtimes._check_compiler("torch_compile")
    with pytest.raises(kp.ArgumentError, match="KERAS_BACKEND=torch"):  # under TensorFlow
        kp.latency_model(_small_cnn(), runtime="torch_compile")


def _lscpu_model():
    """The CPU's model name as ``lscpu`` reports it (a reference other than the library's)."""
    lscpu = shutil.which("lscpu")
    out = subprocess.run([lscpu], capture_output=True, text=True).stdout if lscpu else ""
    names = [line.partition(":")[2].strip() for line in out.splitlines()
             if line.startswith("Model name")]
    return names[0] if names else None


def test_device_of_names_this_machines_device():
    import tensorflow as tf

    here = timing.device_of("tf")
    assert here.kind == ("gpu" if tf.config.list_physical_devices("GPU") else "cpu")
    if here.kind == "cpu" and _lscpu_model():
        assert here.name == _lscpu_model()
    assert timing.device_of("onnx").kind == "cpu"  # host runtimes run on the CPU


@pytest.fixture(scope="module")
def small():
    return _small_cnn()


@pytest.fixture(scope="module")
def fitted(small):
    return kp.latency_model(small, batch_size=4, variants=8, timer=_timer(), verbose=0)


def _on(lm, kind, name):
    return dataclasses.replace(lm, backend="tensorflow", device_kind=kind, device_name=name,
                               precision="float32")


def test_device_fields_survive_json_and_old_files_load_without_them(tmp_path, fitted):
    assert (fitted.backend, fitted.device_kind, fitted.device_name) == (None, None, None)
    assert fitted.precision == "float32"  # a custom timer: the device is unknown
    gpu = _on(fitted, "gpu", "NVIDIA H200")
    again = kp.LatencyModel.from_json(gpu.to_json(tmp_path / "lm.json"))
    assert again == gpu
    lines = []
    again.summary(print_fn=lines.append)
    assert "Timed on gpu 'NVIDIA H200' (tensorflow, runtime 'tf', batch 4, float32)" in lines
    old = kp.LatencyModel.from_json(FORMAT_1)
    assert (old.backend, old.device_kind, old.device_name, old.precision) == (None,) * 4
    lines = []
    old.summary(print_fn=lines.append)
    assert any("Timed on an unrecorded device" in line for line in lines)


def test_a_latency_model_of_another_device_kind_is_refused(small, fitted, tmp_path):
    here = timing.device_of("tf")
    other = "gpu" if here.kind == "cpu" else "cpu"
    elsewhere = _on(fitted, other, "Other Chip 9000")
    with pytest.raises(kp.LatencyModelMismatchError,
                       match=rf"latency_model was timed on {other} 'Other Chip 9000' .*this "
                             rf"process computes on {here.kind} {re.escape(repr(here.name))}.*"
                             r"fit one here with kp\.latency_model\(model\)"):
        kp.precrop(small, latency=0.5, latency_model=elsewhere)
    path = tmp_path / "gpu.json"
    elsewhere.to_json(path)
    with pytest.raises(kp.LatencyModelMismatchError, match=rf"latency_model='{re.escape(str(path))}'"):
        kp.plan(small, latency=0.5, latency_model=path)
    # a prediction for the device it was fitted on is still one
    assert elsewhere.predict(small) == pytest.approx(_synthetic_seconds(small), rel=1e-6)


def test_another_chip_of_the_same_kind_warns_and_the_same_one_plans_silently(small, fitted):
    here = timing.device_of("tf")
    with pytest.warns(UserWarning, match=rf"timed on {here.kind} 'Other Chip 9000'.*may be off"):
        plan = kp.plan(small, latency=0.5, latency_model=_on(fitted, here.kind, "Other Chip 9000"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        same = kp.plan(small, latency=0.5, latency_model=_on(fitted, here.kind, here.name))
        unknown = kp.plan(small, latency=0.5, latency_model=fitted)
    assert plan.widths == same.widths == unknown.widths


def _launch_bound(models):
    """The synthetic cost plus ``LAUNCH`` per layer: a device where launches dominate."""
    return {k: _synthetic_seconds(m) + LAUNCH * len(m.layers) for k, m in models.items()}


def test_a_latency_budget_below_the_launch_floor_names_the_reachable_ratio(small):
    lm = kp.latency_model(small, batch_size=4, variants=8, timer=_launch_bound, verbose=0)
    with pytest.raises(kp.InfeasibleBudgetError) as info:
        kp.plan(small, latency=0.3, latency_model=lm)
    message = str(info.value)
    reachable = float(re.search(r"smallest reachable latency ratio is ([\d.]+):", message)[1])
    assert 0.3 < reachable < 1
    assert info.value.limit["latency"] / lm.seconds == pytest.approx(reachable, abs=1e-3)
    assert re.search(r"(\d+)% of the narrowest plan's time is a constant per layer call", message)
    assert "kp.latency_model(model, batch_size=16), or another runtime= than 'tf'" in message
    # the command line's remedy is commands: fit a latency model, then plan with it
    cli = info.value.format(lambda name, value: f"--{name} {value}", front="cli")
    assert ("`keras-precrop latency MODEL --batch_size 16 --json latency.json` (or another --runtime "
            "than tf), then --latency_model latency.json") in cli
    assert info.value.arguments["latency"] == 0.3  # the user's argument, named as given
    # the ratio is a budget that plans (rounded up), and just below it nothing does
    plan = kp.plan(small, latency=reachable, latency_model=lm)
    assert plan.latency <= reachable * lm.seconds * (1 + 1e-9)
    with pytest.raises(kp.InfeasibleBudgetError):
        kp.plan(small, latency=reachable - 1e-3, latency_model=lm)
    # the narrowest model, rebuilt, is as slow as the message says (the timer, not the fit)
    narrowest = kp.apply_plan(small, plan)
    assert _launch_bound({"n": narrowest})["n"] / _launch_bound({"s": small})["s"] == \
        pytest.approx(reachable, rel=0.15)


@pytest.mark.slow
def test_a_fit_on_the_real_clock_records_this_device(small):
    lm = kp.latency_model(small, batch_size=2, variants=6, rounds=1, refine_rounds=0, verbose=0)
    here = timing.device_of("tf")
    assert (lm.backend, lm.device_kind, lm.device_name, lm.precision) == (
        keras.backend.backend(), here.kind, here.name, "float32")
    with warnings.catch_warnings():  # planned with here, on the device it was fitted on
        warnings.simplefilter("error")
        plan = kp.plan(small, flops=0.5, latency_model=lm)
    assert np.isfinite(plan.latency) and plan.latency < lm.seconds
