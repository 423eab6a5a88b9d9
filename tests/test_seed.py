"""``seed=``: what it fixes (the new model's fresh weights, random channel ranking), what it
leaves alone (Keras' global random state), and where it is refused (it would seed nothing)."""

import random

import keras
import numpy as np
import pytest

import keras_precrop as kp

L = keras.layers


def _model(dropout=False, seeded_head=False):
    """A small residual CNN (Conv, BatchNorm, Add, Dense), optionally with a Dropout."""
    x = keras.Input((8, 8, 3))
    stem = L.Conv2D(8, 3, padding="same", name="stem")(x)
    h = L.Conv2D(8, 3, padding="same", name="a")(L.ReLU()(L.BatchNormalization(name="bn")(stem)))
    h = L.Add(name="add")([stem, h])
    h = L.GlobalAveragePooling2D(name="gap")(h)
    if dropout:
        h = L.Dropout(0.5, name="drop")(h)
    init = keras.initializers.GlorotUniform(seed=11) if seeded_head else "glorot_uniform"
    return keras.Model(x, L.Dense(3, kernel_initializer=init, name="head")(h))


def _same(a, b):
    return len(a.weights) == len(b.weights) and all(
        np.array_equal(u, v) for u, v in zip(a.get_weights(), b.get_weights()))


def _global_draws():
    """The next values of Keras' global random streams: Python's, NumPy's and ``keras.random``'s."""
    return (random.random(), np.random.random(),
            keras.ops.convert_to_numpy(keras.random.uniform((3,))).tolist())


def test_a_seed_fixes_the_fresh_weights_and_another_seed_changes_them():
    model = _model()
    first, again = (kp.precrop(model, params=0.5, seed=2) for _ in range(2))
    other = kp.precrop(model, params=0.5, seed=3)
    assert _same(first, again)
    kernels = [(a, b) for a, b in zip(first.get_weights(), other.get_weights()) if a.ndim > 1]
    assert kernels and all(not np.array_equal(a, b) for a, b in kernels)  # every kernel differs
    # The same weights a model built from scratch gets: a forward pass agrees too.
    x = np.random.default_rng(0).normal(size=(2, 8, 8, 3)).astype("float32")
    np.testing.assert_array_equal(first(x), again(x))


def test_a_seed_leaves_keras_global_random_state_as_it_was():
    model = _model(dropout=True)
    keras.utils.set_random_seed(7)
    expected = _global_draws()
    keras.utils.set_random_seed(7)
    kp.precrop(model, params=0.5, seed=2)
    assert _global_draws() == expected
    # Without a seed the fresh weights are drawn from that state, as Keras draws them.
    keras.utils.set_random_seed(7)
    kp.precrop(model, params=0.5)
    assert _global_draws() != expected


def test_without_a_seed_keras_global_seed_fixes_the_weights():
    model = _model()
    keras.utils.set_random_seed(5)
    first = kp.precrop(model, params=0.5)
    keras.utils.set_random_seed(5)
    assert _same(first, kp.precrop(model, params=0.5))


def test_random_layers_are_seeded_and_the_user_s_seeds_are_kept():
    model = _model(dropout=True, seeded_head=True)
    first = kp.precrop(model, params=0.5, seed=2)
    seeds = first.get_layer("drop").get_config()["seed"]
    assert isinstance(seeds, int) and seeds == kp.precrop(model, params=0.5, seed=2).get_layer(
        "drop").get_config()["seed"]
    assert model.get_layer("drop").get_config()["seed"] is None  # the user's model is untouched
    head = first.get_layer("head").get_config()["kernel_initializer"]["config"]["seed"]
    assert head == 11
    # The user's seed gives the head the kernel a Dense of that shape gets from it.
    reference = keras.initializers.GlorotUniform(seed=11)(first.get_layer("head").kernel.shape)
    np.testing.assert_array_equal(first.get_layer("head").kernel, reference)


def test_kept_weights_ranked_by_l1_refuse_a_seed_that_seeds_nothing():
    model = _model()
    with pytest.raises(kp.ArgumentError, match=r"^seed=2 seeds nothing here: with weights='keep' "
                       r"every weight comes from the model, importance='l1' ranks channels") as err:
        kp.precrop(model, params=0.5, weights="keep", seed=2)
    assert err.value.argument == "seed"
    # Random ranking, a Dropout, or a gained channel (PreConfig) give the seed something to do.
    random_rank = [kp.precrop(model, params=0.5, weights="keep", importance="random", seed=s)
                   for s in (2, 2)]
    assert _same(*random_rank)
    kp.precrop(_model(dropout=True), params=0.5, weights="keep", seed=2)
    grown = kp.reconfigure(model, params=1.4, weights="keep", seed=2)
    assert grown.count_params() > model.count_params()
    assert _same(grown, kp.reconfigure(model, params=1.4, weights="keep", seed=2))


@pytest.mark.parametrize("seed", [-1, 1.5, "2", True])
def test_a_seed_that_is_no_integer_is_refused_before_the_solve(seed):
    with pytest.raises(kp.ArgumentError, match=r"^seed=.* must be None .* or an integer >= 0"):
        kp.precrop(_model(), params=0.5, seed=seed)
