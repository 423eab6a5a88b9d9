"""Benchmark: SynFlow (100 rounds) on the zoo ResNet-20, Keras vs a minimal PyTorch port.

Times ``keras_precrop.pai.synflow`` (``dtype="auto"``, which runs float32 on
ResNet-20, and ``dtype="float64"``) and the Synaptic-Flow reference algorithm
written minimally in PyTorch (``prune_loop`` + ``SynFlow.score`` +
``_global_mask``, float32 as in the reference and float64) on a PyTorch
ResNet-20 holding the *same* weights, and compares the masks. Each thread
count runs in a fresh process (TensorFlow fixes its thread pools at start-up)
with the implementations interleaved, best of ``--repeats``. The PyTorch part
is skipped with a message when torch is not installed (torch is not a
dependency of keras_precrop).

Usage::

    python benchmarks/bench_synflow.py [--density 0.01] [--iterations 100] [--repeats 3] [--threads 1,2]

Writes ``benchmarks/results/synflow.json`` and ``synflow.md``.
"""

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from _timing import machine_info  # noqa: E402
from keras_precrop import models, pai  # noqa: E402

RESULTS = pathlib.Path(__file__).resolve().parent / "results"


def _torch_resnet20(keras_model, dtype):
    """A PyTorch ResNet-20 (open_lth layout) carrying the Keras model's weights."""
    import torch
    from torch import nn

    weights = {v.path: v.numpy() for v in keras_model.weights}

    def conv(name, cin, cout, k, stride):
        layer = nn.Conv2d(cin, cout, k, stride, padding=k // 2, bias=False)
        layer.weight.data = torch.from_numpy(weights[f"{name}/kernel"].transpose(3, 2, 0, 1).copy())
        return layer

    def bn(name, c):
        layer = nn.BatchNorm2d(c, eps=1e-5)
        layer.weight.data = torch.from_numpy(weights[f"{name}/gamma"].copy())
        layer.bias.data = torch.from_numpy(weights[f"{name}/beta"].copy())
        layer.running_mean.data = torch.from_numpy(weights[f"{name}/moving_mean"].copy())
        layer.running_var.data = torch.from_numpy(weights[f"{name}/moving_variance"].copy())
        return layer

    class Block(nn.Module):
        def __init__(self, prefix, cin, cout, stride):
            super().__init__()
            self.conv1, self.bn1 = conv(prefix + "conv1", cin, cout, 3, stride), bn(prefix + "bn1", cout)
            self.conv2, self.bn2 = conv(prefix + "conv2", cout, cout, 3, 1), bn(prefix + "bn2", cout)
            self.shortcut = nn.Identity()
            if stride != 1 or cin != cout:
                self.shortcut = nn.Sequential(
                    conv(prefix + "shortcut_conv", cin, cout, 1, stride), bn(prefix + "shortcut_bn", cout)
                )

        def forward(self, x):
            y = torch.relu(self.bn1(self.conv1(x)))
            return torch.relu(self.bn2(self.conv2(y)) + self.shortcut(x))

    class ResNet20(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.bn = conv("stem_conv", 3, 16, 3, 1), bn("stem_bn", 16)
            blocks, cin = [], 16
            for stage, cout in enumerate((16, 32, 64)):
                for block in range(3):
                    stride = 2 if stage > 0 and block == 0 else 1
                    blocks.append(Block(f"stage{stage + 1}_block{block + 1}_", cin, cout, stride))
                    cin = cout
            self.blocks = nn.Sequential(*blocks)
            self.fc = nn.Linear(64, 10)
            self.fc.weight.data = torch.from_numpy(weights["classifier/kernel"].T.copy())
            self.fc.bias.data = torch.from_numpy(weights["classifier/bias"].copy())

        def forward(self, x):
            x = torch.relu(self.bn(self.conv(x)))
            x = self.blocks(x).mean(dim=(2, 3))
            return self.fc(x)

    return ResNet20().to(dtype)


def _torch_synflow(net, density, iterations, dtype, count="reference"):
    """The reference algorithm, minimally: returns {param name: 0/1 mask}.

    Linearize (abs of every state_dict entry, eval mode), ones input, score
    ``|w * dR/dw|`` of conv/linear weights, global ``kthvalue`` threshold with
    ``score <= threshold`` pruned, exponential schedule. ``count="reference"``
    prunes ``int((1 - d) * n)`` weights per round as the reference does;
    ``"round"`` keeps ``round(d * n)`` like keras_precrop.
    """
    import torch

    net.eval()
    with torch.no_grad():
        for tensor in net.state_dict().values():
            tensor.abs_()
    params = {n: p for n, p in net.named_parameters() if n.endswith("weight") and p.dim() > 1}
    masks = {n: torch.ones_like(p) for n, p in params.items()}
    x = torch.ones((1, 3, 32, 32), dtype=dtype)
    for k in range(iterations):
        with torch.no_grad():
            for n, p in params.items():
                p.mul_(masks[n])
        net.zero_grad()
        net(x).sum().backward()
        scores = {n: (p.grad * p).detach().abs() for n, p in params.items()}
        flat = torch.cat([s.flatten() for s in scores.values()])
        round_density = density ** ((k + 1) / iterations)
        if count == "reference":
            prune = int((1.0 - round_density) * flat.numel())
        else:
            prune = flat.numel() - round(round_density * flat.numel())
        if prune >= 1:
            threshold = torch.kthvalue(flat, prune).values
            for n, s in scores.items():
                masks[n] = (s > threshold).to(dtype)
    return masks


def _compare(keras_masks, other, keras_side=False):
    """Fraction of mask entries on which ``other`` (torch layout unless ``keras_side``) agrees."""
    same = total = 0
    for km, om in zip(keras_masks.values(), other.values()):
        if not keras_side:
            om = om.detach().numpy()
            om = om.T if om.ndim == 2 else om.transpose(2, 3, 1, 0)
        same += int((km == om).sum())
        total += km.size
    return same / total


def _worker(args):
    """Times every implementation with ``args.threads`` threads; returns a result dict."""
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    keras.utils.set_random_seed(0)
    model = models.get("resnet20")
    try:
        import torch
    except ImportError:
        torch = None
    runs = {
        f"keras_{dtype}": lambda dtype=dtype: pai.synflow(
            model, args.density, iterations=args.iterations, dtype=dtype, verbose=0
        )
        for dtype in ("auto", "float64")
    }
    if torch is not None:
        torch.set_num_threads(args.threads)
        for name, dtype in (("float32", torch.float32), ("float64", torch.float64)):
            runs[f"torch_{name}"] = lambda dtype=dtype: _torch_synflow(
                _torch_resnet20(model, dtype), args.density, args.iterations, dtype
            )
    times = {name: [] for name in runs}
    masks = {}
    for _ in range(args.repeats):  # interleaved: every implementation sees the same load
        for name, fn in runs.items():
            start = time.perf_counter()
            masks[name] = fn()
            times[name].append(time.perf_counter() - start)
    result = {
        "threads": args.threads,
        "machine": machine_info(),
        "times_s": times,
        "best_s": {k: min(v) for k, v in times.items()},
        "median_s": {k: statistics.median(v) for k, v in times.items()},
    }
    reference = masks["keras_auto"]
    result["kept"] = int(sum(m.sum() for m in reference.values()))
    result["layer_densities_keras"] = pai.layer_densities(reference)
    result["keras_float64_mask_agreement"] = _compare(
        reference, {p: m for p, m in masks["keras_float64"].items()}, keras_side=True)
    if torch is not None:
        result["torch_version"] = torch.__version__
        for name in ("float32", "float64"):
            result[f"torch_{name}_mask_agreement"] = _compare(reference, masks[f"torch_{name}"])
        same_count = _torch_synflow(
            _torch_resnet20(model, torch.float64), args.density, args.iterations, torch.float64, "round"
        )
        result["torch_float64_round_count_mask_agreement"] = _compare(reference, same_count)
    return result


def _markdown(result):
    runs = result["runs"]
    threads = [r["threads"] for r in runs]
    loads = ", ".join(f"{r['machine']['load_average_at_start'][0]:.1f}" for r in runs)
    names = {
        "keras_auto": 'keras_precrop.pai.synflow, dtype="auto" (float32 here)',
        "keras_float64": 'keras_precrop.pai.synflow, dtype="float64"',
        "torch_float32": "PyTorch reference loop, float32",
        "torch_float64": "PyTorch reference loop, float64",
    }
    lines = [
        f"# SynFlow, {result['iterations']} rounds, ResNet-20 at density {result['density']}",
        "",
        f"Machine: {result['machine']} (1-minute load average at start {loads}); versions "
        f"{result['versions']}.",
        f"Seconds per full `synflow` call (setup, tracing and {result['iterations']} rounds), best of "
        f"{result['repeats']} interleaved runs (medians in synflow.json).",
        "",
        "| implementation | " + " | ".join(f"{n} thread{'s' * (n > 1)} (s)" for n in threads) + " |",
        "|---|" + "---|" * len(threads),
    ]
    for key, label in names.items():
        if key in runs[0]["best_s"]:
            lines.append(f"| {label} | " + " | ".join(f"{r['best_s'][key]:.2f}" for r in runs) + " |")
    if "torch_float32" in runs[0]["best_s"]:
        lines += ["", "| ratio | " + " | ".join(f"{n} thr." for n in threads) + " |",
                  "|---|" + "---|" * len(threads)]
        for keras_key, torch_key in (("keras_auto", "torch_float32"), ("keras_float64", "torch_float64")):
            lines.append(
                f"| {keras_key} / {torch_key} | "
                + " | ".join(f"{r['best_s'][keras_key] / r['best_s'][torch_key]:.2f}" for r in runs)
                + " |"
            )
        first = runs[0]
        lines += [
            "",
            "Fraction of mask entries equal to `keras_auto`'s: "
            f"keras float64 {first['keras_float64_mask_agreement']:.4f}, "
            f"torch float32 {first['torch_float32_mask_agreement']:.4f}, "
            f"torch float64 {first['torch_float64_mask_agreement']:.4f}, torch float64 keeping "
            "`round(d * n)` per round like keras_precrop "
            f"{first['torch_float64_round_count_mask_agreement']:.4f}.",
            "The reference prunes `int((1 - d) * n)` weights per round; that count differs by one",
            "weight in some rounds, which shifts later rounds slightly.",
            "",
            "The machine is shared with other jobs: multi-threaded runs of both libraries vary",
            "several-fold from run to run (see `times_s` in synflow.json); single-threaded ones are",
            "the steadier comparison.",
        ]
    else:
        lines += ["", "PyTorch comparison skipped: torch is not installed."]
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--density", type=float, default=0.01)
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    parser.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker_out:
        args.threads = int(args.threads)
        pathlib.Path(args.worker_out).write_text(json.dumps(_worker(args)))
        return
    try:
        import torch  # noqa: F401
    except ImportError:
        print("torch is not installed: skipping the PyTorch comparison (pip install torch).")
    runs = []
    for threads in [int(t) for t in args.threads.split(",")]:
        with tempfile.TemporaryDirectory() as tmp:
            out = pathlib.Path(tmp) / "run.json"
            subprocess.run(
                [sys.executable, __file__, f"--density={args.density}", f"--iterations={args.iterations}",
                 f"--repeats={args.repeats}", f"--threads={threads}", f"--worker-out={out}"],
                check=True,
            )
            runs.append(json.loads(out.read_text()))
    result = {
        "model": "resnet20 (keras_precrop.models.get, seed 0)",
        "density": args.density,
        "iterations": args.iterations,
        "repeats": args.repeats,
        "machine": (f"{runs[0]['machine']['cpu']}, {runs[0]['machine']['logical_cpus']} CPUs "
                    "shared with other jobs"),
        "versions": {"tensorflow": tf.__version__, "keras": keras.__version__},
        "runs": runs,
    }
    if "torch_version" in runs[0]:
        result["versions"]["torch"] = runs[0]["torch_version"]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "synflow.json").write_text(json.dumps(result, indent=2) + "\n")
    markdown = _markdown(result)
    (RESULTS / "synflow.md").write_text(markdown)
    print(markdown)


if __name__ == "__main__":
    main()
