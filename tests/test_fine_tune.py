"""``fine_tune`` trains what it says and leaves the teacher as it was (issue 42).

References: the teacher's ``trainable`` flags (every layer and variable) and
weights read before the call; losses computed here in NumPy from the models'
own outputs before the first step (cross-entropy of probabilities for a
softmax model, the temperature-softened KL divergence of the logits, or of
the log-probabilities of a softmax model); the accuracy of a tiny separable
task before and after.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_precrop as kp

L = keras.layers
RNG = np.random.default_rng(0)
X = RNG.normal(size=(12, 5)).astype("float32")
Y = RNG.integers(0, 3, 12)


def _mlp(softmax, seed=0):
    keras.utils.set_random_seed(seed)
    x = keras.Input((5,))
    h = L.Dense(16, activation="tanh", name="hidden")(x)
    return keras.Model(x, L.Dense(3, activation="softmax" if softmax else None, name="out")(h))


def _flags(model):
    """Every layer's and variable's ``trainable`` flag, by path."""
    layers = model._flatten_layers(include_self=True, recursive=True)
    return ([(layer.name, layer.trainable) for layer in layers]
            + [(v.path, v.trainable) for v in model.weights])


def _teacher():
    keras.utils.set_random_seed(1)
    x = keras.Input((5,))
    h = L.BatchNormalization(name="bn")(L.Dense(8, activation="relu", name="d1")(x))
    block = keras.Sequential([L.Dense(8, name="inner1"), L.Dense(8, name="inner2")], name="block")
    return keras.Model(x, L.Dense(3, name="out")(block(h)))


def test_the_teacher_keeps_its_flags_and_weights_and_does_not_train():
    teacher = _teacher()
    teacher.get_layer("d1").trainable = False
    teacher.get_layer("block").get_layer("inner2").trainable = False
    teacher.get_layer("out").kernel.trainable = False  # a variable frozen alone
    teacher.get_layer("bn").moving_mean.assign(RNG.normal(size=8))  # a training step would move it
    student = keras.models.clone_model(teacher)
    student.trainable = True
    flags, weights = _flags(teacher), [np.asarray(w) for w in teacher.weights]
    before = [np.asarray(w) for w in student.trainable_weights]
    kp.fine_tune(student, (X, Y), teacher=teacher, epochs=2, batch_size=4, verbose=0)
    assert _flags(teacher) == flags
    assert not teacher.get_layer("d1").trainable and teacher.get_layer("bn").trainable
    for w, b in zip(teacher.weights, weights):
        np.testing.assert_array_equal(np.asarray(w), b, err_msg=w.path)
    assert all((np.asarray(w) != b).any() for w, b in zip(student.trainable_weights, before))


def test_a_student_with_nothing_to_train_is_refused_naming_student():
    teacher = _teacher()
    flags = _flags(teacher)
    student = _mlp(softmax=False)
    student.trainable = False
    with pytest.raises(kp.ArgumentError, match=r"^student= has no trainable weights") as err:
        kp.fine_tune(student, (X, Y), teacher=teacher, verbose=0)
    assert err.value.argument == "student"
    student.trainable = True
    for layer in student.layers:  # every layer frozen one by one
        layer.trainable = False
    with pytest.raises(kp.ArgumentError, match=r"^student= has no trainable weights"):
        kp.fine_tune(student, (X, Y), verbose=0)
    assert _flags(teacher) == flags


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "8"])
def test_batch_size_must_be_a_positive_integer(bad):
    student = _mlp(softmax=False)
    message = rf"^batch_size must be a positive integer, got {bad!r}"
    with pytest.raises(kp.ArgumentError, match=message):
        kp.fine_tune(student, (X, Y), batch_size=bad, verbose=0)
    with pytest.raises(kp.ArgumentError, match=rf"^steps_per_epoch must be a positive integer, got "
                                               rf"{bad!r}"):
        kp.fine_tune(student, (X, Y), steps_per_epoch=bad, verbose=0)
    model = keras.Sequential([keras.Input((8, 8, 3)), L.Conv2D(8, 3), L.Conv2D(8, 3)])
    with pytest.raises(kp.ArgumentError, match=message):  # measured or not
        kp.compare(model, params=0.5, batch_size=bad)


def _cross_entropy(p, y):
    return float(np.mean(-np.log(p[np.arange(len(y)), y])))


def _softmax(z):
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


class _Subclassed(keras.Model):
    """A softmax classifier whose last layer cannot be read: told by its outputs."""

    def __init__(self):
        super().__init__(name="softmax_net")
        self.hidden, self.out = L.Dense(16, activation="tanh"), L.Dense(3)

    def call(self, x):
        return keras.ops.softmax(self.out(self.hidden(x)))


@pytest.mark.parametrize("form", ["functional", "subclassed", "one-hot"])
def test_a_softmax_student_is_trained_on_the_cross_entropy_of_its_probabilities(form):
    """The first step's loss (one batch: the loss at the weights before it) is the cross-entropy of
    the probabilities, not of the probabilities taken as logits."""
    keras.utils.set_random_seed(0)
    student = _Subclassed() if form == "subclassed" else _mlp(softmax=True)
    p = np.asarray(student(X, training=False), dtype="float64")
    labels = np.eye(3)[Y] if form == "one-hot" else Y
    history = kp.fine_tune(student, (X, labels), batch_size=len(X), verbose=0)
    assert history.history["loss"][0] == pytest.approx(_cross_entropy(p, Y), rel=1e-5)
    assert abs(_cross_entropy(_softmax(p), Y) - _cross_entropy(p, Y)) > 0.1  # the two differ


@pytest.mark.parametrize("teacher_softmax, student_softmax",
                         [(True, True), (True, False), (False, True)])
def test_distillation_softens_the_log_probabilities_of_a_softmax_model(teacher_softmax,
                                                                      student_softmax):
    """KL divergence of ``softmax(z / T)`` (``z``: logits, or ``log p`` of a softmax model), times
    ``T**2``, and the supervised cross-entropy, at the weights before the first step."""
    teacher, student = _mlp(teacher_softmax, seed=1), _mlp(student_softmax, seed=2)
    t, s = (np.asarray(m(X, training=False), dtype="float64") for m in (teacher, student))
    zt = np.log(t) if teacher_softmax else t
    zs = np.log(s) if student_softmax else s
    qt, qs = _softmax(zt / 4.0), _softmax(zs / 4.0)
    distill = 16.0 * float(np.mean(np.sum(qt * np.log(qt / qs), axis=-1)))
    supervised = _cross_entropy(s if student_softmax else _softmax(s), Y)
    history = kp.fine_tune(student, (X, Y), teacher=teacher, alpha=0.3, distill_temperature=4.0,
                           batch_size=len(X), verbose=0).history
    assert history["distillation_loss"][0] == pytest.approx(distill, rel=1e-4)
    assert history["student_loss"][0] == pytest.approx(supervised, rel=1e-5)
    assert history["loss"][0] == pytest.approx(0.3 * supervised + 0.7 * distill, rel=1e-4)


def test_a_softmax_student_learns_a_separable_task():
    rng = np.random.default_rng(3)
    centers = np.array([[4.0, 0, 0, 0, 0], [0, 4.0, 0, 0, 0], [0, 0, 4.0, 0, 0]])
    y = rng.integers(0, 3, 150)
    x = (centers[y] + rng.normal(scale=0.7, size=(150, 5))).astype("float32")
    student = _mlp(softmax=True, seed=4)
    accuracy = lambda: float(np.mean(np.argmax(np.asarray(student(x)), -1) == y))  # noqa: E731
    before = accuracy()
    kp.fine_tune(student, (x, y), epochs=10, batch_size=16, learning_rate=0.05, verbose=0)
    assert accuracy() >= 0.95 > before


def test_a_teacher_that_is_no_model_or_has_other_outputs_is_refused_naming_teacher():
    student = _mlp(softmax=False)
    with pytest.raises(kp.ArgumentError, match=r"^teacher must be a keras.Model.*got 'resnet20'"):
        kp.fine_tune(student, (X, Y), teacher="resnet20", verbose=0)
    x = keras.Input((5,))
    other = keras.Model(x, L.Dense(4, name="out")(x))  # 4 outputs, the student has 3
    with pytest.raises(kp.ArgumentError, match=r"^teacher= has outputs of shape \(4,\), "
                                               r"the student \(3,\)") as err:
        kp.fine_tune(student, (X, Y), teacher=other, verbose=0)
    assert err.value.argument == "teacher"


def _pruned_cnn(seed):
    """A small residual CNN (stem, one block, dense head) and its plan at half the parameters."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((8, 8, 3))
    x = keras.layers.ReLU()(keras.layers.BatchNormalization()(
        keras.layers.Conv2D(16, 3, padding="same", use_bias=False)(inputs)))
    y = keras.layers.BatchNormalization()(keras.layers.Conv2D(16, 3, padding="same")(
        keras.layers.ReLU()(keras.layers.Conv2D(12, 3, padding="same")(x))))
    x = keras.layers.Add()([x, y])
    model = keras.Model(inputs, keras.layers.Dense(5)(keras.layers.GlobalAveragePooling2D()(x)))
    return model, kp.plan(model, params=0.5)


@pytest.mark.parametrize("teacher", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_going_on_with_the_finalized_model_trains_as_the_masked_model(teacher):
    """fine_tune 1 epoch of 3 with GradualPruning (masks final at step 4), then fine_tune the
    finalized model from epoch 1 with optimizer_from=: the weights end where 3 epochs of the masked
    model end (the same schedule, the carried momentum), distilled or not."""
    rng = np.random.default_rng(0)
    data = tf.data.Dataset.from_tensor_slices((rng.normal(size=(32, 8, 8, 3)).astype("float32"),
                                               rng.integers(0, 5, 32))).batch(4)  # fit keeps its order
    schedule = keras.optimizers.schedules.PolynomialDecay(0.05, 24, 0.0)
    smalls = []
    for epochs in (3, 1):
        model, plan = _pruned_cnn(3)
        pruning = kp.GradualPruning(plan, end_step=4, frequency=2, verbose=0)
        kw = {"teacher": _pruned_cnn(4)[0] if teacher else None, "learning_rate": schedule,
              "weight_decay": 1e-3, "verbose": 0}
        kp.fine_tune(model, data, epochs=epochs, callbacks=[pruning], **kw)
        smalls.append(pruning.finalize())
    kp.fine_tune(smalls[1], data, epochs=3, initial_epoch=1, optimizer_from=pruning, **kw)
    for got, want in zip(smalls[1].weights, smalls[0].weights, strict=True):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(got), keras.ops.convert_to_numpy(want),
                                   rtol=1e-4, atol=1e-5)
    with pytest.raises(kp.ArgumentError, match="initial_epoch=3"):
        kp.fine_tune(smalls[1], data, epochs=3, initial_epoch=3)
    with pytest.raises(kp.ArgumentError, match="optimizer_from="):
        kp.fine_tune(smalls[1], data, epochs=3, optimizer_from="pruning")
