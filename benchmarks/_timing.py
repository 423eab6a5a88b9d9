"""Timing helpers shared by the benchmark scripts (not part of the library).

Wall-clock measurement on a shared, noisy machine: compiled ``tf.function``
forward and SGD train steps with fixed input signatures (no ``model.predict``
or ``fit`` overhead), calibrated inner loops, round-robin interleaving over
variants so load spikes hit every variant alike, and medians. The steps and
the interleaving are the library's own (``keras_precrop.latency``), which
latency models are fitted with; this module adds machine info, profiles and
summaries.
"""

import collections
import importlib.metadata
import json
import os
import pathlib
import platform
import statistics
import sys
import tempfile
import time

import keras
import numpy as np

from keras_precrop import latency


def cpu_name():
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` says."""
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
    except OSError:
        names = []
    return names[0] if names else platform.processor() or platform.machine()


def _version(package):
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _threads():
    """Thread settings of the Keras backend's runtime (TensorFlow only imported under its own)."""
    backend = keras.backend.backend()
    if backend == "torch":
        import torch

        return {"torch_threads": torch.get_num_threads(),
                "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "default (active)")}
    if backend != "tensorflow":
        return {}
    import tensorflow as tf

    threading = tf.config.threading
    # 0 means TensorFlow's default: one thread per usable core.
    return {"intra_op_threads": threading.get_intra_op_parallelism_threads(),
            "inter_op_threads": threading.get_inter_op_parallelism_threads(),
            "onednn": os.environ.get("TF_ENABLE_ONEDNN_OPTS", "default (on)")}


def machine_info():
    """CPU model, core count, Keras backend, library versions and the backend's thread settings."""
    return {
        "cpu": cpu_name(),
        "logical_cpus": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "python": platform.python_version(),
        "backend": keras.backend.backend(),
        "tensorflow": _version("tensorflow") or _version("tensorflow-cpu"),
        "keras": keras.__version__,
        "numpy": np.__version__,
        **{p: _version(p) for p in ("jax", "torch", "onnxruntime", "ai-edge-litert")},
        **_threads(),
        "load_average_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def device(runtime):
    """What ``runtime`` runs on here: the backend's accelerator, else the CPU.

    The interpreters (LiteRT, ONNX Runtime) run on the CPU; ``"tf"``,
    ``"jax"``, ``"torch"`` (and a ``"train"`` step) on the backend's first device.
    """
    accelerator = None
    if runtime in ("tf", "jax", "torch", "train"):
        accelerator = _accelerator(keras.backend.backend())
    return accelerator or f"CPU: {cpu_name()}"


def _accelerator(backend):
    """The name of the backend's first accelerator, or None on a CPU-only machine."""
    if backend == "jax":
        import jax

        first = jax.devices()[0]
        return None if first.platform == "cpu" else first.device_kind
    if backend == "torch":
        import torch

        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    return tf.config.experimental.get_device_details(gpus[0]).get("device_name", "GPU") \
        if gpus else None


def share(x):
    """A share as a percentage, or "n/a" where there is none (a latency model's held-out error
    is ``None`` with fewer than 3 held-out variants)."""
    return "n/a" if x is None else f"{x:.1%}"


def plan_error(error):
    """A latency model's error on its last refinement round's plans: "median / worst" or "-"."""
    if error.get("plans_median") is None:
        return "-"
    return f"{error['plans_median']:.1%} / {error['plans_worst']:.1%}"


def forward(model, batch, seed=0):
    """A no-argument callable running one compiled inference forward pass.

    The library's timing step (``keras_precrop.latency.runner``): a
    ``tf.function`` with a fixed input signature on a fixed random batch,
    returning the logits' sum fetched to host so the work cannot be skipped.
    """
    return latency.runner(model, batch, seed=seed)


def train_step(model, batch, seed=0):
    """A no-argument callable running one compiled SGD training step.

    The library's training step (``keras_precrop.latency.runner(...,
    training=True)``): forward in training mode, mean-square loss, gradient
    tape and ``SGD(momentum=0.9).apply`` (which also applies weight
    constraints, e.g. SynFlow masks) in one ``tf.function`` on a fixed random
    batch. Returns the loss; the model's weights change with each call.
    """
    return latency.runner(model, batch, training=True, seed=seed)


def interleaved(fns, repeats, warmup=2, target_s=0.2):
    """Times several callables round-robin; returns seconds per call per round.

    ``keras_precrop.latency.interleaved`` with ``repeats`` rounds: warm-up,
    inner loops calibrated to about ``target_s`` per sample, the order rotated
    by one each round.

    Returns:
        ``{name: [seconds per call, one entry per round]}``.
    """
    return latency.interleaved(fns, repeats, warmup=warmup, target_s=target_s)


def _profile_ops(fn, calls):
    """Per-op-type kernel time of ``calls`` calls of ``fn`` (ms per call), one profiler session."""
    import tensorflow as tf
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    with tempfile.TemporaryDirectory() as logdir:
        tf.profiler.experimental.start(logdir)
        try:
            for _ in range(calls):
                fn()
        finally:
            tf.profiler.experimental.stop()
        paths = list(pathlib.Path(logdir).rglob("*.xplane.pb"))
        if len(paths) != 1:
            raise RuntimeError(f"Expected one profiler trace under {logdir}, found {paths}.")
        space = xplane_pb2.XSpace()
        space.ParseFromString(paths[0].read_bytes())
    totals = collections.Counter()
    for plane in space.planes:
        for line in plane.lines:
            if not line.name.startswith("tf_Compute"):
                continue
            for event in line.events:
                name = plane.event_metadata[event.metadata_id].name
                # Kernels are "op_name:OpType"; "Process" events wrap them.
                op_type = name.rsplit(":", 1)[1] if ":" in name else None
                if op_type and op_type != "Process" and event.duration_ps:
                    totals[op_type] += event.duration_ps * 1e-9 / calls
    return totals


def op_times(fns, rounds=5, calls=2):
    """Per-op-type time of several callables from the TensorFlow profiler.

    Each round profiles ``calls`` calls of every callable (rotated order, as in
    :func:`interleaved`); the result per op type is the median over rounds of
    its kernel time summed over TensorFlow's compute threads, so ops that ran
    concurrently both count and a column can exceed wall time.

    Returns:
        ``{name: {op type: ms per call}}``, op types by decreasing time.
    """
    names = list(fns)
    per_round = {name: [] for name in names}
    for r in range(rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            per_round[name].append(_profile_ops(fns[name], calls))
    out = {}
    for name, samples in per_round.items():
        ops = set().union(*samples)
        medians = {op: statistics.median(s.get(op, 0.0) for s in samples) for op in ops}
        out[name] = dict(sorted(medians.items(), key=lambda kv: -kv[1]))
    return out


def timed(fn, repeats, setup=None):
    """Runs ``fn`` ``repeats`` times; returns (seconds per run, last result).

    ``setup`` (untimed) runs before each repeat, e.g. to clear the Keras session.
    """
    times, result = [], None
    for _ in range(repeats):
        if setup is not None:
            setup()
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return times, result


def summary(seconds):
    """Median, quartiles and count of a list of timings (seconds)."""
    q = np.percentile(seconds, [25, 50, 75])
    return {"median": float(q[1]), "q1": float(q[0]), "q3": float(q[2]), "n": len(seconds)}


def paired_speedup(baseline, variant):
    """Median over rounds of baseline/variant time (same-round pairs).

    Pairs from the same interleaved round saw the same machine load, so their
    ratio is steadier than a ratio of overall medians.
    """
    if len(baseline) != len(variant):
        raise ValueError(f"Need as many baseline as variant samples, got "
                         f"{len(baseline)} and {len(variant)}.")
    return statistics.median(b / v for b, v in zip(baseline, variant))


ORIGINAL = "original"  # the key of the unpruned model in against_original's result


def against_original(original, models, batch_size, rounds, target_s):
    """TensorFlow inference of ``original`` and of each of ``models`` (``{name: model}``), timed
    interleaved with the library's runners and round-robin, progress on stderr.

    Returns:
        ``{name: (seconds summary, speedup)}`` with the original under
        :data:`ORIGINAL`; speedup: median over rounds of the original's time
        / the model's in the same round.
    """
    fns = {name: latency.runner(model, batch_size=batch_size, runtime="tf")
           for name, model in {ORIGINAL: original, **models}.items()}
    print(f"timing {len(fns)} models, {rounds} rounds of about {target_s} s each ...", file=sys.stderr,
          flush=True)
    samples = latency.interleaved(fns, rounds, target_s=target_s,
                                  log=lambda line: print(f"  {line}", file=sys.stderr, flush=True))
    return {name: (summary(samples[name]), paired_speedup(samples[ORIGINAL], samples[name]))
            for name in fns}


def write_result(out, stem, result, text):
    """Writes a benchmark's ``result`` as ``<stem>.json`` and its Markdown ``text`` as ``<stem>.md``
    into the folder ``out`` (made if missing), and prints the text."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / f"{stem}.md").write_text(text)
    print(text)


def table_head(title, result, note, columns, align):
    """A timing benchmark's Markdown up to its table's first row: the title, how it timed
    (TensorFlow inference: ``result``'s batch, rounds, CPU, TensorFlow version and load) with
    ``note``, and the table's ``columns`` and ``align`` rows (cells joined by ``" | "``)."""
    s, m = result["settings"], result["machine"]
    load = ", ".join(f"{x:.1f}" for x in m["load_average_at_start"] or [])
    return [f"# {title}", "",
            f"TensorFlow inference, batch {s['batch_size']}, {s['rounds']} interleaved rounds; machine: "
            f"{m['cpu']}, {m['usable_cpus']} usable CPUs, TF {m['tensorflow']}, load average at start "
            f"{load}. {note}", "", f"| {columns} |", f"|{align}|"]
