"""Timing models on this machine: runners per runtime, interleaved rounds, time ratios.

Timings are interleaved (round-robin over the models, the start rotated each
round) and summarized by medians, so a load spike hits every model alike.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import logging
import math
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable

import keras
import numpy as np

from keras_precrop.errors import ArgumentError
from keras_precrop.graph import trace as _trace

RUNTIMES = ("tf", "jax", "torch", "torch_compile", "litert", "tflite", "onnx", "litert_int8",
            "onnx_int8")
"""Where a model can be timed: ``"tf"`` (the Keras backend's own compiled step; ``"jax"`` and
``"torch"`` name it under those backends and check that they run it; torch runs eagerly),
``"torch_compile"`` (the Keras model's torch module under ``torch.compile``, inference only),
``"litert"`` (the LiteRT interpreter; ``"tflite"`` is its old name), ``"onnx"`` (ONNX Runtime),
and the int8 forms of the last two (post-training quantization calibrated on a representative
batch)."""
_ONNX = (("onnxruntime", "tf2onnx", "onnx"), "onnx")
# The optional packages of a runtime, and the extra that installs them.
_NEEDS = {"jax": (("jax",), "jax"), "torch": (("torch",), "torch"),
          "torch_compile": (("torch",), "torch"), "onnx": _ONNX, "onnx_int8": _ONNX}
_BACKEND_OF = {"jax": "jax", "torch": "torch", "torch_compile": "torch"}  # runtimes of one backend
_CXX = ("g++", "clang++", "c++")  # compilers torch.compile's inductor can build kernels with
_LITERT = ("litert", "tflite", "litert_int8")  # converted by TensorFlow's LiteRT converter
_CALIBRATION = 16  # random examples that calibrate an int8 model's activation ranges


def input_shape(model):
    """The one input shape of ``model`` (a subclassed model's: the one it was built with)."""
    specs = _trace.input_specs(model)
    if len(specs) != 1:
        raise ValueError(f"Model {model.name!r} has {len(specs)} inputs; latency "
                         "models time single-input models.")
    shape = tuple(specs[0][1][1:])
    if any(d is None for d in shape):
        raise ValueError(f"Model {model.name!r} has an undefined input shape {shape}; "
                         "timing needs a fixed one.")
    return shape


@dataclasses.dataclass(frozen=True)
class Device:
    """Where a runner computes, and how its input gets there and its work is waited for.

    A runner puts its input on the device once, before anything is timed, and
    waits for every call's work before the clock is read again: on a GPU a
    call returns once its kernels are queued, so without the wait a clock
    times launches, and calls of interleaved models overlap in the queue.
    Tests pass a recording device to see that order (:func:`runner`'s
    ``device``).

    Attributes:
        kind: ``"cpu"``, ``"gpu"`` or ``"tpu"``.
        name: the chip (``"NVIDIA H200"``, ``"TPU v4"``, the CPU's model name).
        put: a host array -> that array resident on the device.
        wait: called with a call's output; returns once the work that made it is done.
    """

    kind: str
    name: str
    put: Callable
    wait: Callable


def cpu_name():
    """This machine's CPU model (``/proc/cpuinfo``'s ``model name``, else ``platform``'s)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def device_of(runtime):
    """The :class:`Device` that ``runtime`` computes on in this process.

    LiteRT and ONNX Runtime run on the host CPU; the backend runtimes
    (``"tf"``, ``"jax"``, ``"torch"``, ``"torch_compile"``) on the device the
    Keras backend puts tensors on (its first GPU or TPU, else the CPU).
    """
    if runtime not in _LITERT + ("onnx", "onnx_int8"):
        backend = keras.backend.backend()
        make = {"tensorflow": _tf_device, "jax": _jax_device, "torch": _torch_device}.get(backend)
        if make is not None:
            return make()
    return Device("cpu", cpu_name(), put=lambda x: x, wait=lambda y: None)


def _tf_device():
    """TensorFlow's first GPU, else the CPU; the wait fetches the output to the host."""
    import tensorflow as tf

    gpus = tf.config.list_logical_devices("GPU")
    place, kind, name = "/CPU:0", "cpu", None
    if gpus:
        details = tf.config.experimental.get_device_details(tf.config.list_physical_devices("GPU")[0])
        place, kind, name = gpus[0].name, "gpu", details.get("device_name", "GPU")

    def put(x):
        with tf.device(place):
            return tf.identity(tf.constant(x))

    return Device(kind, name or cpu_name(), put, wait=lambda y: y.numpy())


def _jax_device():
    """JAX's first device; the wait is ``block_until_ready``."""
    import jax

    device = jax.devices()[0]
    kind = "gpu" if device.platform in ("gpu", "cuda", "rocm") else device.platform
    return Device(kind, cpu_name() if kind == "cpu" else device.device_kind,
                  put=lambda x: jax.device_put(x, device), wait=jax.block_until_ready)


def _torch_device():
    """The device Keras' torch backend puts tensors on; the wait synchronizes that device."""
    import torch

    where = keras.ops.convert_to_tensor(np.zeros((), "float32")).device
    kind, name = ("cpu", cpu_name()) if where.type == "cpu" else ("gpu", where.type)
    if where.type == "cuda":
        name = torch.cuda.get_device_name(where)

    def wait(y):
        if where.type == "mps":
            torch.mps.synchronize()
        elif where.type != "cpu":  # eager CPU ops are done when they return
            getattr(torch, where.type).synchronize(where)

    return Device(kind, name, put=lambda x: torch.as_tensor(x, device=where), wait=wait)


def _compiled_step(model, x, runtime, training):
    """A no-argument callable: launches one compiled inference pass or SGD training step on ``x``
    (already on the device) and returns its output, without waiting for it.

    The only backend-specific code of the module, one function per backend.
    Each times the model's own computation, without ``predict_on_batch``'s
    per-call overhead (under JAX it cost about 30 ms per call on resnet20,
    so a model 4x narrower timed at half the original's time instead of a
    fifth, and every latency budget below that was infeasible).
    """
    step = {"tensorflow": _tf_step, "jax": _jax_step, "torch": _torch_step}.get(
        keras.backend.backend())
    if step is None:
        raise ArgumentError(f"timing runs on the tensorflow, jax and torch backends, not on "
                            f"{keras.backend.backend()!r}; set KERAS_BACKEND.")
    if runtime == "torch_compile":
        return _torch_step(model, x, training, compiled=True)
    return step(model, x, training)


def _mean_square(y):
    """The loss of a timed training step: the outputs' mean square (any target would do)."""
    return keras.ops.mean(keras.ops.square(y))


def _sgd(model):
    optimizer = keras.optimizers.SGD(learning_rate=1e-3, momentum=0.9)
    optimizer.build(model.trainable_variables)
    return optimizer


def _tf_step(model, x, training):
    """A ``tf.function`` with a fixed input signature; the pass returns the outputs' sum
    (fetching it waits for the work; no output is skipped); the step is forward, loss,
    gradients and ``SGD(momentum=0.9).apply``, returning the loss."""
    import tensorflow as tf

    spec = tf.TensorSpec(x.shape, tf.float32)
    if not training:
        forward = tf.function(lambda inputs: tf.reduce_sum(model(inputs, training=False)),
                              input_signature=[spec])
        return lambda: forward(x)
    optimizer = _sgd(model)

    @tf.function(input_signature=[spec])
    def step(inputs):
        with tf.GradientTape() as tape:
            loss = _mean_square(model(inputs, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
        return loss

    return lambda: step(x)


def _jax_step(model, x, training):
    """``jax.jit`` of the model's ``stateless_call`` (and of a stateless SGD step)."""
    import jax

    state = [[v.value for v in model.trainable_variables],
             [v.value for v in model.non_trainable_variables]]
    if not training:
        forward = jax.jit(lambda tv, ntv, inputs: model.stateless_call(tv, ntv, inputs)[0])
        return lambda: forward(*state, x)
    optimizer = _sgd(model)
    state.append([v.value for v in optimizer.variables])

    def loss(tv, ntv, inputs):
        y, ntv = model.stateless_call(tv, ntv, inputs, training=True)
        return _mean_square(y), ntv

    @jax.jit
    def step(tv, ntv, ov, inputs):
        (value, ntv), grads = jax.value_and_grad(loss, has_aux=True)(tv, ntv, inputs)
        tv, ov = optimizer.stateless_apply(ov, grads, tv)
        return tv, ntv, ov, value

    def run():
        tv, ntv, ov, value = step(*state, x)
        state[:] = [tv, ntv, ov]
        return value

    return run


def _torch_step(model, x, training, compiled=False):
    """The model called eagerly on a torch tensor, or its module under ``torch.compile``
    (no gradients for inference; a backward pass and ``torch.optim.SGD(momentum=0.9)`` for
    training, eager only)."""
    import torch

    call = torch.compile(model) if compiled else model
    if not training:
        def forward():
            with torch.no_grad():
                return call(x, training=False)
        return forward
    optimizer = torch.optim.SGD([v.value for v in model.trainable_variables], lr=1e-3,
                                momentum=0.9)

    def step():
        optimizer.zero_grad()
        loss = _mean_square(model(x, training=True))
        loss.backward()
        optimizer.step()
        return loss

    return step


def to_tflite(model, batch_size=None, int8=False):
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
        int8: full-integer quantization (int8 weights, activations, input and
            output), activation ranges calibrated on random normal batches.
    """
    import tensorflow as tf

    spec = tf.TensorSpec((batch_size,) + input_shape(model), tf.float32)
    fn = tf.function(lambda x: model(x, training=False), input_signature=[spec])
    converter = tf.lite.TFLiteConverter.from_concrete_functions([fn.get_concrete_function()],
                                                                model)
    converter.experimental_lower_to_saved_model = False
    if int8:
        samples = _calibration_batches(model, batch_size or 1)
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.representative_dataset = lambda: ([batch] for batch in samples)
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        converter.inference_input_type = tf.int8
        converter.inference_output_type = tf.int8
    return converter.convert()


def _calibration_batches(model, batch_size):
    """Random normal batches that calibrate an int8 model (timing needs ranges, not accuracy)."""
    rng = np.random.default_rng(1)
    count = max(1, _CALIBRATION // batch_size)
    return [rng.standard_normal((batch_size,) + input_shape(model)).astype("float32")
            for _ in range(count)]


def _litert_step(model, x, threads, int8=False):
    """A no-argument callable: one LiteRT interpreter invocation on ``x``, returning its output
    (read to the host, like ONNX Runtime's, so every runtime's runner returns the model's output).

    The flatbuffer is :func:`to_tflite`'s (weights frozen into constants);
    the interpreter is ``ai_edge_litert``'s where installed, else TensorFlow's
    ``tf.lite.Interpreter`` (the same runtime under its old name).
    """
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError:
        import tensorflow as tf

        Interpreter = tf.lite.Interpreter
    with warnings.catch_warnings():  # tf.lite.Interpreter's deprecation notice
        warnings.simplefilter("ignore")
        interpreter = Interpreter(model_content=to_tflite(model, len(x), int8=int8),
                                  num_threads=threads)
    interpreter.allocate_tensors()
    detail = interpreter.get_input_details()[0]
    if int8:  # the input is int8 too: quantize the batch with the input's scale
        scale, zero = detail["quantization"]
        x = np.clip(np.round(x / scale + zero), -128, 127).astype(np.int8)
    interpreter.set_tensor(detail["index"], x)
    output = interpreter.get_output_details()[0]["index"]

    def invoke():
        interpreter.invoke()
        return interpreter.get_tensor(output)

    return invoke


def to_onnx(model, path, int8=False):
    """Export ``model`` to an ONNX file at ``path`` with Keras' own exporter (``format="onnx"``).

    The exporter refuses a model that was never called (a freshly rebuilt
    one), so it is called once on zeros first. With ``int8``, the export is
    quantized statically to int8 QDQ (per-channel weights, activation ranges
    calibrated on random normal examples) by ONNX Runtime's quantizer.
    """
    model(np.zeros((1,) + input_shape(model), "float32"), training=False)
    if not int8:
        model.export(str(path), format="onnx", verbose=False)
        return path
    with tempfile.TemporaryDirectory() as folder:
        exported = os.path.join(folder, "float.onnx")
        model.export(exported, format="onnx", verbose=False)
        _quantize_onnx(model, exported, folder, str(path))
    return path


def _quantize_onnx(model, path, folder, quantized):
    """Writes a static int8 QDQ copy of the ONNX model at ``path`` to ``quantized``."""
    import onnxruntime
    from onnxruntime import quantization as q
    from onnxruntime.quantization.shape_inference import quant_pre_process

    class _Batches(q.CalibrationDataReader):
        def __init__(self, name):
            self.batches = iter({name: b} for b in _calibration_batches(model, 1))

        def get_next(self):
            return next(self.batches, None)

    name = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"]).get_inputs()[0].name
    prepared = os.path.join(folder, "prepared.onnx")
    quant_pre_process(path, prepared)
    q.quantize_static(prepared, quantized, _Batches(name), quant_format=q.QuantFormat.QDQ,
                      activation_type=q.QuantType.QInt8, weight_type=q.QuantType.QInt8,
                      per_channel=True, calibrate_method=q.CalibrationMethod.MinMax)


def _onnx_step(model, x, threads, int8=False):
    """A no-argument callable: one ONNX Runtime session run on ``x`` (model exported by Keras;
    with ``int8``, statically quantized to int8 QDQ)."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    with tempfile.TemporaryDirectory() as folder:
        path = to_onnx(model, os.path.join(folder, "model.onnx"), int8=int8)
        session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    feed = {session.get_inputs()[0].name: x}
    return lambda: session.run(None, feed)


def missing(runtime):
    """What a runtime lacks here: ``"<packages>: pip install 'keras-precrop[<extra>]'"``, or None.

    Looks the optional packages up without importing them (so a process may
    ask about ``"jax"`` or ``"torch"`` without loading that backend).
    """
    packages, extra = _NEEDS.get(runtime, ((), None))
    absent = [p for p in packages if importlib.util.find_spec(p) is None]
    return f"{', '.join(absent)}: pip install 'keras-precrop[{extra}]'" if absent else None


def _check_installed(runtime):
    """Raises an :class:`~keras_precrop.ArgumentError` naming the extra a runtime lacks."""
    hint = missing(runtime)
    if hint:
        raise ArgumentError(f"{{runtime}} needs {hint}", runtime=runtime)


def runner(model, batch_size, runtime="tf", training=False, seed=0, device=None):
    """A no-argument callable that runs ``model`` once on a fixed random batch and waits for it.

    The batch is put on the device once, here; each call launches the work
    (a compiled step's first call compiles it: :func:`interleaved` warms up),
    waits until the device has done it, and returns the output.

    Args:
        model: a single-input Keras model with a fixed input shape.
        batch_size: examples per call.
        runtime: ``"tf"`` (the backend's compiled step), ``"torch_compile"``
            (``torch.compile`` of the model's module), ``"litert"`` (or its
            old name ``"tflite"``: the LiteRT interpreter), ``"onnx"`` (ONNX
            Runtime, the model exported by Keras), or ``"litert_int8"`` /
            ``"onnx_int8"`` (their int8 quantizations); one thread per usable core.
        training: time a training step (forward, backward, SGD update)
            instead of inference; ``"tf"`` only.
        seed: seed of the random batch.
        device: the :class:`Device` to put the batch on and wait for
            (default :func:`device_of` the runtime); tests pass a recording one.
    """
    check_settings(batch_size, runtime, training)
    x = np.random.default_rng(seed).standard_normal(
        (batch_size,) + input_shape(model)).astype("float32")
    _check_installed(runtime)
    device = device or device_of(runtime)
    x = device.put(x)
    int8 = runtime.endswith("_int8")
    if runtime in _LITERT:
        launch = _litert_step(model, x, _usable_cpus(), int8)
    elif runtime in ("onnx", "onnx_int8"):
        launch = _onnx_step(model, x, _usable_cpus(), int8)
    else:
        launch = _compiled_step(model, x, runtime, training)

    def call():
        y = launch()
        device.wait(y)
        return y

    return call


def _usable_cpus():
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


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
    done = itertools.count(1)

    def ratio(candidate):
        seconds = measure({"original": model, "candidate": candidate})
        result = Measured(float(seconds["candidate"]) / float(seconds["original"]),
                          narrowed(model, candidate))
        cut = "".join(f"; cuts {name!r} from {before} to {after} channels"
                      for name, after, before in result.narrowed[:3])
        log(f"calibration round {next(done)}: the plan measures {result:.3f} of the "
            f"original's time{cut}")
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
    """Raises :class:`~keras_precrop.ArgumentError` for timing settings no runner takes."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) \
            or batch_size < 1:
        raise ArgumentError("{batch_size:subject} must be a positive integer{got}", batch_size=batch_size)
    if runtime not in RUNTIMES:
        raise ArgumentError(f"{{runtime:subject}} must be one of {RUNTIMES}{{got}}", runtime=runtime)
    _check_backend(runtime)
    _check_compiler(runtime)
    if training and runtime not in ("tf", "jax", "torch"):
        raise ArgumentError("{training} times a training step, which only {runtime:tf} runs",
                            training=training)


def _check_backend(runtime):
    """Raises :class:`~keras_precrop.ArgumentError` where the Keras backend cannot run ``runtime``.

    ``"jax"``, ``"torch"`` and ``"torch_compile"`` time that backend's own step; the LiteRT runtimes
    convert the model by calling it on TensorFlow tensors, which only the
    TensorFlow backend takes (another one failed deep inside the converter).
    """
    backend = keras.backend.backend()
    need = _BACKEND_OF.get(runtime, "tensorflow" if runtime in _LITERT else backend)
    if backend != need:
        raise ArgumentError(f"{{runtime}} times the model under KERAS_BACKEND={need}; this "
                            f"process runs {backend!r} (set KERAS_BACKEND before Keras is "
                            "imported)", runtime=runtime)


def _check_compiler(runtime):
    """Raises :class:`~keras_precrop.ArgumentError` for ``"torch_compile"`` without a C++ compiler.

    ``torch.compile``'s inductor generates C++ (on a CPU) or Triton kernels
    (on a GPU, launched through C) and builds them with the machine's
    compiler; without one the first call fails deep inside torch.
    """
    if runtime != "torch_compile":
        return
    found = [c for c in (os.environ.get("CXX"), *_CXX) if c and shutil.which(c)]
    if not found:
        raise ArgumentError("{runtime} builds its kernels with a C++ compiler, and none of "
                            f"{', '.join(_CXX)} (or $CXX) is on PATH here; install one, or time "
                            "the eager model with {runtime:torch}", runtime=runtime)
