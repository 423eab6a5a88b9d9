"""End-to-end runs of examples/train_cifar.py and examples/train_imagenet.py.

Fast tests run the scripts in a subprocess under ``tfds.testing.mock_data``
(random images in the real datasets' format), so they need neither the real
data nor long epochs. The slow ones train ResNet-20 for one epoch on the real
CIFAR-10 from ``../shared/tfds`` (the issue's benchmark).
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402

# Importing the package registers PrefixAdd, MaskConstraint and SGDWithL2, which checkpoints use.
from keras_precrop import models, profile  # noqa: E402
from keras_precrop.training import constraints  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TFDS_DIR = REPO.parent / "shared" / "tfds"

# Runs a script as __main__ with TFDS serving mock examples of any dataset.
_MOCK_RUNNER = """
import os, runpy, sys
import tensorflow_datasets as tfds
script, count = sys.argv[1], int(sys.argv[2])
sys.argv = [script, *sys.argv[3:]]
sys.path.insert(0, os.path.dirname(script))
with tfds.testing.mock_data(num_examples=count):
    runpy.run_path(script, run_name="__main__")
"""


def _run(script, flags, mock_examples=None, timeout=600):
    path = str(REPO / "examples" / script)
    if mock_examples is None:
        command = [sys.executable, path]
    else:
        command = [sys.executable, "-c", _MOCK_RUNNER, path, str(mock_examples)]
    return subprocess.run(
        [*command, *flags],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _train(tmp_path, script, flags, mock_examples=64):
    proc = _run(script, [*flags, f"--model_dir={tmp_path}"], mock_examples)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    with open(tmp_path / "results.json") as f:
        return json.load(f), proc.stdout


def _check_results(results, epochs):
    assert [row["epoch"] for row in results["history"]] == list(range(epochs))
    accuracies = [row["val_accuracy"] for row in results["history"]]
    assert results["final_accuracy"] == accuracies[-1]
    assert results["best_accuracy"] == max(accuracies)
    assert results["train_time_s"] == pytest.approx(sum(row["epoch_time"] for row in results["history"]))
    assert results["wall_time_s"] >= results["train_time_s"]
    assert results["params_ratio"] == pytest.approx(results["params"] / results["original_params"])
    assert results["macs_ratio"] == pytest.approx(results["macs"] / results["original_macs"])


_SHORT = ["--epochs=2", "--batch_size=32"]


def test_cifar_baseline(tmp_path):
    results, stdout = _train(tmp_path, "train_cifar.py", ["--model=resnet20", "--method=baseline", *_SHORT])
    _check_results(results, epochs=2)
    expected = models.get("resnet20").count_params()
    assert results["params"] == results["original_params"] == expected
    assert results["macs_ratio"] == 1.0
    assert f"Total params: {expected:,}" in stdout  # the table is printed before training
    assert stdout.index("Total params") < stdout.index("Epoch 1/2")
    # The default --verbose=1 into a pipe: plain lines, no progress-bar control characters.
    assert not any(c in stdout for c in "\r\b\x1b") and "2/2 - " in stdout
    assert (results["steps_per_epoch"], results["recipe"]) == (2, "cifar10")  # 64 mock examples / 32
    lr0 = 0.1 * 32 / 128
    assert [row["learning_rate"] for row in results["history"]] == pytest.approx([lr0, lr0 / 2])
    assert keras.saving.load_model(tmp_path / "last.keras").count_params() == expected


def test_cifar_precrop_params(tmp_path):
    results, stdout = _train(
        tmp_path, "train_cifar.py", ["--method=precrop_params", "--params=0.3", "--verbose=0", *_SHORT]
    )
    _check_results(results, epochs=2)
    assert "Epoch" not in stdout and "2/2 - " not in stdout  # --verbose=0 trains silently
    trained = keras.saving.load_model(tmp_path / "last.keras")
    assert results["params"] == trained.count_params()
    assert results["params"] <= 0.3 * models.get("resnet20").count_params()
    assert results["params_ratio"] > 0.25  # the budget is used, not just met


def test_cifar_synflow_keeps_masked_weights_zero(tmp_path):
    results, stdout = _train(
        tmp_path, "train_cifar.py", ["--method=synflow", "--params=0.1", "--verbose=2", *_SHORT]
    )
    _check_results(results, epochs=2)
    assert re.search(r"^100/100 - \d+s - .*density: 0.1000$", stdout, re.M)  # SynFlow's one line
    trained = keras.saving.load_model(tmp_path / "last.keras")
    kernels = [w.numpy() for w in trained.weights if w.trainable and len(w.shape) >= 2]
    kept = sum(int(np.count_nonzero(k)) for k in kernels)
    assert kept / sum(k.size for k in kernels) == pytest.approx(0.1, abs=1e-4)
    assert results["params"] == trained.count_params() - sum(k.size for k in kernels) + kept
    assert "Density" in stdout and stdout.index("Density") < stdout.index("Epoch 1/2")


def test_cifar_export_init_writes_the_untrained_model_and_its_record(tmp_path):
    """--export_init: the model that would train, untrained, and the record results.json would start
    with; nothing is trained (no history, no checkpoints)."""
    proc = _run("train_cifar.py", ["--method=synflow", "--params=0.1", "--verbose=0", "--export_init",
                                   f"--model_dir={tmp_path}", *_SHORT], mock_examples=64)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert "trained nothing" in proc.stdout and "Epoch" not in proc.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["init.json", "init_model.keras"]
    record = json.loads((tmp_path / "init.json").read_text())
    model = keras.saving.load_model(tmp_path / "init_model.keras", compile=False)
    kernels = [w.numpy() for w in model.weights if w.trainable and len(w.shape) >= 2]
    kept = sum(int(np.count_nonzero(k)) for k in kernels)
    assert kept / sum(k.size for k in kernels) == pytest.approx(0.1, abs=1e-4)  # masks applied already
    assert record["params"] == model.count_params() - sum(k.size for k in kernels) + kept
    assert [record[key] for key in ("method", "epochs", "seed", "normalize")] == ["synflow", 2, 0, True]
    assert "--export_init" in record["command"] and "final_accuracy" not in record


@pytest.mark.slow
def test_imagenet_resnet18_on_mock_data(tmp_path):
    results, _ = _train(
        tmp_path,
        "train_imagenet.py",
        ["--model=resnet18", "--method=precrop_flops", "--flops=0.5", "--epochs=1", "--batch_size=4"],
        mock_examples=8,
    )
    _check_results(results, epochs=1)
    assert results["recipe"] == "imagenet_resnet"
    assert results["macs"] <= 0.5 * results["original_macs"]
    assert results["history"][0]["learning_rate"] == pytest.approx(0.2 * 4 / 512)


@pytest.fixture(scope="module")
def common():
    """examples/_common.py imported here, its flags defined once in this process."""
    from absl import flags

    sys.path.insert(0, str(REPO / "examples"))
    try:
        import _common
    finally:
        sys.path.pop(0)
    _common.define_flags(default_model="resnet20")
    yield _common
    flags.FLAGS.unparse_flags()


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--method=precrop_params"], "--method=precrop_params needs --params"),
        (["--method=synflow", "--params=1.5"], "must be <= 1"),
        (["--method=preconfig"], "needs --params and/or --flops"),
        (["--method=baseline", "--params=0.5"], "drop --params"),
        (["--method=precrop_flops", "--flops=-1"], "--flops must be a positive ratio"),
        (["--method=precrop_flops"], "needs --flops"),
        (["--method=random", "--params=0.5", "--epochs=0"], "--epochs must be a positive integer"),
        (["--method=preconfig", "--flops=1", "--balance=2", "--mode=layerwise"],
         "--balance needs --mode=exact (or no --mode); got --mode=layerwise"),
        (["--method=synflow", "--params=0.1", "--balance=2"], "--balance apply to"),
        (["--method=synflow", "--params=0.1", "--flops=0.5"],
         "--method=synflow keeps --params of the weights whatever their FLOPs; drop --flops"),
        (["--method=random", "--params=0.1", "--flops=0.5", "--granularity=filter"],
         "only --method=random with --densities=synexp takes it"),
    ],
)
def test_inconsistent_flags_are_refused(common, flags, message):
    from absl import app
    from absl.flags import FLAGS

    FLAGS.unparse_flags()
    FLAGS(["train_cifar.py", "--model_dir=/unused", *flags])
    with pytest.raises(app.UsageError, match=re.escape(message)):
        common._check_flags()


def test_consistent_flags_pass(common):
    from absl.flags import FLAGS

    for flags in (
        ["--method=baseline"],
        ["--method=preconfig", "--flops=1.0"],
        ["--method=snip", "--params=0.05"],
        ["--method=precrop_params", "--params=0.1", "--balance=2"],
        ["--method=preconfig", "--flops=1", "--balance=2"],  # mode auto: exact with a balance
        ["--method=random", "--params=0.05", "--flops=0.06", "--densities=synexp"],  # paper's figure 5
    ):
        FLAGS.unparse_flags()
        FLAGS(["train_cifar.py", "--model_dir=/unused", *flags])
        common._check_flags()


def test_synexp_densities_take_the_flops_budget_too(common):
    """--densities=synexp with --flops: the density program's layer densities under both budgets,
    whose masked MACs (each layer's MACs times its density, by the library's profile) meet --flops."""
    from absl.flags import FLAGS

    reference = models.get("resnet20")
    prof = profile(reference)

    def masked_macs(*flops):
        FLAGS.unparse_flags()
        FLAGS(["train_cifar.py", "--model_dir=/unused", "--method=random", "--params=0.05",
               "--densities=synexp", *flops])
        common._check_flags()
        solved = common._random_densities(reference)
        return sum(layer.macs * solved.get(f"{layer.name}/kernel", 1.0) for layer in prof.layers)

    free_macs, macs = masked_macs(), masked_macs("--flops=0.06")
    assert free_macs > 0.1 * prof.total_macs  # the FLOPs budget binds ...
    assert macs <= 0.06 * prof.total_macs * (1 + 1e-6)  # ... and the densities meet it


def test_the_experiments_know_the_scripts_methods(common):
    """experiments/run.py's method lists (the report and sanity checks read them) are the script's."""
    sys.path.insert(0, str(REPO / "experiments"))
    try:
        import run
    finally:
        sys.path.pop(0)
    assert (run.MASKED, run.STRUCTURED) == (common.UNSTRUCTURED, common.STRUCTURED)


@pytest.mark.parametrize(
    "flags, message",
    [(["--method=precrop_params"], "needs --params"), (["--method=magic"], "magic")],
)
def test_script_reports_bad_flags_in_one_line(tmp_path, flags, message):
    proc = _run("train_cifar.py", [*flags, f"--model_dir={tmp_path}"])
    assert proc.returncode != 0
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


# ---------------------------------------------------- the benchmark


@pytest.mark.slow
@pytest.mark.skipif(
    not (TFDS_DIR / "cifar10").is_dir(), reason=f"real CIFAR-10 is not prepared at {TFDS_DIR}"
)
@pytest.mark.parametrize("method", [["--method=baseline"], ["--method=precrop_params", "--params=0.3"]])
def test_resnet20_one_real_cifar_epoch_beats_chance(tmp_path, method):
    results, _ = _train(
        tmp_path,
        "train_cifar.py",
        ["--model=resnet20", *method, "--epochs=1", f"--data_dir={TFDS_DIR}"],
        mock_examples=None,
    )
    _check_results(results, epochs=1)
    assert results["steps_per_epoch"] == 50_000 // 128
    assert results["final_accuracy"] > 0.3  # chance is 0.1


@pytest.mark.slow
def test_cifar_example_trains_masks_under_jax_data_parallel(tmp_path, monkeypatch):
    monkeypatch.setenv("KERAS_BACKEND", "jax")
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    flags = ["--model=resnet20", "--method=synflow", "--params=0.2", "--strategy=mirrored", "--epochs=1"]
    flags.append("--batch_size=32")
    results, stdout = _train(tmp_path, "train_cifar.py", flags)
    assert (results["backend"], results["replicas"]) == ("jax", 2)
    assert len(results["history"]) == 1 and np.isfinite(results["history"][0]["loss"])
    assert results["params_ratio"] < 0.25
    trained = keras.saving.load_model(tmp_path / "last.keras")
    masked = [
        layer for layer in trained.layers
        if isinstance(getattr(layer, "kernel_constraint", None), constraints.MaskConstraint)
    ]
    assert len(masked) == 22  # every conv and the classifier of ResNet-20
    for layer in masked:
        assert np.all(layer.kernel.numpy()[layer.kernel_constraint.mask == 0] == 0), layer.name
