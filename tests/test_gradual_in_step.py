"""``kp.GradualPruning`` applies its masks inside the compiled train step (TensorFlow, the suite's
backend), and asks the host for nothing between its mask updates.

* every step leaves the masked weights at exactly zero, seen by a callback that runs before
  the pruning one (so not its after-batch work), and under ``steps_per_execution`` inside an
  execution's steps too;
* between updates the callback neither reads the optimizer's step count nor assigns a weight:
  counted with a spy on the host's reads and on eager assignments, batch by batch;
* the weights get their own constraints back when the fit ends (a user's constraint keeps
  applying during it), no layer attribute changes, and a plain fit afterwards masks nothing
  (it runs the same train function, the lent factors set to 1); a second fit with the callback
  reuses that train function instead of tracing again.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_precrop as kp
from keras_precrop import gradual
from tests.backend_scripts import gradual_fit

pytestmark = pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="TensorFlow's step")

L = keras.layers


def _model(seed=0):
    """The residual CNN of the backend tests, compiled to train fast (masked weights would move)."""
    model = gradual_fit.residual_cnn(seed)
    model.compile(keras.optimizers.SGD(0.05, momentum=0.9),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _numpy(w):
    return keras.ops.convert_to_numpy(w)


class _Probe(keras.callbacks.Callback):
    """At every batch end: whether the weights masked by the last update are zero, how many they
    are, and the spies' counts so far."""

    def __init__(self, pruning, counts):
        super().__init__()
        self.pruning, self.counts, self.rows = pruning, counts, []

    def on_train_batch_end(self, batch, logs=None):
        masks = self.pruning._masks
        zero = all(not np.any(_numpy(w)[m == 0]) for w, m in masks)
        masked = sum(int((m == 0).sum()) for _, m in masks)
        self.rows.append((int(_numpy(self.model.optimizer.iterations)), zero, dict(self.counts), masked))


@pytest.fixture
def spies(monkeypatch):
    """Counts the callback's reads of the step count and the eager (host) assignments of weights."""
    counts = {"reads": 0, "assigns": 0}
    read = gradual.GradualPruning._step

    def counted_read(self):
        counts["reads"] += 1
        return read(self)

    variable_type = type(keras.Variable(0.0))
    assign = variable_type.assign

    def counted_assign(self, value):
        if tf.executing_eagerly() and self.trainable:
            counts["assigns"] += 1
        return assign(self, value)

    monkeypatch.setattr(gradual.GradualPruning, "_step", counted_read)
    monkeypatch.setattr(variable_type, "assign", counted_assign)
    return counts


def test_masks_hold_after_every_step_and_the_host_works_only_at_updates(spies):
    model = _model()
    x, y = gradual_fit.data(batches=8)
    pruning = kp.GradualPruning(kp.plan(model, params=0.5), end_step=8, frequency=4, verbose=0)
    before, after = _Probe(pruning, spies), _Probe(pruning, spies)
    model.fit(x, y, batch_size=8, epochs=2, shuffle=False, callbacks=[before, pruning, after],
              verbose=0)  # steps 1-16, updates at 0 (before the first), 4 and 8
    assert [row[0] for row in after.rows] == list(range(1, 17))
    assert all(zero for _, zero, _, _ in before.rows)  # the step zeroed them, not the callback
    assert before.rows[-1][3] > 0
    for (step, _, was, _), (_, _, now, _) in zip(after.rows, after.rows[1:]):
        worked = {k for k in now if now[k] != was[k]}
        assert worked == ({"reads", "assigns"} if step + 1 in (4, 8) else set()), step + 1
    masked = sum(int((m == 0).sum()) for _, m in pruning._masks)
    assert pruning._fraction == 1.0 and masked > 0
    small = pruning.finalize()
    np.testing.assert_allclose(_numpy(model(x[:4])), _numpy(small(x[:4])), rtol=1e-4, atol=1e-4)


def test_masks_hold_inside_an_execution_of_several_steps():
    """``steps_per_execution=4``: callbacks see steps 4 and 8 only; the masks of the update at
    step 4 hold through steps 5-8, seen before the callback's update at step 8 (which would zero
    them itself): a callback could not reach the steps inside an execution."""
    model = _model(1)
    model.compile(keras.optimizers.SGD(0.05, momentum=0.9),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True), steps_per_execution=4)
    x, y = gradual_fit.data(batches=8)
    pruning = kp.GradualPruning(kp.plan(model, params=0.5), end_step=8, frequency=4, verbose=0)
    probe = _Probe(pruning, {})
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, callbacks=[probe, pruning], verbose=0)
    assert [(step, zero) for step, zero, _, _ in probe.rows] == [(4, True), (8, True)]
    assert probe.rows[-1][3] > 0  # the update at step 4 masked some
    assert pruning._fraction == 1.0


def test_the_weights_own_constraints_come_back_and_a_plain_fit_after_masks_nothing():
    keras.utils.set_random_seed(2)
    inputs = keras.Input((8, 8, 3))
    h = L.Conv2D(12, 3, padding="same", name="c1", kernel_constraint=keras.constraints.NonNeg())(inputs)
    h = L.Conv2D(8, 3, padding="same", name="c2")(L.ReLU()(h))
    model = keras.Model(inputs, L.Dense(5, name="fc")(L.GlobalAveragePooling2D()(h)))
    model.compile(keras.optimizers.SGD(0.05, momentum=0.9),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    own = {w.path: w.constraint for w in model.weights}
    attribute = model.get_layer("c1").kernel_constraint
    x, y = gradual_fit.data(batches=4)
    pruning = kp.GradualPruning(kp.plan(model, params=0.5), end_step=2, frequency=1, verbose=0)
    model.fit(x, y, batch_size=8, epochs=1, callbacks=[pruning], verbose=0)
    traced = model.train_function
    assert {w.path: w.constraint for w in model.weights} == own
    assert model.get_layer("c1").kernel_constraint is attribute
    kernel = model.get_layer("c1").kernel
    assert _numpy(kernel).min() >= 0  # NonNeg applied in the steps, before the mask
    masks = {w.path: m for w, m in pruning._masks}
    assert not np.any(_numpy(kernel)[masks[kernel.path] == 0])
    model.fit(x, y, batch_size=8, epochs=1, callbacks=[pruning], verbose=0)
    assert model.train_function is traced  # the second fit did not trace again
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)  # no callback: the masked weights train
    assert model.train_function is traced
    assert any(np.any(_numpy(w)[m == 0]) for w, m in pruning._masks)
    assert {w.path: w.constraint for w in model.weights} == own
    model.fit(x, y, batch_size=8, epochs=1, callbacks=[pruning], verbose=0)
    assert model.train_function is not traced  # the plain fit ran it: made anew, with the factors
    assert not any(np.any(_numpy(w)[m == 0]) for w, m in pruning._masks)
    pruning.finalize()
    assert {w.path: w.constraint for w in model.weights} == own


def test_finalize_gives_the_constraints_back_after_a_fit_that_raised():
    model = _model(3)
    x, y = gradual_fit.data(batches=4)
    own = {w.path: w.constraint for w in model.weights}
    pruning = kp.GradualPruning(kp.plan(model, params=0.5), end_step=2, frequency=1, verbose=0)

    class Stop(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 2:
                raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError, match="interrupted"):
        model.fit(x, y, batch_size=8, epochs=1, callbacks=[pruning, Stop()], verbose=0)
    assert {w.path: w.constraint for w in model.weights} != own  # lent until the fit ends
    small = pruning.finalize()
    assert {w.path: w.constraint for w in model.weights} == own
    np.testing.assert_allclose(_numpy(model(x[:4])), _numpy(small(x[:4])), rtol=1e-4, atol=1e-4)
