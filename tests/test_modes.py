"""``residual="tie"`` and ``mode="paper"`` on every zoo model.

Each rebuilt model is checked against its plan with Keras' and TensorFlow's
own counts and each layer's width; paper-mode widths are recomputed from the
solved densities with the paper's rule ``floor(sqrt(p_l) * C_l)``.
"""

import math

import pytest

import keras_precrop as kp
from tests.conftest import assert_budget_use, assert_matches_plan

FAST = ["resnet20"]
SLOW = sorted(set(kp.models.list()) - set(FAST))
ZOO = FAST + [pytest.param(name, marks=pytest.mark.slow) for name in SLOW]


def _rebuilt(name, **options):
    """A zoo model, its plan at half the parameters and the checked rebuild."""
    model = kp.models.get(name)
    plan = kp.plan(model, params=0.5, **options)
    new = kp.apply_plan(model, plan)
    assert_matches_plan(model, plan, new)
    return model, plan, new


@pytest.mark.parametrize("name", ZOO)
def test_tied_residual_streams(name):
    model, plan, new = _rebuilt(name, residual="tie")
    assert_budget_use(plan, model, 1.0)
    assert not any(isinstance(layer, (kp.ChannelSlice, kp.PrefixAdd)) for layer in new.layers)
    assert all(g["kind"] != "view" for g in plan.variables)


@pytest.mark.parametrize("name", ZOO)
def test_paper_mode_widths_are_floor_sqrt_density_times_width(name):
    model, plan, _ = _rebuilt(name, mode="paper")
    densities = plan.solver["layer_densities_solved"]
    groups = {g["name"]: g for g in plan.variables}
    variables = kp.profile(model).variables
    bound = {v.name: variables[v.bound].name for v in variables if v.bound is not None}
    checked = 0
    for layer, p in densities.items():
        # A layer's own channels are the group named after it, its view of a
        # residual stream "<layer>:in"; a view or a writer is then clipped to
        # its stream's new width.
        for name_ in (layer, f"{layer}:in"):
            group = groups.get(name_)
            if group is None or group["fixed"]:
                continue
            expected = max(1, math.floor(math.sqrt(p) * group["width"]))
            if name_ in bound:
                expected = min(expected, groups[bound[name_]]["new"])
            assert group["new"] == expected, (name_, p)
            checked += 1
    assert checked > 0
