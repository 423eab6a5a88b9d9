"""Training-only branches in a model's ``call`` (issue 42, defect 3).

A trace records one graph. A Python branch on ``training`` (``if training:
x = self.noise(x)``) is traced for inference and for training; where the two
graphs differ the model is refused naming the layers and the composite that
branches, never pruned into a model that lacks the branch. Layers that are
called unconditionally and behave differently in training by themselves
(``Dropout``, ``GaussianNoise``) keep that behaviour: the reference is the
original model's own outputs with ``training=True`` and ``training=False``.
"""

import keras
import numpy as np
import pytest
from keras import layers as L

import keras_precrop as kp


class NoisyNet(keras.Model):
    """A subclassed model that adds noise only when training, by a Python branch."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.conv = L.Conv2D(8, 3, padding="same", name="conv")
        self.noise = L.GaussianNoise(0.5, name="noise")
        self.pool = L.GlobalAveragePooling2D(name="pool")
        self.head = L.Dense(4, name="head")

    def call(self, x, training=None):
        x = self.conv(x)
        if training:
            x = self.noise(x)
        return self.head(self.pool(x))


class DropBlock(L.Layer):
    """A composite whose dropout runs only when training (``training`` inherited, not passed)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.conv = L.Conv2D(8, 3, padding="same", name="conv")
        self.drop = L.Dropout(0.5, name="drop")

    def call(self, x, training=None):
        x = self.conv(x)
        return self.drop(x) if training else x


class BlockNet(keras.Model):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.stem = L.Conv2D(8, 3, padding="same", name="stem")
        self.block = DropBlock(name="block")
        self.pool = L.GlobalAveragePooling2D(name="pool")
        self.head = L.Dense(4, name="head")

    def call(self, x, training=None):
        return self.head(self.pool(self.block(self.stem(x))))


class StochasticBlock(L.Layer):
    """Noise and dropout called unconditionally: they act only when training, by themselves."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.conv = L.Conv2D(8, 3, padding="same", name="conv")
        self.noise = L.GaussianNoise(0.3, name="noise")
        self.drop = L.Dropout(0.3, name="drop")

    def call(self, x, training=None):
        return self.drop(self.noise(self.conv(x), training=training))


class StochasticNet(keras.Model):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.stem = L.Conv2D(8, 3, padding="same", name="stem")
        self.block = StochasticBlock(name="block")
        self.noise = L.GaussianNoise(0.3, name="top_noise")
        self.pool = L.GlobalAveragePooling2D(name="pool")
        self.head = L.Dense(4, name="head")

    def call(self, x, training=None):
        return self.head(self.pool(self.noise(self.block(self.stem(x)))))


def _built(cls):
    keras.utils.set_random_seed(0)
    model = cls()
    model(np.zeros((1, 8, 8, 3), "float32"))
    return model


def _spread(model, x, training):
    """Largest difference between two calls: nonzero where the model draws noise."""
    first, second = (keras.ops.convert_to_numpy(model(x, training=training)) for _ in range(2))
    return float(np.abs(first - second).max())


def test_a_training_only_branch_of_the_model_is_refused_naming_the_layer():
    model = _built(NoisyNet)
    with pytest.raises(kp.UnsupportedModelError) as err:
        kp.precrop(model, params=0.5)
    message = str(err.value)
    assert "'noise'" in message and "only when training" in message
    assert "unconditionally" in message  # the remedy


def test_a_training_only_branch_of_a_composite_is_refused_with_a_remedy_that_works():
    model = _built(BlockNet)
    with pytest.raises(kp.UnsupportedLayerError) as err:
        kp.profile(model)
    assert "'block_drop'" in str(err.value) and err.value.arguments == {"ignore": ["block"]}
    ignore = err.value.arguments["ignore"]  # the composite kept whole, with its branch
    assert kp.profile(model, ignore=ignore).total_params == model.count_params()
    new = kp.precrop(model, params=1.0, weights="keep", ignore=ignore)
    x = np.random.default_rng(0).normal(size=(4, 8, 8, 3)).astype("float32")
    for m in (model, new):
        assert _spread(m, x, training=True) > 1e-3 and _spread(m, x, training=False) == 0.0


def test_unconditional_noise_layers_keep_their_training_behaviour():
    model = _built(StochasticNet)
    x = np.random.default_rng(0).normal(size=(4, 8, 8, 3)).astype("float32")
    new = kp.precrop(model, params=1.0, weights="keep")
    classes = {type(layer).__name__ for layer in new.layers}
    assert {"GaussianNoise", "Dropout"} <= classes
    for m in (model, new):
        assert _spread(m, x, training=True) > 1e-3   # noise when training, as the original
        assert _spread(m, x, training=False) == 0.0  # none at inference
    np.testing.assert_allclose(keras.ops.convert_to_numpy(new(x, training=False)),
                               keras.ops.convert_to_numpy(model(x, training=False)),
                               rtol=1e-5, atol=1e-5)
