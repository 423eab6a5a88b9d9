"""User data checked against the model before any of it reaches Keras (issue 42).

``data=`` of Taylor importance and ``fine_tune``'s ``train_data=`` /
``validation_data=`` that do not fit the model are refused with a
``DataError`` whose message starts with the user's argument and says what
was expected; data that fits goes through whole (a generator's first batch,
read by the check, is not lost: the model it gives equals the model a list of
the same batches gives).
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_precrop as kp
from keras_precrop.errors import DataError
from keras_precrop.training._user_data import array_batches, check_data, outputs_probabilities

L = keras.layers
RNG = np.random.default_rng(0)
X = RNG.normal(size=(16, 8, 8, 3)).astype("float32")
Y = RNG.integers(0, 4, 16)


def _cnn():
    keras.utils.set_random_seed(0)
    x = keras.Input((8, 8, 3))
    h = L.Conv2D(8, 3, padding="same", activation="relu", name="c1")(x)
    h = L.Conv2D(8, 3, padding="same", activation="relu", name="c2")(h)
    return keras.Model(x, L.Dense(4, name="fc")(L.GlobalAveragePooling2D()(h)))


class _Endless(keras.utils.PyDataset):
    """A PyDataset without a length: infinite to Keras (``num_batches`` None)."""

    num_batches = None

    def __getitem__(self, i):
        return X[:4], Y[:4]


class _Unsized(keras.utils.PyDataset):
    """A PyDataset with neither a length nor ``num_batches``, which Keras cannot read."""

    def __getitem__(self, i):
        return X[:4], Y[:4]


def _dataset(x, y):
    return tf.data.Dataset.from_tensor_slices((x, y))


BAD_TAYLOR_DATA = {
    "image size": ((X[:, :6, :6], Y), r"data= has inputs of shape \(16, 6, 6, 3\) .*"
                   r"takes inputs of shape \(None, 8, 8, 3\): every example must be \(8, 8, 3\)"),
    "channels": ((X[..., :1], Y), r"data= has inputs of shape \(16, 8, 8, 1\)"),
    "string inputs": ((X.astype(str), Y), r"data= has inputs of dtype <U.*takes numbers"),
    "string labels": ((X, Y.astype(str)), r"data= has labels of dtype <U"),
    "labels out of range": ((X, Y + 4), r"data= has label [4-7]; model 'functional.*' has 4 "
                            r"outputs, so labels are class indices 0 to 3"),
    "negative labels": ((X, Y - 4), r"data= has label -[1-4]"),
    "fractional labels": ((X, Y + 0.5), r"data= has label [0-3]\.5"),
    "one-hot of another width": ((X, np.eye(5)[Y]), r"data= has labels of shape \(16, 5\) .* "
                                 r"one-hot rows of width 4"),
    "NaN inputs": ((np.where(X > 2, np.nan, X), Y), r"data= has NaN or infinite inputs"),
    "infinite labels": ((X, np.where(Y > 2, np.inf, Y)), r"data= has NaN or infinite labels"),
    "fewer labels": ((X, Y[:10]), r"data= has 16 inputs but 10 labels"),
    "no examples": ((X[:0], Y[:0]), r"data= is empty"),
    "empty generator": ((b for b in []), r"data= is empty: it yielded no batch"),
    "inputs alone": (_dataset(X, Y).map(lambda x, y: x).batch(4), r"data= must give \(x, y\) batches"),
    "dict examples": (tf.data.Dataset.from_tensor_slices({"image": X, "label": Y}).batch(4),
                      r"data= must give \(x, y\) batches.*a dict"),
    "unbatched": (_dataset(X, Y), r"data= gives single examples of shape \(8, 8, 3\), not batches"
                  r".*dataset\.batch\(32\)"),
    "infinite dataset": (_dataset(X, Y).batch(4).repeat(), r"data= is an infinite tf\.data\.Dataset"
                         r".*Pass a finite one, e\.g\. dataset\.take\(8\)"),
    "infinite PyDataset": (_Endless(), r"data= is an infinite PyDataset"),
    "PyDataset without a length": (_Unsized(), r"data= is a PyDataset with neither __len__ nor "
                                   r"num_batches"),
    "not data": (3, r"data= must be \(x, y\) arrays.*got a int"),
    "one example": ((X[0], Y[0]), r"data= gives single examples of shape \(8, 8, 3\).*x\[None\]"),
    "nested lists": ((X.tolist(), Y), r"data= has inputs as a Python list of lists.*np\.asarray"),
}


@pytest.mark.parametrize("case", sorted(BAD_TAYLOR_DATA))
def test_taylor_importance_refuses_data_that_does_not_fit_the_model_naming_data(case):
    data, message = BAD_TAYLOR_DATA[case]
    model = _cnn()
    before = [np.asarray(w) for w in model.weights]
    with pytest.raises(DataError, match=message) as err:
        kp.precrop(model, params=0.5, weights="keep", importance="taylor", data=data)
    assert str(err.value).startswith("data= ") and err.value.argument == "data"
    assert isinstance(err.value, kp.ArgumentError)
    plan = kp.plan(model, params=0.5)  # apply_plan, called alone, checks the same way
    with pytest.raises(DataError, match=message):
        kp.apply_plan(model, plan, weights="keep", importance="taylor", data=data)
    for w, b in zip(model.weights, before):
        np.testing.assert_array_equal(np.asarray(w), b)


def test_bfloat16_inputs_and_a_numpy_bool_refit_are_taken():
    """bfloat16 (ml_dtypes, no NumPy number) inputs to a bfloat16 model, and refit=np.True_."""
    model = keras.Sequential([keras.Input((16,), dtype="bfloat16"),
                              keras.layers.Dense(32, activation="relu", dtype="bfloat16"),
                              keras.layers.Dense(4, dtype="bfloat16")])
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = np.random.default_rng(0).normal(size=(256, 16)).astype(ml_dtypes.bfloat16)
    small = kp.precrop(model, params=0.5, weights="keep", data=(x, np.arange(256) % 4),
                       refit=np.True_, verbose=0)
    assert small.count_params() == small.precrop_plan.params
    one_hot = np.eye(4, dtype=ml_dtypes.bfloat16)[np.arange(256) % 4]  # bfloat16 labels too
    assert check_data(model, (x, one_hot), "data").labels == "one-hot"


def test_data_that_fits_goes_through_whole_in_every_form():
    """A generator's first batch, read by the check, still counts: each form of the same four
    batches ranks the channels as the list of them does, so the kept weights are equal."""
    model = _cnn()
    batches = [(X[i:i + 4], Y[i:i + 4]) for i in range(0, 16, 4)]
    reference = kp.precrop(model, params=0.5, weights="keep", importance="taylor", data=batches)
    forms = {"generator": (b for b in batches), "tf.data": _dataset(X, Y).batch(4),
             "one-hot": [(x, np.eye(4)[y]) for x, y in batches],
             "float labels": [(x, y.astype("float32")) for x, y in batches]}
    for form, data in forms.items():
        small = kp.precrop(model, params=0.5, weights="keep", importance="taylor", data=data)
        for a, b in zip(small.weights, reference.weights):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6,
                                       err_msg=form)


def test_check_data_tells_the_labels_apart_and_gives_a_generator_back_whole():
    model = _cnn()
    assert check_data(model, (X, Y), "data").labels == "sparse"
    assert check_data(model, (X, Y[:, None]), "data").labels == "sparse"
    assert check_data(model, (X, np.eye(4)[Y]), "data").labels == "one-hot"
    assert check_data(model, (X, Y + 10), "data", classes=False).labels is None  # a loss of one's own
    assert check_data(model, X, "data", labels=False).labels is None
    batches = [(X[i:i + 4], Y[i:i + 4]) for i in range(0, 16, 4)]
    checked = check_data(model, iter(batches), "data")
    again = list(checked.data)
    assert len(again) == 4 and all(a[0] is b[0] for a, b in zip(again, batches))
    np.testing.assert_array_equal(checked.inputs, X[:4])
    infinite = _dataset(X, Y).batch(4).repeat()
    assert check_data(model, infinite, "train_data", bound=("steps_per_epoch", 3)).data is infinite
    with pytest.raises(DataError, match=r"^train_data= is an infinite .*pass steps_per_epoch="):
        check_data(model, infinite, "train_data", bound=("steps_per_epoch", None))


class _Classifier(keras.Model):
    """A subclassed model: no symbolic inputs or outputs to read shapes from."""

    def __init__(self, softmax):
        super().__init__()
        self.dense, self.softmax = L.Dense(3), softmax

    def call(self, x):
        y = self.dense(x)
        return keras.ops.softmax(y) if self.softmax else y


def test_a_subclassed_model_is_checked_by_running_it():
    model = _Classifier(softmax=False)
    x = RNG.normal(size=(6, 5)).astype("float32")
    assert check_data(model, (x, np.arange(6) % 3), "data").labels == "sparse"
    with pytest.raises(DataError, match=r"^data= has label 3; model .* has 3 outputs"):
        check_data(model, (x, np.arange(6) % 4), "data")
    with pytest.raises(DataError, match=r"^data= has inputs of shape \(6, 4\) that model .* cannot "
                                        r"run on"):
        check_data(model, (x[:, :4], np.arange(6) % 3), "data")


def test_a_softmax_output_is_told_from_logits():
    x = keras.Input((4,))
    dense = L.Dense(3)
    assert not outputs_probabilities(keras.Model(x, dense(x)))
    assert outputs_probabilities(keras.Model(x, L.Dense(3, activation="softmax")(x)))
    assert outputs_probabilities(keras.Model(x, L.Softmax()(dense(x))))
    assert outputs_probabilities(keras.Model(x, keras.ops.softmax(dense(x))))
    inner = keras.Sequential([L.Dense(3), L.Activation("softmax")])
    assert outputs_probabilities(keras.Model(x, inner(x)))  # through a nested model
    assert not outputs_probabilities(keras.Model(x, L.Activation("log_softmax")(dense(x))))
    sample = RNG.normal(size=(4, 5)).astype("float32")
    assert outputs_probabilities(_Classifier(softmax=True), sample)
    assert not outputs_probabilities(_Classifier(softmax=False), sample)


def test_fine_tune_names_its_own_data_arguments():
    model = _cnn()
    with pytest.raises(DataError, match=r"^train_data= has inputs of shape \(16, 6, 6, 3\)"):
        kp.fine_tune(model, (X[:, :6, :6], Y), verbose=0)
    with pytest.raises(DataError, match=r"^validation_data= has label [4-7]"):
        kp.fine_tune(model, (X, Y), validation_data=(X, Y + 4), verbose=0)
    with pytest.raises(DataError, match=r"^train_data= is an infinite tf\.data\.Dataset: pass "
                                        r"steps_per_epoch="):
        kp.fine_tune(model, _dataset(X, Y).batch(4).repeat(), verbose=0)
    with pytest.raises(DataError, match=r"^train_data= must give \(x, y\) batches"):
        kp.fine_tune(model, X, verbose=0)  # labels are needed unless distilling with alpha=0


@pytest.mark.parametrize("batch_size, limit, sizes", [(5, None, [5, 5, 5, 1]), (5, 8, [5, 5]),
                                                      (16, 4, [16]), (4, 100, [4, 4, 4, 4])])
def test_array_batches_cut_rows_in_order_without_copies(batch_size, limit, sizes):
    """Arrays are read in batches that start below ``limit``, rows in order, (x, y) kept paired."""
    batches = array_batches((X, Y), batch_size, limit=limit)
    assert [len(x) for x, _ in batches] == [len(y) for _, y in batches] == sizes
    rows = sum(sizes)
    np.testing.assert_array_equal(np.concatenate([x for x, _ in batches]), X[:rows])
    np.testing.assert_array_equal(np.concatenate([y for _, y in batches]), Y[:rows])
    assert all(np.shares_memory(x, X) for x, _ in batches)  # views: a list read at every update
    nested = array_batches({"a": X, "b": Y}, 8)
    assert [sorted(b) for b in nested] == [["a", "b"]] * 2
    np.testing.assert_array_equal(nested[1]["b"], Y[8:])


def _two_inputs():
    keras.utils.set_random_seed(0)
    a, b = keras.Input((6,), name="a"), keras.Input((4,), name="b")
    h = L.Dense(16, activation="relu", name="h")(L.Concatenate()([a, b]))
    return keras.Model([a, b], L.Dense(3, name="out")(h))


@pytest.mark.parametrize("importance", ["taylor", "activation"])
def test_several_inputs_as_a_list_a_tuple_or_a_dict_rank_alike(importance):
    """A two-input model's batches: x as a list, a tuple (Keras' forms) or a dict by input name,
    whole or batched, rank the channels alike (before: the dict refused, the tuple misread)."""
    model = _two_inputs()
    xa, xb = RNG.normal(size=(32, 6)).astype("float32"), RNG.normal(size=(32, 4)).astype("float32")
    y = RNG.integers(0, 3, 32)
    forms = [([xa, xb], y), ((xa, xb), y), ({"a": xa, "b": xb}, y), [({"a": xa, "b": xb}, y)]]
    if importance == "activation":  # reads no labels: inputs alone serve
        forms += [{"a": xa, "b": xb}, [{"a": xa, "b": xb}]]
    kept = [kp.precrop(model, params=0.5, weights="keep", importance=importance, data=data)
            .get_weights() for data in forms]
    for weights in kept[1:]:
        for a, b in zip(weights, kept[0]):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    with pytest.raises(DataError, match=r"data= gives one array of inputs a batch, but model "
                                        r"'functional.*' takes 2 \(\['a', 'b'\]\): give .* a dict"):
        kp.precrop(model, params=0.5, weights="keep", importance=importance, data=[[xa, xb]])
