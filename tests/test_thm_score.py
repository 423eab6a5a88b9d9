"""``experiments/thm_score.py``: figure 4's proxy, SynFlow's score under random masks.

The expected score under random weight and filter masks is checked against
its Monte Carlo mean on a small ReLU CNN (fixed weights, many masks).
"""

import sys

import keras
import numpy as np
import pytest

from keras_precrop import pai
from tests.conftest import REPO

sys.path.insert(0, str(REPO / "experiments"))
import thm_score  # noqa: E402

L = keras.layers


def _relu_cnn():
    keras.utils.set_random_seed(3)
    inputs = keras.Input((6, 6, 2))
    x = L.Conv2D(6, 3, padding="same", activation="relu", use_bias=False, name="c1")(inputs)
    x = L.Conv2D(6, 3, padding="same", activation="relu", use_bias=False, name="c2")(x)
    x = L.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, L.Dense(3, use_bias=False, name="fc")(x))


@pytest.mark.parametrize("granularity", ["weight", pytest.param("filter", marks=pytest.mark.slow)])
def test_expected_score_is_the_mean_score_under_random_masks(granularity):
    model = _relu_cnn()
    densities = {"c1/kernel": 0.5, "c2/kernel": 0.25, "fc/kernel": 0.5}
    samples = [thm_score.score(model, pai.random_masks(model, densities, granularity, seed=s))
               for s in range(40)]
    realized = pai.layer_densities(pai.random_masks(model, densities, granularity, seed=0))
    expected = thm_score.expected_score(model, realized)
    error = np.std(samples) / np.sqrt(len(samples))
    assert abs(np.mean(samples) - expected) < 4 * error
    # not a vacuous match: the masks take most of the dense score away, and samples vary
    assert expected < 0.1 * thm_score.score(model) and error > 0
