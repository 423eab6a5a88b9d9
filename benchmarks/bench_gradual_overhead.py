"""Benchmark: what ``kp.GradualPruning`` adds to an epoch of ``fit``, at its default frequency.

Two copies of one model (ResNet-20 by default) train on the same random
CIFAR-shaped batches: one with a plain ``fit``, one with a ``GradualPruning``
callback whose schedule is under way for every measured epoch (it re-ranks
and masks every ``--frequency`` steps, and the train step zeroes the masked
weights after every step). After one warm-up epoch each (tracing, the
callback's walk of the model), the two fits alternate epoch by epoch, the
first of each round rotated, so a load spike falls on both alike. The
overhead is the median over rounds of (epoch with the callback) / (plain
epoch in the same round) - 1, beside the ratio of the medians and of the
fastest epochs; the time of each mask update (the callback's ``_update``,
timed in place) is given beside it. Goal (issue 60): at most 10% at the
default frequency. Where ``--out`` holds an earlier run's results, the table
puts its numbers beside the new ones (what a change to the callback did).

Usage::

    python benchmarks/bench_gradual_overhead.py              # ~7 min on 2 cores, quiet machine
    python benchmarks/bench_gradual_overhead.py --quick      # smoke run, writes to a temp folder

Writes ``gradual_overhead.json`` and ``gradual_overhead.md`` into ``--out``
(default ``benchmarks/results``; ``--quick`` writes to a temporary folder so
that a smoke run never looks like evidence).
"""

import argparse
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import _timing  # noqa: E402
import keras_precrop as kp  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
GOAL = 0.10  # at most 10% more time per epoch


def _compiled(model):
    model.compile(keras.optimizers.SGD(0.01, momentum=0.9),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


class _UpdateTimer:
    """Wraps a ``GradualPruning``'s mask update and records how long each one takes."""

    def __init__(self, callback):
        self.seconds, inner = [], callback._update

        def timed(*args, **kwargs):
            start = time.perf_counter()
            inner(*args, **kwargs)
            self.seconds.append(time.perf_counter() - start)

        callback._update = timed


def bench(model_name, steps, rounds, batch_size, frequency, seed=0):
    """Seconds per epoch of both fits, round by round, and the mask updates' seconds."""
    keras.utils.set_random_seed(seed)
    plain = _compiled(kp.models.get(model_name))
    pruned = _compiled(keras.models.clone_model(plain))
    pruned.set_weights(plain.get_weights())
    plan = kp.plan(plain, flops=0.5)
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(steps * batch_size, *plain.input_shape[1:])).astype("float32")
    y = rng.integers(0, plain.output_shape[-1], size=len(x))
    callback = kp.GradualPruning(plan, end_step=steps * (rounds + 2), frequency=frequency, verbose=0)
    timer = _UpdateTimer(callback)
    fits = {"plain": lambda: plain.fit(x, y, batch_size=batch_size, epochs=1, verbose=0),
            "gradual": lambda: pruned.fit(x, y, batch_size=batch_size, epochs=1, verbose=0,
                                          callbacks=[callback])}
    for fit in fits.values():  # warm-up: tracing, the callback's walk
        fit()
    warm_updates = len(timer.seconds)
    seconds = {name: [] for name in fits}
    for r in range(rounds):
        for name in (list(fits) if r % 2 == 0 else list(fits)[::-1]):
            start = time.perf_counter()
            fits[name]()
            seconds[name].append(time.perf_counter() - start)
    return seconds, timer.seconds[warm_updates:]


def _estimates(seconds):
    """The overhead three ways: the median same-round ratio, the ratio of the medians and of the
    fastest epochs (the least disturbed by the load of a shared machine)."""
    plain, gradual = seconds["plain"], seconds["gradual"]
    return {"median same-round ratio": statistics.median(g / p for g, p in zip(gradual, plain)) - 1,
            "ratio of the medians": statistics.median(gradual) / statistics.median(plain) - 1,
            "ratio of the fastest": min(gradual) / min(plain) - 1}


def _verdict(estimates):
    """Met where every estimate is within the goal, not met where none is, else unsettled."""
    if max(estimates.values()) <= GOAL:
        return "met"
    if min(estimates.values()) > GOAL:
        return "not met"
    return "not settled by this run (the estimates straddle it)"


def _previous(folder):
    """The medians and overhead estimates of the run written into ``folder`` before, if any."""
    path = folder / "gradual_overhead.json"
    if not path.exists():
        return None
    old = json.loads(path.read_text())
    return {"plain": statistics.median(old["seconds"]["plain"]),
            "gradual": statistics.median(old["seconds"]["gradual"]), "overhead": old["overhead"]}


def _markdown(result):
    s = result["seconds"]
    ratios = [g / p for g, p in zip(s["gradual"], s["plain"])]
    estimates = _estimates(s)
    updates = result["update_seconds"]
    per_update = f"{statistics.median(updates):.3f}" if updates else "n/a"
    # The updates' own share of the measured epochs: the part of the overhead that does not
    # depend on the same-round pairing (a load spike on one side of a pair moves the ratio).
    update_share = sum(updates) / sum(s["plain"])
    lines = [
        f"# `GradualPruning`'s overhead per epoch ({result['model']})", "",
        f"{result['steps']} steps of batch {result['batch_size']} an epoch, frequency "
        f"{result['frequency']} (the default), {result['rounds']} interleaved rounds after a "
        f"warm-up epoch each; machine: {result['machine']['cpu']}, "
        f"{result['machine']['usable_cpus']} usable CPUs, backend {result['machine']['backend']}.",
        "",
        "| fit | median s / epoch | fastest s / epoch |", "|---|---:|---:|",
        f"| plain `fit` | {statistics.median(s['plain']):.2f} | {min(s['plain']):.2f} |",
        f"| `fit` + `GradualPruning` | {statistics.median(s['gradual']):.2f} | "
        f"{min(s['gradual']):.2f} |", "",
        "Overhead: " + ", ".join(f"{name} **{value:+.1%}**" for name, value in estimates.items())
        + f" (same-round ratios: {', '.join(f'{r - 1:+.1%}' for r in ratios)}); {len(updates)} "
        f"mask updates in the measured epochs, median {per_update} s each: {update_share:.1%} of "
        "the plain epochs' time.", "",
        f"Goal (issue 60) at most {GOAL:.0%}: {_verdict(estimates)}.", ""]
    previous = result.get("previous")
    if previous:
        lines[-2:-2] = [
            f"The run written here before this one: median epochs {previous['plain']:.2f} s plain, "
            f"{previous['gradual']:.2f} s with the callback; overhead "
            + ", ".join(f"{name} {value:+.1%}" for name, value in previous["overhead"].items())
            + ".", ""]
    return "\n".join(lines), estimates, update_share


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet20")
    parser.add_argument("--steps", type=int, default=50, help="steps per epoch")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--batch_size", type=int, default=128)
    parser.add_argument("--frequency", type=int, default=50)
    parser.add_argument("--out", type=pathlib.Path, default=None,
                        help="results folder (default benchmarks/results; --quick: a temp folder)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 10 steps, 1 round")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.rounds = 10, 1
    out = args.out or (pathlib.Path(tempfile.mkdtemp()) if args.quick else RESULTS)
    seconds, updates = bench(args.model, args.steps, args.rounds, args.batch_size, args.frequency)
    result = {"model": args.model, "steps": args.steps, "rounds": args.rounds,
              "batch_size": args.batch_size, "frequency": args.frequency,
              "machine": _timing.machine_info(), "seconds": seconds, "update_seconds": updates,
              "previous": _previous(out)}
    text, result["overhead"], result["update_share"] = _markdown(result)  # overhead: 3 ways
    out.mkdir(parents=True, exist_ok=True)
    (out / "gradual_overhead.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "gradual_overhead.md").write_text(text)
    print(text)
    print(f"written to {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
