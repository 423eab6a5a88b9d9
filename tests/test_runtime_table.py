"""The runtime table: one record per runtime, a runtime registered from outside, the recorded name.

Issue 59 items 2 and 5b, issue 60 item 9: a runtime is one entry of
``keras_precrop.latency.runtimes``; ``register_runtime`` adds one that
``kp.latency_model`` times with (here ``model.predict_on_batch``, the step
the package itself never uses); the Keras backend's own step is recorded by
the backend's name; a plan that fits a latency model walks the model once.
"""

import dataclasses
import json
import sys

import keras
import numpy as np
import pytest

import keras_precrop as kp
from keras_precrop._cli_flags import parser as _parser
from keras_precrop.graph import walker
from keras_precrop.latency import runtimes, timing
from tests.test_backends import _check, _run
from tests.test_latency import _small_cnn, _synthetic_seconds, _timer

BUILT_IN = ("tf", "jax", "torch", "torch_compile", "litert", "tflite", "onnx", "litert_int8",
            "onnx_int8")
ABSENT = "keras_precrop_no_such_module"


@pytest.fixture(autouse=True)
def table(monkeypatch):
    """The runtime table as it is; what a test registers is gone after it."""
    monkeypatch.setattr(runtimes, "_TABLE", dict(runtimes._TABLE))


@pytest.fixture(scope="module")
def small():
    return _small_cnn()


def _predict_on_batch(built):
    """A step builder that times ``model.predict_on_batch`` and records each model it builds for."""
    def step(model, x, training):
        built.append(model)
        return lambda: model.predict_on_batch(x)

    return step


def test_a_runtime_registered_from_outside_times_a_latency_model(small, tmp_path):
    built = []
    kp.latency.register_runtime("mine", _predict_on_batch(built), doc="Keras' predict_on_batch")
    assert "mine" in kp.latency.RUNTIMES and kp.latency.timing.RUNTIMES == BUILT_IN + ("mine",)
    assert _parser().parse_args(["latency", "resnet20", "--runtime", "mine"]).runtime == "mine"
    lm = kp.latency_model(small, batch_size=2, runtime="mine", variants=6, rounds=1,
                          refine_rounds=0, blocks=(1,), verbose=0)
    assert lm.runtime == "mine" and lm.describe()["runtime"] == "mine"
    assert len(built) == 6  # one step per timed variant, the original's rebuild first
    assert built[0].count_params() == small.count_params() > built[1].count_params()
    assert all(v["seconds"] > 0 for v in lm.variants)
    assert (lm.backend, lm.device_kind) == (keras.backend.backend(), "cpu")  # the host CPU
    again = kp.LatencyModel.from_json(lm.to_json(tmp_path / "lm.json"))
    assert json.loads((tmp_path / "lm.json").read_text())["runtime"] == "mine"
    assert kp.plan(small, flops=0.5, latency_model=again).latency > 0  # planned on its device
    # The runner returns what the step returned: the model's outputs on the seeded batch.
    x = np.random.default_rng(0).standard_normal((2, 16, 16, 3)).astype("float32")
    np.testing.assert_allclose(kp.latency.runner(small, 2, runtime="mine")(),
                               keras.ops.convert_to_numpy(small(x)), rtol=1e-5, atol=1e-5)


def test_an_unknown_runtime_is_refused_listing_the_table(small):
    kp.latency.register_runtime("mine", _predict_on_batch([]))
    with pytest.raises(kp.ArgumentError) as info:
        kp.latency_model(small, runtime="coreml", timer=_timer(), verbose=0)
    assert info.value.arguments == {"runtime": "coreml"}
    assert str(info.value) == (f"runtime must be one of {BUILT_IN + ('mine',)}, got 'coreml' "
                               "(kp.latency.register_runtime adds one)")


@pytest.mark.parametrize("extra, install", [("mine", "'keras-precrop[mine]'"), (None, ABSENT)])
def test_a_registered_runtime_without_its_package_names_the_package_and_the_extra(
        small, extra, install):
    built = []
    kp.latency.register_runtime("mine", _predict_on_batch(built), needs=("numpy", ABSENT),
                                extra=extra)
    with pytest.raises(kp.ArgumentError) as info:
        kp.latency_model(small, runtime="mine", verbose=0)
    assert str(info.value) == f"runtime='mine' needs {ABSENT}: pip install {install}"
    assert built == []  # refused before anything was built or timed


def test_a_registered_runtime_names_the_backend_it_needs_and_what_it_cannot_time(small):
    kp.latency.register_runtime("mine_on_jax", _predict_on_batch([]), backend="jax")
    other = "torch" if keras.backend.backend() == "jax" else "jax"
    kp.latency.register_runtime("mine", _predict_on_batch([]), backend=other)
    with pytest.raises(kp.ArgumentError, match=f"runtime='mine' times the model under "
                                               f"KERAS_BACKEND={other}; this process runs"):
        kp.latency.runner(small, 2, runtime="mine")
    kp.latency.register_runtime("mine", _predict_on_batch([]), replace=True)
    with pytest.raises(kp.ArgumentError, match="training=True times a training step"):
        kp.latency.runner(small, 2, runtime="mine", training=True)


@pytest.mark.parametrize("name, aliases", [("onnx", ()), ("mine", ("tflite",))])
def test_a_name_the_table_has_is_refused_unless_replaced(name, aliases):
    with pytest.raises(kp.ArgumentError, match="names the runtime .* already; pick another name, "
                                               "or pass replace=True"):
        kp.latency.register_runtime(name, _predict_on_batch([]), aliases=aliases)
    assert kp.latency.RUNTIMES == BUILT_IN


def test_a_replaced_runtime_keeps_its_place_and_answers_to_its_aliases():
    step = _predict_on_batch([])
    kp.latency.register_runtime("onnx", step, aliases=("ort",), replace=True)
    assert kp.latency.RUNTIMES == BUILT_IN[:7] + ("ort",) + BUILT_IN[7:]
    assert timing.runtime_of("ort").step is step and runtimes.missing("ort") is None


def test_the_backend_s_own_step_is_recorded_by_the_backend_s_name(small, monkeypatch):
    """``"tf"`` is the Keras backend's compiled step: under JAX a latency model recorded ``"tf"``
    for ``jax.jit``. Under each backend it records that backend's runtime (the process's Keras is
    TensorFlow; the runtime table is asked as JAX and torch would ask it)."""
    options = dict(batch_size=4, variants=6, refine_rounds=0, timer=_timer(), verbose=0)
    assert kp.latency_model(small, runtime="tf", **options).runtime == "tf"
    assert kp.latency_model(small, runtime="tflite", **options).runtime == "litert"
    for backend in ("jax", "torch"):
        monkeypatch.setattr(keras.backend, "backend", lambda b=backend: b)
        assert kp.latency_model(small, runtime="tf", **options).runtime == backend
        assert timing.runtime_of(backend).name == backend


_UNDER_JAX = """
import json, sys
import keras_precrop as kp
from tests.test_latency import _small_cnn, _timer
small = _small_cnn()
lm = kp.latency_model(small, batch_size=4, variants=6, refine_rounds=0, timer=_timer(), verbose=0)
old = kp.LatencyModel.from_json(sys.argv[1])
plan = kp.plan(small, latency=0.6, latency_model=old)
print(json.dumps([lm.runtime, old.runtime, plan.widths]))
"""


def test_under_jax_the_step_is_recorded_as_jax_and_old_tf_files_still_plan(small, tmp_path):
    """A file written before the name was fixed (``runtime: 'tf'`` under JAX) plans under JAX
    as it does here, on the device ``"tf"`` stands for there."""
    lm = kp.latency_model(small, batch_size=4, variants=6, refine_rounds=0, timer=_timer(),
                          verbose=0)
    here = timing.device_of("tf")
    old = dataclasses.replace(lm, backend="jax", device_kind=here.kind, device_name=here.name)
    assert old.runtime == "tf"
    old.to_json(tmp_path / "old.json")
    expected = kp.plan(small, latency=0.6, latency_model=str(tmp_path / "old.json"))
    code = _UNDER_JAX.replace("sys.argv[1]", repr(str(tmp_path / "old.json")))
    out = _check(_run("jax", ["-c", code], tmp_path, timeout=300))
    recorded, loaded, widths = json.loads(out.strip().splitlines()[-1])
    assert (recorded, loaded) == ("jax", "tf")
    assert widths == expected.widths


def _count_walks(monkeypatch):
    """Counts every walk the package makes, wherever a module holds the walker's ``walk``."""
    real, walked = walker.walk, []

    def counting(model, **kwargs):
        walked.append(model)
        return real(model, **kwargs)

    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").startswith("keras_precrop") and \
                getattr(module, "walk", None) is real:
            monkeypatch.setattr(module, "walk", counting)
    return walked


def test_a_plan_that_fits_its_latency_model_walks_the_model_once(small, monkeypatch):
    options = dict(batch_size=4, variants=8, refine_rounds=1, timer=_timer(), verbose=0)
    reference = kp.latency_model(small, **options)  # fitted on a walk of its own
    expected = kp.plan(small, latency=0.6, latency_model=reference, calibrate=0)
    walked = _count_walks(monkeypatch)
    new = kp.precrop(small, latency=0.6, latency_model=options, calibrate=0)
    assert sum(model is small for model in walked) == 1
    plan = new.precrop_plan
    assert plan.widths == expected.widths and plan.latency == pytest.approx(expected.latency)
    assert plan.solver["latency_model"] == expected.solver["latency_model"]
    assert new.count_params() == kp.apply_plan(small, expected).count_params()
    assert plan.latency == pytest.approx(reference.predict(new))
    assert _synthetic_seconds(new) < 0.65 * _synthetic_seconds(small)


def test_a_walk_of_another_model_or_under_other_settings_is_refused(small):
    graph = walker.walk(small)
    for kwargs in (dict(residual="tie"), dict(ignore="stem")):
        with pytest.raises(kp.ArgumentError, match="graph= is a walk of model 'small_cnn'"):
            kp.latency_model(small, timer=_timer(), verbose=0, graph=graph, **kwargs)
    with pytest.raises(kp.ArgumentError, match="not of model 'other'"):
        kp.latency_model(_small_cnn("other"), timer=_timer(), verbose=0, graph=graph)
