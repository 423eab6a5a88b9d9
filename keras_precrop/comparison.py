"""One call to compare the translation modes, uniform width scaling included.

The question a user asks first is whether a pruned layout beats what they
already have: one width factor for every layer (a width multiplier).
:func:`compare` plans the same budgets in each mode and lays the plans side by
side: parameters, MACs, predicted latency (with a latency model), the SynExp
objective, and, with ``measure=True``, the speedup each rebuilt model measures
on this machine (all models timed interleaved in one process, the spread over
rounds beside the median). It closes with a recommendation: the fastest plan
measured within the budgets, or, unmeasured, ``mode="auto"``'s pick with the
evidence behind it and what the other rows do better.
"""

from __future__ import annotations

import dataclasses
import statistics
import textwrap

from keras_precrop import _json, _tables
from keras_precrop import latency as _latency
from keras_precrop.budget import kinds as _kinds
from keras_precrop.budget.modes import MODES
from keras_precrop.errors import ArgumentError
from keras_precrop.planning import apply_plan, plan
from keras_precrop.subject import Subject

DEFAULT_MODES = ("exact", "layerwise", "uniform")


@dataclasses.dataclass
class Comparison(_json.JsonDataclass):
    """Plans of one model under the same budgets, one row per mode.

    Attributes:
        model_name: the model compared.
        budgets: the budget arguments given (``{"flops": 0.5}``).
        auto_mode: the row ``mode="auto"``'s plan is: its mode, or, where
            that plan is none of the modes' (under a latency budget auto
            floors exact mode's residual streams at the uniform widths), a
            row of its own named by mode and floor (``"exact, floor=1.0 on
            streams"``).
        rows: per mode: ``mode``, ``params``, ``macs`` (and their ratios of the
            original), ``latency`` (predicted seconds per batch, or None),
            ``objective`` (SynExp, higher keeps more), ``uniform_ratio``
            (uniform mode's width factor, else None), ``floor_ratio`` (the
            factor a floor holds every width above, else None), ``floor_on``
            (``"streams"`` where that floor holds the residual streams alone,
            else None), ``within_budgets`` (the plan meets every budget:
            ``mode="paper"`` may not) and ``speedup``, ``speedup_min``,
            ``speedup_max`` (the original's measured time over the plan's in
            each interleaved round: median, least and most; None unmeasured).
        timing: what was timed, or None.
        recommendation: ``{"mode", "basis", "reason"}``: the row to use for
            these budgets (``basis`` ``"measured"``: the fastest measured
            within the budgets; ``"tie"``: ``mode="auto"``'s pick, measured
            level with the fastest (their spreads over the rounds overlap);
            ``"auto"``: ``mode="auto"``'s pick, unmeasured) and why, in words.
            None in comparisons saved before it was made.
    """

    model_name: str
    budgets: dict
    auto_mode: str
    rows: list
    timing: dict | None = None
    recommendation: dict | None = None

    def row(self, mode):
        """The row of ``mode``."""
        return next(r for r in self.rows if r["mode"] == mode)

    def summary(self, print_fn=print):
        """Print one line per mode, ``model.summary()`` style, what the objective is, what was
        timed, and the recommendation."""
        head = ["Mode", "Params", "MACs", "Objective", "Width factor"]
        has_latency = any(r["latency"] is not None for r in self.rows)
        head += ["Latency (ms, predicted)"] * has_latency
        if self.timing:
            head += [f"Speedup min-max ({self.timing['rounds']} rounds)", "Speedup (median)"]
        lines = [tuple(head)]
        for r in self.rows:
            cells = [r["mode"] + (" (auto)" if r["mode"] == self.auto_mode else ""),
                     f"{r['params']:,} ({r['params_ratio']:.1%})",
                     f"{r['macs']:,} ({r['macs_ratio']:.1%})", f"{r['objective']:.2f}",
                     _factor(r)]
            if has_latency:
                cells.append("" if r["latency"] is None else f"{r['latency'] * 1e3:.3f}")
            if self.timing:
                spread = (f"{r['speedup_min']:.2f}-{r['speedup_max']:.2f}x"
                          if r.get("speedup_min") is not None else "-")  # saved before spreads were
                cells += [spread, f"{r['speedup']:.2f}x"]
            lines.append(tuple(cells))
        given = ", ".join(f"{k}={v}" for k, v in self.budgets.items())
        print_fn(f'Modes compared: "{self.model_name}" at {given}')
        notes = [OBJECTIVE_NOTE]
        if self.timing:
            t = self.timing
            notes.append(f"Measured: {t['runtime']}, batch {t['batch_size']}, "
                         f"{'training step' if t['training'] else 'inference'}, {t['rounds']} "
                         "interleaved rounds; speedup: the original's time over the plan's in each "
                         f"round; original {t['original_ms']:.3f} ms (median)")
        if self.recommendation:
            notes.append(f"Recommended: {self.recommendation['mode']}. {self.recommendation['reason']}")
        for line in _tables.table(lines) + [line for note in notes for line in _wrap(note)]:
            print_fn(line)


# What the table's Objective column is (cm.objective of the plan's widths), printed under it.
OBJECTIVE_NOTE = (
    "Objective: the SynExp objective, sum over the prunable kernels of ln(density), a kernel's "
    "density being the share of its input channels kept times the share of its output channels "
    "kept (depthwise: of its channels; a concatenated input: its parts' width-weighted mean); 0 "
    "is the original, higher keeps more of its widths. Exact mode maximizes it; it predicts "
    "neither accuracy nor speed.")


def _wrap(text):
    """``text`` as lines of at most 100 characters, the later ones indented."""
    return textwrap.wrap(text, 100, subsequent_indent="  ", break_on_hyphens=False)


def compare(model, params=None, flops=None, *, modes=DEFAULT_MODES, measure=False, rounds=7,
            batch_size=64, runtime="tf", verbose=1, **options):
    """Plan the same budgets in several modes and compare the plans.

    Args:
        model: a functional or Sequential Keras model with a defined input shape.
        params: parameter budget ratio, as in :func:`keras_precrop.plan`.
        flops: FLOP budget ratio, as in :func:`keras_precrop.plan`.
        modes: the translation modes to compare (default exact, layerwise,
            uniform; one mode may be given as a string); ``mode="auto"``'s
            pick is marked in the table, and added as a row when it is none
            of them (``Comparison.auto_mode``).
        measure: also time the original and every plan's rebuilt model on
            this machine, interleaved, and report the speedups.
        rounds: interleaved timing rounds when measuring.
        batch_size: the batch size to time at (a latency model's own
            settings take precedence when one is given or fitted).
        runtime: the runtime to time on (likewise).
        verbose: 1 prints timing progress (``timing plans: round k/n``), 0 is silent.
        **options: further :func:`keras_precrop.plan` options (``latency``,
            ``latency_model``, ``max_params``, ``max_macs``, ``round_to``,
            ``min_channels``, ``ignore``, ``residual``, ``upper``); a latency
            model is fitted or read once and shared by every mode.

    Returns:
        A :class:`Comparison`, with its ``recommendation``: measured, the
        fastest plan within the budgets; else ``mode="auto"``'s pick, and why.
    """
    _latency.timing.check_settings(batch_size, runtime, False)  # measured or not: 0 is no batch
    _latency.timing.check_rounds(rounds)
    asked = modes
    if isinstance(modes, str) or not isinstance(modes, (list, tuple, set, frozenset)):
        modes = [modes]  # a string is one mode, not "e", "x", ...; anything else is named below
    modes = list(modes)
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        raise ArgumentError(f"{{modes}} must name modes among {sorted(MODES)}.", modes=asked)
    if "mode" in options:
        raise ArgumentError("{mode} is what compare varies; give modes=[...] instead.",
                            mode=options["mode"])
    subject = Subject(model)  # one walk of the model for every plan and rebuild
    if options.get("latency") is not None or options.get("latency_model") is not None:
        rules = {"residual": options.get("residual", "prefix"),
                 "attention": options.get("attention", "heads")}
        prof = subject.profile(options.get("ignore", ()), rules["residual"], {},
                               rules["attention"])  # "auto" resolved
        options["latency_model"] = _latency.resolve(
            options.get("latency_model"), model, **rules, ignore=tuple(prof.ignore), graph=prof.graph)
        options.setdefault("calibrate", 0)
    plans = {m: plan(subject, params, flops, mode=m, **options) for m in modes}
    auto_plan = plan(subject, params, flops, **options)
    auto = _auto_row(plans, auto_plan)
    given = {k: v for k, v in (("params", params), ("flops", flops), *options.items())
             if k in _kinds.arguments() and v is not None}
    rows = [_row(m, p) for m, p in plans.items()]
    timing = None
    if measure:
        lm = options.get("latency_model")
        settings = (dict(batch_size=lm.batch_size, runtime=lm.runtime, training=lm.training)
                    if lm is not None else dict(batch_size=batch_size, runtime=runtime,
                                                training=False))
        timing = _measure(subject, plans, rows, settings, rounds, verbose)
    pick = next(r for r in rows if r["mode"] == auto)
    why = auto_plan.solver["auto_mode"]
    recommendation = _by_speed(rows, pick, why) if measure else _by_auto(rows, pick, why)
    return Comparison(model.name, given, auto, rows, timing, recommendation)


def _auto_row(plans, auto):
    """The name of the row of ``auto`` (``mode="auto"``'s plan) in ``plans``, which gains it
    under its mode and floor when no mode planned the same widths."""
    same = [m for m, p in plans.items() if p.widths == auto.widths]
    if same:
        return same[0]
    name = auto.mode_label
    plans[name] = auto
    return name


def _row(mode, p):
    """The table row of plan ``p``."""
    return {"mode": mode, "params": p.params, "params_ratio": p.params / p.original["params"],
            "macs": p.macs, "macs_ratio": p.macs / p.original["macs"], "latency": p.latency,
            "objective": float(p.solver["objective"]),
            "uniform_ratio": p.solver.get("uniform_ratio"), "floor_ratio": p.solver.get("floor_ratio"),
            "floor_on": p.solver.get("floor_on"), "within_budgets": _within_budgets(p),
            "speedup": None, "speedup_min": None, "speedup_max": None}


def _within_budgets(p):
    """Whether plan ``p`` meets its budgets: params and MACs exactly, a latency budget as
    predicted (or as measured, where the plan was calibrated by measuring)."""
    calibrated = "latency_calibration" in p.solver
    return all(p.predicted[row] <= budget * (1 + 1e-9) for row, budget in p.budgets.items()
               if budget is not None and not (calibrated and row == _latency.ROW))


def _factor(row):
    """The width-factor cell: uniform's factor, or ``>= f`` where a floor holds every width above
    ``f`` times its original (``>= f (streams)`` where it holds the residual streams alone)."""
    if row["uniform_ratio"] is not None:
        return f"{row['uniform_ratio']:.3f}"
    if row.get("floor_ratio") is None:
        return ""
    return f">= {row['floor_ratio']:.3f}" + (" (streams)" if row.get("floor_on") == "streams" else "")


def _measure(subject, plans, rows, settings, rounds, verbose):
    """Times the original (``subject.model``) and each plan's model interleaved; fills the rows'
    speedups: the original's time over the plan's in each round (both timed in it), median,
    least and most."""
    models = {"original": subject.model, **{mode: apply_plan(subject, p) for mode, p in plans.items()}}
    log = _latency.timing.logger(verbose, "timing plans")  # no latency model is fitted here
    fns = {name: _latency.runner(m, **settings) for name, m in models.items()}
    samples = _latency.interleaved(fns, rounds, log=log)
    seconds = {name: statistics.median(s) for name, s in samples.items()}
    for r in rows:
        ratios = [o / t for o, t in zip(samples["original"], samples[r["mode"]])]
        r.update(speedup=statistics.median(ratios), speedup_min=min(ratios), speedup_max=max(ratios))
    return {**settings, "rounds": rounds, "original_ms": seconds["original"] * 1e3,
            "seconds": seconds}


def _speed(row):
    """A row's measured speedup and its spread: ``1.23x [1.20-1.27x]``."""
    return f"{row['speedup']:.2f}x [{row['speedup_min']:.2f}-{row['speedup_max']:.2f}x]"


def _by_speed(rows, pick, why):
    """The recommendation by measured speed: the row within the budgets with the highest median
    speedup, and how it relates to auto's pick (``pick``, picked for reason ``why``).

    Where auto's pick is not the fastest but its spread over the rounds overlaps the fastest's,
    the two are a tie (the order may be noise, and two runs of ``--measure`` can order them
    apart): then auto's pick is recommended, for what its rule follows (what trained best).
    """
    within = [r for r in rows if r["within_budgets"]]  # auto's plan always is
    best = max(within, key=lambda r: r["speedup"])
    tied = [r for r in within if r is not best and r["speedup_max"] >= best["speedup_min"]]
    if pick is not best and pick in tied:
        notes = [f"Measured, {best['mode']} {_speed(best)} and {pick['mode']} {_speed(pick)} "
                 "(median [min-max] over the rounds) tie: their spreads overlap, so which is "
                 f'faster may be noise. Of the two, mode="auto"\'s pick is recommended: {why}.']
        chosen, basis = pick, "tie"
    else:
        notes = [f"The fastest measured plan within the budgets: {_speed(best)}, median [min-max] "
                 "over the rounds."]
        runner_up = max(tied, key=lambda r: r["speedup"], default=None)
        if runner_up is not None:
            notes.append(f"{runner_up['mode']}'s {_speed(runner_up)} overlaps it: the order may be "
                         "noise; more rounds tell.")
        if best is pick:
            notes.append('It is also mode="auto"\'s pick.')
        else:
            notes.append(f'mode="auto" picks {pick["mode"]} ({_speed(pick)}) for another reason: '
                         f"{why}.")
        chosen, basis = best, "measured"
    if best["speedup"] < 1:
        notes.append(f"Even {'the fastest' if basis == 'tie' else 'it'} runs slower than the "
                     "original here: these budgets buy no speed on this machine; a latency budget "
                     "(latency=) asks for time.")
    over = [r["mode"] for r in rows if not r["within_budgets"] and r["speedup"] > best["speedup"]]
    if over:
        notes.append(f"{', '.join(over)} measured faster but exceed the budgets.")
    return {"mode": chosen["mode"], "basis": basis, "reason": " ".join(notes)}


def _by_auto(rows, pick, why):
    """The recommendation unmeasured: auto's pick (``pick``, for reason ``why``), and where
    another row scores a higher objective or predicts less latency, why auto keeps its pick."""
    notes = [f'mode="auto" picks it for these budgets: {why}.']
    within = [r for r in rows if r["within_budgets"]]  # auto's plan always is
    best = max(within, key=lambda r: r["objective"])
    if best["objective"] > pick["objective"] + 0.005:  # higher as printed
        notes.append(f"{best['mode']} scores a higher objective ({best['objective']:.2f} vs "
                     f"{pick['objective']:.2f}), but auto's rule follows that evidence, not the "
                     "objective, a proxy.")
    over = [r["mode"] for r in rows if not r["within_budgets"]]
    if over:
        notes.append(f"{', '.join(over)} exceed{'s' * (len(over) == 1)} the budgets and "
                     f"{'is' if len(over) == 1 else 'are'} not compared.")
    predicted = [r for r in within if r["latency"] is not None]
    fastest = min(predicted, key=lambda r: r["latency"], default=None)
    if fastest is not None and fastest["latency"] < pick["latency"] * 0.99:  # not a rounding's worth
        notes.append(f"{fastest['mode']} predicts {1 - fastest['latency'] / pick['latency']:.0%} less "
                     f"latency ({fastest['latency'] * 1e3:.3f} vs {pick['latency'] * 1e3:.3f} ms); "
                     "auto does not pick by speed.")
    notes.append("Nothing was timed: measure=True (--measure) times every plan here and "
                 "recommends the fastest.")
    return {"mode": pick["mode"], "basis": "auto", "reason": " ".join(notes)}
