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

import dataclasses
import hashlib
import json
import logging
import math
import os
import statistics
import sys
import time
import warnings

import keras
import numpy as np
from scipy import optimize

from keras_precrop import _json
from keras_precrop import costs as _costs
from keras_precrop import graph as _graph
from keras_precrop import solver as _solver
from keras_precrop.rebuild import rebuild

RUNTIMES = ("tf", "tflite")
ROW = "latency"  # the budget row's name in plans and cost models
_ALIASES = {"PrefixAdd": "Add"}  # rebuilt layers that stand for the layer they replace
_UNCOSTED = ("ChannelSlice",)  # charged to its reader's input elements instead
_RIDGE = (0.0, 1e-4, 1e-3, 1e-2)  # candidate penalties on the columns' time shares
_FORMAT = 2  # version of the JSON layout (2: per-column blocks, "out:ReLU@16")
_SAME_SCORE = 1e-6  # cross-validated errors closer than this tie (the simpler fit wins)


class LatencyModelMismatchError(ValueError):
    """A latency model is used with a model it was not fitted on."""


# --------------------------------------------------------------------------
# Features: per-layer-class sums of bilinear terms over the width variables
# --------------------------------------------------------------------------


def _class_key(rec):
    """Layer class a record's time is charged to (None: charged elsewhere)."""
    name = rec.class_name
    return None if name in _UNCOSTED else _ALIASES.get(name, name)


def _block_of(column):
    """Block size a feature column rounds free widths up to (``out:ReLU@16``: 16; no ``@``: 1)."""
    return int(column.partition("@")[2] or 1)


@dataclasses.dataclass
class _Features:
    """Feature columns of one walked model as terms over its width variables.

    Column ``col[t]`` gains ``mult[t] * r(w)[a[t]] * r(w)[b[t]]`` (index
    ``V``: a factor of one), where ``r`` rounds the free widths up to the
    column's block (named ``<feature>@<block>``; unrounded without ``@``);
    ``layer[t]`` is the term's layer (an index into ``graph.layers``).
    """

    columns: list
    col: np.ndarray
    mult: np.ndarray
    a: np.ndarray
    b: np.ndarray
    layer: np.ndarray

    @classmethod
    def of(cls, graph, columns=None):
        """Unrounded features of ``graph``; with ``columns`` given, those (rounded ones included)."""
        one = len(graph.variables)
        position = {id(rec): i for i, rec in enumerate(graph.layers)}
        index = {}
        terms = []

        def add(column, mult, a, b, layer):
            if mult:
                terms.append((index.setdefault(column, len(index)), mult, a, b, layer))

        def var(rec, seg, as_input):
            if seg is None:
                return one
            # A residual reader sees its own view of the stream.
            return graph.variable(rec, seg) if as_input else graph.group_variable(seg)

        for call in graph.calls:
            rec = call.record
            key = _class_key(rec)
            if key is None:
                continue
            i = position[id(rec)]
            for kind, tensors, keys in (("out", call.node.outputs, call.outputs),
                                        ("in", call.node.arguments.keras_tensors, call.inputs)):
                for t, k in zip(tensors, keys):
                    pixels = math.prod(t.shape[1:-1])
                    for p in graph.tensor_channels[k]:
                        add(f"{kind}:{key}", pixels * p.mult, var(rec, p.segment, kind == "in"),
                            one, i)
            add("const", 1.0, one, one, i)
        for i, rec in enumerate(graph.layers):
            key = _class_key(rec)
            for t in rec.terms if key is not None else ():
                add(f"macs:{key}", t.macs, var(rec, t.a, True), var(rec, t.b, True), i)
        col, mult, a, b, layer = np.array(terms, dtype=np.float64).reshape(-1, 5).T
        features = cls(list(index), col.astype(np.int64), mult, a.astype(np.int64),
                       b.astype(np.int64), layer.astype(np.int64))
        return features if columns is None else features.select(columns)

    @classmethod
    def from_template(cls, columns, template):
        """Features stored in a :class:`LatencyModel`'s template (layers unknown)."""
        return cls(columns, *(np.asarray(template[k]) for k in ("col", "mult", "a", "b")),
                   np.zeros(len(template["col"]), dtype=np.int64))

    def select(self, columns):
        """The given columns of these unrounded features, in that order.

        A column ``<feature>@<block>`` has the terms of ``<feature>``; a
        feature this model lacks has none.
        """
        index = {c: j for j, c in enumerate(self.columns)}
        parts = [(j, np.flatnonzero(self.col == index.get(c.partition("@")[0], -1)))
                 for j, c in enumerate(columns)]
        take = np.concatenate([terms for _, terms in parts]).astype(np.int64)
        col = np.concatenate([np.full(len(terms), j) for j, terms in parts]).astype(np.int64)
        return _Features(list(columns), col, self.mult[take], self.a[take], self.b[take],
                         self.layer[take])

    def with_block(self, block, fixed):
        """These unrounded features and, for ``block`` > 1, a copy of each rounded up to it.

        Columns without a free width (the per-call constant, fixed widths)
        get no copy: it would repeat them.
        """
        free = np.append(~np.asarray(fixed), False)
        varies = [bool(np.any(free[self.a[self.col == j]] | free[self.b[self.col == j]]))
                  for j in range(len(self.columns))]
        rounded = [f"{c}@{block}" for c, v in zip(self.columns, varies) if v and block > 1]
        return self.select(self.columns + rounded)

    @property
    def blocks(self):
        """Block size of every term (its column's)."""
        return np.array([_block_of(c) for c in self.columns], dtype=np.int64)[self.col]

    def matrix(self, widths, fixed):
        """(n, columns) feature values at (n, V) widths."""
        w = np.atleast_2d(np.asarray(widths, dtype=np.float64))
        values = _costs.term_factors(w, fixed, self.a, self.b, self.blocks) * self.mult
        out = np.zeros((len(w), len(self.columns)))
        for j in range(len(self.columns)):
            out[:, j] = values[:, self.col == j].sum(axis=1)
        return out


def _signature(graph):
    """Identity of a model's architecture, the same for its rebuilt (pruned) copies.

    A hash of the input shapes and every costed layer's path and class (the
    ``ChannelSlice`` layers a rebuild adds are left out, a ``PrefixAdd``
    counts as the ``Add`` it replaces); widths do not enter.
    """
    fn = _graph.functional_of(graph.model)
    layers = sorted((rec.path, _class_key(rec)) for rec in graph.layers if _class_key(rec))
    text = json.dumps([[list(t.shape[1:]) for t in fn.inputs], layers])
    return hashlib.sha1(text.encode()).hexdigest()[:16]


# --------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------


def _input_shape(model):
    if len(model.inputs) != 1:
        raise ValueError(f"Model {model.name!r} has {len(model.inputs)} inputs; latency "
                         "models time single-input models.")
    shape = tuple(model.inputs[0].shape[1:])
    if any(d is None for d in shape):
        raise ValueError(f"Model {model.name!r} has an undefined input shape {shape}; "
                         "timing needs a fixed one.")
    return shape


def _compiled_step(model, x, training):
    """A no-argument callable: one compiled inference pass or SGD training step on ``x``.

    The only backend-specific code of the module. TensorFlow: a
    ``tf.function`` with a fixed input signature (the pass returns the
    outputs' sum, fetched to the host, so no work is skipped; the training
    step is forward, mean-square loss, gradients and
    ``SGD(momentum=0.9).apply``). Other backends: Keras' own compiled
    ``predict_on_batch`` / ``train_on_batch``.
    """
    if keras.backend.backend() != "tensorflow":
        if not training:
            return lambda: model.predict_on_batch(x)
        model.compile(optimizer=keras.optimizers.SGD(learning_rate=1e-3, momentum=0.9),
                      loss="mse")
        target = np.zeros(model.outputs[0].shape[1:], dtype="float32")[None].repeat(len(x), 0)
        return lambda: model.train_on_batch(x, target)
    import tensorflow as tf

    spec = tf.TensorSpec(x.shape, tf.float32)
    x = tf.constant(x)
    if not training:
        forward = tf.function(lambda inputs: tf.reduce_sum(model(inputs, training=False)),
                              input_signature=[spec])
        return lambda: float(forward(x))
    optimizer = keras.optimizers.SGD(learning_rate=1e-3, momentum=0.9)
    optimizer.build(model.trainable_variables)

    @tf.function(input_signature=[spec])
    def step(inputs):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(inputs, training=True)))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
        return loss

    return lambda: float(step(x))


def to_tflite(model, batch_size=None):
    """Convert a Keras model to a TFLite flatbuffer (bytes), weights frozen.

    The weights become constants of the graph (the converter freezes the
    function instead of saving it as a SavedModel first), as in a converted
    ``model.export()``: batch norm is folded into the convolutions, their
    activations fused, and the interpreter's XNNPACK delegate runs the whole
    graph as one partition. (The converter's default route for a function
    keeps Keras 3's weights as resource variables: every call then reads
    them, transposes each kernel and computes batch norm separately, and
    XNNPACK, which needs constant weights, is cut into one partition per
    layer; that ran resnet20 about 8x slower.)

    Args:
        model: a single-input Keras model; rebuilt models with
            ``ChannelSlice`` / ``PrefixAdd`` convert to builtin TFLite ops
            (``SLICE``, ``PAD``, ``ADD``).
        batch_size: fixed batch size of the converted graph (None: dynamic).
    """
    import tensorflow as tf

    spec = tf.TensorSpec((batch_size,) + _input_shape(model), tf.float32)
    fn = tf.function(lambda x: model(x, training=False), input_signature=[spec])
    converter = tf.lite.TFLiteConverter.from_concrete_functions([fn.get_concrete_function()],
                                                                model)
    converter.experimental_lower_to_saved_model = False
    return converter.convert()


def _tflite_step(model, x, threads):
    """A no-argument callable: one TFLite interpreter invocation on ``x``."""
    import tensorflow as tf

    with warnings.catch_warnings():  # tf.lite.Interpreter's deprecation notice
        warnings.simplefilter("ignore")
        interpreter = tf.lite.Interpreter(model_content=to_tflite(model, len(x)),
                                          num_threads=threads)
    interpreter.allocate_tensors()
    interpreter.set_tensor(interpreter.get_input_details()[0]["index"], x)
    return interpreter.invoke


def runner(model, batch_size, runtime="tf", training=False, seed=0):
    """A no-argument callable that runs ``model`` once on a fixed random batch.

    Args:
        model: a single-input Keras model with a fixed input shape.
        batch_size: examples per call.
        runtime: ``"tf"`` (compiled Keras/TensorFlow function) or ``"tflite"``
            (TFLite interpreter, one thread per usable core).
        training: time a training step (forward, backward, SGD update)
            instead of inference; ``"tf"`` only.
        seed: seed of the random batch.
    """
    _check_settings(batch_size, runtime, training)
    x = np.random.default_rng(seed).standard_normal(
        (batch_size,) + _input_shape(model)).astype("float32")
    if runtime == "tflite":
        return _tflite_step(model, x, _usable_cpus())
    return _compiled_step(model, x, training)


def _usable_cpus():
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def _calls_per_sample(fn, target_s):
    """How many back-to-back calls make one sample last about ``target_s``."""
    start = time.perf_counter()
    fn()
    return max(1, math.ceil(target_s / max(time.perf_counter() - start, 1e-6)))


def interleaved(fns, rounds, warmup=2, target_s=0.1, log=None):
    """Time several callables round-robin; seconds per call, one entry per round.

    Each callable is warmed up (tracing, allocator and kernel caches), its
    inner loop calibrated so that a sample lasts about ``target_s``; then each
    round times every callable once, the order rotated by one each round, so
    slow phases of a shared machine hit all of them alike.

    Args:
        fns: ``{name: no-argument callable}``.
        rounds: samples per callable.
        warmup: untimed calls per callable before calibrating.
        target_s: approximate duration of one sample.
        log: called with a progress line per round, if given.

    Returns:
        ``{name: [seconds per call, one per round]}``.
    """
    names = list(fns)
    tf_logger = logging.getLogger("tensorflow")
    level = tf_logger.level
    tf_logger.setLevel(logging.ERROR)  # a compiled step per model is not "retracing"
    try:
        for name in names:
            for _ in range(warmup):
                fns[name]()
    finally:
        tf_logger.setLevel(level)
    inner = {name: _calls_per_sample(fns[name], target_s) for name in names}
    samples = {name: [] for name in names}
    for r in range(rounds):
        if log:
            log(f"round {r + 1}/{rounds}")
        k = r % len(names)
        for name in names[k:] + names[:k]:
            fn, n = fns[name], inner[name]
            start = time.perf_counter()
            for _ in range(n):
                fn()
            samples[name].append((time.perf_counter() - start) / n)
    return samples


def _logger(verbose):
    """Progress lines on stderr (``verbose=1``) or none."""
    if not verbose:
        return lambda line: None
    return lambda line: print(f"latency model: {line}", file=sys.stderr, flush=True)


def time_ratio(latency_model, model, rounds=7, verbose=1, timer=None):
    """A function ``ratio(candidate)``: the measured time of ``candidate`` over ``model``'s.

    Both are timed as ``latency_model`` was (batch size, runtime, inference
    or training step), interleaved and summarized by medians; ``model`` is
    prepared once. This is the measurement a latency plan is calibrated
    against (``plan(calibrate=...)``).

    Args:
        latency_model: the :class:`LatencyModel` whose timing settings apply.
        model: the reference model (the one the latency model was fitted on).
        rounds: interleaved timing rounds per call of ``ratio``.
        verbose: 1 prints timing progress, 0 is silent.
        timer: replaces the clock, as in :func:`latency_model`.
    """
    measure = timer or _timer(latency_model.batch_size, latency_model.runtime,
                              latency_model.training, rounds, _logger(verbose))

    def ratio(candidate):
        seconds = measure({"original": model, "candidate": candidate})
        return float(seconds["candidate"]) / float(seconds["original"])

    return ratio


def _timer(batch_size, runtime, training, rounds, log):
    """The default timer: median seconds per call of each model, interleaved.

    A model timed again (the refinement round's anchors) reuses its
    prepared runner.
    """
    prepared = {}  # id(model) -> (model, runner)

    def measure(models):
        fns = {}
        for i, (name, model) in enumerate(models.items(), start=1):
            if id(model) not in prepared:
                log(f"preparing variant {i}/{len(models)} ({name})")
                prepared[id(model)] = (model, runner(model, batch_size, runtime, training))
            fns[name] = prepared[id(model)][1]
        samples = interleaved(fns, rounds, log=log)
        return {name: statistics.median(s) for name, s in samples.items()}

    return measure


# --------------------------------------------------------------------------
# Variants and fit
# --------------------------------------------------------------------------


def _variant_widths(cm, count, scale_range, seed):
    """Integer widths of the variants to time, with labels.

    The original, uniform scalings of every free width down to
    ``scale_range[0]``, then random ones: a random level per variant times a
    log-normal factor per width, clipped to ``scale_range``. Views and
    writers of a residual stream are clipped to the stream's width.
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
    widths = np.where(cm.fixed, cm.widths, np.maximum(1, np.round(np.array(factors) * cm.widths)))
    bound = np.where(cm.bound >= 0, cm.bound, np.arange(len(cm.bound)))
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


def _plan_widths(model, preliminary, ratios, cm, known, log):
    """Widths of ``plan(model, latency=r)`` under a preliminary latency model, per ratio.

    Ratios whose plan is infeasible or repeats ``known`` widths (or another
    plan) are skipped.
    """
    from keras_precrop import planning  # planning imports this module

    out = {}
    for ratio in ratios:
        try:
            plan = planning.plan(model, latency=ratio, latency_model=preliminary,
                                 residual=preliminary.residual, ignore=preliminary.ignore)
        except _solver.InfeasibleBudgetError as err:
            log(f"refinement: no plan at latency={ratio} ({err})")
            continue
        widths = np.array([plan.widths[v.name] for v in cm.variables], dtype=np.float64)
        if not any(np.array_equal(widths, w) for w in [*known, *out.values()]):
            out[f"latency{ratio}"] = widths
    return out


def _check_settings(batch_size, runtime, training):
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) \
            or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    if runtime not in RUNTIMES:
        raise ValueError(f"runtime must be one of {RUNTIMES}, got {runtime!r}")
    if training and runtime != "tf":
        raise ValueError("training=True times a training step, which only runtime='tf' runs")


def _checked_times(seconds, labels):
    t = np.array([float(seconds[label]) for label in labels])
    if not np.all(np.isfinite(t) & (t > 0)):
        raise ValueError(f"the timer returned non-positive or non-finite times: {seconds}")
    return t


def latency_model(model, batch_size=32, runtime="tf", training=False, *, variants=20, rounds=5,
                  holdout=0.25, blocks=(1, 8, 16), scale_range=(0.25, 1.0),
                  refine=(0.3, 0.5, 0.7), refine_rounds=2, residual="prefix", ignore=(), seed=0,
                  verbose=1, timer=None):
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
    measure its error where plans live.

    Defaults take about a minute for resnet20 and three for MobileNetV2 at
    224x224 on a quiet 2-core CPU; fewer ``variants`` and ``rounds`` are
    faster and less accurate.

    Args:
        model: a functional or Sequential Keras model with one input of a
            fixed shape.
        batch_size: examples per timed call (the latency is per batch).
        runtime: ``"tf"`` (compiled TensorFlow function; other Keras backends
            use ``predict_on_batch``/``train_on_batch``) or ``"tflite"`` (TFLite
            interpreter).
        training: time a training step (forward, backward, SGD update)
            instead of inference.
        variants: number of models timed in the first round, the original
            included (>= 6).
        rounds: interleaved timing rounds (medians over rounds).
        holdout: share of the random variants held out of the fit to
            measure its error.
        blocks: candidate block sizes of the rounded copies of the features
            (1: none).
        scale_range: smallest and largest width factor of the random
            variants.
        refine: latency budgets (ratios of the original's predicted time)
            of the refinement rounds' plans; ``()`` skips refinement. Plans
            the current fit cannot make (infeasible) are left out.
        refine_rounds: refinement rounds (0: none).
        residual, ignore: as in :func:`keras_precrop.plan`; they decide
            which widths the variants vary.
        seed: seed of the random variants.
        verbose: 1 prints progress (which variant is being prepared, timing
            rounds, the fit's error), 0 is silent.
        timer: replaces the clock: ``timer({label: keras.Model}) -> {label:
            seconds per call}`` (e.g. for tests or another device).

    Returns:
        A :class:`LatencyModel`.
    """
    _check_settings(batch_size, runtime, training)
    if isinstance(variants, bool) or not isinstance(variants, (int, np.integer)) or variants < 6:
        raise ValueError(f"variants must be an integer >= 6, got {variants!r}")
    if isinstance(rounds, bool) or not isinstance(rounds, (int, np.integer)) or rounds < 1:
        raise ValueError(f"rounds must be a positive integer, got {rounds!r}")
    if not 0 < holdout < 1:
        raise ValueError(f"holdout must be a share in (0, 1), got {holdout!r}")
    lo, hi = scale_range
    if not 0 < lo < hi <= 1:
        raise ValueError(f"scale_range must be (low, high) with 0 < low < high <= 1, "
                         f"got {scale_range!r}")
    if not blocks or any(int(b) != b or b < 1 for b in blocks):
        raise ValueError(f"blocks must be positive integers, got {blocks!r}")
    if any(isinstance(r, bool) or not isinstance(r, (int, float, np.number)) or not 0 < r < 1
           for r in refine):
        raise ValueError(f"refine must hold latency ratios in (0, 1), got {refine!r}")
    if isinstance(refine_rounds, bool) or not isinstance(refine_rounds, (int, np.integer)) \
            or refine_rounds < 0:
        raise ValueError(f"refine_rounds must be a non-negative integer, got {refine_rounds!r}")
    log = _logger(verbose)
    start = time.perf_counter()
    _input_shape(model)
    graph = _graph.walk(model, ignore=ignore, residual=residual)
    cm = _costs.CostModel(graph)
    if cm.fixed.all():
        raise ValueError(f"Model {model.name!r} has no prunable widths: nothing to vary.")
    labels, widths = _variant_widths(cm, variants, scale_range, seed)
    log(f"building {len(labels)} variants of {model.name!r}")
    models = {label: rebuild(graph, w.astype(int)) for label, w in zip(labels, widths)}
    measure = timer or _timer(batch_size, runtime, training, rounds, log)
    seconds = measure(models)
    t = _checked_times(seconds, labels)
    n_random = len(labels) - sum(not label.startswith("random") for label in labels)
    held = np.zeros(len(labels), dtype=bool)
    held[len(labels) - max(1, round(holdout * n_random)):] = True
    features = _Features.of(graph)
    candidates = {b: features.with_block(b, cm.fixed) for b in sorted({int(b) for b in blocks})}

    def fit(rows):
        """Block, ridge, features and coefficients fitted on the variants in ``rows``."""
        cv, block, ridge = _choose(lambda b: candidates[b].matrix(widths[rows], cm.fixed),
                                   t[rows], tuple(candidates))
        X = candidates[block].matrix(widths, cm.fixed)
        return block, ridge, X, _fit(X[rows], t[rows], ridge), cv

    def assemble(block, ridge, beta, **fields):
        f = candidates[block]
        return LatencyModel(
            model_name=model.name, signature=_signature(graph),
            input_shape=list(_input_shape(model)), batch_size=int(batch_size), runtime=runtime,
            training=bool(training), residual=residual, ignore=list(ignore), block=int(block),
            ridge=float(ridge), columns=f.columns, coef=[float(c) for c in beta],
            template={"names": [v.name for v in cm.variables], "widths": cm.widths.tolist(),
                      "fixed": cm.fixed.tolist(), "col": f.col.tolist(),
                      "mult": f.mult.tolist(), "a": f.a.tolist(), "b": f.b.tolist()},
            **fields)

    block, ridge, X, beta, cv = fit(~held)
    refined = np.zeros(len(labels), dtype=bool)
    plan_errors = []  # the last round's plans, as the fit that made them predicted them
    anchors = [label for label in labels if not label.startswith("random")]
    for k in range(1, refine_rounds + 1 if refine else 1):
        log(f"refinement round {k}: plans at latency {list(refine)} (block {block})")
        held_errors = _relative_errors(X[held], t[held], beta)
        preliminary = assemble(block, ridge, beta, variants=[], fit_seconds=0.0,
                               error={"median": float(np.median(held_errors)),
                                      "worst": float(held_errors.max())})
        plans = _plan_widths(model, preliminary, refine, cm, widths, log)
        if not plans:
            break
        again = measure({**{label: models[label] for label in anchors},
                         **{f"refine{k}:{label}": rebuild(graph, w.astype(int))
                            for label, w in plans.items()}})
        scale = statistics.median(seconds[a] / float(again[a]) for a in anchors)
        new = [f"refine{k}:{label}" for label in plans]
        measured = _checked_times(again, new) * scale
        plan_widths = np.array(list(plans.values()))
        plan_errors = _relative_errors(candidates[block].matrix(plan_widths, cm.fixed), measured,
                                       beta)
        labels += new
        widths = np.vstack([widths, plan_widths])
        t = np.append(t, measured)
        held = np.append(held, np.zeros(len(plans), dtype=bool))
        refined = np.append(refined, np.ones(len(plans), dtype=bool))
        block, ridge, X, beta, cv = fit(~held)
    errors = _relative_errors(X, t, beta)
    result = assemble(
        block, ridge, beta,
        error={"median": float(np.median(errors[held])), "worst": float(errors[held].max()),
               "train_median": float(np.median(errors[~held])),
               "train_worst": float(errors[~held].max()), "cross_validated_rms": float(cv),
               "plans_median": float(np.median(plan_errors)) if len(plan_errors) else None,
               "plans_worst": float(np.max(plan_errors)) if len(plan_errors) else None},
        variants=[{"label": label, "seconds": float(s), "predicted": float(p),
                   "held_out": bool(h), "refinement": bool(r)}
                  for label, s, p, h, r in zip(labels, t, X @ beta, held, refined)],
        fit_seconds=time.perf_counter() - start)
    plans_text = (f"; on its last plans before refitting median "
                  f"{result.error['plans_median']:.1%}, worst {result.error['plans_worst']:.1%}"
                  if len(plan_errors) else "")
    log(f"fitted in {result.fit_seconds:.0f} s: held-out error median "
        f"{result.error['median']:.1%}, worst {result.error['worst']:.1%}{plans_text} "
        f"(block {block})")
    return result


# --------------------------------------------------------------------------
# The fitted model
# --------------------------------------------------------------------------


@dataclasses.dataclass
class LatencyModel(_json.JsonDataclass):
    """A fitted latency model: predicted seconds per batch of one model at any widths.

    Attributes:
        model_name, signature, input_shape: identity of the model it was
            fitted on (the signature ignores widths, so it also fits that
            model's rebuilt copies).
        batch_size, runtime, training: what was timed.
        residual, ignore: width variables the variants varied.
        block: the features' rounded copies (columns ``<feature>@<block>``)
            round free widths up to multiples of this (1: no copies).
        ridge: the fit's ridge penalty (chosen by cross-validation).
        columns, coef: feature names (``macs:Conv2D``, ``out:ReLU``,
            ``const``, ``out:ReLU@16``, ...) and seconds per unit of each.
        error: relative prediction error on the held-out variants
            (``median``, ``worst``), on the fitted ones (``train_median``,
            ``train_worst``) and on the last refinement round's plans as
            the fit that made them predicted them, before they were timed
            (``plans_median``, ``plans_worst``; None without refinement).
        variants: label, measured and predicted seconds of every variant,
            whether it was held out and whether it is a refinement plan.
        template: the fitted model's width variables and feature terms, so
            :meth:`predict` works from JSON alone.
        fit_seconds: wall time of the whole measurement and fit.
    """

    model_name: str
    signature: str
    input_shape: list
    batch_size: int
    runtime: str
    training: bool
    residual: str
    ignore: list
    block: int
    ridge: float
    columns: list
    coef: list
    error: dict
    variants: list
    template: dict
    fit_seconds: float
    format: int = _FORMAT

    @property
    def seconds(self):
        """Predicted seconds per batch of the original model."""
        return self.predict(np.asarray(self.template["widths"]))

    def describe(self):
        """A short JSON-ready summary (what plans record)."""
        return {"model_name": self.model_name, "signature": self.signature,
                "batch_size": self.batch_size, "runtime": self.runtime,
                "training": self.training, "block": self.block,
                "error": {k: self.error[k] for k in ("median", "worst")},
                "units": "seconds per batch"}

    def check(self, graph, argument="latency_model"):
        """Raise :class:`LatencyModelMismatchError` unless ``graph`` is this architecture."""
        signature = _signature(graph)
        if signature != self.signature:
            raise LatencyModelMismatchError(
                f"{argument} was fitted on model {self.model_name!r} (layer signature "
                f"{self.signature}), not on model {graph.model.name!r} (signature {signature}); "
                "fit one for this model with kp.latency_model(model).")

    def _features(self, graph):
        return _Features.of(graph, self.columns)

    def cost_row(self, graph, argument="latency_model"):
        """The predicted time as a :class:`~keras_precrop.costs.CostRow` over ``graph``'s widths."""
        self.check(graph, argument)
        f = self._features(graph)
        return _costs.CostRow(ROW, np.asarray(self.coef)[f.col] * f.mult, f.a, f.b, f.layer,
                              f.blocks)

    def predict(self, x):
        """Predicted seconds per batch.

        Args:
            x: a Keras model of the fitted architecture (the original or a
                rebuilt copy, e.g. ``kp.precrop(model, ...)``), a
                :class:`~keras_precrop.Plan` or ``{variable name: width}``
                (width variables of the fitted ``residual``/``ignore`` settings), or a
                width vector in the order of ``template["names"]``.
        """
        if isinstance(x, keras.Model):
            known = set(_graph.layer_names(_graph.functional_of(x)))
            if not known.issuperset(self.ignore):
                raise LatencyModelMismatchError(
                    f"predict's model {x.name!r} lacks the layers "
                    f"{sorted(set(self.ignore) - known)[:5]} this latency model was fitted "
                    f"with as ignore=; it was fitted on model {self.model_name!r}.")
            graph = _graph.walk(x, ignore=self.ignore, residual=self.residual)
            self.check(graph, "predict's model")
            cm = _costs.CostModel(graph)
            return float(self._evaluate(self._features(graph), cm.widths, cm.fixed))
        widths = getattr(x, "widths", x)
        names = self.template["names"]
        if isinstance(widths, dict):
            if set(widths) != set(names):
                raise LatencyModelMismatchError(
                    f"the widths name variables {sorted(set(widths) - set(names))[:5]} unknown to "
                    f"this latency model (fitted on {self.model_name!r} with residual="
                    f"{self.residual!r}, ignore={self.ignore}); pass the rebuilt model instead.")
            widths = [widths[n] for n in names]
        widths = np.asarray(widths, dtype=np.float64)
        if widths.shape != (len(names),):
            raise ValueError(f"widths must have one entry per width variable ({len(names)}), "
                             f"got shape {widths.shape}")
        features = _Features.from_template(self.columns, self.template)
        return float(self._evaluate(features, widths, np.asarray(self.template["fixed"])))

    def _evaluate(self, features, widths, fixed):
        return features.matrix(widths, fixed)[0] @ np.asarray(self.coef)

    def summary(self, print_fn=print):
        """Print the fit: what was timed, its error and the largest coefficients' shares."""
        what = "training step" if self.training else "inference"
        print_fn(f'Latency model of "{self.model_name}": {what}, runtime {self.runtime}, '
                 f"batch {self.batch_size}, block {self.block}")
        print_fn(f"Original: {self.seconds * 1e3:.3f} ms per batch (predicted), "
                 f"{self.variants[0]['seconds'] * 1e3:.3f} ms measured")
        print_fn(f"Held-out error: median {self.error['median']:.1%}, worst "
                 f"{self.error['worst']:.1%} ({sum(v['held_out'] for v in self.variants)} of "
                 f"{len(self.variants)} variants); fitted in {self.fit_seconds:.0f} s")
        if self.error.get("plans_median") is not None:
            print_fn(f"Error on the last refinement round's plans, before refitting: median "
                     f"{self.error['plans_median']:.1%}, worst {self.error['plans_worst']:.1%}")
        t = self.template
        share = _Features.from_template(self.columns, t).matrix(
            np.asarray(t["widths"]), np.asarray(t["fixed"]))[0] * self.coef
        rows = [("Feature", "Coefficient (s/unit)", "Share of time")]
        for j in np.argsort(-share):
            if share[j] > 0:
                rows.append((self.columns[j], f"{self.coef[j]:.3e}",
                             f"{share[j] / share.sum():.1%}"))
        for line in _costs._table(rows):
            print_fn(line)

    @classmethod
    def from_dict(cls, data):
        """A latency model from :meth:`to_dict`'s data (format 1 files too).

        Format 1 rounded every feature to ``block``; its columns are renamed
        ``<feature>@<block>``, which predicts the same.
        """
        version = data.get("format", _FORMAT)
        if version == 1:
            suffix = f"@{data['block']}" if data["block"] > 1 else ""
            data = {**data, "columns": [c + suffix for c in data["columns"]], "format": _FORMAT}
        elif version != _FORMAT:
            raise ValueError(f"latency model format {version} is not {_FORMAT}; refit it")
        return super().from_dict(data)


def resolve(latency_model_arg, model, argument="latency_model", **defaults):
    """The :class:`LatencyModel` that a ``latency_model=`` argument stands for.

    A :class:`LatencyModel` is used as is, a string or path is read as JSON,
    a dict holds options for :func:`latency_model` (measured now, ``defaults``
    filling in the rest, e.g. the plan's ``residual`` and ``ignore``), and
    None measures one with the defaults.
    """
    if isinstance(latency_model_arg, LatencyModel):
        return latency_model_arg
    if isinstance(latency_model_arg, (str, os.PathLike)):
        return LatencyModel.from_json(os.fspath(latency_model_arg))
    if latency_model_arg is None or isinstance(latency_model_arg, dict):
        return latency_model(model, **{**defaults, **(latency_model_arg or {})})
    raise TypeError(f"{argument} must be a LatencyModel, a JSON file path, a dict of "
                    f"kp.latency_model options or None, got {type(latency_model_arg).__name__}")
