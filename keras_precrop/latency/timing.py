"""Timing models on this machine: runners per runtime, interleaved rounds, time ratios.

Timings are interleaved (round-robin over the models, the start rotated each
round) and summarized by medians, so a load spike hits every model alike.
"""

from __future__ import annotations

import itertools
import logging
import math
import statistics
import sys
import time

import keras
import numpy as np

from keras_precrop.errors import ArgumentError
from keras_precrop.graph import trace as _trace
from keras_precrop.latency import devices as _devices
from keras_precrop.latency import runtimes as _runtimes
from keras_precrop.latency import steps as _steps

# Moved to the runtime table, the devices and the steps; these paths still import them.
RUNTIMES = _runtimes.RUNTIMES
Device = _devices.Device
cpu_name = _devices.cpu_name
missing = _runtimes.missing
input_shape = _steps.input_shape
to_tflite = _steps.to_tflite
to_onnx = _steps.to_onnx


def runtime_of(name):
    """The :class:`~keras_precrop.latency.runtimes.Runtime` that ``name`` stands for in this
    process (``"tf"``, the backend's own step, is ``"jax"`` under JAX and ``"torch"`` under torch).

    Raises:
        ArgumentError: for a name the runtime table lacks, listing the table.
    """
    return _runtimes.lookup(name, keras.backend.backend())


def device_of(runtime):
    """The :class:`~keras_precrop.latency.devices.Device` that ``runtime`` computes on in this
    process, as the runtime table says.

    LiteRT and ONNX Runtime run on the host CPU; the backend runtimes
    (``"tf"``, ``"jax"``, ``"torch"``, ``"torch_compile"``) on the device the
    Keras backend puts tensors on (its first GPU or TPU, else the CPU).
    """
    return runtime_of(runtime).device()


def runner(model, batch_size, runtime="tf", training=False, seed=0, device=None):
    """A no-argument callable that runs ``model`` once on a fixed random batch and waits for it.

    The batch is put on the device once, here; each call launches the work
    (a compiled step's first call compiles it: :func:`interleaved` warms up),
    waits until the device has done it, and returns the output.

    Args:
        model: a single-input Keras model with a fixed input shape.
        batch_size: examples per call.
        runtime: a name in the runtime table (:data:`RUNTIMES`;
            :mod:`~keras_precrop.latency.runtimes`): ``"tf"`` (the backend's
            compiled step), ``"torch_compile"``, ``"litert"``, ``"onnx"``,
            their int8 forms, or one :func:`~keras_precrop.latency.runtimes.register_runtime`
            added.
        training: time a training step (forward, backward, SGD update)
            instead of inference; the backend's own steps only.
        seed: seed of the random batch.
        device: the :class:`Device` to put the batch on and wait for
            (default :func:`device_of` the runtime); tests pass a recording one.
    """
    found = check_settings(batch_size, runtime, training)
    x = np.random.default_rng(seed).standard_normal(
        (batch_size,) + input_shape(model)).astype("float32")
    _runtimes.check_installed(runtime)
    device = device or found.device()
    launch = found.step(model, device.put(x), training)

    def call():
        y = launch()
        device.wait(y)
        return y

    return call


def _calls_per_sample(fn, target_s, clock):
    """How many back-to-back calls make one sample last about ``target_s``."""
    start = clock()
    fn()
    return max(1, math.ceil(target_s / max(clock() - start, 1e-6)))


def interleaved(fns, rounds, warmup=2, target_s=0.1, log=None, clock=time.perf_counter):
    """Time several callables round-robin; seconds per call, one entry per round.

    Each callable is warmed up (tracing, compilation, allocator and kernel
    caches), its inner loop calibrated so that a sample lasts about
    ``target_s``; then each round times every callable once, the order
    rotated by one each round, so slow phases of a shared machine hit all of
    them alike. A sample reads the clock, makes its calls (each of
    :func:`runner`'s waits for its own work) and reads the clock again.

    Args:
        fns: ``{name: no-argument callable}``.
        rounds: samples per callable.
        warmup: untimed calls per callable before calibrating.
        target_s: approximate duration of one sample.
        log: called with a progress line per round, if given.
        clock: seconds, read before and after each sample (tests record it).

    Returns:
        ``{name: [seconds per call, one per round]}``.
    """
    check_rounds(rounds)
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
    inner = {name: _calls_per_sample(fns[name], target_s, clock) for name in names}
    samples = {name: [] for name in names}
    for r in range(rounds):
        if log:
            log(f"round {r + 1}/{rounds}")
        k = r % len(names)
        for name in names[k:] + names[:k]:
            fn, n = fns[name], inner[name]
            start = clock()
            for _ in range(n):
                fn()
            samples[name].append((clock() - start) / n)
    return samples


def logger(verbose, label="latency model"):
    """Progress lines on stderr (``verbose=1``) or none, each after ``label`` (what is timed)."""
    if not verbose:
        return lambda line: None
    return lambda line: print(f"{label}: {line}", file=sys.stderr, flush=True)


class Measured(float):
    """A measured time ratio, with the layers the timed candidate cuts to a few channels.

    Attributes:
        narrowed: ``(name, channels, original channels)`` of every layer
            with filters or units that the candidate cuts to
            :data:`FEW_CHANNELS` or fewer, or under :data:`NARROW_SHARE` of
            the original's, narrowest share first.
    """

    narrowed: tuple = ()

    def __new__(cls, value, narrowed=()):
        self = super().__new__(cls, value)
        self.narrowed = tuple(narrowed)
        return self


FEW_CHANNELS = 2  # a layer cut to this many channels or fewer has collapsed
NARROW_SHARE = 0.1  # ... and so has one cut under this share of its channels


def _channels_of(layer):
    """A layer's chosen output width (``filters``, ``units``), or None."""
    width = getattr(layer, "filters", None) or getattr(layer, "units", None)
    return width if isinstance(width, int) else None


def narrowed(original, candidate):
    """``(name, channels, original channels)`` of the layers ``candidate`` (a rebuild of
    ``original``) cuts to a few channels (see :class:`Measured`), narrowest share first.

    Layers are matched by the names the rebuild gives them (the walk's).
    """
    traced = _trace.traced(original)
    widths = {traced.name(op): _channels_of(op) for op in traced.functional.operations}
    cut = []
    for layer in candidate.layers:
        after, before = _channels_of(layer), widths.get(layer.name)
        if after is not None and before is not None and after < before \
                and (after <= FEW_CHANNELS or after < NARROW_SHARE * before):
            cut.append((layer.name, after, before))
    return tuple(sorted(cut, key=lambda c: c[1] / c[2]))


def time_ratio(latency_model, model, rounds=7, verbose=1, timer=None):
    """A function ``ratio(candidate)``: the measured time of ``candidate`` over ``model``'s.

    Both are timed as ``latency_model`` was (batch size, runtime, inference
    or training step), interleaved and summarized by medians; ``model`` is
    prepared once. This is the measurement a latency plan is calibrated
    against (``plan(calibrate=...)``): each call is a round, and prints its
    measured ratio (and the layers the candidate cuts to a few channels).

    Args:
        latency_model: the :class:`LatencyModel` whose timing settings apply.
        model: the reference model (the one the latency model was fitted on).
        rounds: interleaved timing rounds per call of ``ratio``.
        verbose: 1 prints timing progress, 0 is silent.
        timer: replaces the clock, as in :func:`latency_model`.

    Returns:
        ``ratio(candidate) ->`` :class:`Measured`.
    """
    log = logger(verbose)
    measure = timer or timer_of(latency_model.batch_size, latency_model.runtime,
                              latency_model.training, rounds, log)
    done, last = itertools.count(1), {}

    def ratio(candidate):
        seconds = measure({"original": model, "candidate": candidate})
        result = Measured(float(seconds["candidate"]) / float(seconds["original"]),
                          narrowed(model, candidate))
        cut = "".join(f"; cuts {name!r} from {before} to {after} channels"
                      for name, after, before in result.narrowed[:3])
        again = last.get("candidate") is candidate  # a surprising round timed again
        last.update(candidate=candidate, round=last["round"] if again else next(done))
        log(f"calibration round {last['round']}{' (timed again)' if again else ''}: the plan "
            f"measures {result:.3f} of the original's time{cut}")
        return result

    return ratio


def timer_of(batch_size, runtime, training, rounds, log, device=None):
    """The default timer: median seconds per call of each model, interleaved.

    A model timed again (the refinement round's anchors) reuses its
    prepared runner. ``device`` is :func:`runner`'s.
    """
    device = device or device_of(runtime)
    prepared = {}  # id(model) -> (model, runner)

    def measure(models):
        fns = {}
        for i, (name, model) in enumerate(models.items(), start=1):
            if id(model) not in prepared:
                log(f"preparing variant {i}/{len(models)} ({name})")
                prepared[id(model)] = (model, runner(model, batch_size, runtime, training,
                                                             device=device))
            fns[name] = prepared[id(model)][1]
        samples = interleaved(fns, rounds, log=log)
        return {name: statistics.median(s) for name, s in samples.items()}

    return measure


def check_rounds(rounds):
    """Raises :class:`~keras_precrop.ArgumentError` unless ``rounds`` (timing rounds, whose
    median is the time) is a positive integer."""
    if isinstance(rounds, bool) or not isinstance(rounds, (int, np.integer)) or rounds < 1:
        raise ArgumentError("{rounds:subject} must be a positive integer{got}", rounds=rounds)


def check_settings(batch_size, runtime, training):
    """The :class:`~keras_precrop.latency.runtimes.Runtime` that ``runtime`` stands for here,
    once the timing settings are ones a runner takes.

    Raises:
        ArgumentError: for a batch size that is not a positive integer, a
            runtime the table lacks (the message lists it), another Keras
            backend than the runtime's, or a training step it does not time.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) \
            or batch_size < 1:
        raise ArgumentError("{batch_size:subject} must be a positive integer{got}", batch_size=batch_size)
    return _runtimes.checked(runtime, training, keras.backend.backend())
