"""``keras-precrop prune-trained``: a trained model pruned gradually while it trains (issue 43).

The command is run in-process on a tiny CNN with BatchNormalization and an
.npz of random 16x16 images; its saved model is checked against the library
(``kp.apply_plan`` of the same plan), its printed accuracies against the
models' own predictions. ``fine_tune``'s ``weight_decay=`` and
``callbacks=``, which the command trains with, are checked here too.
"""

import json
import re
from pathlib import Path

import keras
import numpy as np
import pytest

import keras_precrop as kp
from keras_precrop import _cli_flags, _cli_trained
from keras_precrop.cli import main
from tests.conftest import run_python


def _tiny_cnn(width=16):
    """Two 3x3 convolutions with BatchNormalization, 16x16x3 in, 10 logits out."""
    x = inputs = keras.Input((16, 16, 3))
    for i in (1, 2):
        x = keras.layers.Conv2D(width, 3, padding="same", use_bias=False, name=f"conv{i}")(x)
        x = keras.layers.ReLU()(keras.layers.BatchNormalization(name=f"bn{i}")(x))
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(10, name="head")(x))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """``{"model": .keras, "data": .npz with a test split, "train_only": .npz without}``."""
    folder = tmp_path_factory.mktemp("prune_trained")
    keras.utils.set_random_seed(0)
    _tiny_cnn().save(folder / "trained.keras")
    rng = np.random.default_rng(0)
    arrays = {"x_train": rng.normal(size=(256, 16, 16, 3)).astype("float32"),
              "y_train": rng.integers(0, 10, 256),
              "x_test": rng.normal(size=(64, 16, 16, 3)).astype("float32"),
              "y_test": rng.integers(0, 10, 64)}
    np.savez(folder / "data.npz", **arrays)
    np.savez(folder / "train_only.npz", x_train=arrays["x_train"], y_train=arrays["y_train"])
    np.savez(folder / "no_x_train.npz", images=arrays["x_train"], y_train=arrays["y_train"])
    np.savez(folder / "small_images.npz", x_train=arrays["x_train"][:, :8, :8],
             y_train=arrays["y_train"])
    return {name: str(folder / name) for name in ("trained.keras", "data.npz", "train_only.npz",
                                                   "no_x_train.npz", "small_images.npz")}


def _accuracy(model, x, y):
    return float(np.mean(np.argmax(model.predict(x, verbose=0), -1) == y))


def test_the_saved_model_has_the_plan_s_widths_trained_and_its_accuracy_is_printed(files, tmp_path,
                                                                                     capsys, monkeypatch):
    """Pruned over the first of 3 epochs (a third), then the rebuilt model trains epochs 2-3."""
    out, fits, fine_tune = str(tmp_path / "small.keras"), [], kp.fine_tune

    def spy(student, *args, **kwargs):
        fits.append((student.count_params(), kwargs["epochs"], kwargs.get("initial_epoch", 0)))
        return fine_tune(student, *args, **kwargs)

    monkeypatch.setattr(kp, "fine_tune", spy)
    assert main(["prune-trained", files["trained.keras"], "--params", "0.5", "--data",
                 files["data.npz"], "--epochs", "3", "--batch_size", "32", "--out", out]) == 0
    printed = capsys.readouterr().out
    original, small = keras.models.load_model(files["trained.keras"]), keras.models.load_model(out)
    plan = kp.plan(original, params=0.5)
    assert small.count_params() == kp.apply_plan(original, plan).count_params() < 0.5 * \
        original.count_params()
    # Trained: not the one-shot slice of the same widths with the trained weights.
    sliced = kp.apply_plan(original, plan, weights="keep")
    assert [w.shape for w in small.weights] == [w.shape for w in sliced.weights]
    assert not np.allclose(small.get_layer("head").kernel, sliced.get_layer("head").kernel)
    # The accuracies printed are the models' own on the test split.
    test = np.load(files["data.npz"])
    found = re.search(r"Test accuracy: ([\d.]+) original, ([\d.]+) pruned", printed)
    assert found, printed
    assert float(found[1]) == pytest.approx(_accuracy(original, test["x_test"], test["y_test"]),
                                            abs=1e-4)
    assert float(found[2]) == pytest.approx(_accuracy(small, test["x_test"], test["y_test"]), abs=1e-4)
    before, after = kp.profile(original), kp.profile(small)
    assert (f"{after.total_params:,} params ({after.total_params / before.total_params:.1%} of "
            f"{before.total_params:,}), {after.total_macs:,} MACs") in printed
    assert "GradualPruning: step 8, 100% of the way to the plan" in printed  # 24 steps, a third
    # Epoch 1 trained the masked model, epochs 2-3 the rebuilt one (its own fit, from epoch 2).
    assert printed.index("step 8, 100%") < printed.index("Epoch 2/3") < printed.index("Epoch 3/3")
    assert fits == [(original.count_params(), 1, 0), (small.count_params(), 3, 1)]
    assert "distillation_loss" in printed  # distilled from the original by default


def test_a_plan_file_without_distillation_or_test_split(files, tmp_path, capsys):
    plan_file, out = str(tmp_path / "plan.json"), str(tmp_path / "small.keras")
    assert main(["precrop", files["trained.keras"], "--flops", "0.4", "--plan", plan_file]) == 0
    assert main(["prune-trained", files["trained.keras"], "--apply", plan_file, "--no-distill",
                 "--gradual_epochs", "0", "--data", files["train_only.npz"], "--epochs", "1",
                 "--batch_size", "64", "--out", out]) == 0
    printed = capsys.readouterr().out
    original, small = keras.models.load_model(files["trained.keras"]), keras.models.load_model(out)
    plan = kp.Plan.from_json(plan_file)
    assert small.count_params() == kp.apply_plan(original, plan).count_params()
    assert "Test accuracy" not in printed and "distillation_loss" not in printed
    assert "GradualPruning: step 0, 100% of the way to the plan" in printed  # one shot at once


def test_a_latency_budget_prunes_to_the_plan_of_that_latency_model(files, tmp_path, capsys):
    """``--latency 0.5 --latency_model`` (README's command, with a latency model fitted beforehand on
    a synthetic clock, time = MACs): the saved model has the widths ``kp.plan`` gives for that
    budget and model, and that latency model predicts it at most half the original's time."""
    original = keras.models.load_model(files["trained.keras"])
    fitted = kp.latency_model(original, batch_size=4, variants=12, refine_rounds=0, verbose=0,
                              timer=lambda models: {k: 1e-9 * kp.profile(m).total_macs + 1e-6
                                                    for k, m in models.items()})
    lm_file, out = str(tmp_path / "latency.json"), str(tmp_path / "small.keras")
    fitted.to_json(lm_file)
    assert main(["prune-trained", files["trained.keras"], "--latency", "0.5", "--latency_model",
                 lm_file, "--data", files["data.npz"], "--epochs", "2", "--batch_size", "64",
                 "--out", out]) == 0
    small = keras.models.load_model(out)
    expected = kp.apply_plan(original, kp.plan(original, latency=0.5, latency_model=fitted))
    assert [w.shape for w in small.weights] == [w.shape for w in expected.weights]
    assert fitted.predict(small) <= 0.5 * fitted.predict(original) * (1 + 1e-6)
    assert small.count_params() < original.count_params()


def test_shrink_fades_the_doomed_channels_then_cuts_them_at_once(files, tmp_path, capsys):
    """--shrink: the channels the plan leaves out fade (printed as fading) until --gradual_epochs
    ends, then all go at once (schedule 'final'); the saved model has the plan's widths."""
    out = str(tmp_path / "small.keras")
    assert main(["prune-trained", files["trained.keras"], "--params", "0.5", "--shrink", "0.2",
                 "--data", files["data.npz"], "--epochs", "1", "--gradual_epochs", "0.5",
                 "--batch_size", "32", "--out", out]) == 0
    printed = capsys.readouterr().out
    assert re.search(r"GradualPruning: step 0, 0% of the way to the plan, 0 weights masked, "
                     r"[\d,]+ fading", printed), printed
    assert "GradualPruning: step 4, 100% of the way to the plan" in printed  # 8 steps, half
    assert "% of the way to the plan" not in printed.replace(" 0% of", "").replace(" 100% of", "")
    original, small = keras.models.load_model(files["trained.keras"]), keras.models.load_model(out)
    assert small.count_params() == kp.apply_plan(original, kp.plan(original, params=0.5)).count_params()


def test_refit_cuts_at_once_refits_the_projections_and_trains_the_smaller_model(files, tmp_path,
                                                                               capsys, monkeypatch):
    """--refit: the model that trains is ``kp.apply_plan(..., weights="keep", refit=True)`` on the
    first training examples (its head solved by least squares), trained every epoch as it is."""
    out, fits, fine_tune = str(tmp_path / "small.keras"), [], kp.fine_tune

    def spy(student, *args, **kwargs):
        fits.append((student.count_params(), kwargs["epochs"], kwargs.get("initial_epoch", 0),
                     keras.ops.convert_to_numpy(student.get_layer("head").kernel)))
        return fine_tune(student, *args, **kwargs)

    monkeypatch.setattr(kp, "fine_tune", spy)
    assert main(["prune-trained", files["trained.keras"], "--params", "0.5", "--refit", "--data",
                 files["train_only.npz"], "--epochs", "2", "--batch_size", "64", "--out", out]) == 0
    printed = capsys.readouterr().out
    assert "Refitting 1 projections by least squares on 4 batches" in printed
    assert "GradualPruning" not in printed
    original, small = keras.models.load_model(files["trained.keras"]), keras.models.load_model(out)
    arrays = np.load(files["train_only.npz"])
    batches = [(arrays["x_train"][i:i + 64], arrays["y_train"][i:i + 64]) for i in range(0, 256, 64)]
    plan = kp.plan(original, params=0.5)
    refit = kp.apply_plan(original, plan, weights="keep", data=batches, refit=True)
    cut = kp.apply_plan(original, plan, weights="keep")
    assert [f[:3] for f in fits] == [(refit.count_params(), 2, 0)]  # no masked epoch
    np.testing.assert_allclose(fits[0][3], refit.get_layer("head").kernel, rtol=1e-4, atol=1e-6)
    assert not np.allclose(fits[0][3], cut.get_layer("head").kernel, atol=1e-3)
    assert small.count_params() == refit.count_params()
    assert not np.allclose(small.get_layer("head").kernel, fits[0][3])  # then trained


def test_refit_with_no_epoch_saves_the_cut_refit_model_untrained(files, tmp_path, capsys):
    """--refit --epochs 0: the saved model is kp.apply_plan(..., refit=True) on the first training
    examples, weight for weight (no training step), and its test accuracy is printed."""
    out = str(tmp_path / "small.keras")
    assert main(["prune-trained", files["trained.keras"], "--params", "0.5", "--refit", "--data",
                 files["data.npz"], "--epochs", "0", "--batch_size", "64", "--out", out]) == 0
    assert "Test accuracy" in capsys.readouterr().out
    original, small = keras.models.load_model(files["trained.keras"]), keras.models.load_model(out)
    arrays = np.load(files["data.npz"])
    n = len(arrays["x_train"][:256])
    batches = [(arrays["x_train"][i:i + 64], arrays["y_train"][i:i + 64]) for i in range(0, n, 64)]
    refit = kp.apply_plan(original, kp.plan(original, params=0.5), weights="keep", data=batches,
                          refit=True, verbose=0)
    for a, b in zip(small.get_weights(), refit.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("importance", ["taylor", "bn_scale"])
def test_importance_ranks_the_channels_during_training(files, tmp_path, capsys, monkeypatch, importance):
    """--importance reaches kp.GradualPruning; taylor with the first training examples in batches."""
    out, made, gradual_pruning = str(tmp_path / "small.keras"), [], kp.GradualPruning

    def spy(*args, **kwargs):
        made.append(kwargs)
        return gradual_pruning(*args, **kwargs)

    monkeypatch.setattr(kp, "GradualPruning", spy)
    assert main(["prune-trained", files["trained.keras"], "--params", "0.5", "--importance", importance,
                 "--data", files["train_only.npz"], "--epochs", "1", "--batch_size", "64",
                 "--out", out]) == 0
    assert made[0]["importance"] == importance
    if importance == "taylor":
        x = np.load(files["train_only.npz"])["x_train"]
        assert [len(b[0]) for b in made[0]["data"]] == [64] * 4  # the 256 examples
        np.testing.assert_array_equal(np.concatenate([b[0] for b in made[0]["data"]]), x)
    else:
        assert made[0]["data"] is None
    original = keras.models.load_model(files["trained.keras"])
    assert keras.models.load_model(out).count_params() == \
        kp.apply_plan(original, kp.plan(original, params=0.5)).count_params()


def test_the_rankings_offered_are_those_gradual_pruning_takes():
    from keras_precrop import gradual  # noqa: PLC0415  (the command line's module loads no keras)

    assert set(_cli_flags.GRADUAL_IMPORTANCE) == set(gradual.IMPORTANCE)


def _refusal(argv, capsys):
    """The one error line of ``prune-trained ARGV`` (exit status 1), without its prefix."""
    assert main(["prune-trained", *argv]) == 1
    out, err = capsys.readouterr()
    assert "Model written" not in out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("keras-precrop: error: "), lines
    return lines[0].removeprefix("keras-precrop: error: ")


@pytest.mark.parametrize("argv,message", [
    (["{model}.h5"], "MODEL {model}.h5: prune-trained prunes a trained model saved as a .keras file"),
    (["{model}", "--out", "small.h5"], "--out small.h5: a rebuilt model is saved as a .keras file"),
    (["{model}", "--out", "/nonexistent_dir/small.keras"], "--out /nonexistent_dir/small.keras: "
     "cannot write into /nonexistent_dir"),  # before training, not after
    (["{model}", "--apply", "plan.json"], "--params 0.5 has no effect with --apply plan.json: the plan "
     "fixes the widths."),
    (["{model}", "--gradual_epochs", "2"], "--gradual_epochs 2 must be between 0 and --epochs 1"),
    (["{model}", "--epochs", "0"], "--epochs 0 must be a positive integer (0 only with --refit"),
    (["{model}", "--epochs", "-1", "--refit"], "--epochs -1 must be a positive integer"),
    (["{model}", "--epochs", "0", "--refit", "--no-distill"], "--no-distill has no effect with "
     "--epochs 0: nothing trains."),
    (["{model}", "--epochs", "0", "--refit", "--learning_rate", "0.01"], "--learning_rate 0.01 has "
     "no effect with --epochs 0"),
    (["{model}", "--shrink", "1"], "--shrink 1 must be in [0, 1): the share of a doomed channel's"),
    (["{model}", "--shrink", "0.01", "--gradual_epochs", "0"], "--shrink 0.01 has no effect with "
     "--gradual_epochs 0"),
    (["{model}", "--refit", "--gradual_epochs", "0.5"], "--refit has no effect with "
     "--gradual_epochs 0.5: it cuts at once and refits before training"),
    (["{model}", "--refit", "--shrink", "0.01"], "--shrink 0.01 has no effect with --refit"),
    (["{model}", "--learning_rate", "0"], "--learning_rate 0 must be a positive number."),
    (["{model}", "--data", "missing.npz"], "--data missing.npz: No such file or directory"),
    (["{model}", "--data", "data.csv"], "--data data.csv: give cifar10 or a .npz file"),
    (["{model}", "--data", "{no_x_train}"], "--data {no_x_train} has no array x_train (it has: images, "
     "y_train)"),
    (["{model}", "--data", "{small_images}"], "--data {small_images}: x_train, y_train has inputs of "
     "shape"),
    (["{model}", "--data_dir", "tfds"], "--data_dir tfds has no effect with --data {data}"),
    (["{model}", "--data", "{data}"], ""),  # the defaults below, with the budget left out:
])
def test_bad_flags_are_refused_naming_the_flag(argv, message, files, capsys):
    names = {"model": files["trained.keras"], "data": files["data.npz"],
             "no_x_train": files["no_x_train.npz"], "small_images": files["small_images.npz"]}
    argv = [a.format(**names) for a in argv]
    defaults = {"--params": "0.5", "--data": names["data"], "--epochs": "1", "--out": "small.keras"}
    if not message:  # no budget and no plan
        defaults.pop("--params")
        message = "Give the widths to prune to: a budget (--params, --flops or --latency) or --apply"
    given = [flag for flag in argv if flag.startswith("--")]
    argv += [part for flag, value in defaults.items() if flag not in given for part in (flag, value)]
    assert _refusal(argv, capsys).startswith(message.format(**names))


def test_data_that_does_not_fit_is_refused_before_a_plan_is_solved(files, capsys, monkeypatch):
    """Data checked first: a latency budget's plan would be timed (minutes) before the refusal."""
    monkeypatch.setattr(kp, "plan", lambda *a, **k: pytest.fail("planned before the data check"))
    assert main(["prune-trained", files["trained.keras"], "--params", "0.5", "--data",
                 files["small_images.npz"], "--epochs", "1", "--out", "small.keras"]) == 1
    out, err = capsys.readouterr()
    assert f"--data {files['small_images.npz']}: x_train, y_train has inputs of shape" in err


def test_a_plan_of_another_model_is_refused_naming_plan(files, tmp_path, capsys):
    plan_file = str(tmp_path / "plan.json")
    kp.plan(_tiny_cnn(width=12), params=0.5).to_json(plan_file)
    line = _refusal([files["trained.keras"], "--apply", plan_file, "--data", files["data.npz"],
                     "--epochs", "1", "--out", str(tmp_path / "s.keras")], capsys)
    assert line.startswith(f"--apply {plan_file} does not fit {files['trained.keras']}: Width "
                           "variable 'conv1' has 16 channels in model"), line


TFDS_DIR = Path(__file__).resolve().parents[2] / "shared" / "tfds"


@pytest.mark.slow
@pytest.mark.skipif(not (TFDS_DIR / "cifar10").is_dir(), reason=f"no CIFAR-10 prepared at {TFDS_DIR}")
def test_cifar10_is_loaded_from_data_dir_and_checked_against_the_model(files, tmp_path, capsys):
    line = _refusal([files["trained.keras"], "--params", "0.5", "--data", "cifar10", "--data_dir",
                     str(TFDS_DIR), "--epochs", "1", "--out", str(tmp_path / "s.keras")], capsys)
    assert line.startswith("--data cifar10: its train split has inputs of shape (128, 32, 32, 3)"), line


def test_required_flags_are_argparse_usage_errors(files, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["prune-trained", files["trained.keras"], "--params", "0.5", "--epochs", "1",
              "--out", "s.keras"])
    assert exit_.value.code == 2
    assert "the following arguments are required: --data" in capsys.readouterr().err


def test_help_loads_no_heavy_module():
    done = run_python(["-c", (
        "import json, sys\n"
        "import keras_precrop.cli as c\n"
        "try:\n    c.main(['prune-trained', '--help'])\nexcept SystemExit as e:\n    code = e.code\n"
        "heavy = {m.split('.')[0] for m in sys.modules} & {'tensorflow', 'keras', 'jax', 'torch', "
        "'numpy'}\n"
        "print(json.dumps([code, sorted(heavy)]), file=sys.stderr)\n")])
    assert json.loads(done.stderr.strip().splitlines()[-1]) == [0, []], done.stderr[-2000:]
    assert done.stdout.startswith("usage: keras-precrop prune-trained")


def test_the_recipe_is_the_cifar10_recipe_of_the_experiments():
    recipe = kp.train.RECIPES["cifar10"]
    ours = _cli_trained.RECIPE
    assert (ours["learning_rate"], ours["batch_size"], ours["weight_decay"]) \
        == (recipe.base_lr, recipe.batch_size, recipe.weight_decay)


# -- fine_tune's weight_decay= and callbacks=, which prune-trained trains with ----------------------

def _dense_model():
    keras.utils.set_random_seed(1)
    inputs = keras.Input((4,))
    return keras.Model(inputs, keras.layers.Dense(3, name="d")(inputs))


def test_fine_tune_weight_decay_is_coupled_l2_on_kernels_and_callbacks_are_called():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(16, 4)).astype("float32"), rng.integers(0, 3, 16)
    start = _dense_model().get_weights()
    steps = []
    counter = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: steps.append(batch))
    after = {}
    for decay in (0.0, 0.01):
        model = _dense_model()
        model.set_weights(start)
        kp.fine_tune(model, (x, y), learning_rate=0.1, batch_size=16, weight_decay=decay,
                     callbacks=[counter], verbose=0)
        after[decay] = model.get_weights()
    # One step from the same weights: the decay adds 0.01 * w to the kernel's gradient only.
    np.testing.assert_allclose(after[0.01][0] - after[0.0][0], -0.1 * 0.01 * start[0], atol=1e-6)
    np.testing.assert_allclose(after[0.01][1], after[0.0][1], atol=1e-7)
    assert steps == [0, 0]


@pytest.mark.parametrize("bad", [-1e-4, float("nan"), True, "1e-4"])
def test_fine_tune_refuses_a_weight_decay_that_is_no_number_at_least_0(bad):
    with pytest.raises(kp.ArgumentError, match=r"^weight_decay=.* must be a finite number >= 0\."):
        kp.fine_tune(_dense_model(), (np.zeros((4, 4)), np.zeros(4, int)), weight_decay=bad)
