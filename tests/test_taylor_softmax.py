"""Taylor importance on a model that ends in a softmax (issue 42).

The loss whose gradients rank channels takes such a model's outputs as
probabilities, not as logits; the reference is the cross-entropy of the
probabilities written out by hand and differentiated by TensorFlow.
(TensorFlow's own cross-entropy finds the logits behind a Keras softmax
by itself; a softmax written out, as in ``_HandSoftmax``, it cannot see.)
"""

import keras
import numpy as np
import pytest
from keras import ops

from keras_precrop import planning
from tests.conftest import L

tf = pytest.importorskip("tensorflow")


class _HandSoftmax(keras.Model):
    """A subclassed classifier whose call() writes its softmax out."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.conv = L.Conv2D(3, 3, padding="same", name="conv")
        self.head = L.Dense(4, name="head")

    def call(self, x):
        z = self.head(ops.mean(self.conv(x), axis=(1, 2)))
        e = ops.exp(z - ops.max(z, axis=-1, keepdims=True))
        return e / ops.sum(e, axis=-1, keepdims=True)


def _functional(activation):
    x = keras.Input((4, 4, 2), name="img")
    h = L.GlobalAveragePooling2D(name="gap")(L.Conv2D(3, 3, padding="same", name="conv")(x))
    return keras.Model(x, L.Dense(4, activation=activation, name="head")(h))


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="tf.GradientTape reference")
@pytest.mark.parametrize("kind", ["hand_softmax", "softmax", "logits"])
def test_taylor_gradients_are_those_of_the_cross_entropy_of_the_outputs(kind):
    keras.utils.set_random_seed(0)
    model = _HandSoftmax() if kind == "hand_softmax" else _functional(
        "softmax" if kind == "softmax" else None)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(5, 4, 4, 2)).astype("float32")
    y = rng.integers(0, 4, size=5)
    model(x)
    (got,) = planning.data_batches(model, (x, y))
    with tf.GradientTape() as tape:
        out = model(x, training=False)
        probabilities = tf.nn.softmax(out) if kind == "logits" else out
        loss = -tf.reduce_mean(tf.math.log(tf.gather(probabilities, y, batch_dims=1)))
    want = tape.gradient(loss, model.trainable_weights)
    for weight, reference in zip(model.trainable_weights, want):
        np.testing.assert_allclose(np.asarray(got[id(weight)]), reference.numpy(),
                                   rtol=1e-4, atol=1e-6)
