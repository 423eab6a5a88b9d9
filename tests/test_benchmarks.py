"""Which trained models ``benchmarks/bench_trained_speed.py`` times (it times nothing here).

The benchmark rebuilds each trained model of a network's grids to time it; a
model it rebuilds wrongly would put a wrong speedup beside a right accuracy.
These tests rebuild the committed runs of the reproduction and check the
rebuilt plans against what each run recorded when it trained (parameters,
MACs), latency plans (``--plan_file``) included.
"""

import json
import shutil
import sys

import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import bench_trained_speed as bench  # noqa: E402

RUNS = REPO / "experiments" / "runs"
_LATENCY = "resnet20-precrop_plan-planresnet20_tf_b64_latency0.5_{}-ep10-s{}"
_FLOPS = "resnet20-precrop_flops-flops0.0884-modeexact-ep10-s{}"


def _copy_runs(tmp_path, names):
    """A runs folder holding the committed ``results.json`` of ``names``."""
    for name in names:
        (tmp_path / name).mkdir()
        shutil.copy(RUNS / name / "results.json", tmp_path / name / "results.json")
    return tmp_path


def test_latency_plans_are_timed_from_their_plan_files(tmp_path):
    """A latency plan's run (recorded with the absolute path of the checkout that trained it) is
    rebuilt from the plan file of that name here; its seeds share one model, as a budget plan's do,
    and each rebuilt plan has the parameters and MACs its run trained."""
    names = [_LATENCY.format(kind, seed) for kind in ("uniform", "streamfloor") for seed in (0, 1)]
    names += [_FLOPS.format(seed) for seed in (0, 1)]
    runs = bench.structured_runs(_copy_runs(tmp_path, names), "resnet20", 10)
    assert sorted(runs) == sorted(names)
    plans, skipped = bench.distinct_plans(bench.kp.models.get("resnet20"), runs)
    assert skipped == {}
    assert sorted(p["label"] for p in plans) == sorted({name.rsplit("-s", 1)[0] for name in names})
    for p in plans:
        assert p["runs"] == [f"{p['label']}-s0", f"{p['label']}-s1"]
        trained = runs[p["runs"][0]]
        assert (p["plan"].params, p["plan"].macs) == (trained["params"], trained["macs"])
    streams = next(p for p in plans if "streamfloor" in p["label"])
    assert streams["plan"].mode_label == "exact, floor=1.0 on streams"


def test_a_plan_file_that_no_longer_matches_its_run_is_skipped_with_why(tmp_path):
    """A run whose plan file is gone, or plans other widths than it trained, is not timed; the note
    names the file or both parameter counts."""
    name = _LATENCY.format("uniform", 0)
    runs = bench.structured_runs(_copy_runs(tmp_path, [name]), "resnet20", 10)
    base = bench.kp.models.get("resnet20")
    gone = {name: {**runs[name], "plan_file": "/elsewhere/experiments/plans/missing.json"}}
    _, skipped = bench.distinct_plans(base, gone)
    assert "cannot re-plan it" in skipped[name] and "missing.json" in skipped[name]
    other = {name: {**runs[name], "params": runs[name]["params"] + 1}}
    _, skipped = bench.distinct_plans(base, other)
    params = runs[name]["params"]
    assert skipped[name] == f"its plan file holds {params:,} params, it trained {params + 1:,}"


@pytest.mark.parametrize("method", ["synflow", "baseline"])
def test_masked_and_dense_runs_are_not_rebuilt(tmp_path, method):
    """Runs that keep the original's dense kernels (masks, the baseline) are left to the report's 1.0x."""
    name = f"resnet20-{method}-ep10-s0"
    (tmp_path / name).mkdir()
    (tmp_path / name / "results.json").write_text(json.dumps({"method": method, "model": "resnet20",
                                                              "epochs": 10}))
    assert bench.structured_runs(tmp_path, "resnet20", 10) == {}


def test_the_vits_at_init_runs_are_rebuilt_as_vit_at_init_cut_them(tmp_path):
    """``--model vit_cifar`` times vit_at_init.py's precrop and uniform runs only (not the teachers,
    the trained arms or the keras_hub configs): a budget's run is re-planned to the model
    ``kp.precrop`` made for it, a calibrated latency plan's run is its plan file."""
    pytest.importorskip("keras_hub")
    base = bench.base_model("vit_cifar")
    plan_file = "experiments/plans/vit_cifar_tf_b64_headdims_latency0.5_uniform.json"
    records = {
        "vit_cifar-precrop-params0.5-ep10-s0": {
            "method": "precrop", "budgets": {"params": 0.5, "flops": None, "latency": None},
            "params": bench.kp.precrop(base, params=0.5).count_params()},
        "vit_cifar-uniform-vit_cifar_tf_b64_headdims_latency0.5_uniform-ep10-s1": {
            "method": "uniform", "budgets": {"params": None, "flops": None, "latency": 0.5},
            "plan": f"/elsewhere/{plan_file}", "params": 211554},
        "vit_cifar-homogeneous-params0.5-ep10-s0": {"method": "homogeneous"},
        "vit_cifar-teacher-ep10-s0": {"seed": 0},
        "vit_cifar-oneshot-flops0.5-distill-ep10-s0": {"arm": "oneshot"},
    }
    for name, record in records.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps({**record, "epochs": 10}))
    runs = bench.structured_runs(tmp_path, "vit_cifar", 10)
    assert sorted(runs) == sorted(list(records)[:2])
    plans, skipped = bench.distinct_plans(base, runs)
    assert skipped == {}
    assert sorted((p["runs"], p["plan"].params) for p in plans) == sorted(
        ([name], records[name]["params"]) for name in runs)
