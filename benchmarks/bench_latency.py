"""Benchmark: latency models and latency budgets (issue 11) on this CPU.

For resnet20 (batch 64) and keras.applications MobileNetV2 (224x224, batch 16):

1. Fit a latency model for TF inference and one for the TFLite interpreter;
   report the fit time and the held-out prediction error (median, worst).
2. ``precrop(model, latency=0.5)`` with each; measure its throughput speedup
   in its runtime (interleaved with the baseline and FLOPs plans).
3. At equal measured speed, compare the SynExp objective (the accuracy
   proxy) of the latency plan with that of FLOPs plans: ``precrop(flops=R)``
   for a sweep of R is measured alongside, and its objective interpolated at
   the latency plan's measured speedup.
4. resnet20 only: the same with ``training=True`` (an SGD training step,
   batch 128).

Every measured plan also gets its predicted time ratio next to the measured
one (the latency model's error on plans, not only on its own variants).

Goals (issue 11): fit <= 60 s (resnet20), <= 180 s (MobileNetV2); held-out
error <= 10%; latency=0.5 >= 1.8x throughput (TF and TFLite); training
latency=0.5 >= 1.7x (resnet20).

Usage::

    python benchmarks/bench_latency.py            # both models, full settings (~15-25 min)
    python benchmarks/bench_latency.py --quick    # resnet20, tiny settings (code check, ~2 min)
    python benchmarks/bench_latency.py --models resnet20

Writes ``benchmarks/results/latency.json`` and ``latency.md`` (``--out`` picks
another folder, e.g. for quick runs).
"""

import argparse
import json
import os
import pathlib
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import _timing  # noqa: E402
import keras_precrop as kp  # noqa: E402

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
# name -> (builder, inference batch, training batch or None)
MODELS = {
    "resnet20": (lambda: kp.models.get("resnet20"), 64, 128),
    "mobilenet_v2": (lambda: keras.applications.MobileNetV2(weights=None), 16, None),
}
BUDGET = 0.5
FLOPS_SWEEP = {False: (0.7, 0.6, 0.5, 0.4, 0.3, 0.25, 0.2), True: (0.5, 0.25)}
FIT = {False: dict(variants=20, rounds=5), True: dict(variants=6, rounds=1, refine_rounds=1)}
ROUNDS = {False: 12, True: 2}  # interleaved rounds of the plan measurements
GOALS = {"fit_seconds": {"resnet20": 60.0, "mobilenet_v2": 180.0}, "error": 0.10,
         "speedup": {"tf": 1.8, "tflite": 1.8, "train": 1.7}}


def _log(*args):
    print(*args, file=sys.stderr, flush=True)


def _interpolate(speedups, objectives, at):
    """Objective of the FLOPs plans at a measured speedup (piecewise linear, None outside)."""
    order = np.argsort(speedups)
    x, y = np.asarray(speedups)[order], np.asarray(objectives)[order]
    if not x[0] <= at <= x[-1]:
        return None
    return float(np.interp(at, x, y))


def _study(name, base, batch, runtime, training, quick):
    """Fit a latency model, plan latency=BUDGET and FLOPs sweeps, measure them interleaved."""
    what = "train" if training else runtime
    _log(f"{name} [{what}]: fitting a latency model (batch {batch}) ...")
    lm = kp.latency_model(base, batch_size=batch, runtime=runtime, training=training,
                          **FIT[quick])
    start = time.perf_counter()
    calibrated = kp.precrop(base, latency=BUDGET, latency_model=lm, calibrate=2)
    calibration_seconds = time.perf_counter() - start
    plans = {"baseline": base, f"latency{BUDGET}": calibrated,
             f"latency{BUDGET} uncalibrated": kp.precrop(base, latency=BUDGET, latency_model=lm)}
    for ratio in FLOPS_SWEEP[quick]:
        # Exact mode, as the committed results were measured (mode="auto" picks layerwise here).
        plans[f"flops{ratio}"] = kp.precrop(base, flops=ratio, mode="exact")
    _log(f"{name} [{what}]: measuring {len(plans)} models ...")
    fns = {label: kp.latency.runner(model, batch, runtime, training)
           for label, model in plans.items()}
    samples = kp.latency.interleaved(fns, ROUNDS[quick], target_s=0.3)
    rows = []
    for label, model in plans.items():
        plan = getattr(model, "precrop_plan", None)
        measured = _timing.summary(samples[label])["median"] / _timing.summary(
            samples["baseline"])["median"]
        predicted = lm.predict(model) / lm.seconds
        rows.append({
            "label": label, "params": model.count_params(),
            "macs_ratio": kp.profile(model).total_macs / kp.profile(base).total_macs,
            "objective": 0.0 if plan is None else plan.solver["objective"],
            "seconds": _timing.summary(samples[label]),
            "speedup": _timing.paired_speedup(samples["baseline"], samples[label]),
            "predicted_time_ratio": predicted, "measured_time_ratio": measured,
            "prediction_error": abs(predicted - measured) / measured,
        })
    latency_row, uncalibrated_row = rows[1], rows[2]
    sweep = [r for r in rows if r["label"].startswith("flops")]
    flops_objective = _interpolate([r["speedup"] for r in sweep], [r["objective"] for r in sweep],
                                   latency_row["speedup"])
    goal = GOALS["speedup"][what]
    return {
        "what": what, "batch": batch,
        "latency_model": {"block": lm.block, "ridge": lm.ridge, "error": lm.error,
                          "fit_seconds": lm.fit_seconds, "variants": lm.variants,
                          "refinement_plans": sum(v["refinement"] for v in lm.variants),
                          "fit_goal_seconds": GOALS["fit_seconds"].get(name),
                          "coefficients": dict(zip(lm.columns, lm.coef))},
        "rows": rows,
        "latency_speedup": latency_row["speedup"], "speedup_goal": goal,
        "uncalibrated_speedup": uncalibrated_row["speedup"],
        "calibration": calibrated.precrop_plan.solver["latency_calibration"],
        "calibration_seconds": calibration_seconds,
        "speedup_met": latency_row["speedup"] >= goal,
        "objective_latency_plan": latency_row["objective"],
        "objective_flops_plans_at_equal_speed": flops_objective,
    }


def _bench_model(name, quick):
    build, batch, train_batch = MODELS[name]
    base = build()
    studies = [_study(name, base, batch, "tf", False, quick),
               _study(name, base, batch, "tflite", False, quick)]
    if train_batch:
        studies.append(_study(name, base, train_batch, "tf", True, quick))
    keras.backend.clear_session()
    return {"model": name, "studies": studies}


def _fmt_objective(x):
    return "outside the sweep" if x is None else f"{x:.1f}"


def _markdown(result):
    m = result["machine"]
    lines = [
        "# Latency models and latency budgets",
        "",
        f"{'QUICK RUN (tiny settings; not for quoting). ' if result['quick'] else ''}"
        f"Machine: {m['cpu']}, {m['usable_cpus']} usable CPUs, TF {m['tensorflow']}, Keras "
        f"{m['keras']}, load average at start "
        f"{', '.join(f'{x:.1f}' for x in m['load_average_at_start'])}. Latency models: "
        f"{result['fit']['variants']} variants, {result['fit']['rounds']} rounds; plans "
        f"measured over {result['rounds']} interleaved rounds.",
        "",
        "## Goals",
        "",
        "| model | runtime | fit s (goal) | held-out error median / worst (goal <= 10%) | "
        "error on its last refinement plans | "
        f"latency={BUDGET} speedup (goal) | objective: latency plan vs FLOPs plans at equal "
        "speed |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in result["models"]:
        for st in row["studies"]:
            fit = st["latency_model"]
            goal_s = fit["fit_goal_seconds"]
            fit_cell = f"{fit['fit_seconds']:.0f}" + (
                f" ({goal_s:.0f}: {'met' if fit['fit_seconds'] <= goal_s else 'NOT met'})"
                if goal_s and st["what"] != "train" else "")
            err = fit["error"]
            err_met = "met" if err["worst"] <= GOALS["error"] else "NOT met"
            lines.append(
                f"| {row['model']} | {st['what']} (batch {st['batch']}) | {fit_cell} | "
                f"{err['median']:.1%} / {err['worst']:.1%} ({err_met}) | {_timing.plan_error(err)} | "
                f"{st['latency_speedup']:.2f}x (>= {st['speedup_goal']}x: "
                f"{'met' if st['speedup_met'] else 'NOT met'}; uncalibrated "
                f"{st['uncalibrated_speedup']:.2f}x; calibration "
                f"{len(st['calibration']['rounds'])} rounds, {st['calibration_seconds']:.0f} s) | "
                f"{st['objective_latency_plan']:.1f} vs "
                f"{_fmt_objective(st['objective_flops_plans_at_equal_speed'])} |")
    lines += ["", "Fit time goals apply to inference fits (TF and TFLite) on a quiet 2-core "
              "CPU. Objective: SynExp, the sum over kernels of log density (0 = unpruned; "
              "higher keeps more of the accuracy proxy); the FLOPs plans' value at the latency "
              "plan's measured speedup is interpolated over the FLOPs sweep. The latency plan is "
              "`precrop(latency=0.5, calibrate=2)`: planned with the latency model, then timed "
              "against the original and re-planned with a corrected budget (the default when "
              "the latency model is measured in the same call); uncalibrated: the latency "
              "model's plan alone. Error on its last "
              "refinement plans: the latency model's fit before its last refinement round "
              "predicting the plans it made (median / worst), measured before they entered the "
              "fit; the latency plan's own prediction error is in the tables below."]
    for row in result["models"]:
        for st in row["studies"]:
            fit = st["latency_model"]
            lines += ["", f"## {row['model']}, {st['what']} (batch {st['batch']})", "",
                      f"Latency model: block {fit['block']}, ridge {fit['ridge']:g}, fitted in "
                      f"{fit['fit_seconds']:.0f} s; error on held-out variants median "
                      f"{fit['error']['median']:.1%}, worst {fit['error']['worst']:.1%} (on "
                      f"fitted ones {fit['error']['train_median']:.1%} / "
                      f"{fit['error']['train_worst']:.1%}; on its last refinement plans "
                      f"{_timing.plan_error(fit['error'])}); {fit['refinement_plans']} of its "
                      f"{len(fit['variants'])} variants are refinement plans.", "",
                      "| model | params | MACs ratio | objective | ms per batch | speedup | "
                      "predicted time ratio | measured time ratio | prediction error |",
                      "|---|---|---|---|---|---|---|---|---|"]
            for r in st["rows"]:
                lines.append(
                    f"| {r['label']} | {r['params']:,} | {r['macs_ratio']:.3f} | "
                    f"{r['objective']:.1f} | {r['seconds']['median'] * 1e3:.2f} | "
                    f"{r['speedup']:.2f}x | {r['predicted_time_ratio']:.3f} | "
                    f"{r['measured_time_ratio']:.3f} | {r['prediction_error']:.1%} |")
    lines += ["", f"Command: `{result['command']}`; total {result['seconds']:.0f} s."]
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="resnet20 only (unless --models), tiny fits and few rounds")
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), help="models to run")
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS,
                        help="folder for latency.json/.md (default benchmarks/results)")
    args = parser.parse_args()
    names = args.models or (["resnet20"] if args.quick else list(MODELS))
    start = time.perf_counter()
    result = {
        "what": "latency models (fit time, held-out error) and latency=0.5 plans vs FLOPs "
                "plans: measured throughput / training-step speedup and SynExp objective",
        "quick": args.quick,
        "command": " ".join(["python", "benchmarks/bench_latency.py"] + sys.argv[1:]),
        "machine": _timing.machine_info(),
        "fit": FIT[args.quick], "rounds": ROUNDS[args.quick], "models": [],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    for name in names:
        result["models"].append(_bench_model(name, args.quick))
        result["seconds"] = time.perf_counter() - start
        (args.out / "latency.json").write_text(json.dumps(result, indent=2) + "\n")
        text = _markdown(result)
        (args.out / "latency.md").write_text(text)  # after every model: keeps partial runs
    print(text)


if __name__ == "__main__":
    main()
