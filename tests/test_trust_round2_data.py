"""Trust, round 2 (issue 60): ``kp.fine_tune`` and the user data it trains on.

References: the weights before a refused call (nothing trained); the bad
examples found here by NumPy; the weights the same call with Python numbers,
or with labels as an array, ends at; batches counted by a callback of the
test's own; Keras' own warnings; the exit status and the one error line of
``keras-precrop prune-trained``.
"""

import math
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_precrop as kp
from keras_precrop.cli import main
from keras_precrop.errors import DataError, LossNotFiniteError, is_integer, is_number
from tests.conftest import small_classifier

RNG = np.random.default_rng(0)
X = RNG.normal(size=(96, 8, 8, 3)).astype("float32")
Y = RNG.integers(0, 3, 96)


def _weights(model):
    return [keras.ops.convert_to_numpy(w).copy() for w in model.weights]


def _assert_same(got, want, **tolerance):
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, **(tolerance or {"rtol": 0, "atol": 0}))


def _bad_examples(x):
    """NumPy's own reading: the examples holding a NaN or an infinity."""
    return np.flatnonzero(~np.isfinite(x.reshape(len(x), -1)).all(axis=1))


# -- 1. every example of arrays is checked; a loss that turns NaN stops training ------------------

def test_a_nan_past_the_first_batch_of_arrays_is_refused_naming_its_first_example_and_count():
    x = X.copy()
    x[40, 1, 2, 0], x[70, 0, 0, 1] = np.nan, np.inf  # batches 3 and 5 of 16
    bad = _bad_examples(x)
    model = small_classifier()
    before = _weights(model)
    with pytest.raises(DataError, match=rf"^train_data= has NaN or infinite inputs in {len(bad)} of "
                                        rf"its 96 examples, the first at index {bad[0]}:") as err:
        kp.fine_tune(model, (x, Y), batch_size=16, verbose=0)
    assert err.value.argument == "train_data"
    with pytest.raises(DataError, match=rf"^validation_data= has NaN or infinite inputs in {len(bad)} "
                                        rf"of its 96 examples, the first at index {bad[0]}:"):
        kp.fine_tune(model, (X, Y), validation_data=(x, Y), batch_size=16, verbose=0)
    labels = Y.copy()
    labels[50] = 3  # past the first batch: a class the model does not have
    with pytest.raises(DataError, match=r"^train_data= has label 3; model .* has 3 outputs"):
        kp.fine_tune(model, (X, labels), batch_size=16, verbose=0)
    _assert_same(_weights(model), before)


@pytest.mark.parametrize("teacher", [False, True])
def test_a_loss_that_turns_nan_stops_training_naming_the_epoch_and_the_batch(teacher):
    """A dataset is checked on its first batch; a NaN in its third batch is caught as training
    reaches it, not returned as NaN weights."""
    x = X.copy()
    x[2 * 16 + 5, 3, 3, 2] = np.nan  # batch 3 of 16 examples
    data = tf.data.Dataset.from_tensor_slices((x, Y)).batch(16)
    extra = {"teacher": small_classifier(seed=1)} if teacher else {}
    with pytest.raises(LossNotFiniteError, match=r"^train_data= gave a loss of nan in epoch 1, by "
                                                 r"batch 3: training stopped") as err:
        kp.fine_tune(small_classifier(), data, epochs=2, verbose=0, **extra)
    assert isinstance(err.value, DataError) and err.value.argument == "train_data"


# -- 2. numbers as Keras takes them ----------------------------------------------------------------

def test_numpy_scalars_are_numbers_and_train_as_python_numbers_do():
    data = tf.data.Dataset.from_tensor_slices((X, Y)).batch(16)  # one order: no shuffle to match
    kw = {"epochs": 2, "learning_rate": 0.05, "weight_decay": 1e-3, "steps_per_epoch": 3,
          "initial_epoch": 0, "distill_temperature": 2.0, "alpha": 0.25}
    models = []
    for convert in (lambda v: v, lambda v: np.float32(v) if isinstance(v, float) else np.int64(v)):
        model = small_classifier()
        kp.fine_tune(model, data, teacher=small_classifier(seed=1), verbose=0,
                     **{k: convert(v) for k, v in kw.items()})
        models.append(_weights(model))
    _assert_same(models[1], models[0], rtol=1e-5, atol=1e-6)  # np.float32(0.05) is not 0.05
    assert is_number(np.float32(0.01)) and is_integer(np.int64(3)) and not is_integer(np.float32(3))


@pytest.mark.parametrize("name, value", [("epochs", True), ("learning_rate", True),
                                         ("weight_decay", np.True_), ("batch_size", np.True_),
                                         ("alpha", True)])
def test_bools_are_still_no_numbers(name, value):
    with pytest.raises(kp.ArgumentError, match=f"^{name}[= ]") as err:
        kp.fine_tune(small_classifier(), (X, Y), verbose=0, **{name: value})
    assert err.value.argument == name
    assert not is_number(True) and not is_number(np.True_) and not is_integer(False)


# -- 3. callbacks as fit takes them ------------------------------------------------------------------

class _Batches(keras.callbacks.Callback):
    """Counts the training batches it is called for."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def on_train_batch_end(self, batch, logs=None):
        self.count += 1


def test_callbacks_may_be_none_or_one_callback():
    counter = _Batches()
    kp.fine_tune(small_classifier(), (X, Y), epochs=2, batch_size=32, callbacks=counter, verbose=0)
    assert counter.count == 2 * math.ceil(len(X) / 32)
    history = kp.fine_tune(small_classifier(), (X, Y), epochs=2, callbacks=None, verbose=0)
    assert len(history.history["loss"]) == 2
    with pytest.raises(kp.ArgumentError, match=r"^callbacks must be a keras\.callbacks\.Callback, "
                                               r"a list of them, or None, got 'early'") as err:
        kp.fine_tune(small_classifier(), (X, Y), callbacks="early", verbose=0)
    assert err.value.argument == "callbacks"


# -- 4. and 7. optimizer_from= refused in the caller's words -----------------------------------------

def _pruned(compile_with=None):
    """A GradualPruning fitted to its end (by fine_tune, or by fit with ``compile_with``) and the
    model its finalize() returns."""
    model = small_classifier()
    pruning = kp.GradualPruning(kp.plan(model, params=0.5), end_step=2, frequency=1, verbose=0)
    if compile_with is None:
        kp.fine_tune(model, (X[:32], Y[:32]), batch_size=16, callbacks=[pruning], verbose=0)
    else:
        model.compile(compile_with, keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(X[:32], Y[:32], batch_size=16, callbacks=[pruning], verbose=0)
    return pruning, pruning.finalize()


def test_optimizer_from_names_student_and_optimizer_from_not_a_distiller():
    pruning, small = _pruned()
    other = keras.models.clone_model(small)  # not the model finalize() returned
    teacher = small_classifier(seed=1)
    for student, source in ((other, pruning), (small, kp.GradualPruning(pruning.plan, end_step=2))):
        with pytest.raises(kp.ArgumentError, match=r"^student= must be the model that "
                                                   r"optimizer_from\.finalize\(\) returned") as err:
            kp.fine_tune(student, (X, Y), teacher=teacher, optimizer_from=source, verbose=0)
        assert "Distiller" not in str(err.value) and err.value.argument == "student"


def test_an_optimizer_of_another_class_is_named_as_the_caller_chose_it():
    pruning, small = _pruned(keras.optimizers.SGD(0.01, momentum=0.9))
    with pytest.raises(kp.ArgumentError, match=r"^optimizer_from= fitted the masked model with SGD, "
                                               r"and fine_tune trains with SGDWithL2"):
        kp.fine_tune(small, (X, Y), optimizer_from=pruning, verbose=0)
    small.compile(keras.optimizers.Adam(), "mse")
    with pytest.raises(kp.ArgumentError) as err:
        pruning.carry_optimizer(small)
    assert str(err.value) == ("optimizer='Adam' cannot take the state of the SGD that fitted the "
                              "masked model: only an optimizer of the same class can. Compile the "
                              "model with SGD.")


# -- 5. labels as a list; x and y of different lengths ------------------------------------------------

def test_labels_as_a_python_list_train_as_the_array_does():
    trained = []
    for labels in (Y, Y.tolist()):
        model = small_classifier()
        keras.utils.set_random_seed(7)  # the same shuffle of the arrays
        kp.fine_tune(model, (X, labels), batch_size=16, verbose=0)
        trained.append(_weights(model))
    _assert_same(trained[1], trained[0])


@pytest.mark.parametrize("labels", [Y[:80], Y[:80].tolist()])
def test_x_and_y_of_different_lengths_are_refused_naming_both(labels):
    with pytest.raises(DataError, match=r"^train_data= has 96 inputs but 80 labels: x holds 96 "
                                        r"examples and y 80"):
        kp.fine_tune(small_classifier(), (X, labels), batch_size=16, verbose=0)


# -- 6. prune-trained --data ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    path = tmp_path_factory.mktemp("trust2") / "trained.keras"
    small_classifier().save(path)
    return str(path)


def _refusal(trained, data, tmp_path, capsys):
    """The one error line of ``prune-trained`` on ``--data data`` (exit status 1)."""
    out_file = tmp_path / "small.keras"
    code = main(["prune-trained", trained, "--params", "0.5", "--data", data, "--epochs", "1",
                 "--batch_size", "16", "--out", str(out_file)])
    out, err = capsys.readouterr()
    assert code == 1 and not out_file.exists() and "Model written" not in out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("keras-precrop: error: "), lines
    return lines[0].removeprefix("keras-precrop: error: ")


def test_prune_trained_refuses_a_nan_past_the_first_batch_naming_the_file(trained, tmp_path, capsys):
    x = X.copy()
    x[60, 0, 0, 0] = np.nan  # batch 4 of 16
    path = str(tmp_path / "nan.npz")
    np.savez(path, x_train=x, y_train=Y)
    assert _refusal(trained, path, tmp_path, capsys).startswith(
        f"--data {path}: x_train, y_train has NaN or infinite inputs in 1 of its 96 examples, the "
        f"first at index {_bad_examples(x)[0]}")


def test_prune_trained_refuses_arrays_of_different_lengths(trained, tmp_path, capsys):
    path = str(tmp_path / "short.npz")
    np.savez(path, x_train=X, y_train=Y[:80])
    assert _refusal(trained, path, tmp_path, capsys).startswith(
        f"--data {path}: x_train, y_train has 96 inputs but 80 labels")


def test_prune_trained_names_an_npy_file_given_as_npz_and_says_what_it_must_hold(trained, tmp_path,
                                                                                   capsys):
    path = str(tmp_path / "one_array.npz")
    with open(path, "wb") as file:
        np.save(file, X[:4, 0, 0])  # np.save's format under an .npz name
    assert _refusal(trained, path, tmp_path, capsys) == (
        f"--data {path} is not a .npz archive of named arrays (it holds one array of shape (4, 3), "
        "as np.save writes): save x_train and y_train (and x_test, y_test for a test accuracy) with "
        f"np.savez({path!r}, x_train=x, y_train=y), the images preprocessed as the model takes "
        "them (scaled and normalized as it was trained).")


# -- 8. no "shuffle=True ... will be ignored" for data that shuffles itself -----------------------

class _Endless(keras.utils.PyDataset):
    """An infinite PyDataset (``num_batches`` None), read for ``steps_per_epoch`` batches."""

    num_batches = None

    def __init__(self):
        super().__init__()

    def __getitem__(self, i):
        return X[:16], Y[:16]


def _pipeline():
    """A ``kp.data`` CIFAR-10 training pipeline (shuffled, augmented) of 32 synthetic images."""
    images = RNG.integers(0, 256, size=(32, 32, 32, 3), dtype=np.uint8)
    examples = tf.data.Dataset.from_tensor_slices({"image": images, "label": RNG.integers(0, 10, 32)})
    return kp.data.make_pipeline(examples, "cifar10", 8, training=True, seed=0)


def _cifar_model():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((32, 32, 3))
    x = keras.layers.GlobalAveragePooling2D()(keras.layers.Conv2D(4, 3)(inputs))
    return keras.Model(inputs, keras.layers.Dense(10)(x))


@pytest.mark.parametrize("form", ["kp.data pipeline", "generator", "infinite PyDataset"])
def test_data_that_shuffles_itself_trains_without_keras_shuffle_warning(form):
    model, steps = (_cifar_model(), None) if form == "kp.data pipeline" else (small_classifier(), 2)
    data = {"kp.data pipeline": _pipeline, "generator": lambda: ((X[i:i + 16], Y[i:i + 16])
                                                                 for i in range(0, 96, 16)),
            "infinite PyDataset": _Endless}[form]()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = kp.fine_tune(model, data, steps_per_epoch=steps, verbose=0)
    assert len(history.history["loss"]) == 1
    assert [str(w.message) for w in caught if "shuffle" in str(w.message)] == []
