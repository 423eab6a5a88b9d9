"""``mode="uniform"`` (one width factor for every layer) and ``compare``, against references.

The reference for a plain chain of convolutions is its closed-form parameter
and MAC count, checked once against Keras' ``count_params()``; the uniform
width factor is then verified from its definition (the largest ``r`` whose
rounded-down widths ``floor(r * C)`` meet the budget), independently of the
library's cost model.
"""

import json
import math
import pathlib

import keras
import numpy as np
import pytest

import keras_precrop as kp
from keras_precrop.cli import main as cli_main
from tests.conftest import assert_matches_plan, tf_macs

L = keras.layers
WIDTHS = (8, 16, 24)
SIZE, CLASSES = 8, 10


def _chain(widths=WIDTHS):
    x = keras.Input((SIZE, SIZE, 3))
    h = x
    for i, w in enumerate(widths):
        h = L.Conv2D(w, 3, padding="same", name=f"conv{i}")(h)
    h = L.GlobalAveragePooling2D()(h)
    return keras.Model(x, L.Dense(CLASSES, name="head")(h), name="chain")


def _params(widths):
    """Closed-form parameters of :func:`_chain` (3x3 convs with bias, dense head)."""
    ins = (3, *widths)
    return sum(9 * a * b + b for a, b in zip(ins, widths)) + widths[-1] * CLASSES + CLASSES


def _macs(widths):
    ins = (3, *widths)
    return sum(SIZE * SIZE * 9 * a * b for a, b in zip(ins, widths)) + widths[-1] * CLASSES


def _floor_widths(r):
    return tuple(max(1, math.floor(r * c + 1e-9)) for c in WIDTHS)


def test_the_closed_form_reference_is_keras_own_count():
    for widths in (WIDTHS, (3, 5, 7)):
        model = _chain(widths)
        assert _params(widths) == model.count_params()
        assert _macs(widths) == tf_macs(model)


@pytest.mark.parametrize("budget", [{"params": 0.5}, {"params": 0.2}, {"flops": 0.3},
                                    {"params": 0.6, "flops": 0.4}])
def test_uniform_widths_follow_the_largest_factor_that_fits(budget):
    model = _chain()
    plan = kp.plan(model, mode="uniform", **budget)
    r = plan.solver["uniform_ratio"]
    limits = {"params": budget.get("params", np.inf) * _params(WIDTHS),
              "macs": budget.get("flops", np.inf) * _macs(WIDTHS)}

    def fits(widths):
        return _params(widths) <= limits["params"] and _macs(widths) <= limits["macs"]

    # r is the largest factor whose rounded-down widths fit (a slightly larger one does not).
    assert fits(_floor_widths(r)) and not fits(_floor_widths(r * (1 + 1e-6) + 1e-9))
    widths = tuple(plan.widths[f"conv{i}"] for i in range(3))
    for w, c in zip(widths, WIDTHS):  # every free width within one grid step of r * C
        assert abs(w - r * c) < 1 or w == 1
    assert fits(widths)
    for i in range(3):  # no width within that step can grow one channel and still fit
        grown = list(widths)
        grown[i] += 1
        if grown[i] <= math.ceil(r * WIDTHS[i] - 1e-9):
            assert not fits(tuple(grown)), (i, grown)
    new = kp.apply_plan(model, plan)
    assert new.count_params() == _params(widths) == plan.params


def test_uniform_resnet20_matches_its_plan_and_scales_every_stage_alike():
    model = kp.models.get("resnet20")
    small = kp.precrop(model, flops=0.5, mode="uniform")
    plan = small.precrop_plan
    assert plan.mode == "uniform" and plan.macs <= 0.5 * plan.original["macs"]
    assert_matches_plan(model, plan, small)
    r = plan.solver["uniform_ratio"]
    for v in plan.variables:
        if not v["fixed"]:
            assert abs(v["new"] - r * v["width"]) < 1, v


def test_uniform_reconfigure_grows_every_width_by_one_factor():
    model = _chain()
    plan = kp.plan(model, params=2.0, mode="uniform", upper=None)
    r = plan.solver["uniform_ratio"]
    assert r > 1 and plan.params <= 2.0 * _params(WIDTHS)
    limit = 2.0 * _params(WIDTHS)
    assert _params(_floor_widths(r)) <= limit < _params(_floor_widths(r * (1 + 1e-6) + 1e-9))


def test_compare_lays_the_modes_side_by_side():
    model = _chain()
    comparison = kp.compare(model, params=0.3)
    assert [row["mode"] for row in comparison.rows] == ["exact", "layerwise", "uniform"]
    for row in comparison.rows:
        alone = kp.plan(model, params=0.3, mode=row["mode"])
        assert (row["params"], row["macs"]) == (alone.params, alone.macs)
        assert row["objective"] == pytest.approx(alone.solver["objective"])
    assert comparison.auto_mode == kp.plan(model, params=0.3).mode
    assert comparison.row("uniform")["uniform_ratio"] is not None
    lines = []
    comparison.summary(print_fn=lines.append)
    assert any(line.startswith(f"| {comparison.auto_mode} (auto)") for line in lines)
    with pytest.raises(kp.ArgumentError, match="modes=\\['exact', 'nope'\\] must name modes"):
        kp.compare(model, params=0.3, modes=["exact", "nope"])


def test_compare_measures_speedups_with_a_fake_free_clock(monkeypatch):
    model = _chain()
    # Every model takes time proportional to its MACs: speedups are MAC ratios.
    monkeypatch.setattr(kp.latency, "runner", lambda m, **kw: (lambda: m))
    monkeypatch.setattr(kp.latency, "interleaved",
                        lambda fns, rounds, log=None: {k: [kp.profile(f()).total_macs] * rounds
                                                       for k, f in fns.items()})
    comparison = kp.compare(model, flops=0.4, measure=True, rounds=3, verbose=0)
    for row in comparison.rows:
        assert row["speedup"] == pytest.approx(1 / row["macs_ratio"])
    assert comparison.timing["rounds"] == 3


def test_the_command_line_takes_mode_uniform_and_compares(tmp_path, capsys):
    plan_path, json_path = tmp_path / "plan.json", tmp_path / "compare.json"
    assert cli_main(["precrop", "resnet20", "--flops", "0.5", "--mode", "uniform",
                     "--plan", str(plan_path)]) == 0
    plan = kp.Plan.from_json(str(plan_path))
    assert plan.mode == "uniform" and "uniform_ratio" in plan.solver
    assert cli_main(["compare", "resnet20", "--params", "0.3", "--json", str(json_path)]) == 0
    out = capsys.readouterr().out
    assert "| uniform " in out and "Width factor" in out
    rows = json.loads(json_path.read_text())["rows"]
    assert [r["mode"] for r in rows] == ["exact", "layerwise", "uniform"]
    assert cli_main(["compare", "resnet20", "--params", "0.3", "--rounds", "3"]) == 1
    assert "--rounds 3 has no effect without --latency or --measure" in capsys.readouterr().err


@pytest.mark.parametrize("floor", [1.0, 0.5])
@pytest.mark.parametrize("budget", [{"params": 0.3}, {"flops": 0.2}])
def test_floor_keeps_every_width_above_the_uniform_one_and_fills_the_budget(budget, floor):
    model = _chain()
    r = kp.plan(model, mode="uniform", **budget).solver["uniform_ratio"]
    plan = kp.plan(model, floor=floor, **budget)
    assert plan.mode == "exact" and plan.solver["floor_ratio"] == pytest.approx(floor * r)
    widths = tuple(plan.widths[f"conv{i}"] for i in range(3))
    for w, c in zip(widths, WIDTHS):  # no width below floor * r * C, rounded down
        assert w >= max(1, math.floor(floor * r * c + 1e-9))
    limits = {"params": budget.get("params", np.inf) * _params(WIDTHS),
              "macs": budget.get("flops", np.inf) * _macs(WIDTHS)}

    def fits(ws):
        return _params(ws) <= limits["params"] and _macs(ws) <= limits["macs"]

    assert fits(widths)
    for i in range(3):  # maximal: no width can grow one channel and still fit
        grown = list(widths)
        grown[i] += 1
        if grown[i] <= WIDTHS[i]:
            assert not fits(tuple(grown)), (i, grown)
    assert kp.apply_plan(model, plan).count_params() == _params(widths) == plan.params


def test_floor_on_resnet20_keeps_the_width_multipliers_streams():
    model = kp.models.get("resnet20")
    uniform = kp.plan(model, flops=0.3, mode="uniform")
    small = kp.precrop(model, flops=0.3, floor=1.0)
    plan = small.precrop_plan
    assert_matches_plan(model, plan, small)
    assert plan.macs <= 0.3 * plan.original["macs"]
    r = uniform.solver["uniform_ratio"]
    for v in plan.variables:
        if not v["fixed"]:
            assert v["new"] >= math.floor(r * v["width"] + 1e-9), v
    # exact mode spends what the floor leaves: the SynExp objective is at least the uniform plan's
    assert plan.solver["objective"] >= uniform.solver["objective"]


# The latency model of ResNet-20 fitted on the experiments' CPU (TensorFlow, batch 64): the case where
# exact mode alone narrows the residual streams below the uniform widths.
_RESNET20_LATENCY = pathlib.Path(__file__).resolve().parents[1] / "experiments" / "plans" / (
    "resnet20_tf_b64_latency_model.json")


def test_a_floor_on_the_streams_holds_the_residual_streams_alone():
    """floor_on="streams": every residual stream at least the uniform width, while the layers inside
    the blocks may go below it (a floor on every width holds them all); the budget is met."""
    model = kp.models.get("resnet20")
    options = {"latency": 0.5, "latency_model": str(_RESNET20_LATENCY), "calibrate": 0}
    streams = {v.name for v in kp.profile(model).variables if v.kind == "stream"}
    r = kp.plan(model, mode="uniform", **options).solver["uniform_ratio"]

    def below(plan, names):  # the free widths of ``names`` narrower than the uniform plan's
        return [v["name"] for v in plan.variables if v["name"] in names and not v["fixed"]
                and v["new"] < math.floor(r * v["width"] + 1e-9)]

    alone = kp.plan(model, mode="exact", **options)
    assert below(alone, streams)  # exact mode alone starves a stream: where the floor matters
    held = kp.plan(model, mode="exact", floor=1.0, floor_on="streams", **options)
    assert held.mode_label == "exact, floor=1.0 on streams" and held.solver["floor_on"] == "streams"
    assert not below(held, streams) and below(held, {v["name"] for v in held.variables} - streams)
    assert held.latency <= 0.5 * held.original["latency"] * (1 + 1e-9)
    lines = []
    held.summary(print_fn=lines.append)
    assert lines[0].startswith("Plan (exact, floor=1.0 on streams, residual=prefix)")
    every = kp.plan(model, mode="exact", floor=1.0, **options)
    assert not below(every, {v["name"] for v in every.variables}) and "floor_on" not in every.solver
    # compare's width-factor cell does not claim every width for a floor on the streams alone
    lines = []
    kp.compare(model, modes=["exact"], floor=1.0, floor_on="streams", **options).summary(lines.append)
    assert f">= {r:.3f} (streams)" in "\n".join(lines)


def test_auto_under_a_latency_budget_floors_the_streams_and_compare_adds_its_row():
    """mode="auto" under a latency budget is exact mode with ResNet-20's residual streams floored at
    the uniform widths (exact mode alone starves one); compare marks that plan, a row of its own,
    since none of the modes it compares planned those widths."""
    model = kp.models.get("resnet20")
    options = {"latency": 0.5, "latency_model": str(_RESNET20_LATENCY), "calibrate": 0}
    auto = kp.plan(model, **options)
    held = kp.plan(model, mode="exact", floor=1.0, floor_on="streams", **options)
    assert auto.widths == held.widths and auto.mode_label == "exact, floor=1.0 on streams"
    comparison = kp.compare(model, modes=["exact", "uniform"], **options)
    assert [row["mode"] for row in comparison.rows] == ["exact", "uniform", "exact, floor=1.0 on streams"]
    assert comparison.auto_mode == "exact, floor=1.0 on streams"
    row = comparison.row(comparison.auto_mode)
    assert (row["params"], row["macs"]) == (auto.params, auto.macs)
    lines = []
    comparison.summary(print_fn=lines.append)
    floored = next(line for line in lines if line.startswith("| exact, floor=1.0 on streams (auto)"))
    assert f">= {auto.solver['floor_ratio']:.3f} (streams)" in floored


@pytest.mark.parametrize("options, message", [
    ({"floor": 1.0, "floor_on": "bogus"}, "floor_on='bogus' is unknown; use one of ['all', 'streams']."),
    ({"floor_on": "streams"}, "floor_on='streams' says which widths a floor holds; give floor= too."),
])
def test_floor_on_refuses_bad_values_naming_them(options, message):
    with pytest.raises(kp.ArgumentError) as err:
        kp.plan(_chain(), params=0.3, **options)
    assert message in str(err.value) and err.value.arguments["floor_on"] == options["floor_on"]


@pytest.mark.parametrize("options, message", [
    ({"floor": 0}, "floor=0 must be a ratio in (0, 1]"),
    ({"floor": 1.5}, "floor=1.5 must be a ratio in (0, 1]"),
    ({"floor": True}, "floor=True must be a ratio in (0, 1]"),
    ({"floor": 1.0, "mode": "layerwise"}, "floor=1.0 needs mode='exact' (the width program); "
     "mode='layerwise' sets widths by its own rule."),
])
def test_floor_refuses_bad_values_naming_them(options, message):
    with pytest.raises(kp.ArgumentError) as err:
        kp.plan(_chain(), params=0.3, **options)
    assert message in str(err.value)
    assert err.value.arguments["floor"] is options["floor"]


def test_the_command_line_takes_floor(tmp_path, capsys):
    plan_path = tmp_path / "plan.json"
    assert cli_main(["precrop", "resnet20", "--flops", "0.3", "--floor", "1", "--plan",
                     str(plan_path)]) == 0
    assert kp.Plan.from_json(str(plan_path)).widths == kp.plan(kp.models.get("resnet20"), flops=0.3,
                                                                floor=1.0).widths
    capsys.readouterr()
    assert cli_main(["precrop", "resnet20", "--flops", "0.3", "--floor", "2"]) == 1
    assert "--floor 2 must be a ratio in (0, 1]" in capsys.readouterr().err
    assert cli_main(["precrop", "resnet20", "--flops", "0.3", "--floor", "1", "--floor_on", "streams",
                     "--plan", str(plan_path)]) == 0
    assert kp.Plan.from_json(str(plan_path)).solver["floor_on"] == "streams"
    capsys.readouterr()
    assert cli_main(["precrop", "resnet20", "--flops", "0.3", "--floor_on", "streams"]) == 1
    assert "--floor_on streams says which widths a floor holds; give --floor too." in capsys.readouterr().err
