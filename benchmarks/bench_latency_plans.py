"""Benchmark: the experiments' latency plans of one network timed together, interleaved.

``experiments/latency_plans.py`` calibrates each plan of the equal-time grids
(``uniform_latency``, ``latency_floor``, ``latency_stream_floor``,
``uniform_mobilenet``) in its own process and at its own time, so two plans
that each measured "0.50 of the original's time" were measured under other
loads. This times every plan recorded in
``experiments/plans/<model>_tf_b<batch>_plans.json`` against the original in
one process, round-robin (``keras_precrop.latency.interleaved``), so their
speedups compare directly.

Usage (a quiet machine: pause the training, ``experiments/run.py``'s docstring says how)::

    python benchmarks/bench_latency_plans.py --model resnet20
    python benchmarks/bench_latency_plans.py --model mobilenet_v2_cifar

Writes ``latency_plans_<model>.json`` (per plan: params, MACs, the time ratio
its calibration measured, median seconds and speedup here) and ``.md`` into
``--out`` (default ``benchmarks/results``).
"""

import argparse
import json
import os
import pathlib
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import _timing  # noqa: E402
import keras_precrop as kp  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
PLANS = REPO / "experiments" / "plans"


def markdown(result):
    """One row per plan: its mode, costs, the calibration's time ratio and the speedup measured here."""
    lines = _timing.table_head(
        f"The latency plans of {result['settings']['model']} timed together", result,
        "*calibration*: the time ratio `experiments/latency_plans.py` measured for the plan on its own; "
        "*here*: median over rounds of the plan's time / the original's in the same round, and its "
        "inverse, the speedup.", "plan | mode | params | MACs ratio | calibration | here | speedup",
        "---|---|---:|---:|---:|---:|---:")
    for name, p in result["plans"].items():
        lines.append(f"| {name} | {p['mode_label']} | {p['params']:,} | {p['macs_ratio']:.3f} | "
                     f"{p['calibrated']:.3f} | {1 / p['speedup']:.3f} | {p['speedup']:.2f}x |")
    return "\n".join(lines + ["", f"Command: `{result['command']}`; {result['seconds']:.0f} s."]) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="resnet20", help="zoo model whose latency plans are timed")
    parser.add_argument("--batch-size", type=int, default=64, help="inference batch (the plans')")
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds")
    parser.add_argument("--target-s", type=float, default=0.3, help="seconds per sample (inner loop)")
    parser.add_argument("--out", type=pathlib.Path, default=REPO / "benchmarks" / "results")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    records = json.loads((PLANS / f"{args.model}_tf_b{args.batch_size}_plans.json").read_text())["plans"]
    plans = {name: kp.Plan.from_json(str(PLANS / f"{name}.json")) for name in records}
    base = kp.models.get(args.model)
    timed = _timing.against_original(base, {name: kp.apply_plan(base, plan) for name, plan in plans.items()},
                                     args.batch_size, args.rounds, args.target_s)
    result = {
        "command": " ".join(["python", "benchmarks/bench_latency_plans.py", *sys.argv[1:]]),
        "settings": {"model": args.model, "batch_size": args.batch_size, "runtime": "tf",
                     "rounds": args.rounds, "target_s": args.target_s},
        "machine": _timing.machine_info(),
        "seconds": time.perf_counter() - start,
        "original": {"params": base.count_params(), "seconds": timed[_timing.ORIGINAL][0]},
        "plans": {name: {"mode_label": plan.mode_label, "params": plan.params,
                         "macs_ratio": plan.macs / plan.original["macs"],
                         "calibrated": records[name]["calibration"]["measured"],
                         "seconds": timed[name][0], "speedup": timed[name][1]}
                  for name, plan in plans.items()},
    }
    _timing.write_result(args.out, f"latency_plans_{args.model}", result, markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
