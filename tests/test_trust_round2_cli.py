"""Issue 60, "Trust, round 2": ``prune-trained``, ``kp.hub.apply_plan``, packaging of the bench.

Each test checks a promise against an independent reference: a file's bytes
before and after, an exit status, the type of the returned object, the
models' own predictions, ``git status`` of the repository.
"""

import contextlib
import io
import os
import re
import sys

import keras
import numpy as np
import pytest

import keras_precrop as kp
from keras_precrop import progress
from keras_precrop.cli import main
from tests.test_cli_prune_trained import TFDS_DIR


def _cnn(size=16, norms=("bn", "bn"), name="cnn"):
    """Two 3x3 convolutions (16 channels), each followed by a normalization (``"bn"``: batch,
    ``"ln"``: layer), ``size``-square RGB in, 10 logits out."""
    layers = {"bn": keras.layers.BatchNormalization, "ln": keras.layers.LayerNormalization}
    x = inputs = keras.Input((size, size, 3))
    for i, norm in enumerate(norms, 1):
        x = keras.layers.Conv2D(16, 3, padding="same", use_bias=False, name=f"conv{i}")(x)
        x = keras.layers.ReLU()(layers[norm](name=f"{norm}{i}")(x))
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(10, name="head")(x), name=name)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A BatchNormalization CNN and a LayerNormalization one, saved, and .npz data: ``random`` with
    random labels, ``own`` labelled by the BN model's own predictions (it scores 1.0 there)."""
    folder = tmp_path_factory.mktemp("round2")
    keras.utils.set_random_seed(0)
    model = _cnn()
    model.save(folder / "trained.keras")
    _cnn(norms=("ln", "bn")).save(folder / "ln.keras")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(128, 16, 16, 3)).astype("float32")
    np.savez(folder / "random.npz", x_train=x, y_train=rng.integers(0, 10, 128))
    own = np.argmax(model.predict(x, verbose=0), -1)
    np.savez(folder / "own.npz", x_train=x, y_train=own, x_test=x[:64], y_test=own[:64])
    return {name: str(folder / name) for name in ("trained.keras", "ln.keras", "random.npz", "own.npz")}


def _run(argv):
    """``keras-precrop ARGV`` in this process: ``(exit status, stdout, stderr)``, its output captured
    in memory, as in a log file (no terminal)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exit_:  # argparse's usage errors
            code = exit_.code
    return code, out.getvalue(), err.getvalue()


def _prune(files, data, out, *flags):
    return _run(["prune-trained", files["trained.keras"], "--params", "0.5", "--data", files[data],
                 "--epochs", "1", "--batch_size", "32", "--out", str(out), *flags])


# -- 1. kp.hub.apply_plan of a plan file ---------------------------------------------------------

def test_hub_apply_plan_of_a_plan_file_gives_the_task_a_plan(tmp_path):
    pytest.importorskip("keras_hub")
    from tests.test_keras_hub import TASKS  # noqa: PLC0415  (needs keras_hub)

    task = TASKS["ResNetImageClassifier"][0]()
    plan = kp.plan(kp.hub.backbone_of(task), params=0.5)
    path = tmp_path / "plan.json"
    plan.to_json(str(path))
    for given in (str(path), path):
        new = kp.hub.apply_plan(task, given, weights="keep")
        assert type(new.precrop_plan) is kp.Plan, type(new.precrop_plan)
        assert new.precrop_plan.widths == plan.widths
        assert new.backbone.count_params() == new.precrop_plan.params == plan.params


# -- 2. --out naming the MODEL ---------------------------------------------------------------------

@pytest.mark.parametrize("spelled", ["same", "relative", "symlink", "hardlink"])
@pytest.mark.parametrize("command", ["prune-trained", "precrop"])
def test_out_that_is_the_model_is_refused_with_exit_status_2(files, tmp_path, monkeypatch, spelled,
                                                              command):
    model = tmp_path / "model.keras"
    model.write_bytes(open(files["trained.keras"], "rb").read())
    before = model.read_bytes()
    monkeypatch.chdir(tmp_path)
    out = {"same": str(model), "relative": os.path.join("..", tmp_path.name, "model.keras"),
           "symlink": "link.keras", "hardlink": "hard.keras"}[spelled]
    if spelled == "symlink":
        os.symlink(model, "link.keras")
    elif spelled == "hardlink":
        os.link(model, "hard.keras")
    extra = ["--data", files["own.npz"], "--epochs", "1"] if command == "prune-trained" else []
    code, printed, err = _run([command, str(model), "--params", "0.5", *extra, "--out", out])
    assert code == 2, (code, err)
    assert err.startswith(f"keras-precrop: error: --out {out} is MODEL {model} itself"), err
    assert model.read_bytes() == before and not printed


# -- 3. data the original scores at chance on --------------------------------------------------------

def _accuracy(model_file, data_file):
    arrays = np.load(data_file)
    predicted = np.argmax(keras.models.load_model(model_file).predict(arrays["x_train"], verbose=0), -1)
    return float(np.mean(predicted == arrays["y_train"]))


@pytest.fixture(scope="module")
def at_chance(files, tmp_path_factory):
    """prune-trained on random labels, with --quiet: ``(exit status, stdout, stderr, out file)``."""
    out = tmp_path_factory.mktemp("at_chance") / "small.keras"
    return (*_prune(files, "random.npz", out, "--quiet", "--no-distill", "--gradual_epochs", "0"), out)


def test_a_model_at_chance_on_the_data_is_warned_about(files, at_chance):
    score = _accuracy(files["trained.keras"], files["random.npz"])
    assert score <= 0.15  # the reference: random labels, chance for 10 classes
    code, printed, err, out = at_chance
    assert code == 0 and os.path.exists(out)  # a warning, not a refusal
    assert (f"keras-precrop: warning: the original model scores {score:.4f} on the first examples of "
            f"--data {files['random.npz']}, chance level for its 10 classes (0.1000)") in err, err
    assert "the data likely lacks the preprocessing the model was trained with" in err
    assert "x_train (and x_test) as the model's input, already preprocessed" in err
    assert "y_train (and y_test) as integer class labels" in err


def test_no_warning_where_the_original_scores_well(files, tmp_path):
    assert _accuracy(files["trained.keras"], files["own.npz"]) == 1.0
    code, printed, err = _prune(files, "own.npz", tmp_path / "small.keras", "--gradual_epochs", "0")
    assert code == 0, err
    assert "warning" not in err and "Test accuracy: 1.0000 original" in printed


# -- 7. output for a log: no control characters, --quiet ------------------------------------------

def test_training_output_off_a_terminal_is_plain_lines(at_chance):
    code, printed, err, out = at_chance
    assert re.search(r"^4/4 - \d+s - .*accuracy: [\d.]+", printed, re.M), printed  # 128 / 32 steps
    assert "\r" not in printed + err and "\x1b" not in printed + err and "\b" not in printed


def test_fit_verbose_is_the_bar_on_a_terminal_and_plain_lines_elsewhere(monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.delitem(sys.modules, "ipykernel", raising=False)
    monkeypatch.setattr(sys, "stdout", Terminal())
    assert progress.fit_verbose() == 1
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    assert progress.fit_verbose() == 2


def test_quiet_prints_the_plan_s_totals_without_its_table(files, at_chance):
    code, printed, err, out = at_chance
    plan = kp.plan(keras.models.load_model(files["trained.keras"]), params=0.5)
    assert "conv1 (Conv2D)" not in printed and "| Layer (type)" not in printed
    assert f"Params: {plan.original['params']:,} -> {plan.params:,}" in printed
    code, printed, err = _run(["precrop", files["trained.keras"], "--params", "0.5"])
    assert code == 0 and "conv1 (Conv2D)" in printed  # without --quiet: the changed layers
    code, printed, err = _run(["precrop", files["trained.keras"], "--params", "0.5", "--quiet", "--all"])
    assert code == 2 and "not allowed with argument" in err


# -- 4. a latency budget that is not met ---------------------------------------------------------------

@pytest.fixture(scope="module")
def latency_file(files, tmp_path_factory):
    """A latency model of the BN CNN fitted on a synthetic clock (time = MACs)."""
    model = keras.models.load_model(files["trained.keras"])
    fitted = kp.latency_model(model, batch_size=4, variants=6, refine_rounds=0, verbose=0,
                              timer=lambda models: {k: 1e-9 * kp.profile(m).total_macs + 1e-6
                                                    for k, m in models.items()})
    path = tmp_path_factory.mktemp("latency") / "lm.json"
    fitted.to_json(str(path))
    return str(path)


def _clock_measures(monkeypatch, ratio):
    """Calibration's clock: every plan measures ``ratio`` of the original's time."""
    monkeypatch.setattr(kp.latency, "time_ratio",
                        lambda lm, model, verbose=1, timer=None: lambda candidate: ratio)


def test_a_latency_plan_measured_over_budget_writes_nothing_and_fails(files, latency_file, tmp_path,
                                                                      monkeypatch):
    out, plan_file = tmp_path / "fast.keras", tmp_path / "plan.json"
    argv = ["precrop", files["trained.keras"], "--latency", "0.5", "--latency_model", latency_file,
            "--calibrate", "1", "--out", str(out), "--plan", str(plan_file)]
    _clock_measures(monkeypatch, 0.9)
    code, printed, err = _run(argv)
    assert code == 1, err
    assert "NOT met" in printed and not out.exists() and not plan_file.exists()
    assert err.startswith("keras-precrop: error: --latency 0.5 is not met: the plan measured 90.0% of "
                          "the original's time"), err
    assert "nothing was written" in err and "--calibrate 4" in err and "--latency 0.9" in err
    _clock_measures(monkeypatch, 0.5)  # the same command, measured within the budget
    code, printed, err = _run(argv)
    assert code == 0 and out.exists() and plan_file.exists(), err


def test_prune_trained_refuses_an_unmet_latency_plan_before_training(files, latency_file, tmp_path,
                                                                     monkeypatch):
    plan = kp.plan

    def calibrated(*args, **kwargs):  # prune-trained has no --calibrate: calibrate as it measures
        return plan(*args, **{**kwargs, "latency_model": latency_file, "calibrate": 1})

    monkeypatch.setattr(kp, "plan", calibrated)
    monkeypatch.setattr(kp, "fine_tune", lambda *a, **k: pytest.fail("trained"))
    _clock_measures(monkeypatch, 0.9)
    out = tmp_path / "small.keras"
    code, printed, err = _run(["prune-trained", files["trained.keras"], "--latency", "0.5", "--data",
                               files["own.npz"], "--epochs", "1", "--out", str(out)])
    assert code == 1 and not out.exists()
    assert "keras-precrop: error: --latency 0.5 is not met" in err, err


# -- 5. --ignore on prune-trained ----------------------------------------------------------------------

def test_a_layernorm_model_is_pruned_with_or_without_ignore(files, tmp_path):
    """A cut LayerNormalization trains masked over its kept channels (issue 61), so prune-trained
    cuts it (before: refused, naming --ignore ln1); --ignore ln1 keeps it whole."""
    out = tmp_path / "small.keras"
    argv = ["prune-trained", files["ln.keras"], "--params", "0.5", "--data", files["own.npz"],
            "--epochs", "1", "--batch_size", "64", "--out", str(out)]
    original = keras.models.load_model(files["ln.keras"])
    for ignore, ln_width in (([], None), (["ln1"], 16)):
        code, printed, err = _run([*argv, *(["--ignore", *ignore] if ignore else [])])
        assert code == 0, err
        small = keras.models.load_model(out)
        expected = kp.apply_plan(original, kp.plan(original, params=0.5, ignore=ignore))
        assert small.count_params() == expected.count_params() < original.count_params()
        width = small.get_layer("ln1").weights[0].shape[0]
        assert width == ln_width if ln_width else width < 16  # kept whole, or cut
        assert small.get_layer("conv2").filters < 16


# -- 6. --split: a slice of CIFAR-10 --------------------------------------------------------------------

@pytest.mark.parametrize("flags,message", [
    (["--data", "{own}", "--split", "train[:10%]"], "--split train[:10%] has no effect with --data {own}"),
    (["--data", "cifar10", "--split", "test[:10%]"], "--split test[:10%]: train on a part of CIFAR-10's "
     "train split"),
])
def test_split_is_refused_where_it_means_nothing(files, flags, message):
    flags = [f.format(own=files["own.npz"]) for f in flags]
    code, printed, err = _run(["prune-trained", files["trained.keras"], "--params", "0.5", *flags,
                               "--epochs", "1", "--out", "small.keras"])
    assert code == 1 and err.startswith("keras-precrop: error: " + message.format(own=files["own.npz"]))


@pytest.mark.slow
@pytest.mark.skipif(not (TFDS_DIR / "cifar10").is_dir(), reason=f"no CIFAR-10 prepared at {TFDS_DIR}")
def test_split_trains_on_that_slice_of_cifar10(tmp_path, monkeypatch):
    """``--split train[:300]`` at batch 100: 3 training batches an epoch (50,000 images: 500). Slow
    (40 s here) for the test split's 10,000 images, read three times."""
    keras.utils.set_random_seed(0)
    _cnn(size=32).save(tmp_path / "trained.keras")
    batches, fine_tune = [], kp.fine_tune

    def spy(student, train, **kwargs):
        batches.append(len(train))
        return fine_tune(student, train, **kwargs)

    monkeypatch.setattr(kp, "fine_tune", spy)
    code, printed, err = _run(["prune-trained", str(tmp_path / "trained.keras"), "--params", "0.5",
                               "--data", "cifar10", "--data_dir", str(TFDS_DIR), "--split", "train[:300]",
                               "--epochs", "1", "--batch_size", "100", "--gradual_epochs", "0",
                               "--no-distill", "--out", str(tmp_path / "small.keras")])
    assert code == 0, err
    assert batches == [300 // 100]
    assert re.search(r"Test accuracy: [\d.]+ original, [\d.]+ pruned", printed)



def test_prune_trained_under_a_parameter_budget_takes_a_model_of_open_input_size(tmp_path, capsys):
    """Parameters do not depend on the input size: a model built on (None, None, 3) prunes to
    --params, is saved with Keras' count of the plan's parameters, and the report says why it
    gives no MACs (it raised 'MACs depend on spatial size' after the whole training)."""
    import keras
    import numpy as np

    import keras_precrop as kp
    from keras_precrop.cli import main

    keras.utils.set_random_seed(0)
    x = inputs = keras.Input((None, None, 3))
    for i in (1, 2):
        x = keras.layers.Conv2D(16, 3, padding="same", name=f"conv{i}")(x)
        x = keras.layers.ReLU()(keras.layers.BatchNormalization(name=f"bn{i}")(x))
    x = keras.layers.GlobalAveragePooling2D()(x)
    model = keras.Model(inputs, keras.layers.Dense(10, name="head")(x))
    model.save(tmp_path / "open.keras")
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "data.npz", x_train=rng.normal(size=(64, 16, 16, 3)).astype("float32"),
             y_train=rng.integers(0, 10, 64))
    out = tmp_path / "small.keras"
    assert main(["prune-trained", str(tmp_path / "open.keras"), "--params", "0.5", "--data",
                 str(tmp_path / "data.npz"), "--epochs", "1", "--batch_size", "32", "--out",
                 str(out)]) == 0
    printed = capsys.readouterr().out
    small = keras.models.load_model(out)
    assert small.count_params() <= 0.5 * model.count_params()
    assert small.count_params() == kp.plan(model, params=0.5).params
    assert small(np.zeros((1, 24, 24, 3), "float32")).shape == (1, 10)  # still any input size
    assert f"{small.count_params():,} params" in printed
    assert "MACs depend on the input size, which the model leaves open" in printed
