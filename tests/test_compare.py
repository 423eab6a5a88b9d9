"""``compare``'s recommendation, objective footnote and measured spread, against references.

The references: ``kp.plan`` alone (what ``mode="auto"`` picks and why), the
SynExp objective of a plain chain of convolutions in closed form (what the
footnote says the column is), per-round speedups computed here from the
samples a fake clock hands out, and, timed for real on a tiny model through
the command line, the JSON rows themselves (the recommended row is their
fastest) and the progress lines on stderr.
"""

import json
import math
import pathlib
import re
import statistics

import keras
import pytest

import keras_precrop as kp
from keras_precrop.cli import main as cli_main

L = keras.layers
WIDTHS = (8, 16, 24)


def _chain():
    x = keras.Input((8, 8, 3))
    h = x
    for i, w in enumerate(WIDTHS):
        h = L.Conv2D(w, 3, padding="same", name=f"conv{i}")(h)
    h = L.GlobalAveragePooling2D()(h)
    return keras.Model(x, L.Dense(10, name="head")(h), name="chain")


def _objective(widths):
    """Closed form of the footnote's sum of ln(density) for :func:`_chain`: each conv keeps
    (in share) x (out share), the head its input share (3 input channels and 10 classes are fixed)."""
    shares = [w / c for w, c in zip(widths, WIDTHS)]
    return sum(math.log(s) for s in shares) * 2


def test_unmeasured_the_recommendation_is_autos_pick_with_its_evidence():
    """At flops=0.4 auto picks layerwise though exact scores a higher objective: the closing line
    names auto's pick, states auto's reason and why the higher objective does not overrule it."""
    model = _chain()
    comparison = kp.compare(model, flops=0.4)
    auto = kp.plan(model, flops=0.4)
    exact = kp.plan(model, flops=0.4, mode="exact")
    assert auto.mode == "layerwise" and exact.solver["objective"] > auto.solver["objective"]
    rec = comparison.recommendation
    assert rec["mode"] == auto.mode in [r["mode"] for r in comparison.rows]
    assert rec["basis"] == "auto" and auto.solver["auto_mode"] in rec["reason"]
    assert (f"exact scores a higher objective ({exact.solver['objective']:.2f} vs "
            f"{auto.solver['objective']:.2f})") in rec["reason"]
    lines = []
    comparison.summary(print_fn=lines.append)
    printed = "\n".join(lines)
    start = next(i for i, line in enumerate(lines) if line.startswith("Recommended: "))
    closing = " ".join(line.strip() for line in lines[start:])  # the last lines, wrapped
    assert closing == f"Recommended: layerwise. {rec['reason']}"
    # the footnote says what the column is: the sum of ln(density), here in closed form
    assert "Objective: the SynExp objective, sum over the prunable kernels of ln(density)" in printed
    for row in comparison.rows:
        widths = [kp.plan(model, flops=0.4, mode=row["mode"]).widths[f"conv{i}"] for i in range(3)]
        assert row["objective"] == pytest.approx(_objective(widths))
        assert re.search(rf"^\| {re.escape(row['mode'])}\b.*\| +{row['objective']:.2f} \|", printed, re.M)


def test_unmeasured_a_row_over_the_budgets_is_named_not_offered():
    """ResNet-20 at params=0.3: paper mode's widths exceed the budget (it may) and score a higher
    objective than auto's pick; the recommendation says paper exceeds the budgets instead of
    citing its objective against auto's."""
    model = kp.models.get("resnet20")
    comparison = kp.compare(model, params=0.3, modes=("exact", "paper"), verbose=0)
    rows = {r["mode"]: r for r in comparison.rows}
    paper = kp.precrop(model, params=0.3, mode="paper")
    assert paper.count_params() > 0.3 * model.count_params() and not rows["paper"]["within_budgets"]
    assert rows["paper"]["objective"] > rows["exact"]["objective"]
    reason = comparison.recommendation["reason"]
    assert "paper exceeds the budgets and is not compared." in reason
    assert "paper scores a higher objective" not in reason


# The latency model of ResNet-20 fitted on the experiments' CPU (TensorFlow, batch 64).
_RESNET20_LATENCY = pathlib.Path(__file__).resolve().parents[1] / "experiments" / "plans" / (
    "resnet20_tf_b64_latency_model.json")


def test_unmeasured_a_row_predicted_faster_than_autos_pick_is_named_with_its_latency():
    """ResNet-20 at flops=0.5 with its latency model: auto picks layerwise, and uniform widths
    predict less time (the latency model's own prediction of the built model); the recommendation
    keeps auto's pick and says so, with both predictions."""
    model = kp.models.get("resnet20")
    comparison = kp.compare(model, flops=0.5, modes=["layerwise", "uniform"],
                            latency_model=str(_RESNET20_LATENCY))
    lm = kp.LatencyModel.from_json(str(_RESNET20_LATENCY))
    seconds = {m: lm.predict(kp.precrop(model, flops=0.5, mode=m)) for m in ("layerwise", "uniform")}
    assert seconds["uniform"] < 0.99 * seconds["layerwise"]
    rec = comparison.recommendation
    assert rec["mode"] == comparison.auto_mode == "layerwise"
    assert (f"uniform predicts {1 - seconds['uniform'] / seconds['layerwise']:.0%} less latency "
            f"({seconds['uniform'] * 1e3:.3f} vs {seconds['layerwise'] * 1e3:.3f} ms); auto does not "
            "pick by speed.") in rec["reason"]


@pytest.mark.parametrize("slower", [False, True])
def test_measured_speedups_are_per_round_ratios_and_the_fastest_within_budget_is_recommended(
        monkeypatch, slower, tmp_path):
    """A fake clock with known samples: each row's speedup is the median, least and most of the
    original's time over the plan's per round; paper mode, fastest here but over the budget, is
    left out, and the recommendation is the fastest within the budget, said to be slower than the
    original where it is (``slower``: every plan takes 10 times as long)."""
    model = _chain()
    base = {"original": 1.0, "paper": 0.1, "exact": 0.5, "layerwise": 0.4, "uniform": 0.45}
    base = {name: t * (10 if slower and name != "original" else 1) for name, t in base.items()}
    jitter = [1.0, 1.3, 0.8]  # the original is slow in round 2, each plan in its own round

    def samples(fns, rounds, log=None):
        return {name: [base[name] * (jitter[(r + i) % 3] if name != "original" else jitter[r])
                       for r in range(rounds)] for i, name in enumerate(fns)}

    monkeypatch.setattr(kp.latency, "runner", lambda m, **kw: (lambda: m))
    monkeypatch.setattr(kp.latency, "interleaved", samples)
    modes = ["exact", "layerwise", "uniform", "paper"]
    comparison = kp.compare(model, flops=0.4, modes=modes, measure=True, rounds=3, verbose=0)
    expected = samples({"original": 0, **dict.fromkeys(modes)}, 3)
    for row in comparison.rows:
        ratios = [o / t for o, t in zip(expected["original"], expected[row["mode"]])]
        assert (row["speedup_min"], row["speedup"], row["speedup_max"]) == pytest.approx(
            (min(ratios), statistics.median(ratios), max(ratios)))
    paper = comparison.row("paper")
    assert paper["macs"] > 0.4 * kp.profile(model).total_macs and not paper["within_budgets"]
    assert paper["speedup"] == max(r["speedup"] for r in comparison.rows)
    within = [r for r in comparison.rows if r["macs"] <= 0.4 * kp.profile(model).total_macs]
    best = max(within, key=lambda r: r["speedup"])
    rec = comparison.recommendation
    assert rec["mode"] == best["mode"] == "layerwise" and rec["basis"] == "measured"
    assert "paper measured faster but exceed the budgets" in rec["reason"]
    assert ("Even it runs slower than the original here" in rec["reason"]) == (best["speedup"] < 1) == slower
    lines = []
    comparison.summary(print_fn=lines.append)
    row = next(line for line in lines if line.startswith("| layerwise"))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[-2:] == [f"{best['speedup_min']:.2f}-{best['speedup_max']:.2f}x",
                          f"{best['speedup']:.2f}x"]
    assert "| Speedup min-max (3 rounds) | Speedup (median) |" in lines[2]
    old = comparison.to_dict()  # as saved before spreads and recommendations were recorded
    del old["recommendation"]
    for r in old["rows"]:
        del r["speedup_min"], r["speedup_max"]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    lines = []
    kp.Comparison.from_json(str(path)).summary(print_fn=lines.append)
    row = next(line for line in lines if line.startswith("| layerwise"))
    assert [cell.strip() for cell in row.strip("|").split("|")][-2:] == ["-", f"{best['speedup']:.2f}x"]
    assert not any(line.startswith("Recommended") for line in lines)


@pytest.mark.parametrize("uniform, tie", [(0.38, True), (0.2, False)])
def test_auto_s_pick_measured_level_with_the_fastest_is_a_tie_and_is_recommended(monkeypatch, uniform,
                                                                                tie):
    """A fake clock: uniform is the fastest by median; where layerwise (auto's pick at flops=0.4)
    overlaps it over the rounds (0.38 against 0.40 s with 5% jitter) the two tie and auto's pick
    is recommended; twice as fast (0.2 s), uniform is recommended as measured."""
    model = _chain()
    base = {"original": 1.0, "exact": 0.5, "layerwise": 0.4, "uniform": uniform}
    jitter = [1.0, 1.05, 0.95]

    def samples(fns, rounds, log=None):
        return {name: [base[name] * (jitter[(r + i) % 3] if name != "original" else 1.0)
                       for r in range(rounds)] for i, name in enumerate(fns)}

    monkeypatch.setattr(kp.latency, "runner", lambda m, **kw: (lambda: m))
    monkeypatch.setattr(kp.latency, "interleaved", samples)
    comparison = kp.compare(model, flops=0.4, modes=["exact", "layerwise", "uniform"], measure=True,
                            rounds=3, verbose=0)
    assert comparison.auto_mode == "layerwise"
    pick, fastest = comparison.row("layerwise"), comparison.row("uniform")
    assert fastest["speedup"] == max(r["speedup"] for r in comparison.rows)
    assert (pick["speedup_max"] >= fastest["speedup_min"]) == tie  # the reference: the spreads
    rec = comparison.recommendation
    if tie:
        assert (rec["mode"], rec["basis"]) == ("layerwise", "tie")
        assert rec["reason"].startswith("Measured, uniform ") and " tie: their spreads overlap" \
            in rec["reason"]
    else:
        assert (rec["mode"], rec["basis"]) == ("uniform", "measured")
        assert 'mode="auto" picks layerwise' in rec["reason"]


def test_the_command_line_measures_recommends_the_fastest_and_writes_it_to_json(tmp_path, capsys):
    """Timed for real (tiny model, 2 rounds, batch 2): the JSON's recommendation is its fastest
    row by median speedup (or auto's pick where its spread overlaps the fastest's: a tie), each
    spread holds its median, and progress says what is timed."""
    path, json_path = tmp_path / "chain.keras", tmp_path / "compare.json"
    _chain().save(path)
    assert cli_main(["compare", str(path), "--flops", "0.4", "--measure", "--rounds", "2",
                     "--batch_size", "2", "--json", str(json_path)]) == 0
    captured = capsys.readouterr()
    data = json.loads(json_path.read_text())
    rows, rec = data["rows"], data["recommendation"]
    fastest = max(rows, key=lambda r: r["speedup"])
    auto = next(r for r in rows if r["mode"] == data["auto_mode"])
    tie = auto is not fastest and auto["speedup_max"] >= fastest["speedup_min"]
    assert (rec["mode"], rec["basis"]) == ((auto["mode"], "tie") if tie else (fastest["mode"], "measured"))
    for row in rows:
        assert row["speedup_min"] <= row["speedup"] <= row["speedup_max"]
    opening = "Measured, " if tie else "The fastest measured plan"
    assert f"Recommended: {rec['mode']}. {opening}" in captured.out
    assert "timing plans: round 2/2" in captured.err and "latency model" not in captured.err
    assert kp.Comparison.from_json(str(json_path)).recommendation == rec
