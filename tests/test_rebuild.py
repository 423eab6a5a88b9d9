"""Property tests: random functional CNNs rebuild and match their plans."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import keras_precrop as kp
from tests.conftest import assert_budget_use, assert_matches_plan, random_cnns

# Keras seeds new layers' initializers from Python's `random`; harmless here.
pytestmark = pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisDeprecationWarning")
_SETTINGS = dict(deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


def _check(model, params, flops, upper, residual):
    try:
        plan = kp.plan(model, params, flops, upper=upper, residual=residual)
    except kp.InfeasibleBudgetError:
        # Only allowed when even the narrowest model (every free width 1) is too big.
        cost = kp.profile(model, residual=residual).cost
        narrowest = cost.totals(np.where(cost.fixed, cost.widths, 1.0))
        budgets = np.array([params or np.inf, flops or np.inf]) * cost.totals(cost.widths)
        assert np.any(narrowest > budgets)
        return
    new = kp.apply_plan(model, plan)
    prof = kp.profile(new)
    assert prof.total_params == new.count_params() == plan.params
    assert prof.total_macs == plan.macs
    assert_matches_plan(model, plan, new)  # TensorFlow's MACs, each layer's width
    assert_budget_use(plan, model, upper)
    x = np.random.default_rng(0).normal(size=(2,) + tuple(model.input_shape[1:]))
    assert new(x).shape == model(x).shape
    for key, value in (("params", plan.params), ("macs", plan.macs)):
        budget = plan.budgets[key]
        if budget is not None:
            assert value <= budget
    if upper == 1.0:
        assert all(g["new"] <= g["width"] for g in plan.variables)


@settings(max_examples=25, **_SETTINGS)
@given(model=random_cnns(), params=st.floats(0.2, 1.0), flops=st.one_of(st.none(), st.floats(0.3, 1.0)),
       residual=st.sampled_from(("prefix", "tie")))
def test_random_cnns_precrop(model, params, flops, residual):
    _check(model, params, flops, 1.0, residual)


@settings(max_examples=10, **_SETTINGS)
@given(model=random_cnns(), params=st.floats(0.5, 1.2), flops=st.floats(0.8, 1.2))
def test_random_cnns_reconfigure(model, params, flops):
    _check(model, params, flops, None, "prefix")


@pytest.mark.slow
@settings(max_examples=500, deadline=None, suppress_health_check=list(HealthCheck))
@given(model=random_cnns(), params=st.floats(0.1, 1.0), flops=st.one_of(st.none(), st.floats(0.2, 1.0)),
       residual=st.sampled_from(("prefix", "tie")), upper=st.sampled_from((1.0, None)))
def test_random_cnns_many(model, params, flops, residual, upper):
    _check(model, params, flops, upper, residual)
