"""Where a runtime computes: the device a runner puts its batch on and waits for.

Light on purpose: the runtime table (:mod:`keras_precrop.latency.runtimes`)
names a device finder per runtime, and the command line lists that table for
``--help`` without loading Keras or NumPy; those (and the backend's own
library) are imported when a device is looked up.
"""

from __future__ import annotations

import dataclasses
import platform
from collections.abc import Callable


@dataclasses.dataclass(frozen=True)
class Device:
    """Where a runner computes, and how its input gets there and its work is waited for.

    A runner puts its input on the device once, before anything is timed, and
    waits for every call's work before the clock is read again: on a GPU a
    call returns once its kernels are queued, so without the wait a clock
    times launches, and calls of interleaved models overlap in the queue.
    Tests pass a recording device to see that order
    (:func:`~keras_precrop.latency.timing.runner`'s ``device``).

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


def cpu_flags():
    """This machine's CPU feature flags (``/proc/cpuinfo``'s ``flags``; empty where unknown)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.partition(":")[2].split())
    except OSError:
        pass
    return frozenset()


def nchwc_block():
    """The channel block of ONNX Runtime's blocked (NCHWc) CPU convolutions here: 16 with
    AVX-512, 8 with AVX2, 1 (no blocked layout) otherwise, as its MLAS library picks it."""
    flags = cpu_flags()
    return 16 if "avx512f" in flags else 8 if "avx2" in flags else 1


def host_cpu():
    """The host CPU: the batch stays a NumPy array, and a call's work is done when it returns
    (LiteRT, ONNX Runtime, and a registered runtime unless it names another device)."""
    return Device("cpu", cpu_name(), put=lambda x: x, wait=lambda y: None)


def backend_device():
    """The device the Keras backend puts tensors on: its first GPU or TPU, else the CPU."""
    import keras

    make = {"tensorflow": _tf_device, "jax": _jax_device, "torch": _torch_device}.get(
        keras.backend.backend(), host_cpu)
    return make()


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
    import keras
    import numpy as np
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
