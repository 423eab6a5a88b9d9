"""PreCrop / PreConfig: plans, rebuilt models and their exact costs."""

import functools
import json

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
BUDGETS = [(0.1, None), (0.3, None), (0.5, None), (0.8, None), (None, 0.3), (None, 0.5), (0.5, 0.5)]


@functools.lru_cache(maxsize=None)
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
    assert all(g["new"] <= g["width"] for g in plan.groups)
    if mode != "paper":
        assert_budget_use(plan, model, 1.0, options.get("round_to", 1),
                          options.get("min_channels", 1))
        binding = []
        for key, ratio, achieved, total in (("params", params, plan.params, model.count_params()),
                                            ("macs", flops, plan.macs, plan.original["macs"])):
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
    assert any(g["new"] > g["width"] for g in plan.groups)  # some layers widen
    assert kp.profile(new).total_params == plan.params == new.count_params()


def test_precrop_full_budget_keeps_widths():
    model = _model("mobilenet_v2_cifar")
    plan = kp.plan(model, params=1.0)
    assert all(g["new"] == g["width"] for g in plan.groups)
    assert plan.params == model.count_params()


def test_round_to_and_min_channels():
    model = _model("resnet20")
    plan = kp.plan(model, params=0.3, round_to=4, min_channels=8)
    for g in plan.groups:
        if not g["fixed"]:
            assert g["new"] % 4 == 0 or g["new"] == g["width"]
            assert g["new"] >= 8
    new = kp.apply_plan(model, plan)
    assert new.count_params() == plan.params


def test_ignore_keeps_layer_widths():
    model = _model("resnet20")
    plan = kp.plan(model, params=0.3, ignore=["stage1_block1_conv1"])
    layer = next(l for l in plan.layers if l["name"] == "stage1_block1_conv1")
    assert layer["channels_new"] == layer["channels"]


def test_deterministic():
    model = _model("mobilenet_v2_cifar")
    a = kp.plan(model, params=0.4, flops=0.6)
    b = kp.plan(model, params=0.4, flops=0.6)
    assert a.widths == b.widths


def test_keras_round_trip_identical_outputs(tmp_path):
    model = _model("resnet20")
    new = kp.precrop(model, params=0.3)
    assert any(isinstance(l, (kp.ChannelSlice, kp.PrefixAdd)) for l in new.layers)
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
    assert [l.get_config() for l in a.layers] == [l.get_config() for l in b.layers]
    json.loads(plan.to_json())  # plain JSON


def test_plan_for_other_model_is_refused():
    plan = kp.plan(_model("resnet20"), params=0.5)
    with pytest.raises(kp.PlanMismatchError, match="does not fit"):
        kp.apply_plan(kp.models.get("resnet32"), plan)


@pytest.mark.parametrize("kwargs,match", [
    (dict(params=0.0), "positive"),
    (dict(params=-1.0), "positive"),
    (dict(params=float("nan")), "positive"),
    (dict(flops=float("inf")), "positive"),
    (dict(), "at least one budget"),
    (dict(params=0.5, max_params=10), "not both"),
    (dict(params=0.5, round_to=0), "round_to"),
    (dict(params=0.5, mode="magic"), "mode"),
])
def test_bad_budgets(kwargs, match):
    with pytest.raises(ValueError, match=match):
        kp.plan(_model("resnet20"), **kwargs)


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
