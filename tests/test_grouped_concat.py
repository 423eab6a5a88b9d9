"""A concatenation read by a grouped conv or GroupNorm: only the sum of its parts keeps the groups.

Regression for random CNNs whose plans could not be built: a ``groups=3``
conv reading a concatenation of 12 + 13 + 8 channels was planned to read
9 + 3 + 8 = 20 (Keras refused it), because the walker asked each part to be
a multiple of 3 and let a part that is no multiple move anyway.
"""

import keras
import numpy as np
import pytest

import keras_precrop as kp
from tests.conftest import assert_budget_use, assert_matches_plan, build_cnn

L = keras.layers


def _group_norm_model():
    """Parts of 8 + 5 + 3 channels concatenated into GroupNormalization(groups=4)."""
    inputs = keras.Input((8, 8, 3))
    x = L.Conv2D(8, 3, padding="same", name="stem")(inputs)
    parts = [L.Conv2D(w, 1, name=f"part{w}")(x) for w in (8, 5, 3)]
    x = L.Concatenate(name="cat")(parts)
    x = L.GroupNormalization(groups=4, name="gn")(x)
    x = L.Conv2D(6, 1, name="head")(x)
    x = L.GlobalAveragePooling2D(name="gap")(x)
    return keras.Model(inputs, L.Dense(3, name="out")(x))


def _readers(model):
    """``{name: (input width, groups)}`` of every layer that keeps a group count."""
    return {layer.name: (layer.input.shape[-1], layer.groups) for layer in model.layers
            if getattr(layer, "groups", 1) > 1}


@pytest.mark.parametrize("build, fixed, free", [
    (lambda: build_cnn([("concat", 12, 1), ("grouped", 12, 1)], "gap", 16),
     {"l0", "l2"}, {"l1"}),  # 8 + 13 are no multiples of 3, 12 is
    (_group_norm_model, {"part5", "part3"}, {"part8"}),  # 5 + 3 are no multiples of 4
])
@pytest.mark.parametrize("params", [0.6, 0.75, 0.9])
def test_concat_into_grouped_layer_builds(build, fixed, free, params):
    """Every plan builds: the parts that are no multiple keep their width, the others move by it."""
    model = build()
    try:
        plan = kp.plan(model, params=params)
    except kp.InfeasibleBudgetError:
        cost = kp.profile(model).cost
        narrowest = cost.totals(np.where(cost.fixed, cost.widths, 1.0))[0]
        assert narrowest > params * model.count_params()
        return
    new = kp.apply_plan(model, plan)
    variables = {v["name"]: v for v in plan.variables}
    assert {n for n in fixed | free if variables[n]["fixed"]} == fixed
    assert all(variables[n]["new"] == variables[n]["width"] for n in fixed)
    assert new.count_params() == plan.params
    assert_matches_plan(model, plan, new)
    assert_budget_use(plan, model, 1.0)
    original = _readers(model)
    for name, (width, groups) in _readers(new).items():
        assert groups == original[name][1] and width % groups == 0
    x = np.random.default_rng(0).normal(size=(2, *model.input_shape[1:])).astype("float32")
    assert np.isfinite(keras.ops.convert_to_numpy(new(x))).all()


def test_free_part_moves():
    """The part that is a multiple of the groups is still pruned, in steps of the groups."""
    model = build_cnn([("concat", 12, 1), ("grouped", 12, 1)], "gap", 16)
    plan = kp.plan(model, params=0.9)
    part = next(v for v in plan.variables if v["name"] == "l1")
    assert part["new"] < part["width"] and part["new"] % 3 == 0
    new = kp.apply_plan(model, plan, weights="keep")
    assert new.count_params() == plan.params
