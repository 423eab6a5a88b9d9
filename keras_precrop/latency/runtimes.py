"""The runtimes a model can be timed on, as one table.

A runtime is a :class:`Runtime` record: its name (and old names), the step
that times a model on it, the optional packages it needs and the extra that
installs them, the Keras backend it must run under, the device it computes
on, and whether it times a training step. :data:`RUNTIMES`, the ``runtime=``
of :func:`~keras_precrop.latency_model` and
:func:`~keras_precrop.latency.timing.runner`, the command line's
``--runtime`` choices and the guide's table of runtimes all read this table:
adding a runtime is one entry, and :func:`register_runtime` adds one from
outside the package.

This module imports neither Keras nor NumPy, so that the command line lists
the runtimes for ``--help`` at once: the built-in steps
(:mod:`keras_precrop.latency.steps`) are imported when one is built.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import shutil
from collections.abc import Callable, Mapping

from keras_precrop._views import NameView
from keras_precrop.latency.devices import backend_device, host_cpu, nchwc_block

_CXX = ("g++", "clang++", "c++")  # compilers torch.compile's inductor can build kernels with
_REGISTER = "kp.latency.register_runtime adds one"


@dataclasses.dataclass(frozen=True)
class Runtime:
    """One place a model can be timed: what runs it, what it needs, where it computes.

    Attributes:
        name: what ``runtime=`` and ``--runtime`` call it, and what a latency
            model fitted on it records.
        step: ``step(model, x, training) -> launch``: prepares ``model``
            (compiles, converts or exports it) to run on the batch ``x``
            (already on the device) and returns a no-argument callable that
            launches one call and returns its output; the runner waits for
            that output with the device's ``wait``.
        doc: what it times, in one line (the guide's table of runtimes).
        needs: the modules it imports, looked up (not imported) before timing.
        extra: the keras-precrop extra that installs ``needs``
            (``pip install 'keras-precrop[<extra>]'``); None: the modules
            themselves are what to install.
        backend: the Keras backend (``KERAS_BACKEND``) it must run under; None: any.
        device: ``device() -> Device``: where it computes in this process
            (:mod:`~keras_precrop.latency.devices`).
        training: whether ``step`` also times a training step (``training=True``).
        aliases: other names it answers to (``"tflite"``, LiteRT's old name).
        check: ``check(name)`` raises an :class:`~keras_precrop.ArgumentError`
            for what else this machine lacks (``torch_compile``'s C++
            compiler), ``name`` as the user gave it; None: nothing else.
        other_backends: ``{backend: runtime}``: the runtime this name stands
            for under another Keras backend (``"tf"``, the backend's own
            compiled step, is ``"jax"`` under JAX and ``"torch"`` under torch).
        multiple: ``multiple() -> int``: the channel multiple its kernels need on
            this machine to run at full speed (ONNX Runtime's blocked
            convolutions: 16 with AVX-512); None: any width.
        caution: why its time may not fall with width here, in one sentence
            (what a latency model or calibration that measured that says).
    """

    name: str
    step: Callable
    doc: str = ""
    needs: tuple = ()
    extra: str | None = None
    backend: str | None = None
    device: Callable = host_cpu
    training: bool = False
    aliases: tuple = ()
    check: Callable | None = None
    other_backends: Mapping = dataclasses.field(default_factory=dict)
    multiple: Callable | None = None
    caution: str = ""

    def missing(self):
        """What it lacks here, ``"<modules>: pip install <what installs them>"``, or None."""
        absent = [m for m in self.needs if importlib.util.find_spec(m) is None]
        if not absent:
            return None
        what = f"'keras-precrop[{self.extra}]'" if self.extra else " ".join(absent)
        return f"{', '.join(absent)}: pip install {what}"


def _error(template, **arguments):
    """An :class:`~keras_precrop.ArgumentError` (imported here: the errors module loads NumPy)."""
    from keras_precrop.errors import ArgumentError

    return ArgumentError(template, **arguments)


def _builtin(step, **options):
    """A built-in step builder: ``keras_precrop.latency.steps.<step>`` with ``options``,
    imported when a step is built (it loads Keras) and looked up then (tests wrap it)."""
    def build(model, x, training):
        from keras_precrop.latency import steps

        return getattr(steps, step)(model, x, training, **options)

    return build


def _check_compiler(name):
    """Refuses ``"torch_compile"`` without a C++ compiler on PATH.

    ``torch.compile``'s inductor generates C++ (on a CPU) or Triton kernels
    (on a GPU, launched through C) and builds them with the machine's
    compiler; without one the first call fails deep inside torch.
    """
    if not any(c and shutil.which(c) for c in (os.environ.get("CXX"), *_CXX)):
        raise _error("{runtime} builds its kernels with a C++ compiler, and none of "
                     f"{', '.join(_CXX)} (or $CXX) is on PATH here; install one, or time "
                     "the eager model with {runtime:torch}", runtime=name)


_BACKEND_STEP = dict(device=backend_device, training=True)
_TORCH_SPINS = ("PyTorch's OpenMP threads spin-wait, and while other processes load the cores "
                "a call can take many times longer (a 2-thread convolution ran 45x slower on a "
                "loaded 2-core CPU): time on a quiet machine, or start Python with "
                "OMP_WAIT_POLICY=PASSIVE")
_NCHWC = ("ONNX Runtime runs a convolution in its blocked layout (NCHWc) only where its output "
          "channels are a multiple of the CPU's block (16 with AVX-512, 8 with AVX2); other "
          "widths run slower kernels with layout copies around them (ResNet-20 at 3/4 of its "
          "widths, 12/24/48 channels, measured 1.03-1.33x the original's time on an AVX-512 "
          "CPU), and so do slices and pads of a residual stream")
_LITERT = dict(backend="tensorflow")  # the converter calls the model on TensorFlow tensors
_ONNX = dict(needs=("onnxruntime", "tf2onnx", "onnx"), extra="onnx")
_TABLE = {runtime.name: runtime for runtime in (
    Runtime("tf", _builtin("tf_step"), "the Keras backend's own compiled step: a `tf.function` "
            "(under JAX and torch it is the `jax` / `torch` runtime, and a latency model records "
            "that name)", backend="tensorflow", other_backends={"jax": "jax", "torch": "torch"},
            **_BACKEND_STEP),
    Runtime("jax", _builtin("jax_step"), "`jax.jit` of the model's `stateless_call`",
            needs=("jax",), extra="jax", backend="jax", **_BACKEND_STEP),
    Runtime("torch", _builtin("torch_step"), "the model called eagerly on torch tensors",
            needs=("torch",), extra="torch", backend="torch", caution=_TORCH_SPINS,
            **_BACKEND_STEP),
    Runtime("torch_compile", _builtin("torch_step", compiled=True),
            "`torch.compile` of the model's torch module, as torch users serve (inference; "
            "needs a C++ compiler, and the first compile takes a minute on a CPU)",
            needs=("torch",), extra="torch", backend="torch", device=backend_device,
            check=_check_compiler, caution=_TORCH_SPINS),
    Runtime("litert", _builtin("litert_step"), "the LiteRT interpreter (`ai_edge_litert`'s "
            "where installed) on the converted model, weights frozen", aliases=("tflite",),
            **_LITERT),
    Runtime("onnx", _builtin("onnx_step"), "ONNX Runtime on Keras' own ONNX export", **_ONNX,
            multiple=nchwc_block, caution=_NCHWC),
    Runtime("litert_int8", _builtin("litert_step", int8=True), "LiteRT on the full-integer "
            "post-training quantization, calibrated on random batches (ranges for timing, not "
            "for accuracy)", **_LITERT),
    Runtime("onnx_int8", _builtin("onnx_step", int8=True), "ONNX Runtime on the static int8 "
            "QDQ quantization, calibrated on random batches", **_ONNX),
)}


class _Names(NameView):
    """Every name the runtime table takes, aliases included, in table order: a tuple that
    follows the table (a registered runtime is in it at once)."""

    def _names(self):
        return tuple(n for runtime in _TABLE.values() for n in (runtime.name, *runtime.aliases))


RUNTIMES = _Names()
"""Where a model can be timed: the runtime table's names, aliases included (``"tf"``, ``"jax"``,
``"torch"``, ``"torch_compile"``, ``"litert"``, ``"tflite"``, ``"onnx"``, ``"litert_int8"``,
``"onnx_int8"`` and any :func:`register_runtime` added); a tuple-like view of the table."""


def _named(name):
    """The table's runtime called ``name`` or answering to it as an alias, or None."""
    return next((runtime for runtime in _TABLE.values()
                 if name == runtime.name or name in runtime.aliases), None)


def lookup(name, backend=None):
    """The :class:`Runtime` that ``name`` stands for under the Keras ``backend`` (None: as named).

    Raises:
        ArgumentError: for a name the table lacks, listing the table.
    """
    runtime = _named(name) if isinstance(name, str) else None
    if runtime is None:
        raise _error(f"{{runtime:subject}} must be one of {RUNTIMES}{{got}} ({_REGISTER})",
                     runtime=name)
    stands_for = runtime.other_backends.get(backend)
    return _TABLE[stands_for] if stands_for else runtime


def checked(name, training, backend):
    """The :class:`Runtime` ``name`` stands for under ``backend``, if it runs here as asked.

    Raises:
        ArgumentError: for an unknown name, another Keras backend than the
            runtime's (the LiteRT converter, given another backend's tensors,
            failed deep inside), what its ``check`` finds lacking, or a
            training step it does not time.
    """
    runtime = lookup(name, backend)
    if runtime.backend is not None and runtime.backend != backend:
        raise _error(f"{{runtime}} times the model under KERAS_BACKEND={runtime.backend}; this "
                     f"process runs {backend!r} (set KERAS_BACKEND before Keras is imported)",
                     runtime=name)
    if runtime.check is not None:
        runtime.check(name)
    if training and not runtime.training:
        raise _error("{training} times a training step, which only {runtime:tf} runs",
                     training=training)
    return runtime


def missing(name):
    """What runtime ``name`` lacks here: ``"<modules>: pip install 'keras-precrop[<extra>]'"``,
    or None.

    Looks the optional modules up without importing them (so a process may
    ask about ``"jax"`` or ``"torch"`` without loading that backend).
    """
    return lookup(name).missing()


def not_monotone(name):
    """What may make runtime ``name``'s time not fall with width here, and the remedy, in words.

    For a name the table lacks (a runtime registered in another process), what is true of
    any runtime.
    """
    runtime = _named(name) if isinstance(name, str) else None
    cause = (runtime.caution if runtime is not None and runtime.caution else
             f"runtime {name!r} may switch kernels at some widths, or other processes loaded "
             "the machine while it was timed")
    multiple = runtime.multiple() if runtime is not None and runtime.multiple else 1
    if multiple > 1:
        cause += (f"; the multiple here is {multiple}: plan with round_to={multiple} "
                  f"(kp.plan(..., round_to={multiple}) fits its latency model on that grid too)")
    return cause


def check_installed(name):
    """Raises an :class:`~keras_precrop.ArgumentError` naming what runtime ``name`` lacks here
    (its modules and the extra that installs them)."""
    hint = missing(name)
    if hint:
        raise _error(f"{{runtime}} needs {hint}", runtime=name)


def register_runtime(name, step, *, doc="", needs=(), extra=None, backend=None, device=None,
                     training=False, aliases=(), check=None, replace=False):
    """Add a runtime to the table: ``runtime=name`` (and ``--runtime name``) then times with ``step``.

    A model is timed as the built-in runtimes time it (interleaved rounds,
    medians), with ``step`` making each call::

        def predict(model, x, training):
            return lambda: model.predict_on_batch(x)

        kp.latency.register_runtime("predict", predict, doc="Keras' predict_on_batch")
        lm = kp.latency_model(model, runtime="predict")  # lm.runtime == "predict"

    A latency model records the runtime's name; a process that plans with a
    saved one of a registered runtime registers it first.

    Args:
        name: the runtime's name.
        step: ``step(model, x, training) -> launch``: prepares ``model`` to run
            on the batch ``x`` (a NumPy array, or what ``device``'s ``put`` made
            of it) and returns a no-argument callable that runs one call and
            returns its output; called once per timed model.
        doc: what it times, in one line.
        needs: modules it imports: a missing one is refused before timing.
        extra: the keras-precrop extra that installs ``needs`` (the error says
            ``pip install 'keras-precrop[<extra>]'``); None: it names the modules.
        backend: the Keras backend it must run under (``"tensorflow"``,
            ``"jax"``, ``"torch"``); None: any.
        device: ``device() -> Device`` (:class:`~keras_precrop.latency.devices.Device`):
            where it computes; default the host CPU, where the batch stays a
            NumPy array and a call's work is done when it returns
            (:func:`~keras_precrop.latency.devices.backend_device`: the Keras
            backend's GPU or TPU).
        training: whether ``step`` times a training step when ``training`` is True.
        aliases: other names it answers to.
        check: ``check(name)`` raises an :class:`~keras_precrop.ArgumentError`
            for what else this machine lacks; None: nothing.
        replace: replace the runtime called ``name`` (a built-in one too);
            otherwise a name or alias the table has is refused.

    Returns:
        The :class:`Runtime` added.
    """
    if not isinstance(name, str) or not name or not all(isinstance(a, str) and a for a in aliases):
        raise _error("{name} and {aliases} must be non-empty strings", name=name, aliases=aliases)
    if not callable(step):
        raise _error("{step} must be callable: step(model, x, training) -> launch", step=step)
    for taken in (name, *aliases):
        owner = _named(taken)
        if owner is not None and not (replace and owner.name == name):
            raise _error(f"{{name}}: {taken!r} names the runtime {owner.name!r} already; pick "
                         "another name, or pass replace=True to replace it", name=name)
    runtime = Runtime(name, step, doc, tuple(needs), extra, backend, device or host_cpu,
                      bool(training), tuple(aliases), check)
    _TABLE[name] = runtime
    return runtime


def markdown_table():
    """The runtime table as a Markdown table (the guide's, filled in by ``docs/hooks.py``)."""
    rows = ["| `runtime=` | What it times | Keras backend | Training step | Needs |",
            "| --- | --- | --- | --- | --- |"]
    for runtime in _TABLE.values():
        names = " / ".join(f"`{n}`" for n in (runtime.name, *runtime.aliases))
        under = "".join(f"; under {b}: `{r}`" for b, r in runtime.other_backends.items())
        needs = (f"`pip install 'keras-precrop[{runtime.extra}]'`" if runtime.extra
                 else ", ".join(runtime.needs) or "-")
        doc = runtime.doc.replace("|", "&#124;")
        rows.append(f"| {names} | {doc} | {runtime.backend or 'any'}{under} | "
                    f"{'yes' if runtime.training else '-'} | {needs} |")
    return "\n".join(rows)
