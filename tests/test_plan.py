"""PreCrop / PreConfig: plans, rebuilt models and their exact costs."""

import functools
import json
import pathlib

import keras
import numpy as np
import pytest

import keras_precrop as kp
from tests.conftest import assert_budget_use, assert_matches_plan

_APPS = {
    "MobileNetV2": keras.applications.MobileNetV2,
    "EfficientNetB0": keras.applications.EfficientNetB0,
    "ResNet50": keras.applications.ResNet50,
    "DenseNet121": keras.applications.DenseNet121,
}
OLD_PLAN = pathlib.Path(__file__).parent / "data" / "plan_v0_resnet20_params0.5.json"
BUDGETS = [(0.1, None), (0.3, None), (0.5, None), (0.8, None), (None, 0.3), (None, 0.5), (0.5, 0.5)]


@functools.cache
def _model(name):
    if name in _APPS:
        return _APPS[name](weights=None)
    return kp.models.get(name)


def _check_precrop(model, params, flops, mode="exact", **options):
    """Rebuild, run and compare the rebuilt model with the plan (independent counts)."""
    plan = kp.plan(model, params, flops, mode=mode, **options)
    new = kp.apply_plan(model, plan)
    prof = kp.profile(new)
    assert new.count_params() == prof.total_params == plan.params
    assert prof.total_macs == plan.macs
    assert_matches_plan(model, plan, new)  # Keras', TensorFlow's and the layers' own numbers
    x = np.random.default_rng(0).uniform(size=(1,) + tuple(model.input_shape[1:]))
    assert tuple(new(x).shape) == (1,) + tuple(model.output_shape[1:])
    assert all(g["new"] <= g["width"] for g in plan.variables)
    if mode != "paper":
        assert_budget_use(plan, model, 1.0, options.get("round_to", 1),
                          options.get("min_channels", 1))
        binding = []
        for ratio, achieved, total in ((params, plan.params, model.count_params()),
                                       (flops, plan.macs, plan.original["macs"])):
            if ratio is None:
                continue
            assert achieved <= ratio * total
            binding.append(achieved / (ratio * total))
        assert max(binding) >= 0.99, binding
    return plan, new


@pytest.mark.parametrize("params,flops", BUDGETS)
def test_precrop_resnet20_budgets(params, flops):
    _check_precrop(_model("resnet20"), params, flops)


@pytest.mark.parametrize("name,params,flops", [
    ("wide_resnet20", 0.3, None), ("vgg16", None, 0.5), ("mobilenet_v2_cifar", 0.5, 0.5),
    ("resnet34", 0.5, None), ("MobileNetV2", None, 0.3), ("EfficientNetB0", 0.5, None),
])
def test_precrop_zoo_sample(name, params, flops):
    _check_precrop(_model(name), params, flops)


@pytest.mark.slow
@pytest.mark.parametrize("params,flops", BUDGETS)
@pytest.mark.parametrize("name", ["resnet20", "wide_resnet20", "vgg16", "mobilenet_v2_cifar",
                                  "resnet34", *_APPS])
def test_precrop_zoo_all(name, params, flops):
    _check_precrop(_model(name), params, flops)


@pytest.mark.parametrize("params,flops", [(0.3, None), (None, 0.5), (0.5, 0.5)])
def test_layerwise_mode_meets_budgets(params, flops):
    _check_precrop(_model("mobilenet_v2_cifar"), params, flops, mode="layerwise")


@pytest.mark.parametrize("params,flops", [(0.3, None), (None, 0.5)])
def test_paper_mode_reports_deviation(params, flops):
    plan, _ = _check_precrop(_model("resnet20"), params, flops, mode="paper")
    deviation = plan.solver["deviation"]
    key = "params" if params else "macs"
    achieved = plan.params if params else plan.macs
    assert deviation[key] == pytest.approx(achieved / plan.budgets[key] - 1)


@pytest.mark.parametrize("name", ["EfficientNetB0", "MobileNetV2", "resnet34"])
def test_reconfigure_same_flops_fewer_params(name):
    model = _model(name)
    new = kp.reconfigure(model, params=0.8, flops=1.0)
    plan = new.precrop_plan
    assert plan.mode == "layerwise"
    assert plan.params == pytest.approx(0.8 * model.count_params(), rel=0.0125)
    assert plan.params <= 0.8 * model.count_params()
    assert plan.macs <= plan.original["macs"]
    assert any(g["new"] > g["width"] for g in plan.variables)  # some layers widen
    assert kp.profile(new).total_params == plan.params == new.count_params()


def test_auto_mode_picks_by_budget_and_says_why(capsys):
    """The default mode="auto" is layerwise under a binding FLOPs budget and where widths may grow,
    exact otherwise and with a balance bound; its plan is the picked mode's, named with why."""
    model = _model("resnet20")
    macs = kp.profile(model).total_macs
    cases = [
        (dict(params=0.3), "exact", "no FLOPs budget"),
        (dict(flops=0.5), "layerwise", "a FLOPs budget"),
        (dict(params=0.5, max_macs=macs // 3), "layerwise", "a FLOPs budget binds"),
        (dict(params=0.5, flops=1.0), "exact", "no FLOPs budget binds"),  # a params budget in effect
        (dict(params=0.3, balance=2), "exact", "balance="),
        (dict(params=0.8, flops=1.0, upper=None), "layerwise", "widths may grow"),
        (dict(params=0.8, flops=1.0, upper=None, balance=2), "exact", "balance="),
    ]
    for kwargs, mode, why in cases:
        auto = kp.plan(model, **kwargs)
        assert (auto.mode, why in auto.solver["auto_mode"]) == (mode, True), kwargs
        picked = kp.plan(model, mode=mode, **kwargs)
        assert [v["new"] for v in auto.variables] == [v["new"] for v in picked.variables], kwargs
        assert "auto_mode" not in picked.solver
    auto.summary()
    picked.summary()
    out = capsys.readouterr().out
    assert 'Plan (exact, picked by mode="auto", residual=prefix)' in out
    assert "Plan (exact, residual=prefix)" in out
    assert kp.precrop(model, flops=0.5).precrop_plan.mode == "layerwise"


def test_precrop_full_budget_keeps_widths():
    model = _model("mobilenet_v2_cifar")
    plan = kp.plan(model, params=1.0)
    assert all(g["new"] == g["width"] for g in plan.variables)
    assert plan.params == model.count_params()


def test_round_to_and_min_channels():
    model = _model("resnet20")
    plan = kp.plan(model, params=0.3, round_to=4, min_channels=8)
    for g in plan.variables:
        if not g["fixed"]:
            assert g["new"] % 4 == 0 or g["new"] == g["width"]
            assert g["new"] >= 8
    new = kp.apply_plan(model, plan)
    assert new.count_params() == plan.params


def test_ignore_keeps_layer_widths():
    model = _model("resnet20")
    plan = kp.plan(model, params=0.3, ignore=["stage1_block1_conv1"])
    layer = next(row for row in plan.layers if row["name"] == "stage1_block1_conv1")
    assert layer["channels_new"] == layer["channels"]


def test_summary_counts_the_layers_it_hides_and_reads_older_plans():
    model = _model("resnet20")
    plan = kp.plan(model, params=0.5)
    changed, everything = [], []
    plan.summary(print_fn=changed.append, only_changed=True)
    plan.summary(print_fn=everything.append)
    costly = [layer for layer in plan.layers if layer["params"] or layer["macs"]]
    hidden = sum(layer["params"] == layer["params_new"] for layer in costly)
    assert 0 < hidden < len(costly)
    assert f"{hidden} unchanged layers not shown (only_changed=False shows them)." in changed
    rows = [line for line in everything if line.startswith("| ")]
    assert len(rows) == 1 + len(costly) and not any("not shown" in line for line in everything)
    assert "In channels" in rows[0] and "Out channels" in rows[0]
    # Plans saved before input channels were recorded still print.
    old = plan.to_dict()
    for layer in old["layers"]:
        del layer["channels_in"], layer["channels_in_new"]
    lines = []
    kp.Plan.from_dict(old).summary(print_fn=lines.append)
    first_row = [line for line in lines if line.startswith("| ")][1]
    assert first_row.split("|")[2].strip() == "?"


def test_deterministic():
    model = _model("mobilenet_v2_cifar")
    a = kp.plan(model, params=0.4, flops=0.6)
    b = kp.plan(model, params=0.4, flops=0.6)
    assert a.widths == b.widths


def test_keras_round_trip_identical_outputs(tmp_path):
    model = _model("resnet20")
    new = kp.precrop(model, params=0.3)
    assert any(isinstance(layer, (kp.ChannelSlice, kp.PrefixAdd)) for layer in new.layers)
    path = tmp_path / "m.keras"
    new.save(path)
    loaded = keras.models.load_model(path)
    x = np.random.default_rng(1).uniform(size=(2, 32, 32, 3)).astype("float32")
    np.testing.assert_array_equal(new.predict(x, verbose=0), loaded.predict(x, verbose=0))


def test_plan_json_round_trip_identical_model(tmp_path):
    model = _model("mobilenet_v2_cifar")
    plan = kp.plan(model, params=0.5)
    again = kp.Plan.from_json(plan.to_json(tmp_path / "p.json"))
    assert again == plan
    assert kp.Plan.from_json(str(tmp_path / "p.json")) == plan
    a, b = kp.apply_plan(model, plan), kp.apply_plan(model, again)
    assert [layer.get_config() for layer in a.layers] == [layer.get_config() for layer in b.layers]
    json.loads(plan.to_json())  # plain JSON


def test_plan_written_by_earlier_code_loads_and_applies():
    """The fixture was written by ``kp.plan(resnet20, params=0.5)`` before "groups" became "variables"."""
    data = json.loads(OLD_PLAN.read_text())
    assert "groups" in data and "variables" not in data
    old = kp.Plan.from_json(str(OLD_PLAN))
    assert old.variables == data["groups"]
    now = kp.plan(_model("resnet20"), params=0.5)
    assert old.variables == now.variables and old.predicted == now.predicted
    rebuilt = kp.apply_plan(_model("resnet20"), old)
    assert rebuilt.count_params() == old.params == kp.profile(rebuilt).total_params
    assert "variables" in json.loads(old.to_json()) and kp.Plan.from_json(old.to_json()) == old


def test_plan_for_other_model_is_refused():
    plan = kp.plan(_model("resnet20"), params=0.5)
    with pytest.raises(kp.PlanMismatchError, match="does not fit"):
        kp.apply_plan(kp.models.get("resnet32"), plan)


def _conv_ratio_factors(plan):
    """Factor between input and output width ratios of every Conv2D whose both sides changed width,
    read from the plan's per-layer channel strings (not from the solver's pairs)."""
    factors = {}
    for layer in plan.layers:
        if layer["class_name"] != "Conv2D":
            continue
        c_in, n_in = int(layer["channels_in"]), int(layer["channels_in_new"])
        c_out, n_out = int(layer["channels"]), int(layer["channels_new"])
        if (c_in, c_out) != (n_in, n_out):
            r = (n_in / c_in) / (n_out / c_out)
            factors[layer["name"]] = max(r, 1 / r)
    return factors


def test_balance_removes_bottlenecks_at_little_objective_cost():
    model = _model("resnet20")
    free = kp.plan(model, params=0.11)
    worst = max(_conv_ratio_factors(free).values())
    assert worst > 8  # the unbalanced optimum has e.g. a 64 -> 3 -> 50 bottleneck
    assert free.solver["balance_max"] >= worst * (1 - 1e-9)  # it reports every adjacent pair
    plan, new = _check_precrop(model, 0.11, None, balance=2)
    factors = _conv_ratio_factors(plan)
    assert max(factors.values()) <= 2 * 1.15, factors  # integer rounding may exceed it a little
    assert plan.solver["balance_max"] <= 2 * 1.15
    # Balance gives up some SynExp objective (it is a constraint), but little.
    assert free.solver["objective"] - 3.0 < plan.solver["objective"] < free.solver["objective"]
    # balance=1 ties every adjacent ratio: the prunable widths scale uniformly.
    uniform = kp.plan(model, params=0.11, balance=1)
    ratios = [g["new"] / g["width"] for g in uniform.variables if not g["fixed"]]
    assert max(ratios) / min(ratios) <= 1.25


def test_balance_makes_exact_preconfig_well_posed():
    # Without a cap, exact mode's objective is scale-degenerate (module docstring); a balance
    # bound keeps every adjacent pair within the factor.
    plan = kp.plan(_model("resnet20"), params=0.8, flops=1.0, upper=None, balance=2)
    assert plan.solver["balance_max"] <= 2 * 1.15
    assert plan.params <= 0.8 * _model("resnet20").count_params()


@pytest.mark.parametrize("kwargs,message", [
    (dict(params=0.0), "params=0.0 must be a positive, finite ratio of the original model's parameters"),
    (dict(flops=0), "flops=0 must be a positive, finite ratio of the original model's FLOPs"),
    (dict(params=-1), "params=-1 must be a positive"),
    (dict(params=float("nan")), "params=nan must be a positive"),
    (dict(flops=float("inf")), "flops=inf must be a positive"),
    (dict(max_macs=0), "max_macs=0 must be a positive, finite number of MACs"),
    (dict(max_params=np.float64(-5.0)), "max_params=-5.0 must be a positive, finite number of parameters"),
    (dict(), "Give at least one budget: params=, flops=, latency=, max_params= or max_macs="),
    (dict(params=0.5, max_params=10), "Give either params=0.5 (a ratio) or max_params=10"),
    (dict(flops=0.5, max_macs=10), "Give either flops=0.5 (a ratio) or max_macs=10"),
    (dict(params=0.5, round_to=0), "round_to=0 must be a positive integer"),
    (dict(params=0.5, min_channels=2.5), "min_channels=2.5 must be a positive integer"),
    (dict(params=0.5, mode="magic"), "mode='magic' is unknown"),
    (dict(params=0.5, upper=-1), "upper=-1 must be a positive ratio or None"),
    (dict(params=0.5, balance=0.5), "balance=0.5 must be a factor >= 1"),
    (dict(params=0.5, balance=2, mode="layerwise"), "balance=2 needs mode='exact'"),
])
def test_bad_arguments_are_named_as_passed(kwargs, message):
    with pytest.raises(ValueError) as err:
        kp.plan(_model("resnet20"), **kwargs)
    assert str(err.value).startswith(message)


@pytest.mark.parametrize("kwargs,message", [
    (dict(params="0.5"), "params='0.5' must be a ratio of the original model's parameters"),
    (dict(flops=True), "flops=True must be a ratio of the original model's FLOPs"),
    (dict(max_params=[10]), "max_params=[10] must be a number of parameters"),
])
def test_budget_of_another_type_is_named(kwargs, message):
    with pytest.raises(TypeError) as err:
        kp.plan(_model("resnet20"), **kwargs)
    assert str(err.value).startswith(message)


def _above_original(model):
    """Budgets above the original model, with the start of the error each must give."""
    params, macs = model.count_params(), kp.profile(model).total_macs
    return [
        (dict(params=1.5), "params=1.5 asks for 150% of the original model's parameters"),
        (dict(params=50), "params=50 asks for 5000% of the original model's parameters"),
        (dict(flops=1.01), "flops=1.01 asks for 101% of the original model's FLOPs"),
        (dict(params=0.5, flops=1.2), "flops=1.2 asks for 120%"),
        (dict(max_params=params + 1),
         f"max_params={params + 1} asks for more than the original model's {params:,} parameters"),
        (dict(max_macs=float(2 * macs)),
         f"max_macs={float(2 * macs)!r} asks for more than the original model's {macs:,} MACs"),
    ]


def test_precrop_budget_above_original_points_to_reconfigure():
    model = _model("resnet20")
    for kwargs, message in _above_original(model):
        for call in (kp.precrop, kp.plan):  # plan's default upper=1.0 is PreCrop too
            with pytest.raises(ValueError) as err:
                call(model, **kwargs)
            text = str(err.value)
            assert text.startswith(message) and "Use reconfigure (PreConfig)" in text, text


def test_budget_equal_to_original_is_accepted_and_grows_only_with_reconfigure():
    model = _model("resnet20")
    n = model.count_params()
    assert kp.plan(model, max_params=n).params == n
    assert kp.plan(model, params=1.0, max_macs=kp.profile(model).total_macs).params == n
    grown = kp.reconfigure(model, params=1.5)
    assert n < grown.count_params() == grown.precrop_plan.params <= 1.5 * n
    assert kp.plan(model, params=1.5, upper=2.0).params > n


def test_infeasible_budget_states_minimum():
    with pytest.raises(kp.InfeasibleBudgetError, match="minimum"):
        kp.plan(_model("resnet20"), max_params=100)


def test_unsupported_layer_without_ignore():
    inputs = keras.Input((8, 8, 3))
    x = keras.layers.Conv2D(8, 3, name="b")(inputs)
    x = keras.layers.Conv2D(4, 3, name="c")(x)
    x = keras.layers.Permute((2, 1, 3), name="perm")(x)
    x = keras.layers.Conv2D(4, 3, name="d")(x)
    model = keras.Model(inputs, keras.layers.GlobalAveragePooling2D()(x))
    with pytest.raises(kp.UnsupportedLayerError, match="perm.*Permute"):
        kp.precrop(model, params=0.5)
    new = kp.precrop(model, params=0.7, ignore=["perm"])
    assert new.count_params() <= 0.7 * model.count_params()


def test_nothing_prunable_is_reported():
    inputs = keras.Input((8, 8, 3))
    model = keras.Model(inputs, keras.layers.Conv2D(4, 3, name="only")(inputs))
    with pytest.raises(kp.InfeasibleBudgetError, match="no prunable channels"):
        kp.precrop(model, params=0.5)
    assert kp.plan(model, params=1.0).params == model.count_params()
