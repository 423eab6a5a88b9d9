"""Sections "Accuracy against measured speedup" and "At equal measured time" of
``experiments/report.py``'s page: the trained structured models against the speedups
``benchmarks/bench_trained_speed.py`` measured (or their latency plans' calibration), and the
latency plans of each target against the uniform one.
"""

import pathlib
import statistics

import run as _run  # experiments/run.py: grid loading, run ids, the structured methods
from _report_common import GRIDS, _budget, _compare, _fmt_row, _label, _skipped, _summary
from _report_modes import _against_cell, _against_tally, _mode_cell, _outcome
from _report_plots import _finish, plt

_SPEED_EPOCHS = 10  # the schedule whose trained models bench_trained_speed.py times
# The models that run the original's dense kernels (a mask keeps the zeros in them), at 1.0x.
_FULL_COST = {"baseline": "dense baseline", "synflow": "SynFlow masks (dense kernels)"}


def _trained_models(runs, epochs):
    """``{run id less its seed: (flags, [run ids])}`` of every grid's finished runs at ``epochs``.

    A grid entry's seeds train one set of widths; a run that several grids
    share counts once.
    """
    found = {}
    for path in sorted(GRIDS.glob("*.json")):
        for flags in _run.load_grid(path):
            name = _run.run_id(flags)
            if flags["epochs"] != epochs or name not in runs:
                continue
            ids = found.setdefault(_stem(name), (flags, []))[1]
            if name not in ids:
                ids.append(name)
    return found


def _plan_record(flags, plans):
    """The record in ``plans`` (``_load_plans()``) of a run's ``plan_file`` (None: no plan file or
    no record of it)."""
    if flags.get("plan_file") is None:
        return None
    return plans.get(pathlib.Path(flags["plan_file"]).stem)


def _stem(name):
    """A run id less its seed: ``resnet20-precrop_params-params0.1-modeexact-ep10``."""
    return name.rsplit("-s", 1)[0]


def _timed_speedup(stem, timed):
    """The median speedup that ``timed`` (``_load_speed()``'s ``runs``) holds of the seeds of the
    model ``stem`` (a run id less its seed), or None when none is timed."""
    found = [row["speedup"] for name, row in timed.items() if _stem(name) == stem]
    return statistics.median(found) if found else None


# Said of the speed figure's points placed by their plan's calibration, not the benchmark.
_CALIBRATED = "speedup from calibration timing"


def _speed_label(flags, record=None):
    """The speed figure's series of a model: PreCrop per mode (for a latency plan, ``record``: its
    plan's mode), PreConfig, or a full-cost one."""
    if flags["method"] in _FULL_COST:
        return _FULL_COST[flags["method"]]
    if record is not None:
        floor = ", floor at uniform" if record.get("floor_ratio") is not None else ""
        return f"PreCrop at a time budget ({record['mode']}{floor})"
    return _label({**flags, "method": "PreCrop" if flags["method"].startswith("precrop_") else "PreConfig"})


def _model_speedup(stem, flags, speed, plans):
    """``(speedup, series label)`` of one trained model, or ``(None, why)`` when it has none.

    The benchmark's measurement (``speed``) where it timed a seed; else, for a
    latency plan, 1 / the time ratio its calibration measured (``plans``),
    its series label then saying so; the full-cost models at 1.0x.
    """
    record = _plan_record(flags, plans)
    label = _speed_label(flags, record)
    if flags["method"] in _FULL_COST:
        return 1.0, label
    speedup = _timed_speedup(stem, (speed or {}).get("runs", {}))
    if speedup is not None:
        return speedup, label
    if record is not None:
        return 1 / record["calibration"]["measured"], f"{label}; {_CALIBRATED}"
    skipped = (speed or {}).get("skipped", {})
    return None, next((why for name, why in skipped.items() if _stem(name) == stem), "not timed yet")


def _speed_points(runs, speed, plans=None):
    """The trained models at ``_SPEED_EPOCHS`` epochs with their measured speedups, per network.

    A structured model (``_run.STRUCTURED``) is timed when ``speed`` has
    any of its seeds (they share their widths); a latency plan that it does
    not time takes its calibration's speedup from ``plans``
    (``_load_plans()``); SynFlow's masks and the dense baseline are at 1.0x;
    other masked methods are left out, and so are models pruned from a trained
    one (``init_model``: their own sections compare them; the series here are
    trained from scratch).

    Returns:
        ``(points, untimed)``: ``{network: {series: [(speedup, summary)]}}``
        and ``(run id less its seed, why)`` of the structured models without
        a speedup (why: the benchmark's reason to skip it, or "not timed yet").
    """
    points, untimed = {}, []
    for stem, (flags, ids) in _trained_models(runs, _SPEED_EPOCHS).items():
        if (flags["method"] not in _FULL_COST and flags["method"] not in _run.STRUCTURED) or \
                flags.get("init_model"):
            continue
        speedup, label = _model_speedup(stem, flags, speed, plans or {})
        if speedup is None:
            untimed.append((stem, label))
            continue
        series = points.setdefault(flags["model"], {}).setdefault(label, [])
        series.append((speedup, _summary({"results": [runs[i] for i in ids]})))
    return points, untimed


def _plot_speed(series, path, title, xlabel):
    """Accuracy (mean ± std) against measured speedup: uniform width scaling as a line through its
    points, every other series as markers alone."""
    fig, ax = plt.subplots(figsize=(10, 4.5))
    colors = plt.get_cmap("tab20").colors
    for i, (label, points) in enumerate(sorted(series.items())):
        points = sorted(points, key=lambda point: (point[0], point[1]["acc"]))
        ax.errorbar([x for x, _ in points], [s["acc"] for _, s in points], yerr=[s["std"] for _, s in points],
                    marker="osD^v<>ph*XP"[i % 12], color=colors[2 * i % 20 + i // 10 % 2], capsize=3,
                    label=label, linestyle="-" if "uniform" in label else "none")
    # From the original's 1.0x, so that points close together (one network's equal-time plans) look
    # as close as they are; the legend beside the points, not on them.
    low, high = ax.get_xlim()
    low = min(low, 0.9)
    ax.set_xlim(low, max(high, 1.1) + 0.05 * (high - low))
    _finish(fig, ax, xlabel, title, path, legend={"loc": "upper left", "bbox_to_anchor": (1.01, 1.0)})


def _speed(runs, speed, plans, figures):
    """Accuracy against measured speedup of every trained structured model, a figure per network (into
    the folder ``figures``), and which models are not timed (``speed``: ``_load_speed()``; ``plans``:
    ``_load_plans()``, the latency plans' calibration where the benchmark does not time them)."""
    lines = [f"**Accuracy against measured speedup** ({_SPEED_EPOCHS} epochs, every grid): each structured "
             "model's test accuracy (mean ± std over seeds) against its speedup measured by "
             "`python benchmarks/bench_trained_speed.py --model <network>` (`benchmarks/results/"
             "trained_speed_<network>.json`: "
             "each model re-planned from its flags, a latency plan loaded from its plan file, and timed "
             "interleaved with the original); the dense "
             "baseline and SynFlow's masks run the original's dense kernels, at 1.0x."]
    if speed is None:
        return lines + ["", "Not timed yet: run `python benchmarks/bench_trained_speed.py` on a quiet "
                        "machine.", ""]
    settings, machine = speed["settings"], speed["machine"]
    lines[0] += (f" Timed: TensorFlow inference at batch {settings['batch_size']}, {settings['rounds']} "
                 f"rounds, on {machine['cpu']} ({machine['usable_cpus']} CPUs); speedup = the original's "
                 "time / the model's in the same round, median over rounds.")
    points, untimed = _speed_points(runs, speed, plans)
    if any(_CALIBRATED in label for series in points.values() for label in series):
        lines[0] += (" Series marked *" + _CALIBRATED + "*"
                     " are latency plans (grids uniform_latency, latency_floor, latency_stream_floor and "
                     "uniform_mobilenet, sub-sections \"At equal measured time\" and \"MobileNetV2\") "
                     "that the benchmark has not timed yet: each sits at 1 / the time"
                     " ratio that `experiments/latency_plans.py` measured when it calibrated the plan "
                     "(`experiments/plans/*_plans.json`), another process at another time than the "
                     "benchmark's interleaved rounds, so those points compare only roughly.")
    for network, series in sorted(points.items()):
        if set(series) <= set(_FULL_COST.values()):
            continue  # none of its structured models is timed
        name = f"speed_{network}"
        _plot_speed(series, figures / f"{name}.png", f"{network}: accuracy vs measured speedup "
                    f"({_SPEED_EPOCHS} epochs)", f"measured speedup (batch {settings['batch_size']} "
                    "inference, original = 1)")
        lines += ["", f"![{name}](figures/{name}.png)"]
    if untimed:
        by_reason = _skipped([{"run": stem, "why": why} for stem, why in untimed])
        lines += ["", f"Not timed (run ids less the seed), by reason: {by_reason}."]
    return lines + [""]


def _time_plans(entries, plans):
    """The latency plans among ``entries`` (those with a ``plan_file``) by latency target:
    ``{target: {kind: (entry, record)}}``, targets in the grids' order, where kind is ``"uniform"``
    for a plan of ``mode="uniform"``, ``"floor"`` for one with a floor at the uniform widths
    (``floor=``; the record holds the factor) and ``"old auto"`` for what ``mode="auto"`` gave
    before the floor (the record holds the mode it picked).

    Returns:
        ``(targets, unrecorded)``: the above, and the labels of the entries
        whose plan file ``plans`` (``_load_plans()``) has no record of.
    """
    targets, unrecorded = {}, []
    for e in (e for e in entries if e["flags"].get("plan_file") is not None):  # not budgets' plans
        record = _plan_record(e["flags"], plans)
        if record is None:
            unrecorded.append(e["label"])
            continue
        targets.setdefault(record["target"], {})[_plan_kind(record)] = (e, record)
    return targets, unrecorded


def _plan_kind(record):
    """A latency plan's kind (``_time_plans``) by its record: mode, and floor if any."""
    if record["mode"] == "uniform":
        return "uniform"
    if record.get("floor_ratio") is None:
        return "old auto"
    return "stream floor" if record.get("floor_on") == "streams" else "floor"


def _reference(core, speed, target):
    """The PreCrop-FLOPs entry of ``core`` (not uniform: the baseline is judged apart) whose measured
    speedup (``speed``, ``_load_speed()``) is the smallest not below ``1 / target``:
    ``(entry, speedup, True)``; when none is that fast, the fastest timed one,
    ``(entry, speedup, False)``; None when none is timed."""
    timed = (speed or {}).get("runs", {})
    measured = [(x, e) for e in core if e["flags"]["method"] == "precrop_flops"
                and e["flags"].get("mode") != "uniform"
                and (x := _timed_speedup(_stem(_run.run_id(e["flags"])), timed)) is not None]
    if not measured:
        return None
    fast = [(x, e) for x, e in measured if x >= 1 / target]
    x, e = (min if fast else max)(fast or measured, key=lambda found: found[0])
    return e, x, bool(fast)


def _time_row(target, name, record, summary, verdict, timed=None):
    """One row of the equal-time table: a latency plan's calibrated time, its speedup (``timed``: the
    benchmark's, else the calibration's), costs and accuracy."""
    ratio = record["calibration"]["measured"]
    speedup = f"{1 / ratio:.2f}x" if timed is None else f"{timed:.2f}x (benchmark)"
    return (f"| {target:g} | {name} | {ratio:.3f} | {speedup} | {record['params_ratio']:.4f} | "
            f"{record['macs_ratio']:.4f} | {_mode_cell({name: summary}, name)} | {verdict} |")


def _reference_row(target, core, speed, where):
    """The equal-time table's row of the PreCrop-FLOPs plan of ``core`` (``where`` names whose)
    measured closest to ``1 / target`` without being slower (``_reference``), or of the fastest one,
    saying so, when none is that fast."""
    found = _reference(core, speed, target)
    if found is None:
        return f"| {target:g} | {where}'s PreCrop-FLOPs: none timed yet | | | | | | - |"
    entry, speedup, fast = found
    s = _summary(entry)
    name = f"{where}'s {entry['label']}, {_budget(entry['flags'])}"
    if not fast:
        name += f" (the fastest such plan; none measures {1 / target:.2f}x or more)"
    costs = "- | -" if s is None else f"{s['params_ratio']:.4f} | {s['macs_ratio']:.4f}"
    return (f"| {target:g} | {name} | - | {speedup:.2f}x (benchmark) | {costs} | "
            f"{_mode_cell({'core': s}, 'core')} | - |")


def _equal_time(entries, core, speed, plans, where="grid core"):
    """The latency plans of ``entries`` (one network's): at each latency target, the default plan and
    the floored one against the uniform one (the claims' rule, ``_against_cell``), and the
    PreCrop-FLOPs plan of ``core`` (``where`` names whose) of about that speed."""
    lines = [
        "**At equal measured time.** For each latency target (the plan's time / the original's), the "
        "plan `mode=\"auto\"` gave before issue 27's floor (the mode it picked in brackets), the uniform "
        "one and, where they were trained, exact mode floored at the uniform widths on every width "
        "(`floor=1.0`) and on the residual streams alone (`floor=1.0, floor_on=\"streams\"`); the row "
        "marked *auto now* is what `mode=\"auto\"` gives under a latency budget now: "
        "*time ratio* is what `experiments/latency_plans.py` measured when it calibrated the plan "
        "(`calibration.measured` in `experiments/plans/*_plans.json`; TensorFlow inference at batch 64), "
        "each plan alone; *speedup* is what `benchmarks/bench_trained_speed.py` measured, timing every "
        "trained model of the network interleaved with the original in one process (marked *benchmark*), "
        "else the calibration's inverse; params and MACs ratios are the plan's; accuracy is mean ± std "
        "(n seeds). *vs uniform* is the claims' rule (a lead beyond tol, the sum of the two stds, with "
        f"2+ seeds a side; fewer: pending). The last row of each target is {where}'s PreCrop-FLOPs plan "
        "with the smallest benchmark speedup not below 1 / target: a reference, not judged.",
        "",
        "| target | plan | time ratio | speedup | params ratio | MACs ratio | accuracy % "
        "| vs uniform |",
        "|---:|---|---:|---:|---:|---:|---|---|",
    ]
    targets, unrecorded = _time_plans(entries, plans)
    outcomes, improved = {"old auto": [], **{kind: [] for kind in _FLOORS}}, []
    for target, kinds in targets.items():
        modes = {kind: _summary(e) for kind, (e, _) in kinds.items()}
        improved += _floor_gains(target, modes)
        for kind, (e, record) in kinds.items():
            cell = ""
            if kind != "uniform":
                cell, winner = _against_cell(modes, kind)
                outcomes[kind].append(winner)
            timed = _timed_speedup(_stem(_run.run_id(e["flags"])), (speed or {}).get("runs", {}))
            lines.append(_time_row(target, _time_name(kind, record), record, modes[kind], cell, timed))
        lines.append(_reference_row(target, core, speed, where))
    if unrecorded:
        lines += ["", f"No calibration record in `experiments/plans/` for: {', '.join(unrecorded)}."]
    if not targets:
        return lines + ["", "Verdict: pending (no latency plan recorded yet).", ""]
    tallies = [_against_tally(kind, found) for kind, found in outcomes.items() if found]
    lines += ["", f"Verdict: {'; '.join(tallies)}."]
    if improved:
        lines += ["", f"Each floor against the old auto plan (the claims' rule): {'; '.join(improved)}."]
    return lines + [""]


_FLOORS = ("floor", "stream floor")  # the kinds of floored latency plans (_time_plans)


def _floor_gains(target, modes):
    """Each floored plan of ``modes`` (kind: summary) against the old auto plan at ``target``."""
    found = []
    for kind in (kind for kind in _FLOORS if kind in modes):
        row = _compare(modes[kind], modes.get("old auto"))
        said = _outcome(row, kind, "old auto")
        word = {None: "pending", "tie": "tie"}.get(said, f"{said} leads")
        found.append(f"{kind} at {target:g}: {word}, {_fmt_row(row)}")
    return found


# The kind of latency plan (_plan_kind) that mode="auto" makes now: exact mode with the residual
# streams floored at the uniform widths (modes.AUTO_LATENCY_FLOOR; the tests check it).
_AUTO_LATENCY_KIND = "stream floor"


# What each floored kind of latency plan (_FLOORS) holds at the uniform widths.
_FLOOR_HOLDS = {"floor": "no width", "stream floor": "no residual stream"}


def _time_name(kind, record):
    """The equal-time table's name of a latency plan of ``kind`` (``_time_plans``)."""
    if kind == "uniform":
        return "uniform"
    if kind in _FLOOR_HOLDS:
        now = " = auto now" if kind == _AUTO_LATENCY_KIND else ""
        return (f"{kind}{now} ({record['mode']}, {_FLOOR_HOLDS[kind]} below uniform's: factor "
                f"{record['floor_ratio']:.3f})")
    return f"auto before the floor ({record['mode']})"
