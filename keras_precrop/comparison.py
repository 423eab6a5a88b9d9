"""One call to compare the translation modes, uniform width scaling included.

The question a user asks first is whether a pruned layout beats what they
already have: one width factor for every layer (a width multiplier).
:func:`compare` plans the same budgets in each mode and lays the plans side by
side: parameters, MACs, predicted latency (with a latency model), the SynExp
objective, and, with ``measure=True``, the speedup each rebuilt model measures
on this machine (all models timed interleaved in one process).
"""

from __future__ import annotations

import dataclasses
import statistics

from keras_precrop import _json, _tables
from keras_precrop import latency as _latency
from keras_precrop.budget.modes import MODES
from keras_precrop.errors import ArgumentError
from keras_precrop.planning import Subject, apply_plan, plan

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
            else None) and ``speedup`` (the
            original's measured time over the plan's, or None unmeasured).
        timing: what was timed, or None.
    """

    model_name: str
    budgets: dict
    auto_mode: str
    rows: list
    timing: dict | None = None

    def row(self, mode):
        """The row of ``mode``."""
        return next(r for r in self.rows if r["mode"] == mode)

    def summary(self, print_fn=print):
        """Print one line per mode, ``model.summary()`` style."""
        head = ["Mode", "Params", "MACs", "Objective", "Width factor"]
        has_latency = any(r["latency"] is not None for r in self.rows)
        head += ["Latency (ms, predicted)"] * has_latency + ["Speedup (measured)"] * bool(self.timing)
        lines = [tuple(head)]
        for r in self.rows:
            cells = [r["mode"] + (" (auto)" if r["mode"] == self.auto_mode else ""),
                     f"{r['params']:,} ({r['params_ratio']:.1%})",
                     f"{r['macs']:,} ({r['macs_ratio']:.1%})", f"{r['objective']:.2f}",
                     _factor(r)]
            if has_latency:
                cells.append("" if r["latency"] is None else f"{r['latency'] * 1e3:.3f}")
            if self.timing:
                cells.append(f"{r['speedup']:.2f}x")
            lines.append(tuple(cells))
        given = ", ".join(f"{k}={v}" for k, v in self.budgets.items())
        print_fn(f'Modes compared: "{self.model_name}" at {given}')
        for line in _tables.table(lines):
            print_fn(line)
        if self.timing:
            t = self.timing
            print_fn(f"Measured: {t['runtime']}, batch {t['batch_size']}, "
                     f"{'training step' if t['training'] else 'inference'}, median of "
                     f"{t['rounds']} interleaved rounds; original {t['original_ms']:.3f} ms")


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
        verbose: 1 prints timing progress, 0 is silent.
        **options: further :func:`keras_precrop.plan` options (``latency``,
            ``latency_model``, ``max_params``, ``max_macs``, ``round_to``,
            ``min_channels``, ``ignore``, ``residual``, ``upper``); a latency
            model is fitted or read once and shared by every mode.

    Returns:
        A :class:`Comparison`.
    """
    _latency.timing.check_settings(batch_size, runtime, False)  # measured or not: 0 is no batch
    _latency.timing.check_rounds(rounds)
    asked, modes = modes, [modes] if isinstance(modes, str) else list(modes)  # not "e", "x", ...
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        raise ArgumentError(f"{{modes}} must name modes among {sorted(MODES)}.", modes=asked)
    if "mode" in options:
        raise ArgumentError("{mode} is what compare varies; give modes=[...] instead.",
                            mode=options["mode"])
    if options.get("latency") is not None or options.get("latency_model") is not None:
        options["latency_model"] = _latency.resolve(
            options.get("latency_model"), model, residual=options.get("residual", "prefix"),
            ignore=tuple(options.get("ignore", ())))
        options.setdefault("calibrate", 0)
    subject = Subject(model)  # one walk of the model for every plan and rebuild
    plans = {m: plan(subject, params, flops, mode=m, **options) for m in modes}
    auto = _auto_row(plans, plan(subject, params, flops, **options))
    given = {k: v for k, v in (("params", params), ("flops", flops), *options.items())
             if k in ("params", "flops", "latency", "max_params", "max_macs") and v is not None}
    rows = [_row(m, p) for m, p in plans.items()]
    timing = None
    if measure:
        lm = options.get("latency_model")
        settings = (dict(batch_size=lm.batch_size, runtime=lm.runtime, training=lm.training)
                    if lm is not None else dict(batch_size=batch_size, runtime=runtime,
                                                training=False))
        timing = _measure(subject, plans, rows, settings, rounds, verbose)
    return Comparison(model.name, given, auto, rows, timing)


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
            "floor_on": p.solver.get("floor_on"), "speedup": None}


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
    speedups."""
    models = {"original": subject.model, **{mode: apply_plan(subject, p) for mode, p in plans.items()}}
    log = _latency.timing.logger(verbose)
    fns = {name: _latency.runner(m, **settings) for name, m in models.items()}
    samples = _latency.interleaved(fns, rounds, log=log)
    seconds = {name: statistics.median(s) for name, s in samples.items()}
    for r in rows:
        r["speedup"] = seconds["original"] / seconds[r["mode"]]
    return {**settings, "rounds": rounds, "original_ms": seconds["original"] * 1e3,
            "seconds": seconds}
