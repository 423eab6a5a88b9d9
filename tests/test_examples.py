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
import keras_precrop as kp  # noqa: E402
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
# An existing file in place of a trained model, for the flag checks (which do not load it).
_INIT = f"--init_model={REPO / 'README.md'}"
# The latency plan that grid keep_weights prunes to.
_PLAN = REPO / "experiments" / "plans" / "resnet20_tf_b64_latency0.5_auto.json"


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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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
    # The script relative to its checkout, the flags as given: no path of this machine but those typed.
    assert record["command"].split()[1:3] == ["examples/train_cifar.py", "--method=synflow"]


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
        (["--method=precrop_params", "--params=0.3", "--keep_weights"],
         "--keep_weights needs --init_model: the trained model whose weights it keeps."),
        (["--method=baseline", "--distill"], "--distill needs --init_model: the trained model whose "
         "weights teach."),
        (["--method=baseline", "--init_model=/no/such.keras"], "--init_model /no/such.keras: no such file."),
        (["--method=synflow", "--params=0.1", _INIT, "--keep_weights"],
         "--keep_weights applies to precrop_params/precrop_flops/preconfig/precrop_plan, not "
         "--method=synflow"),
        (["--method=precrop_params", "--params=0.3", _INIT],
         "--method=precrop_params on --init_model needs --keep_weights: without it the pruned model "
         "starts from fresh weights"),
        (["--method=precrop_params", "--params=0.3", "--importance=l2"],
         "--importance=l2 ranks the channels that --keep_weights keeps; add --keep_weights."),
        (["--method=baseline", _INIT, "--distill", "--export_init"], "--export_init trains nothing"),
        (["--method=baseline", "--learning_rate=0"], "--learning_rate must be positive, got 0.0."),
        (["--method=precrop_params", "--params=0.3", _INIT, "--keep_weights", "--gradual_shrink=0.01"],
         "--gradual_shrink shape(s) gradual pruning; add --gradual_epochs."),
        (["--method=precrop_params", "--params=0.3", _INIT, "--keep_weights", "--gradual_epochs=1",
          "--gradual_shrink=1"], "--gradual_shrink must be in [0, 1), got 1.0."),
        (["--method=precrop_params", "--params=0.3", _INIT, "--keep_weights", "--gradual_rebuild"],
         "--gradual_rebuild shape(s) gradual pruning; add --gradual_epochs."),
        (["--method=precrop_params", "--params=0.3", _INIT, "--keep_weights", "--gradual_epochs=0.5",
          "--gradual_rebuild"], "--gradual_rebuild rebuilds the model after --gradual_epochs=0.5: give "
         "a whole number of epochs, at least 1 and below --epochs."),
        (["--method=precrop_params", "--params=0.3", _INIT, "--keep_weights", "--gradual_epochs=2",
          "--epochs=2", "--gradual_rebuild"], "below --epochs"),
        (["--method=baseline", _INIT, "--distill_alpha=0.1"],
         "--distill_alpha weighs the labels' loss against the teacher's; add --distill."),
        (["--method=baseline", _INIT, "--distill", "--distill_alpha=1.5"],
         "--distill_alpha must be in [0, 1], got 1.5."),
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
        ["--method=precrop_plan", f"--plan_file={_PLAN}", _INIT, "--keep_weights", "--distill",
         "--importance=random", "--learning_rate=0.01"],
        ["--method=precrop_flops", "--flops=0.2734", _INIT, "--keep_weights", "--importance=taylor"],
        ["--method=magnitude", "--params=0.1", _INIT, "--distill"],  # masks of the trained weights
        ["--method=baseline", _INIT],  # trains the trained model on
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


def test_init_model_must_be_the_models_architecture(common, tmp_path):
    from absl import app
    from absl.flags import FLAGS

    other = tmp_path / "resnet20_100.keras"
    models.get("resnet20", num_classes=100).save(other)
    (tmp_path / "junk.keras").write_text("not a model")
    FLAGS.unparse_flags()
    FLAGS(["train_cifar.py", "--model_dir=/unused", "--method=baseline", f"--init_model={other}"])
    with pytest.raises(app.UsageError, match=re.escape(
            f"--init_model {other} is not a resnet20 of this dataset: its layer 74 (classifier) is a Dense "
            "with weights [(64, 100), (100,)], --model resnet20's a Dense with [(64, 10), (10,)]. Give the "
            "--model it was trained as.")):
        common._init_model(models.get("resnet20"))
    FLAGS.unparse_flags()
    FLAGS(["train_cifar.py", "--model_dir=/unused", "--method=baseline",
           f"--init_model={tmp_path / 'junk.keras'}"])
    with pytest.raises(app.UsageError, match=re.escape(f"--init_model {tmp_path / 'junk.keras'} is not a "
                                                       "Keras model")):
        common._init_model(models.get("resnet20"))


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    """A ResNet-20 saved as .keras: the trained model of the --init_model runs (its weights are
    seeded, not trained: what is checked is where they go)."""
    keras.utils.set_random_seed(7)
    path = tmp_path_factory.mktemp("teacher") / "final_model.keras"
    models.get("resnet20").save(path)
    return path


@pytest.mark.slow
def test_cifar_keep_weights_prunes_the_init_model_as_the_library_does(tmp_path, teacher):
    """--keep_weights at a plan file: the model to train is apply_plan(weights="keep") of the
    --init_model, weight for weight (--export_init writes it untrained)."""
    flags = ["--method=precrop_plan", f"--plan_file={_PLAN}", f"--init_model={teacher}", "--keep_weights",
             "--export_init", "--verbose=0", f"--model_dir={tmp_path}", *_SHORT]
    proc = _run("train_cifar.py", flags, mock_examples=64)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    record = json.loads((tmp_path / "init.json").read_text())
    assert (record["init_model"], record["keep_weights"], record["importance"], record["distill"]) == (
        str(teacher), True, "l1", None)
    assert 0 <= record["pruned_accuracy"] <= 1 and "Test accuracy before training" in proc.stdout
    pruned = keras.saving.load_model(tmp_path / "init_model.keras", compile=False)
    expected = kp.apply_plan(keras.saving.load_model(teacher, compile=False), kp.Plan.from_json(str(_PLAN)),
                             weights="keep")
    assert record["params"] == pruned.count_params() == expected.count_params()
    for got, want in zip(pruned.get_weights(), expected.get_weights()):
        np.testing.assert_array_equal(got, want)


@pytest.mark.slow
def test_cifar_distill_fine_tunes_the_student_with_the_recipes_loop(tmp_path, teacher):
    """--distill with taylor importance: the Distiller trains in the script's loop (history per epoch,
    test accuracy every epoch, the recipe's schedule from --learning_rate) and --save_model keeps the
    student alone."""
    results, _ = _train(tmp_path, "train_cifar.py", [
        "--method=precrop_flops", "--flops=0.2734", f"--init_model={teacher}", "--keep_weights",
        "--importance=taylor", "--distill", "--distill_alpha=0.1", "--learning_rate=0.01",
        "--save_model", "--verbose=0", *_SHORT])
    _check_results(results, epochs=2)
    assert results["distill"] == {"temperature": 4.0, "alpha": 0.1}
    assert (results["importance"], results["base_lr"]) == ("taylor", 0.01)
    lr0 = 0.01 * 32 / 128
    assert [row["learning_rate"] for row in results["history"]] == pytest.approx([lr0, lr0 / 2])
    assert "distillation_loss" in results["history"][0] and 0 <= results["pruned_accuracy"] <= 1
    student = keras.saving.load_model(tmp_path / "final_model.keras", compile=False)
    assert not isinstance(student, keras.distillation.Distiller)
    assert student.count_params() == results["params"] and results["macs_ratio"] <= 0.2734


@pytest.mark.slow
@pytest.mark.parametrize("shape", [[], ["--gradual_schedule=final", "--gradual_shrink=0.5"],
                                   ["--importance=taylor"]])
def test_cifar_gradual_prunes_while_training_and_saves_the_rebuilt_model(tmp_path, teacher, shape):
    """--gradual_epochs with --distill: the whole model trains masked (kp.GradualPruning reaches the
    plan after one epoch; cubic, or all at once after fading; ranked by L1 or by Taylor on training
    batches at every update), the record names the method and holds
    the plan's costs, the rebuilt smaller model is saved and scores what the masked model's last
    epoch did (the script checks)."""
    results, stdout = _train(tmp_path, "train_cifar.py", [
        "--method=precrop_plan", f"--plan_file={_PLAN}", f"--init_model={teacher}", "--keep_weights",
        "--gradual_epochs=1", "--gradual_frequency=1", "--distill", "--save_model", "--verbose=2",
        *shape, *_SHORT])
    _check_results(results, epochs=2)
    plan = kp.Plan.from_json(str(_PLAN))
    assert results["prune"] == "gradual" and results["gradual"]["end_step"] == 2
    fading = "--gradual_shrink=0.5" in shape
    assert results["gradual"]["shrink"] == (0.5 if fading else 0.0) and ("fading" in stdout) == fading
    assert results["importance"] == ("taylor" if "--importance=taylor" in shape else "l1")
    assert results["params"] == plan.predicted["params"] and results["macs"] == plan.predicted["macs"]
    small = keras.saving.load_model(tmp_path / "final_model.keras", compile=False)
    assert small.count_params() == plan.predicted["params"]
    assert "Rebuilt" in stdout and "GradualPruning: step 2, 100%" in stdout


@pytest.mark.slow
def test_cifar_gradual_rebuild_trains_the_smaller_model_as_the_masked_one_would(tmp_path, teacher):
    """--gradual_rebuild: after epoch 1 (masks at the plan) the rebuilt smaller model trains epochs
    2-3 in a Distiller, the optimizer's state carried over. Reference: the same run without the flag
    (the masked model trains to the end): the same losses per epoch and the same saved model. Run
    again, it resumes the smaller model from its own backup, trains nothing and saves the same."""
    flags = ["--method=precrop_plan", f"--plan_file={_PLAN}", f"--init_model={teacher}",
             "--keep_weights", "--gradual_epochs=1", "--gradual_frequency=1", "--distill",
             "--save_model", "--verbose=2", "--epochs=3", "--batch_size=32"]
    masked, _ = _train(tmp_path / "masked", "train_cifar.py", flags)
    rebuilt, stdout = _train(tmp_path / "rebuilt", "train_cifar.py", [*flags, "--gradual_rebuild"])
    _check_results(rebuilt, epochs=3)
    assert rebuilt["gradual"]["rebuild"] and not masked["gradual"]["rebuild"] and "Rebuilt" in stdout
    for key in ("loss", "val_loss"):
        assert [row[key] for row in rebuilt["history"]] == pytest.approx(
            [row[key] for row in masked["history"]], rel=1e-3)
    saved = {name: keras.saving.load_model(tmp_path / name / "final_model.keras", compile=False)
             for name in ("masked", "rebuilt")}
    # The untrained teacher's wild logits (losses near 10) amplify the summation order's rounding:
    # epoch 2's losses agree to 1e-6, epoch 3's to 1e-4, the weights to 1e-3 (exact carrying:
    # tests/test_gradual.py). A weight of another channel would be off by its own size.
    for got, want in zip(saved["rebuilt"].get_weights(), saved["masked"].get_weights(), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-2, atol=3e-3)
    again, stdout = _train(tmp_path / "rebuilt", "train_cifar.py", [*flags, "--gradual_rebuild"])
    assert again["history"] == rebuilt["history"] and "Rebuilt" not in stdout
    resumed = keras.saving.load_model(tmp_path / "rebuilt" / "final_model.keras", compile=False)
    for got, want in zip(resumed.get_weights(), saved["rebuilt"].get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    "flags, message",
    [(["--method=precrop_params"], "needs --params"),
     pytest.param(["--method=magic"], "magic", marks=pytest.mark.slow)],
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
