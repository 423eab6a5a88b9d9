"""``mode="uniform"`` (one width factor for every layer) and ``compare``, against references.

The reference for a plain chain of convolutions is its closed-form parameter
and MAC count, checked once against Keras' ``count_params()``; the uniform
width factor is then verified from its definition (the largest ``r`` whose
rounded-down widths ``floor(r * C)`` meet the budget), independently of the
library's cost model.
"""

import json
import math

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
