"""Benchmark: end-to-end cost of ``reconfigure`` and ``precrop`` vs building the model.

For EfficientNetB0, MobileNetV2 (``keras.applications``, ``weights=None``) and
the zoo's ImageNet ResNet-34, times building the model, then
``kp.reconfigure(model, params=1.0, flops=1.0)`` (PreConfig at the original
budget, layerwise mode by default) and ``kp.precrop(model, flops=0.5,
mode="exact")`` end to end, and their parts: ``profile`` (graph walk and cost model),
``plan`` (walk + solve + integer widths) and ``apply_plan`` (walk + rebuild
with fresh weights). Medians over repeats; the Keras session is cleared
(untimed) before every repeat. Goal (issue 7): ``reconfigure(EfficientNetB0)``
takes at most 1.5x the time of building EfficientNetB0.

Usage::

    python benchmarks/bench_reconfigure.py [--repeats 5] [--quick]

Writes ``benchmarks/results/reconfigure.json`` and ``reconfigure.md``.
"""

import argparse
import gc
import json
import os
import pathlib
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402

import _timing  # noqa: E402
import keras_precrop as kp  # noqa: E402
from keras_precrop import apply_plan, plan  # noqa: E402

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
MODELS = {
    "EfficientNetB0": lambda: keras.applications.EfficientNetB0(weights=None),
    "MobileNetV2": lambda: keras.applications.MobileNetV2(weights=None),
    "resnet34": lambda: kp.models.get("resnet34"),
}
# operation -> (end-to-end call, plan() keyword arguments it amounts to)
OPERATIONS = {
    "reconfigure(params=1.0, flops=1.0)": (
        lambda m: kp.reconfigure(m, params=1.0, flops=1.0),
        {"params": 1.0, "flops": 1.0, "upper": None, "mode": "layerwise"}),
    "precrop(flops=0.5)": (
        lambda m: kp.precrop(m, flops=0.5, mode="exact"),
        {"flops": 0.5, "upper": 1.0, "mode": "exact"}),
}
GOAL = ("EfficientNetB0", "reconfigure(params=1.0, flops=1.0)", 1.5)


def _fresh_session():
    keras.backend.clear_session()
    gc.collect()


def _bench(name, repeats):
    print(f"{name} ...", file=sys.stderr, flush=True)
    build_times, model = _timing.timed(MODELS[name], repeats, setup=_fresh_session)
    build = _timing.summary(build_times)
    row = {"model": name, "params": model.count_params(), "layers": len(model.layers),
           "build_s": build, "operations": {}}
    for op, (call, plan_kwargs) in OPERATIONS.items():
        e2e, new = _timing.timed(lambda: call(model), repeats, setup=_fresh_session)
        prof, _ = _timing.timed(lambda: kp.profile(model), repeats, setup=_fresh_session)
        plans, the_plan = _timing.timed(lambda: plan(model, **plan_kwargs), repeats,
                                        setup=_fresh_session)
        apply, _ = _timing.timed(lambda: apply_plan(model, the_plan), repeats,
                                 setup=_fresh_session)
        if new.count_params() != the_plan.params:
            raise AssertionError(f"{name} {op}: rebuilt model has {new.count_params():,} "
                                 f"parameters, its plan predicts {the_plan.params:,}.")
        e2e = _timing.summary(e2e)
        row["operations"][op] = {
            "end_to_end_s": e2e, "profile_s": _timing.summary(prof),
            "plan_s": _timing.summary(plans), "apply_plan_s": _timing.summary(apply),
            "ratio_to_build": e2e["median"] / build["median"],
            "new_params": the_plan.params, "new_macs": the_plan.macs,
        }
    return row


def _markdown(result):
    m = result["machine"]
    lines = [
        "# End-to-end cost of reconfigure / precrop vs building the model",
        "",
        f"{'QUICK RUN (few repeats; not for quoting). ' if result['quick'] else ''}"
        f"Machine: {m['cpu']}, {m['usable_cpus']} usable CPUs, TF {m['tensorflow']}, "
        f"Keras {m['keras']}. Medians of {result['repeats']} repeats (Keras session cleared, "
        "untimed, before each). `plan` includes its own graph walk; `apply_plan` walks the "
        "graph again and rebuilds with fresh weights; end to end = one `reconfigure`/`precrop` "
        "call = plan + apply_plan.",
        "",
        "| model | params | operation | build s | end to end s | / build | profile s | plan s "
        "| apply_plan s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result["models"]:
        for op, r in row["operations"].items():
            lines.append(
                f"| {row['model']} | {row['params']:,} | `{op}` | "
                f"{row['build_s']['median']:.2f} | {r['end_to_end_s']['median']:.2f} | "
                f"{r['ratio_to_build']:.2f}x | {r['profile_s']['median']:.3f} | "
                f"{r['plan_s']['median']:.2f} | {r['apply_plan_s']['median']:.2f} |")
    g = result["goal"]
    lines += ["", f"Goal: `{GOAL[1]}` on {GOAL[0]} <= {GOAL[2]}x building it: "
              f"{'met' if g['met'] else 'NOT met'} ({g['ratio']:.2f}x).", "",
              f"Command: `{result['command']}`; total {result['seconds']:.0f} s."]
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=None, help="repeats (default 5; 2 quick)")
    parser.add_argument("--quick", action="store_true", help="2 repeats, EfficientNetB0 only")
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS,
                        help="folder for reconfigure.json/.md (default benchmarks/results)")
    args = parser.parse_args()
    repeats = args.repeats or (2 if args.quick else 5)
    names = [GOAL[0]] if args.quick else list(MODELS)

    start = time.perf_counter()
    machine = _timing.machine_info()
    rows = [_bench(name, repeats) for name in names]
    goal_ratio = rows[0]["operations"][GOAL[1]]["ratio_to_build"]
    result = {
        "what": "wall-clock seconds of building a model vs reconfigure/precrop on it",
        "quick": args.quick,
        "command": " ".join(["python", "benchmarks/bench_reconfigure.py"] + sys.argv[1:]),
        "machine": machine,
        "repeats": repeats,
        "goal": {"text": f"{GOAL[1]} on {GOAL[0]} <= {GOAL[2]}x its build time",
                 "ratio": goal_ratio, "met": goal_ratio <= GOAL[2]},
        "models": rows,
        "seconds": time.perf_counter() - start,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "reconfigure.json").write_text(json.dumps(result, indent=2) + "\n")
    text = _markdown(result)
    (args.out / "reconfigure.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
