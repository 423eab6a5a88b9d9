"""Property tests: random functional CNNs rebuild and match their plans."""

import keras
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import keras_precrop as kp
from keras_precrop.graph import rebuild, walk
from tests.conftest import assert_budget_use, assert_matches_plan, random_cnns

# Keras seeds new layers' initializers from Python's `random`; harmless here.
pytestmark = pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisDeprecationWarning")
_SETTINGS = dict(deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


def _check(model, params, flops, upper, residual):
    try:
        plan = kp.plan(model, params, flops, upper=upper, residual=residual)
    except kp.InfeasibleBudgetError:
        # Only allowed when even the narrowest model is too big: every free width 1, or its
        # multiple (a grouped convolution keeps at least one channel per group).
        cost = kp.profile(model, residual=residual).cost
        narrowest = cost.totals(np.where(cost.fixed, cost.widths, [v.multiple for v in cost.variables]))
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


def test_timing_rebuild_has_the_same_layers_and_sane_values():
    """``rebuild(..., timing=True)`` (latency variants) differs only in its weights' values.

    Same layers, names and weight shapes as the seeded rebuild; every random
    kernel holds finite LeCun-scale values (std 1/sqrt(fan_in)); constant
    initializers (batch-norm statistics, zero biases) are untouched; the
    forward pass is finite.
    """
    model = kp.models.get("mobilenet_v2_cifar")
    graph = walk(model)
    widths = np.maximum(1, np.array([v.width for v in graph.variables]) // 2)
    seeded, timed = rebuild(graph, widths), rebuild(graph, widths, timing=True)
    assert [(w.path, w.shape) for w in timed.weights] == [(w.path, w.shape) for w in seeded.weights]
    assert timed.count_params() == seeded.count_params()
    for w in timed.weights:
        value = keras.ops.convert_to_numpy(w)
        assert np.isfinite(value).all(), w.path
        if w.path.endswith("kernel") and value.size > 100:
            assert np.std(value) == pytest.approx(1 / np.sqrt(np.prod(value.shape[:-1])), rel=0.2), w.path
        if w.path.endswith(("moving_variance", "gamma")):
            assert (value == 1).all(), w.path
    x = np.random.default_rng(0).normal(size=(2,) + tuple(model.input_shape[1:]))
    assert np.isfinite(keras.ops.convert_to_numpy(timed(x))).all()
