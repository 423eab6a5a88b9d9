"""Properties of the public API over random models and options (issue 42).

Random small models (functional CNNs of every block kind ``random_cnns`` knows, channel splits
included, and subclassed models of composite layers: residual, squeeze-excite, depthwise and
split blocks, blocks inside blocks, a functional model inside) meet random options of
``precrop``/``reconfigure`` (budgets, ``weights``, ``importance``, ``ignore``, ``round_to``,
``mode``, ``floor``), sometimes with one mistake a user makes. Every call must end one of two ways:

* a model that is what its plan says: Keras' ``count_params()`` and TensorFlow's graph MACs equal
  the plan's, the plan's originals equal the user's model's by the same references, the budgets
  hold as the width grid allows, it runs; with ``weights="keep"`` every kept weight is a slice of
  the original (found by value) and a plan that keeps every width computes the original's outputs;
* or an exception from ``keras_precrop.errors`` whose message names the user's argument
  (``params=``, ``round_to=``) or a layer of the model; a mistake the options hold is named.

Either way the user's model is left as it was: its weights, variables' ``trainable`` flags,
layers' names and flags, config, call nodes and outputs.

The default suite runs a bounded number of examples (derandomized, so the same ones each run);
``-m slow`` runs several hundred more.
"""

import math
import re

import keras
import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st

import keras_precrop as kp
from keras_precrop import errors, gradual
from keras_precrop.budget.modes import FLOOR_ON, MODES
from keras_precrop.graph import trace, walker
from tests.conftest import (
    BLOCKS,
    SPLITS,
    assert_budget_use,
    assert_matches_plan,
    layers_by_path,
    model_fingerprint,
    random_cnns,
    random_subclassed,
    tf_macs,
)
from tests.test_keep_weights import assert_same_function, assert_sliced, randomize

# Keras seeds new layers' initializers from Python's `random`; harmless here.
pytestmark = pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisDeprecationWarning")

_COMMON = dict(deadline=None, suppress_health_check=list(HealthCheck))
# The default suite: the same examples each run, and a failure reported as found (shrinking one of
# these models takes minutes); `-m slow` draws afresh and shrinks.
_DEFAULT = dict(derandomize=True, phases=(Phase.explicit, Phase.generate), **_COMMON)

# Every exception class the package raises on purpose.
_ERRORS = tuple(c for c in vars(errors).values()
                if isinstance(c, type) and issubclass(c, Exception) and c.__module__ == errors.__name__)

# One mistake a user makes, and the argument its message must name.
_MISTAKES = {
    "no budget": "params",
    "zero budget": "params",
    "precrop above 1": "flops",
    "round_to 0": "round_to",
    "floor outside exact": "floor",
    "floor_on alone": "floor_on",
    "unknown mode": "mode",
    "unknown layer": "ignore",
    "importance without keep": "importance",
}


@st.composite
def options(draw, names):
    """``(api, keyword arguments, mistake)``: a call of ``precrop`` or ``reconfigure``, and the
    mistake its arguments hold (``None`` for none); ``names`` are those ``ignore=`` may give."""
    api = draw(st.sampled_from(("precrop", "precrop", "precrop", "reconfigure")))
    top = 1.0 if api == "precrop" else 1.2
    # (0.05, top], more often above 0.5 (tiny models have little to prune), sometimes exactly 1.
    ratio = st.one_of(st.floats(0.05, top, exclude_min=True), st.floats(0.5, top), st.just(1.0))
    kwargs = {"params": draw(st.none() | ratio), "flops": draw(st.none() | ratio)}
    if kwargs["params"] is None and kwargs["flops"] is None:
        kwargs["params"] = draw(ratio)
    kwargs["weights"] = draw(st.sampled_from((None, "keep")))
    if kwargs["weights"] == "keep":
        kwargs["importance"] = draw(st.sampled_from(("l1", "l1", "l2", "random", "random", "taylor",
                                                     "bn_scale")))
    kwargs["ignore"] = draw(st.lists(st.sampled_from(sorted(names)), max_size=2, unique=True))
    kwargs["round_to"] = draw(st.sampled_from((1, 1, 2, 4, 8)))
    kwargs["mode"] = draw(st.sampled_from(sorted(MODES) + ["auto"]))
    if kwargs["mode"] in ("exact", "auto") and draw(st.booleans()):
        kwargs["floor"] = draw(st.sampled_from((0.5, 1.0)))
        kwargs["floor_on"] = draw(st.sampled_from((None,) + FLOOR_ON))
    mistake = draw(st.sampled_from([None] * 36 + sorted(_MISTAKES)))
    if mistake == "precrop above 1":  # reconfigure takes it: widths may grow
        api = "precrop"
    return api, _with_mistake(kwargs, mistake), mistake


def _with_mistake(kwargs, mistake):
    """``kwargs`` with ``mistake`` made in them (see :data:`_MISTAKES`)."""
    kwargs = dict(kwargs)
    if mistake == "no budget":
        kwargs["params"] = kwargs["flops"] = None
    elif mistake == "zero budget":
        kwargs["params"] = 0.0
    elif mistake == "precrop above 1":
        kwargs["flops"] = 1.5
    elif mistake == "round_to 0":
        kwargs["round_to"] = 0
    elif mistake == "floor outside exact":
        kwargs.update(floor=1.0, mode="paper")
    elif mistake == "floor_on alone":
        kwargs.pop("floor", None)
        kwargs["floor_on"] = "streams"
    elif mistake == "unknown mode":
        kwargs["mode"] = "fastest"
    elif mistake == "unknown layer":
        kwargs["ignore"] = [*kwargs["ignore"], "no_such_layer"]
    elif mistake == "importance without keep":
        kwargs.update(weights=None, importance="l2")
    return kwargs


def _call(model, api, kwargs, x):
    """``kp.precrop``/``kp.reconfigure`` with ``kwargs``; a Taylor ranking gets a batch of ``x``."""
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    if kwargs.get("importance") == "taylor":
        kwargs["data"] = (x, np.arange(len(x)) % 5)
    return getattr(kp, api)(model, **kwargs)


# -- the properties ---------------------------------------------------------------------------


def _check_model(model, data):
    """Any call ends in a model that is its plan or in a refusal in the user's words; the user's
    model is left as it was."""
    randomize(model)
    frozen = data.draw(st.sampled_from([None] + [layer.name for layer in model.layers if layer.weights]))
    if frozen is not None:
        model.get_layer(frozen).trainable = False
    names = _layer_names(model)
    api, kwargs, mistake = data.draw(options(walker.names_of(model)))
    x = np.random.default_rng(0).normal(size=(2,) + _input_shape(model)).astype("float32")
    before, outputs = model_fingerprint(model), np.asarray(model(x, training=False))
    try:
        new = _call(model, api, kwargs, x)
    except Exception as exc:  # noqa: BLE001 (which exception it is, is the property)
        _check_refusal(exc, model, kwargs, mistake, names)
        event(f"refused: {type(exc).__name__}" + (" (a mistake)" if mistake else ""))
    else:
        assert mistake is None, f"{mistake!r} was accepted: {kwargs}"
        _check_result(model, new, api, kwargs, x)
    after = model_fingerprint(model)
    assert {k: v for k, v in after.items() if k != "nodes"} == \
        {k: v for k, v in before.items() if k != "nodes"}
    assert_call_nodes_unchanged(before, after)
    np.testing.assert_array_equal(np.asarray(model(x, training=False)), outputs)


def _input_shape(model):
    """One example's input shape: a functional model's input, or the shape a subclassed model was
    built with."""
    if getattr(model, "inputs", None):
        return tuple(model.inputs[0].shape[1:])
    return tuple(next(iter(model._build_shapes_dict.values()))[1:])


def assert_call_nodes_unchanged(before, after):
    """No layer of the user's model gained or lost a call node (issue 42, defect 8: tracing
    re-called the user's layers)."""
    assert after["nodes"] == before["nodes"]


def _layer_names(model):
    """The layer names ``ignore=`` may give and messages may name: the trace's names of layers and
    ops (``body_block0_conv1``, ``nested/conv``) and the names the user gave."""
    traced = trace.traced(model)
    names = {traced.name(op) for op in traced.functional.operations}
    names.update(path for path, _ in layers_by_path(model))
    names.update(layer.name for layer in model._flatten_layers(include_self=False))
    return names - {"no_such_layer"}


def _check_refusal(exc, model, kwargs, mistake, names):
    """``exc`` is one of the package's errors and names the mistake, else an argument given or a
    layer."""
    message = str(exc)
    assert isinstance(exc, _ERRORS), f"{type(exc).__name__} is not a keras_precrop error: {message}"
    layers = [n for n in names | {model.name} if re.search(rf"\b{re.escape(n)}\b", message)]
    if isinstance(exc, (kp.UnsupportedLayerError, kp.UnsupportedModelError)) and layers:
        return  # the model itself is refused, whatever else the options hold
    if mistake is not None:
        argument = _MISTAKES[mistake]
        assert f"{argument}=" in message, f"{mistake!r} refused without naming {argument}=: {message}"
        return
    given = [f"{k}=" for k, v in kwargs.items() if v is not None and v != []]
    assert any(g in message for g in given) or layers, f"names neither an argument nor a layer: {message}"
    if isinstance(exc, kp.InfeasibleBudgetError):  # a budget, or the model with nothing to prune
        assert re.search(r"\b(params|flops)=", message) or model.name in message, message
        if isinstance(exc.limit, dict):  # the smallest model it says is feasible is
            _check_smallest_feasible(model, kwargs, exc.limit)


def _check_smallest_feasible(model, kwargs, limit):
    """Budgets at ``limit``, the narrowest model's ``{"params", "macs"}`` an
    :class:`InfeasibleBudgetError` reports, are above those asked for, and can be planned."""
    original = {"params": model.count_params(), "macs": tf_macs(model)}
    asked = {"params": kwargs["params"], "macs": kwargs["flops"]}
    limit = {row: cost for row, cost in limit.items() if asked[row] is not None}
    assert any(cost > asked[row] * original[row] for row, cost in limit.items()), (limit, asked)
    if limit == {row: original[row] for row in limit}:  # nothing to prune: the model is the smallest
        return
    budgets = {"max_params" if row == "params" else "max_macs": int(cost) for row, cost in limit.items()}
    budgets.update({k: v for k, v in (("params", kwargs["params"]), ("flops", kwargs["flops"]))
                    if v is not None and {"params": "params", "flops": "macs"}[k] not in limit})
    options = {k: kwargs[k] for k in ("ignore", "round_to", "mode", "floor", "floor_on") if k in kwargs}
    plan = kp.plan(model, **budgets, **options)
    assert plan.params <= budgets.get("max_params", plan.params)


def _check_result(model, new, api, kwargs, x):
    """``new`` is the model its plan describes, within the budgets asked for, with the user's
    weights where they were kept."""
    plan = new.precrop_plan
    assert new.count_params() == plan.predicted["params"] == plan.params
    assert plan.original == {"params": model.count_params(), "macs": tf_macs(model)}
    assert_matches_plan(model, plan, new)  # TensorFlow's MACs, every layer's width, output shape
    upper = 1.0 if api == "precrop" else None
    if plan.mode != "paper":  # the paper's rule as published does not enforce budgets
        for key, ratio in (("params", kwargs["params"]), ("macs", kwargs["flops"])):
            if ratio is not None:
                assert plan.predicted[key] <= math.floor(ratio * plan.original[key] * (1 + 1e-12))
    if plan.mode not in ("paper", "uniform"):  # uniform widths stay near r * C (tests/test_uniform.py)
        assert_budget_use(plan, model, upper, kwargs["round_to"])
    if upper == 1.0:
        assert all(v["new"] <= v["width"] for v in plan.variables)
    assert all(v["new"] % kwargs["round_to"] == 0 or v["new"] == v["width"] or v["fixed"]
               for v in plan.variables)
    y = np.asarray(new(x, training=False))
    assert y.shape == np.asarray(model(x, training=False)).shape and np.isfinite(y).all()
    if kwargs["weights"] == "keep":
        grown = [v["new"] > v["width"] for v in plan.variables]
        shrunk = [v["new"] < v["width"] for v in plan.variables]
        if not any(grown):
            assert_sliced(model, new)
        if not any(shrunk):  # kept or only widened (new channels start silent): the same function
            assert_same_function(model, new, x, tol=1e-4)
        event("built, kept weights: " + {(False, False): "widened and pruned", (True, False): "sliced",
                                         (False, True): "same outputs", (True, True): "sliced, same outputs"}
              [not any(grown), not any(shrunk)])
    else:
        event("built, fresh weights")


def _random_functional():
    return random_cnns(blocks=BLOCKS + SPLITS, max_blocks=4)


@settings(max_examples=18, **_DEFAULT)
@given(model=_random_functional(), data=st.data())
def test_functional_models_become_their_plan_or_are_refused_by_name(model, data):
    _check_model(model, data)


@settings(max_examples=12, **_DEFAULT)
@given(model=random_subclassed(), data=st.data())
def test_subclassed_models_become_their_plan_or_are_refused_by_name(model, data):
    _check_model(model, data)


@pytest.mark.slow
@settings(max_examples=300, **_COMMON)
@given(model=st.one_of(_random_functional(), random_cnns(), random_subclassed()), data=st.data())
def test_many_models_become_their_plan_or_are_refused_by_name(model, data):
    _check_model(model, data)


# -- GradualPruning over random models, schedules and rankings (issue 60) ----------------------


@st.composite
def gradual_options(draw):
    """``(params ratio, keyword arguments of kp.GradualPruning)``: a schedule that ends within the
    short fit (6 steps), a ranking that needs no data, with or without fading and regrowth."""
    ratio = draw(st.sampled_from((0.3, 0.5, 0.8)))
    kwargs = {"end_step": draw(st.integers(0, 4)), "frequency": draw(st.integers(1, 3)),
              "schedule": draw(st.sampled_from(gradual.SCHEDULES)),
              "importance": draw(st.sampled_from(("l1", "l2", "bn_scale"))),
              "regrow": draw(st.booleans()), "shrink": draw(st.sampled_from((0.0, 0.0, 0.05)))}
    return ratio, kwargs


def _check_gradual(model, ratio, kwargs):
    """A short fit with a ``GradualPruning`` ends in a model that is its plan (Keras' count) and
    computes what the masked model computes, or in a refusal naming an argument or a layer."""
    randomize(model)
    names = _layer_names(model)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(12,) + _input_shape(model)).astype("float32")
    y = rng.integers(0, 5, len(x))
    model.compile(keras.optimizers.SGD(1e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    try:
        plan = kp.plan(model, params=ratio)
        pruning = kp.GradualPruning(plan, verbose=0, **kwargs)
        model.fit(x, y, batch_size=2, epochs=1, shuffle=False, callbacks=[pruning], verbose=0)  # 6 steps
        small = pruning.finalize()
    except Exception as exc:  # noqa: BLE001 (which exception it is, is the property)
        _check_refusal(exc, model, {"params": ratio, "flops": None, **kwargs}, None, names)
        event(f"refused: {type(exc).__name__}")
        return
    assert small.count_params() == plan.predicted["params"] == plan.params
    np.testing.assert_allclose(np.asarray(small(x[:4], training=False)),
                               np.asarray(model(x[:4], training=False)), rtol=1e-5, atol=1e-5)
    event(f"finalized: {kwargs['schedule']}, {kwargs['importance']}")


def _random_small_functional():
    return random_cnns(blocks=BLOCKS + SPLITS, max_blocks=3)


@settings(max_examples=10, **_DEFAULT)
@given(model=_random_small_functional(), options=gradual_options())
def test_gradual_pruning_ends_in_its_plan_computing_the_masked_model_or_is_refused_by_name(model, options):
    _check_gradual(model, *options)


@pytest.mark.slow
@settings(max_examples=60, **_COMMON)
@given(model=_random_small_functional(), options=gradual_options())
def test_gradual_pruning_on_many_models_ends_in_its_plan_or_is_refused_by_name(model, options):
    _check_gradual(model, *options)
