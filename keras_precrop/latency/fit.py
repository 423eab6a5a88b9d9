"""Measured latency models: the time a model takes, as one more budget row.

MACs are not time. On a CPU, batch norm, activations and padding (linear in
channel width) take about half of a CNN's time, and kernels that work on
blocks of channels waste the rest of a partly filled block. This module
measures that instead of assuming it: :func:`latency_model` times the model
and width-scaled copies of it (built with the library's rebuild) on the
current machine and fits, per layer class, a cost that is linear in
features the cost model already has:

* ``macs:<class>``: the layer's MAC terms (bilinear in widths),
* ``out:<class>`` / ``in:<class>``: output / input activation elements
  (spatial size x width: linear in widths),
* ``const``: a constant per layer call,

optionally next to a copy of each with the free widths rounded up to a
block size (e.g. 16: the time a kernel spends on a partly filled block of
channels). Every feature is a sum of ``mult * w_a * w_b`` terms over the
width variables, so the fitted time is a :class:`~keras_precrop.costs.CostRow`:
the solver and the plan's integer repair treat it like params and MACs
(``plan(latency=0.5)``).

Timings are interleaved (round-robin over the variants, the start rotated
each round) and summarized by medians, so a load spike hits every variant
alike. The layer classes' coefficients are fitted by non-negative least
squares on relative errors; the block size and a small ridge penalty are
chosen by leave-one-out cross-validation, and the error is reported on
variants held out of the fit.

Plans are not random variants: a latency budget shrinks the layers that
the model calls expensive far more than others (resnet20's first stage to
a third of its width while the last keeps all of it), and the planner
finds the widths where the fit errs on the cheap side. A fit on random
scalings alone mispredicted such plans by 15-25% (resnet20 too slow,
MobileNetV2 too fast). Refinement rounds therefore plan with the current
fit at a few latency budgets, time those plans too and fit again on all
variants.
"""

from __future__ import annotations

import math
import os
import statistics
import time
import warnings

import keras
import numpy as np
from scipy import optimize

from keras_precrop.budget import costs as _costs
from keras_precrop.budget.modes import solve
from keras_precrop.errors import ArgumentError, InfeasibleBudgetError
from keras_precrop.graph import walker as _graph
from keras_precrop.graph.rebuild import rebuild
from keras_precrop.latency import runtimes as _runtimes
from keras_precrop.latency import timing as _timing
from keras_precrop.latency.features import Features, signature
from keras_precrop.latency.model import (
    FIT_REMEDY,
    MIN_HELD_OUT,
    ROW,
    LatencyModel,
    UnusableLatencyModel,
)

_RIDGE = (0.0, 1e-4, 1e-3, 1e-2)  # candidate penalties on the columns' time shares
_SAME_SCORE = 1e-6  # cross-validated errors closer than this tie (the simpler fit wins)
NOT_MONOTONE = 0.1  # a narrower uniform variant timed this much slower than a wider one: not monotone


class LatencyModelWarning(UserWarning):
    """A latency model whose runtime timed a narrower copy of the model slower than a wider
    one: its plans may measure far off their prediction here."""


def _variant_widths(cm, count, scale_range, seed, round_to=1):
    """Integer widths of the variants to time, with labels.

    The original, uniform scalings of every free width down to
    ``scale_range[0]``, then random ones: a random level per variant times a
    log-normal factor per width, clipped to ``scale_range``; each free width
    rounded to a multiple of ``round_to`` (at least one multiple, at most the
    original width). Views and writers of a residual stream are clipped to
    the stream's width.
    """
    lo, hi = scale_range
    rng = np.random.default_rng(seed)
    uniform = [s for s in (0.75, 0.5, 0.25) if lo <= s < hi][: max(0, count - 3)]
    labels = ["original"] + [f"x{s}" for s in uniform]
    factors = [np.full(len(cm.widths), s) for s in [1.0] + uniform]
    for i in range(count - len(labels)):
        level = rng.uniform(lo, hi)
        factors.append(np.clip(level * rng.lognormal(0.0, 0.35, len(cm.widths)), lo, hi))
        labels.append(f"random{i + 1}")
    step = np.where(cm.unrounded, 1, round_to)  # heads step by one head (and fixed widths stay)
    scaled = np.round(np.array(factors) * cm.widths / step) * step
    widths = np.where(cm.fixed, cm.widths, np.minimum(cm.widths, np.maximum(step, scaled)))
    widths = np.maximum(np.maximum(1, widths), np.where(cm.fixed, 0, cm.held_widths()))
    bound = np.where(cm.bound >= 0, cm.bound, np.arange(len(cm.bound)))  # kept-whole writers held
    for _ in range(len(bound)):  # a bound may itself be bounded
        widths = np.minimum(widths, widths[:, bound])
    return labels, widths


def _nnls(A, ridge):
    """Non-negative least squares of ``A beta = 1`` with a ridge on ``beta``."""
    k = A.shape[1]
    lhs = np.vstack([A, math.sqrt(ridge) * np.eye(k)]) if ridge else A
    rhs = np.concatenate([np.ones(len(A)), np.zeros(k if ridge else 0)])
    return optimize.nnls(lhs, rhs, maxiter=50 * k)[0]


def _fit(X, t, ridge):
    """Coefficients (seconds per feature unit) minimizing relative error, beta >= 0."""
    A = X / t[:, None]
    scale = np.abs(A).max(axis=0)
    scale = np.where(scale > 0, scale, 1.0)
    return _nnls(A / scale, ridge) / scale


def _relative_errors(X, t, beta):
    return np.abs(X @ beta - t) / t


def _choose(design, t, blocks):
    """Block size and ridge with the smallest leave-one-out RMS relative error.

    Candidates are tried from the simplest (smallest block, then ridge);
    a later one must lower the error by more than ``_SAME_SCORE``.
    """
    best = None
    for block in blocks:
        X = design(block)
        for ridge in _RIDGE:
            errors = []
            for i in range(len(t)):
                keep = np.arange(len(t)) != i
                errors.append(_relative_errors(X[i:i + 1], t[i:i + 1], _fit(X[keep], t[keep],
                                                                            ridge))[0])
            score = math.sqrt(np.mean(np.square(errors)))
            if best is None or score < best[0] - _SAME_SCORE:
                best = (score, block, ridge)
    return best


def solve_plan(prof, cm, budgets, round_to=1):
    """The default ``planner`` of :func:`latency_model`: ``mode="auto"`` widths of the budget wing.

    The same widths as ``kp.plan(model, latency=r, latency_model=...,
    round_to=round_to)`` with its other defaults, without going through the
    planning floor.
    """
    return solve(prof, cm, budgets, round_to=round_to)[0]


def _not_monotone(labels, seconds):
    """The uniform variants (nested: each narrower in every width) timed slower than a wider
    one by more than :data:`NOT_MONOTONE`: ``{"narrower", "wider", "ratio"}`` each, the ratio
    being the narrower's time over the wider's."""
    uniform = [(label, s) for label, s in zip(labels, seconds)
               if label == "original" or (label.startswith("x") and "/" not in label)]
    found = []
    for i, (wide, t_wide) in enumerate(uniform):
        for narrow, t_narrow in uniform[i + 1:]:
            if t_narrow > t_wide * (1 + NOT_MONOTONE):
                found.append({"narrower": narrow, "wider": wide, "ratio": float(t_narrow / t_wide)})
    return found


def _warn_not_monotone(result):
    """Warns (:class:`LatencyModelWarning`) where ``result``'s runtime timed a narrower uniform
    variant slower than a wider one, naming the runtime, the variants and the likely cause."""
    found = result.error.get("not_monotone") or []
    if not found:
        return
    pairs = ", ".join(f"{p['narrower']} at {p['ratio']:.2f}x the time of {p['wider']}"
                      for p in found[:3])
    warnings.warn(LatencyModelWarning(
        f"Runtime {result.runtime!r} timed narrower copies of {result.model_name!r} slower than "
        f"wider ones ({pairs}; {result.device()}): its time does not fall with width here, so "
        "plans may measure far off their prediction and calibration may not converge. "
        f"{_runtimes.not_monotone(result.runtime)}."), stacklevel=3)


def _plan_widths(planner, prof, preliminary, ratios, known, log):
    """Widths the ``planner`` makes at each latency ratio under a preliminary latency model.

    Ratios whose plan is infeasible or repeats ``known`` widths (or another
    plan) are skipped.
    """
    cm = prof.cost.with_rows([preliminary.cost_row(prof.graph)])
    original = cm.totals(cm.widths)[cm.row_names.index(ROW)]
    out = {}
    for ratio in ratios:
        try:
            widths = np.asarray(planner(prof, cm, {ROW: ratio * original}), dtype=np.float64)
        except InfeasibleBudgetError as err:
            log(f"refinement: no plan at latency={ratio} ({err})")
            continue
        if not any(np.array_equal(widths, w) for w in [*known, *out.values()]):
            out[f"latency{ratio}"] = widths
    return out


def _checked_times(seconds, labels):
    t = np.array([float(seconds[label]) for label in labels])
    if not np.all(np.isfinite(t) & (t > 0)):
        raise ValueError(f"the timer returned non-positive or non-finite times: {seconds}")
    return t


def latency_model(model, batch_size=32, runtime="tf", training=False, *, variants=20, rounds=5,
                  holdout=0.25, blocks=(1, 8, 16), scale_range=(0.25, 1.0),
                  refine=(0.3, 0.5, 0.7), refine_rounds=2, residual="prefix", ignore=(), seed=0,
                  verbose=1, timer=None, planner=None, graph=None, round_to=1, attention="heads"):
    """Measure how long ``model`` and width-scaled copies of it take; fit a latency model.

    Builds ``variants`` copies of the model with other channel widths (the
    original, uniform scalings and random per-variable scalings within
    ``scale_range``), times them interleaved on this machine, and fits per
    layer class the time per MAC, per output and input activation element
    and per layer call (non-negative least squares on relative errors; next
    to each feature a copy with the free widths rounded up to the block
    size in ``blocks`` that cross-validates best). Then ``refine_rounds``
    refinement rounds: plans at the latency budgets ``refine`` made with the
    current fit are timed too (with the original and the uniform scalings
    again, which put the rounds on one scale), and the model is fitted again
    on all variants. Random variants held out of every fit measure its
    error; the last round's plans, predicted before they were timed,
    measure its error where plans live. Where the runtime times a narrower
    uniform copy more than 10% slower than a wider one (ONNX Runtime's
    blocked convolutions at widths off their block, PyTorch's spinning
    threads on a loaded machine), a :class:`LatencyModelWarning` names the
    runtime, the copies and the remedy, and ``error["not_monotone"]`` lists them.

    Defaults take about a minute for resnet20 and three for MobileNetV2 at
    224x224 on a quiet 2-core CPU; fewer ``variants`` and ``rounds`` are
    faster and less accurate.

    Args:
        model: a functional or Sequential Keras model with one input of a
            fixed shape.
        batch_size: examples per timed call (the latency is per batch).
        runtime: where to time: a name of the runtime table
            (:data:`~keras_precrop.latency.runtimes.RUNTIMES`; the guide's
            table of runtimes says what each runs and needs). ``"tf"`` is the
            Keras backend's own compiled step; ``"torch_compile"``,
            ``"litert"``, ``"onnx"``, their int8 forms and any runtime
            :func:`~keras_precrop.latency.runtimes.register_runtime` added
            are the others. The latency model records the runtime by its
            name in this process (``"tf"`` under JAX is ``"jax"``, under torch
            ``"torch"``; ``"tflite"`` is ``"litert"``) and the device it runs
            on here (:meth:`LatencyModel.device`); plans refuse it on another
            kind of device.
        training: time a training step (forward, backward, SGD update)
            instead of inference.
        variants: number of models timed in the first round, the original
            included (>= 6).
        rounds: interleaved timing rounds (medians over rounds).
        holdout: share of the random variants held out of the fit to
            measure its error (at least one; the error is reported from 3
            or more, else it is None: ``variants=16`` holds out 3).
        blocks: candidate block sizes of the rounded copies of the features
            (1: none).
        scale_range: smallest and largest width factor of the random
            variants.
        refine: latency budgets (ratios of the original's predicted time)
            of the refinement rounds' plans; ``()`` skips refinement. Plans
            the current fit cannot make (infeasible) are left out.
        refine_rounds: refinement rounds (0: none).
        residual: as in :func:`keras_precrop.plan`; with ``ignore``, it
            decides which widths the variants vary.
        ignore: as in :func:`keras_precrop.plan` (``"auto"`` included: the layers it keeps
            whole are what the latency model records).
        seed: seed of the random variants.
        verbose: 1 prints progress (which variant is being prepared, timing
            rounds, the fit's error), 0 is silent.
        timer: replaces the clock: ``timer({label: keras.Model}) -> {label:
            seconds per call}`` (e.g. for tests or another device); the
            latency model's device is then unknown (None).
        planner: makes the refinement rounds' plans:
            ``planner(profile, cost_model, {"latency": seconds}) -> widths``,
            the cost model carrying the preliminary fit's latency row;
            default :func:`solve_plan` (the budget wing's ``mode="auto"``).
        graph: the walk of ``model`` with these ``residual`` and ``ignore``
            (``kp.plan`` hands down the one it made); None walks the model here.
        round_to: every free width of the variants and of the refinement
            plans is a multiple of this, as the plan's ``round_to=`` makes them
            (``kp.plan`` hands its own down): a runtime whose kernels need
            channel multiples is then fitted on the widths its plans take.
        attention: as in :func:`keras_precrop.plan` (what attention layers'
            widths count: whole heads, or each head's dimension).

    Returns:
        A :class:`LatencyModel`.
    """
    _check_fit_options(batch_size, runtime, training, variants, rounds, holdout, scale_range,
                       blocks, refine, refine_rounds, round_to)
    log = _timing.logger(verbose)
    start = time.perf_counter()
    _timing.input_shape(model)
    if graph is None:  # ignore="auto" resolved into names, which the latency model records
        graph, ignore, _ = _costs.resolve_ignore(model, ignore, residual, attention)
    graph = _walk(model, graph, (residual, attention), ignore)
    if timer is None:
        _runtimes.check_installed(runtime)  # before building the variants
    device = None if timer else _timing.device_of(runtime)
    measure = timer or _timing.timer_of(batch_size, runtime, training, rounds, log, device)
    fitter = _Fitter(model, graph, measure, blocks, log,
                     dict(batch_size=int(batch_size), runtime=_timing.runtime_of(runtime).name,
                          training=bool(training), residual=residual, attention=attention,
                          ignore=_graph.ignore_names(ignore), round_to=int(round_to),
                          **_timed_on(model, device)))
    fitter.time_variants(variants, scale_range, seed, holdout)
    planner = planner or (lambda prof, cm, budgets: solve_plan(prof, cm, budgets, round_to))
    for k in range(1, refine_rounds + 1 if refine else 1):
        if not fitter.refine(k, refine, planner):
            break
    result = fitter.result(time.perf_counter() - start)
    _warn_not_monotone(result)
    plans_text = (f"; on its last plans before refitting median "
                  f"{result.error['plans_median']:.1%}, worst {result.error['plans_worst']:.1%}"
                  if result.error["plans_median"] is not None else "")
    log(f"fitted in {result.fit_seconds:.0f} s: {result.held_out_text()}{plans_text} "
        f"(block {result.block})")
    return result


def _walk(model, graph, rules, ignore):
    """The walk of ``model`` under ``rules`` (``(residual, attention)``) and ``ignore``:
    ``graph``, the caller's, once it is seen to be one; None: a walk made here.

    Raises:
        ArgumentError: for a walk of another model, or under other settings.
    """
    ignore, (residual, attention) = _graph.ignore_names(ignore), rules
    if graph is None:
        return _graph.walk(model, ignore=ignore, residual=residual, attention=attention)
    fixed = {n for r in graph.layers if r.ignored for n in (r.path, graph.traced.name(r.layer))}
    if graph.model is not model or (graph.residual, graph.attention) != rules or not set(ignore) <= fixed:
        raise ArgumentError(f"{{graph:=}} is a walk of model {graph.model.name!r} with residual="
                            f"{graph.residual!r}, attention={graph.attention!r}, not of model "
                            f"{model.name!r} with residual={residual!r}, attention={attention!r} "
                            f"and ignore={ignore!r}; pass graph=None to walk it here.")
    return graph


def _timed_on(model, device):
    """The :class:`LatencyModel` fields that say where ``model`` is timed (``device``; None:
    by a custom timer, somewhere unknown)."""
    known = device is not None
    return dict(backend=keras.backend.backend() if known else None,
                device_kind=device.kind if known else None,
                device_name=device.name if known else None,
                precision=model.dtype_policy.name)


def _check_fit_options(batch_size, runtime, training, variants, rounds, holdout, scale_range,
                       blocks, refine, refine_rounds, round_to):
    """Raises ``ValueError`` naming the first of :func:`latency_model`'s options that is off."""
    _timing.check_settings(batch_size, runtime, training)
    if isinstance(variants, bool) or not isinstance(variants, (int, np.integer)) or variants < 6:
        raise ArgumentError("{variants:subject} must be an integer >= 6{got}", variants=variants)
    _timing.check_rounds(rounds)
    if not 0 < holdout < 1:
        raise ArgumentError("{holdout:subject} must be a share in (0, 1){got}", holdout=holdout)
    lo, hi = scale_range
    if not 0 < lo < hi <= 1:
        raise ArgumentError("{scale_range:subject} must be (low, high) with 0 < low < high <= 1{got}",
                            scale_range=scale_range)
    if not blocks or any(int(b) != b or b < 1 for b in blocks):
        raise ArgumentError("{blocks:subject} must be positive integers{got}", blocks=blocks)
    if any(isinstance(r, bool) or not isinstance(r, (int, float, np.number)) or not 0 < r < 1
           for r in refine):
        raise ArgumentError("{refine:subject} must hold latency ratios in (0, 1){got}", refine=refine)
    if isinstance(refine_rounds, bool) or not isinstance(refine_rounds, (int, np.integer)) \
            or refine_rounds < 0:
        raise ArgumentError("{refine_rounds:subject} must be a non-negative integer{got}",
                            refine_rounds=refine_rounds)
    if isinstance(round_to, bool) or not isinstance(round_to, (int, np.integer)) or round_to < 1:
        raise ArgumentError("{round_to:subject} must be a positive integer{got}", round_to=round_to)


class _Fitter:
    """The variants timed so far, and the fit on them (:func:`latency_model`'s state)."""

    def __init__(self, model, graph, measure, blocks, log, settings):
        self.model, self.graph, self.measure, self.log = model, graph, measure, log
        self.settings = settings
        self.prof = _costs.ModelProfile(graph)  # the refinement rounds' planner needs it too
        self.cm = self.prof.cost
        if self.cm.unrounded.all():
            raise ValueError(f"Model {model.name!r} has no prunable widths: nothing to vary.")
        features = Features.of(graph)
        self.candidates = {b: features.with_block(b, self.cm.unrounded)
                           for b in sorted({int(b) for b in blocks})}
        self.plan_errors = []  # the last round's plans, as the fit that made them predicted them

    def time_variants(self, count, scale_range, seed, holdout):
        """Times the first round's variants, holds some random ones out, and fits."""
        self.labels, self.widths = _variant_widths(self.cm, count, scale_range, seed,
                                                   self.settings["round_to"])
        self.log(f"building {len(self.labels)} variants of {self.model.name!r}")
        self.models = {label: rebuild(self.graph, w.astype(int), timing=True)
                       for label, w in zip(self.labels, self.widths)}
        self.seconds = self.measure(self.models)
        self.t = _checked_times(self.seconds, self.labels)
        n_random = sum(label.startswith("random") for label in self.labels)
        self.held = np.zeros(len(self.labels), dtype=bool)
        self.held[len(self.labels) - max(1, round(holdout * n_random)):] = True
        self.refined = np.zeros(len(self.labels), dtype=bool)
        self.anchors = [label for label in self.labels if not label.startswith("random")]
        self.fit()

    def fit(self):
        """Block, ridge and coefficients fitted on the variants not held out."""
        rows = ~self.held
        self.cv, self.block, self.ridge = _choose(
            lambda b: self.candidates[b].matrix(self.widths[rows], self.cm.unrounded), self.t[rows],
            tuple(self.candidates))
        self.X = self.candidates[self.block].matrix(self.widths, self.cm.unrounded)
        self.beta = _fit(self.X[rows], self.t[rows], self.ridge)

    def refine(self, k, ratios, planner):
        """Refinement round ``k``: plan at ``ratios``, time the plans, refit; False if none."""
        self.log(f"refinement round {k}: plans at latency {list(ratios)} (block {self.block})")
        preliminary = self.assemble(variants=[], fit_seconds=0.0, error=_held_out_error(
            _relative_errors(self.X[self.held], self.t[self.held], self.beta)))
        plans = _plan_widths(planner, self.prof, preliminary, ratios, self.widths, self.log)
        if not plans:
            return False
        new = [f"refine{k}:{label}" for label in plans]
        again = self.measure({**{label: self.models[label] for label in self.anchors},
                              **{name: rebuild(self.graph, w.astype(int), timing=True)
                                 for name, w in zip(new, plans.values())}})
        scale = statistics.median(self.seconds[a] / float(again[a]) for a in self.anchors)
        measured = _checked_times(again, new) * scale
        plan_widths = np.array(list(plans.values()))
        self.plan_errors = _relative_errors(
            self.candidates[self.block].matrix(plan_widths, self.cm.unrounded), measured, self.beta)
        self.labels += new
        self.widths = np.vstack([self.widths, plan_widths])
        self.t = np.append(self.t, measured)
        self.held = np.append(self.held, np.zeros(len(plans), dtype=bool))
        self.refined = np.append(self.refined, np.ones(len(plans), dtype=bool))
        self.fit()
        return True

    def assemble(self, **fields):
        """The :class:`LatencyModel` of the current fit, with the given fields."""
        f, cm = self.candidates[self.block], self.cm
        return LatencyModel(
            model_name=self.model.name, signature=signature(self.graph),
            input_shape=list(_timing.input_shape(self.model)), **self.settings,
            block=int(self.block), ridge=float(self.ridge), columns=f.columns,
            coef=[float(c) for c in self.beta],
            template={"names": [v.name for v in cm.variables], "widths": cm.widths.tolist(),
                      "fixed": cm.unrounded.tolist(), "col": f.col.tolist(),
                      "mult": f.mult.tolist(), "a": f.a.tolist(), "b": f.b.tolist()},
            **fields)

    def result(self, fit_seconds):
        """The final :class:`LatencyModel`: errors held out, on the fit and on the last plans."""
        errors, held, plans = _relative_errors(self.X, self.t, self.beta), self.held, self.plan_errors
        return self.assemble(
            error={**_held_out_error(errors[held]),
                   "not_monotone": _not_monotone(self.labels, self.t),
                   "train_median": float(np.median(errors[~held])),
                   "train_worst": float(errors[~held].max()),
                   "cross_validated_rms": float(self.cv),
                   "plans_median": float(np.median(plans)) if len(plans) else None,
                   "plans_worst": float(np.max(plans)) if len(plans) else None},
            variants=[{"label": label, "seconds": float(s), "predicted": float(p),
                       "held_out": bool(h), "refinement": bool(r)}
                      for label, s, p, h, r in zip(self.labels, self.t, self.X @ self.beta, held,
                                                   self.refined)],
            fit_seconds=fit_seconds)


def _held_out_error(errors):
    """``median`` and ``worst`` of the held-out variants' relative ``errors``: None for both
    from fewer than :data:`MIN_HELD_OUT` variants, which cannot estimate an error (one
    variant's 0.0% said nothing about the next)."""
    if len(errors) < MIN_HELD_OUT:
        return {"median": None, "worst": None}
    return {"median": float(np.median(errors)), "worst": float(np.max(errors))}


def resolve(latency_model_arg, model, argument="latency_model", graph=None, **defaults):
    """The :class:`LatencyModel` that a ``latency_model=`` argument stands for.

    A :class:`LatencyModel` is used as is, a string or path is read as JSON,
    a dict holds options for :func:`latency_model` (measured now, ``defaults``
    filling in the rest, e.g. the plan's ``residual`` and ``ignore``), and
    None measures one with the defaults. ``graph``, the caller's walk of
    ``model`` under the defaults' ``residual`` and ``ignore``, spares the
    measurement another walk, unless the options ask for other ones.
    """
    if isinstance(latency_model_arg, LatencyModel):
        return latency_model_arg
    if isinstance(latency_model_arg, (str, os.PathLike)):
        path = os.fspath(latency_model_arg)
        try:
            return LatencyModel.from_json(path)
        except UnusableLatencyModel as err:  # named as the argument, with the remedy
            what = err.reason.replace("{", "{{").replace("}", "}}")
            raise ArgumentError(f"{{{argument}}} {what}; fit a latency model with {{remedy}}.",
                                remedy=FIT_REMEDY, **{argument: path}) from None
    if latency_model_arg is None or isinstance(latency_model_arg, dict):
        options = {**defaults, **(latency_model_arg or {})}
        if graph is not None and all(options.get(k) == defaults.get(k)
                                     for k in ("residual", "attention", "ignore")):
            options.setdefault("graph", graph)
        return latency_model(model, **options)
    raise TypeError(f"{argument} must be a LatencyModel, a JSON file path, a dict of "
                    f"kp.latency_model options or None, got {type(latency_model_arg).__name__}")
