"""``benchmarks/bench_gpu.py``: its CPU dry run without TensorFlow, its clock, guard and floors.

The benchmark is meant for a GPU machine with JAX, PyTorch and Keras but no
TensorFlow; here ``--quick`` runs the same code on the CPU, in children with
TensorFlow hidden (``tests/without_tensorflow``), so a break shows before a
GPU is lent. The parts whose numbers matter are checked against references:
the clock against known sleeps and call counts, an infeasible latency budget
against a latency model fitted on a synthetic clock whose floor is known.
"""

import json
import os
import pathlib
import re
import shutil
import sys
import time
import types

import keras
import pytest

import keras_precrop as kp
from tests.conftest import REPO, git, run_python

sys.path.insert(0, str(REPO / "benchmarks"))
import bench_gpu as bench  # noqa: E402

L = keras.layers
WITHOUT_TENSORFLOW = REPO / "tests" / "without_tensorflow"


def _quick_env():
    """TensorFlow hidden; JAX on the CPU with its cheapest compiling: tests/test_backends.py's
    flags, and XLA's older CPU emitters, which compiled ResNet-8's gradient 4x faster here (1.6 s
    instead of 6.6 s); one OpenMP thread so torch does not spin on a loaded 2-core machine."""
    return {**os.environ, "PYTHONPATH": str(WITHOUT_TENSORFLOW), "TF_CPP_MIN_LOG_LEVEL": "2",
            "JAX_PLATFORMS": "cpu", "OMP_NUM_THREADS": "1",
            "XLA_FLAGS": "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true "
                         "--xla_cpu_use_fusion_emitters=false"}


def _check_study(study, plan_options):
    """Every plan of a study was made (with ``plan_options`` added) and timed both ways; speedups
    are medians within their rounds' range and the original is the reference (1.0)."""
    assert set(study["plans"]) == set(bench.PLANS) and "fit" in study
    for label, p in study["plans"].items():
        assert p["options"] == {**bench.PLANS[label], **plan_options}
    timed = {bench.ORIGINAL, *(label for label, p in study["plans"].items()
                               if not p.get("infeasible") or p["infeasible"]["planned_at"])}
    for kind in ("inference", "training"):
        assert set(study[kind]) == timed, kind
        assert study[kind][bench.ORIGINAL]["speedup"] == 1.0
        for t in study[kind].values():
            assert t["median_s"] > 0 and t["speedup_min"] <= t["speedup"] <= t["speedup_max"]
            assert t["rounds"] == bench.TIMING[True]["rounds"]
    flops = study["plans"]["flops0.5"]
    assert flops["macs_ratio"] <= 0.5 and flops["params_ratio"] < 1
    for label, p in study["plans"].items():
        infeasible = p.get("infeasible")
        if infeasible and infeasible["planned_at"] is None:  # a floor too close to 1 to plan at
            assert infeasible["floor_ratio"] * bench.FLOOR_MARGIN >= 1 and "predicted_ratio" not in p
        elif label.startswith("latency"):
            budget = infeasible["planned_at"] if infeasible else bench.BUDGET
            assert p["predicted_ratio"] <= budget * 1.001, (label, p)


@pytest.mark.slow
def test_quick_dry_run_on_jax_and_torch_without_tensorflow(tmp_path):
    """One command runs both backends (each in its own process, TensorFlow hidden) and leaves
    results.json and results.md under OUT/<device>/, every step run, every plan timed."""
    start = time.perf_counter()
    done = run_python(["benchmarks/bench_gpu.py", "--quick", "--out", str(tmp_path / "out")],
                      env=_quick_env())
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    print(f"quick dry run: {time.perf_counter() - start:.0f} s")
    (folder,) = (tmp_path / "out").iterdir()
    assert folder.name.startswith("cpu-")
    result = json.loads((folder / "results.json").read_text())
    assert list(result["backends"]) == ["jax", "torch"]
    for backend, r in result["backends"].items():
        assert r["notes"] == [] and r["device"].startswith("CPU: "), (backend, r["notes"])
        assert [(s["model"], s["input"], s["batch"]) for s in r["studies"]] == [("resnet8", 16, 2)]
        plan_options = {"min_channels": 2} if backend == "torch" else {}  # torch's CPU workaround
        assert len(r["caveats"]) == 2 * (backend == "torch")
        for study in r["studies"]:
            _check_study(study, plan_options)
    text = (folder / "results.md").read_text()
    assert text == bench.markdown(result)
    rows = [line for line in text.splitlines() if line.startswith(("| jax |", "| torch |"))]
    assert len(rows) == 2 * (1 + len(bench.PLANS))  # backends x (original, plans)
    goals = result["goals"]
    assert [(g["backend"], g["model"]) for g in goals] == [("jax", "resnet8"), ("torch", "resnet8")]
    for g in goals:
        assert g["reached"] == (g["why"] is None and g["speedup"] >= bench.GOAL)


def test_the_clock_times_each_step_round_robin_after_warmup(monkeypatch):
    """On a clock that only the steps advance (1 and 4 units per call): each step is called for
    warm-up, once to size its inner loop to ``target_s``, then its inner loop once per round, in
    an order rotated each round, and measures exactly its time per call."""
    now, calls = [0.0], []

    def step(name, seconds):
        def run():
            calls.append(name)
            now[0] += seconds
        return run

    monkeypatch.setattr(bench, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    steps = {"fast": step("fast", 1.0), "slow": step("slow", 4.0)}
    samples = bench._interleaved(steps, rounds=3, target_s=8.0, warmup=2)
    fast, slow = ["fast"] * 8, ["slow"] * 2  # inner loops of about 8 units
    assert calls == ["fast"] * 2 + ["slow"] * 2 + ["fast", "slow"] + fast + slow + slow + fast + fast + slow
    assert samples == {"fast": [1.0] * 3, "slow": [4.0] * 3}


def _guard(tmp_path, budget_s=60.0, step_s=1.0):
    result = {"backend": "test", "studies": [], "notes": []}
    return result, bench._Guard(result, tmp_path / "child.json", budget_s, step_s)


def test_the_guard_skips_a_step_that_overruns_or_fails_and_keeps_the_rest(tmp_path):
    """A step past its alarm and a failing step return None with a note naming them; a step that
    finishes returns its value; the child's JSON on disk holds the notes after each step."""
    result, guard = _guard(tmp_path)
    start = time.perf_counter()
    assert guard("sleeping", lambda: time.sleep(5)) is None
    assert time.perf_counter() - start < 3
    assert guard("dividing", lambda: 1 / 0) is None
    assert guard("adding", lambda: 1 + 1) == 2
    assert result["notes"] == ["sleeping: skipped, it ran past its 1 s guard",
                               "dividing: failed: ZeroDivisionError: division by zero"]
    assert json.loads((tmp_path / "child.json").read_text())["notes"] == result["notes"]


def test_the_guard_starts_nothing_once_the_budget_is_spent(tmp_path):
    result, guard = _guard(tmp_path, budget_s=2.0)
    ran = []
    assert guard("late", lambda: ran.append(1)) is None
    assert ran == [] and result["notes"] == ["late: not run, the backend's time budget was spent"]


def _small_cnn():
    keras.utils.set_random_seed(0)
    x = keras.Input((16, 16, 3))
    h = x
    for width in (16, 32, 64):
        h = L.ReLU()(L.BatchNormalization()(L.Conv2D(width, 3, padding="same")(h)))
    return keras.Model(x, L.Dense(10)(L.GlobalAveragePooling2D()(h)), name="small_cnn")


FLOOR = 0.6  # the synthetic clock's share of the original's time that no width removes


@pytest.fixture(scope="module")
def floored():
    """A small CNN and a latency model fitted on a synthetic clock: ``FLOOR`` of the original's
    time is a per-call constant (as launches are on a GPU), the rest is proportional to MACs."""
    model = _small_cnn()
    macs = kp.profile(model).total_macs

    def clock(models):
        return {label: 1e-3 * (FLOOR + (1 - FLOOR) * kp.profile(m).total_macs / macs)
                for label, m in models.items()}

    return model, kp.latency_model(model, 4, variants=6, rounds=1, refine_rounds=0, verbose=0,
                                   timer=clock)


def test_an_infeasible_latency_budget_is_planned_at_its_floor(floored):
    """latency=0.5 under a 0.6 floor: the record names the floor (the clock's, within 5%) and the
    planner's reason, and the model is planned 5% above the floor; the rebuilt model has the
    parameters the record says."""
    model, lm = floored
    record, rebuilt = bench._plan(model, lm, {"latency": 0.5})
    floor = record["infeasible"]
    assert floor["floor_ratio"] == pytest.approx(FLOOR, rel=0.05)
    assert "latency=0.5" in floor["why"] and "cannot be met" in floor["why"]
    assert floor["planned_at"] == pytest.approx(floor["floor_ratio"] * bench.FLOOR_MARGIN)
    assert record["predicted_ratio"] <= floor["planned_at"] * 1.001
    assert rebuilt.count_params() == pytest.approx(record["params_ratio"] * model.count_params())


def test_a_feasible_budget_is_planned_as_asked(floored):
    model, lm = floored
    record, rebuilt = bench._plan(model, lm, {"latency": 0.8, "mode": "uniform"})
    assert "infeasible" not in record and record["mode"] == "uniform"
    assert record["predicted_ratio"] <= 0.8 * 1.001
    assert rebuilt.count_params() == pytest.approx(record["params_ratio"] * model.count_params())
    macs = kp.profile(model).total_macs
    assert kp.profile(rebuilt).total_macs == pytest.approx(record["macs_ratio"] * macs)


@pytest.mark.parametrize("out", [None, "benchmarks/results/gpu"])
def test_a_run_on_a_cpu_leaves_the_repository_as_it_was(monkeypatch, capsys, out):
    """``--quick`` on a CPU, with or without ``--out benchmarks/results/gpu``: nothing appears
    under ``benchmarks/`` (``git status``, untracked files too), the results go to a new
    temporary folder outside the repository, named after the CPU (the children stand in)."""
    def child(backend, args, budget_s, folder):  # what a CPU child reports, without the minute
        return {"backend": backend, "device": "CPU: test cpu", "studies": [], "notes": []}

    monkeypatch.setattr(bench, "_run_child", child)
    monkeypatch.setattr(bench, "_installed", lambda backend: True)
    monkeypatch.chdir(REPO)
    before = git(REPO, "status", "--porcelain", "--untracked-files=all", "benchmarks")
    assert bench.main(["--quick", *(["--out", out] if out else [])]) == 0
    assert git(REPO, "status", "--porcelain", "--untracked-files=all", "benchmarks") == before
    written = pathlib.Path(re.search(r"wrote (\S+)/results\.json", capsys.readouterr().err)[1])
    try:
        assert REPO not in written.parents and written.name == "cpu-test-cpu"
        assert json.loads((written / "results.json").read_text())["settings"]["quick"] is True
    finally:
        shutil.rmtree(written.parent)
