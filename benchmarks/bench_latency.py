"""Benchmark: latency models and latency budgets (issues 11 and 31) on this CPU.

For resnet20 (batch 64) and keras.applications MobileNetV2 (224x224, batch 16), and with
``--models`` issue 61's ViTs (``vit_cifar``: the CIFAR-10 teacher, batch 64; ``vit_224``: a
224x224 keras_hub ViT of ViT-Ti's size, batch 16),
per runtime (``--runtimes``; default ``tf tflite train``, the issue 11 set):

1. Fit a latency model for the runtime; report the fit time and the held-out
   prediction error (median, worst).
2. ``precrop(model, latency=0.5, calibrate=2)`` with it, and its uncalibrated
   twin; measure their throughput speedup in that runtime, interleaved with
   the baseline (and the FLOPs plans).
3. At equal measured speed, compare the SynExp objective (the accuracy
   proxy) of the latency plan with that of FLOPs plans: ``precrop(flops=R)``
   for a sweep of R is measured alongside (unless ``--no_sweep``), and its
   objective interpolated at the latency plan's measured speedup.
4. ``train`` (resnet20 only): the same for an SGD training step (TF, batch 128).

Every measured plan also gets its predicted time ratio next to the measured
one (the latency model's error on plans, not only on its own variants).

Runtimes (``keras_precrop.latency.RUNTIMES``): ``tf``, ``litert`` / ``tflite``,
``onnx``, ``litert_int8``, ``onnx_int8`` run in this process (TensorFlow
backend); ``jax`` and ``torch`` time their backend's own step, so the script
runs them in a child process of itself with ``KERAS_BACKEND`` set and merges
its results. A runtime whose packages are missing gets a skip row with the
``pip install`` that adds them; one that fails gets a row with the error.

Goals: fit <= 60 s (resnet20), <= 180 s (MobileNetV2); held-out error <= 10%
(median and worst); latency=0.5 >= 1.8x throughput on the float runtimes
(tf, jax, torch, litert / tflite, onnx), >= 1.6x on the int8 ones (issue 31);
training latency=0.5 >= 1.7x (resnet20).

Usage::

    python benchmarks/bench_latency.py            # tf, tflite, train; both models (~15-25 min)
    python benchmarks/bench_latency.py --quick    # resnet20, tiny settings (code check, ~2 min)
    python benchmarks/bench_latency.py --models resnet20
    # issue 31: every runtime, no FLOPs sweep (~45-90 min on a quiet 2-core CPU)
    python benchmarks/bench_latency.py --runtimes tf jax torch litert onnx litert_int8 onnx_int8 --no_sweep
    # issue 61: the ViTs in the float runtimes (writes latency_runtimes_vit_cifar_vit_224.*)
    python benchmarks/bench_latency.py --models vit_cifar vit_224 --runtimes tf onnx litert --no_sweep

Time it on a quiet machine: under other load PyTorch's OpenMP threads spin
(a 2-thread convolution ran 45x slower on a loaded 2-core machine; setting
``OMP_WAIT_POLICY=PASSIVE`` avoids that, and the torch study records it).
Under JAX, every variant's rebuild compiles Keras' random initializers per
new kernel shape, which dominates the jax fit time.

Writes ``latency.json`` and ``latency.md`` for the default runtimes, else
``latency_runtimes.json`` and ``latency_runtimes.md``, in
``benchmarks/results`` (``--out`` picks another folder, e.g. for quick runs).
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import _timing  # noqa: E402
import keras_precrop as kp  # noqa: E402

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
# name -> (builder, inference batch, training batch or None)
def _vit_cifar():
    """Issue 61's CIFAR-10 ViT: the committed teacher (keras_hub ``ViTImageClassifier``, 32x32,
    patch 4, 6 x 4 heads, hidden 128, MLP 256; ``experiments/train_vit_teacher.py``)."""
    import keras_hub  # noqa: F401  (registers the teacher's classes for loading)

    return keras.models.load_model(VIT_TEACHER, compile=False)


def _vit_224():
    """A 224x224 keras_hub ViT of ViT-Ti's size (patch 16, 12 x 3 heads, hidden 192, MLP 768),
    1000 classes, freshly initialized (issue 61's 224x224 configuration)."""
    import keras_hub

    backbone = keras_hub.models.ViTBackbone(
        image_shape=(224, 224, 3), patch_size=16, num_layers=12, num_heads=3, hidden_dim=192,
        mlp_dim=768)
    return keras_hub.models.ViTImageClassifier(backbone=backbone, num_classes=1000,
                                               preprocessor=None)


VIT_TEACHER = RESULTS.parents[1] / "experiments/runs/vit_cifar-teacher-ep15-s0/final_model.keras"
# name -> (builder, inference batch, training batch or None)
MODELS = {
    "resnet20": (lambda: kp.models.get("resnet20"), 64, 128),
    "mobilenet_v2": (lambda: keras.applications.MobileNetV2(weights=None), 16, None),
    "vit_cifar": (_vit_cifar, 64, None),
    "vit_224": (_vit_224, 16, None),
}
DEFAULT_MODELS = ("resnet20", "mobilenet_v2")  # issues 11 and 31; the ViTs (issue 61) by --models
BUDGET = 0.5
RUNTIMES = kp.latency.RUNTIMES + ("train",)  # "train": a TF training step
DEFAULT_RUNTIMES = ("tf", "tflite", "train")
FLOPS_SWEEP = {False: (0.7, 0.6, 0.5, 0.4, 0.3, 0.25, 0.2), True: (0.5, 0.25)}
FIT = {False: dict(variants=20, rounds=5), True: dict(variants=6, rounds=1, refine_rounds=1)}
ROUNDS = {False: 12, True: 2}  # interleaved rounds of the plan measurements
GOALS = {"fit_seconds": {"resnet20": 60.0, "mobilenet_v2": 180.0}, "error": 0.10,
         "speedup": {"float": 1.8, "int8": 1.6, "train": 1.7}}


def _log(*args):
    print(*args, file=sys.stderr, flush=True)


def _backend(runtime):
    """The Keras backend a runtime is timed under."""
    return {"jax": "jax", "torch": "torch"}.get(runtime, "tensorflow")


def _speedup_goal(runtime):
    kind = "train" if runtime == "train" else "int8" if runtime.endswith("_int8") else "float"
    return GOALS["speedup"][kind]


def _batch(name, runtime):
    _, batch, train_batch = MODELS[name]
    return train_batch if runtime == "train" else batch


def _interpolate(speedups, objectives, at):
    """Objective of the FLOPs plans at a measured speedup (piecewise linear, None outside)."""
    if not speedups:
        return None
    order = np.argsort(speedups)
    x, y = np.asarray(speedups)[order], np.asarray(objectives)[order]
    if not x[0] <= at <= x[-1]:
        return None
    return float(np.interp(at, x, y))


def _plans(base, lm, quick, sweep):
    """The baseline, the calibrated and uncalibrated latency plans and the FLOPs sweep."""
    start = time.perf_counter()
    calibrated = kp.precrop(base, latency=BUDGET, latency_model=lm, calibrate=2)
    calibration_seconds = time.perf_counter() - start
    plans = {"baseline": base, f"latency{BUDGET}": calibrated,
             f"latency{BUDGET} uncalibrated": kp.precrop(base, latency=BUDGET, latency_model=lm)}
    for ratio in FLOPS_SWEEP[quick] if sweep else ():
        # Exact mode, as the committed results were measured (mode="auto" picks layerwise here).
        plans[f"flops{ratio}"] = kp.precrop(base, flops=ratio, mode="exact")
    return plans, calibration_seconds


def _row(label, model, base, lm, samples):
    """One measured plan: size, objective, time, speedup, predicted vs measured time ratio."""
    plan = getattr(model, "precrop_plan", None)
    measured = _timing.summary(samples[label])["median"] / _timing.summary(
        samples["baseline"])["median"]
    predicted = lm.predict(model) / lm.seconds
    return {
        "label": label, "params": model.count_params(),
        "macs_ratio": kp.profile(model).total_macs / kp.profile(base).total_macs,
        "objective": 0.0 if plan is None else plan.solver["objective"],
        "seconds": _timing.summary(samples[label]),
        "speedup": _timing.paired_speedup(samples["baseline"], samples[label]),
        "predicted_time_ratio": predicted, "measured_time_ratio": measured,
        "prediction_error": abs(predicted - measured) / measured,
    }


def _fit_summary(name, lm):
    return {"block": lm.block, "ridge": lm.ridge, "error": lm.error,
            "fit_seconds": lm.fit_seconds, "variants": lm.variants,
            "refinement_plans": sum(v["refinement"] for v in lm.variants),
            "fit_goal_seconds": GOALS["fit_seconds"].get(name),
            "coefficients": dict(zip(lm.columns, lm.coef))}


def _measured(name, base, batch, lm, quick, sweep):
    """The plans' rows measured interleaved in the latency model's runtime, and the outcome."""
    plans, calibration_seconds = _plans(base, lm, quick, sweep)
    _log(f"{name} [{lm.runtime}]: measuring {len(plans)} models ...")
    fns = {label: kp.latency.runner(model, batch, lm.runtime, lm.training)
           for label, model in plans.items()}
    samples = kp.latency.interleaved(fns, ROUNDS[quick], target_s=0.3)
    rows = [_row(label, model, base, lm, samples) for label, model in plans.items()]
    latency_row, uncalibrated_row = rows[1], rows[2]
    sweep_rows = [r for r in rows if r["label"].startswith("flops")]
    return {
        "rows": rows, "latency_speedup": latency_row["speedup"],
        "uncalibrated_speedup": uncalibrated_row["speedup"],
        "calibration": plans[f"latency{BUDGET}"].precrop_plan.solver["latency_calibration"],
        "calibration_seconds": calibration_seconds,
        "objective_latency_plan": latency_row["objective"],
        "objective_flops_plans_at_equal_speed": _interpolate(
            [r["speedup"] for r in sweep_rows], [r["objective"] for r in sweep_rows],
            latency_row["speedup"]),
    }


def _study(name, base, batch, runtime, quick, sweep):
    """Fit a latency model, plan latency=BUDGET (and FLOPs sweeps), measure them interleaved.

    A budget the latency model calls infeasible (its narrowest plan is
    slower) is recorded as such, with the fit: the goal is not met.
    """
    training, timed = runtime == "train", "tf" if runtime == "train" else runtime
    _log(f"{name} [{runtime}]: fitting a latency model (batch {batch}) ...")
    lm = kp.latency_model(base, batch_size=batch, runtime=timed, training=training, **FIT[quick])
    goal, error = _speedup_goal(runtime), lm.error
    study = {"what": runtime, "runtime": timed, "training": training, "batch": batch,
             "backend": keras.backend.backend(), "device": _timing.device(runtime),
             "latency_model": _fit_summary(name, lm), "speedup_goal": goal,
             "error_met": None not in (error["median"], error["worst"])
             and max(error["median"], error["worst"]) <= GOALS["error"]}
    try:
        study.update(_measured(name, base, batch, lm, quick, sweep))
    except kp.InfeasibleBudgetError as err:
        return {**study, "infeasible": str(err).splitlines()[0], "speedup_met": False}
    return {**study, "speedup_met": study["latency_speedup"] >= goal}


def _skipped(name, runtime, reason):
    """A study that did not run: why (a missing package, an error)."""
    return {"what": runtime, "runtime": "tf" if runtime == "train" else runtime,
            "batch": _batch(name, runtime), "backend": _backend(runtime), "skipped": reason}


def _run_study(name, base, runtime, quick, sweep):
    """:func:`_study`, or a skip row if the runtime's packages are missing or it fails."""
    hint = kp.latency.timing.missing(runtime) if runtime in kp.latency.RUNTIMES else None
    if hint:
        return _skipped(name, runtime, f"not installed: {hint}")
    start = time.perf_counter()
    try:
        return {**_study(name, base, _batch(name, runtime), runtime, quick, sweep),
                "seconds": time.perf_counter() - start}
    except Exception as err:  # noqa: BLE001 -- one failing runtime must not lose the others
        traceback.print_exc()
        return _skipped(name, runtime, f"failed: {type(err).__name__}: {err}".splitlines()[0])


def _bench_model(name, runtimes, quick, sweep):
    """The studies of one model for the runtimes of this process's backend."""
    runtimes = [r for r in runtimes if _batch(name, r)]  # "train" only where a batch is set
    if not runtimes:
        return {"model": name, "studies": []}
    base = MODELS[name][0]()
    studies = [_run_study(name, base, runtime, quick, sweep) for runtime in runtimes]
    keras.backend.clear_session()
    return {"model": name, "studies": studies}


def _child(backend, runtimes, args, names):
    """Runs ``runtimes`` in a child process under ``KERAS_BACKEND=backend``.

    The child writes its models' studies to a JSON file after each model;
    studies it did not write (a missing backend, a crash) become skip rows.

    Returns:
        The child's machine info (None if it did not run) and its studies per model.
    """
    hint = kp.latency.timing.missing(backend if backend != "tensorflow" else "tf")
    child, reason = {"models": [], "machine": None}, f"not installed: {hint}"
    if not hint:
        with tempfile.TemporaryDirectory() as folder:
            out = pathlib.Path(folder) / "result.json"
            command = [sys.executable, __file__, "--runtimes", *runtimes, "--models", *names,
                       "--json_out", str(out)] + ["--quick"] * args.quick + \
                ["--no_sweep"] * args.no_sweep
            _log(f"running {' '.join(runtimes)} under KERAS_BACKEND={backend} ...")
            code = subprocess.run(command, env={**os.environ, "KERAS_BACKEND": backend}).returncode
            child = json.loads(out.read_text()) if out.exists() else child
        reason = f"failed: the KERAS_BACKEND={backend} process exited with code {code}"
    done = {m["model"]: m["studies"] for m in child["models"]}
    return child["machine"], [done.get(n) or [_skipped(n, r, reason) for r in runtimes
                                              if _batch(n, r)] for n in names]


def _merge(result, backend, machine, studies, order):
    """Adds a child process's studies to ``result``'s models, in ``--runtimes`` order."""
    result["machines"][backend] = machine
    for entry, extra in zip(result["models"], studies):
        entry["studies"] = sorted(entry["studies"] + extra,
                                  key=lambda st: order.index(st["what"]))


def _fmt_objective(x):
    return "outside the sweep" if x is None else f"{x:.1f}"


def _error_cell(err):
    """Held-out error "median / worst (met)", or by how many points it misses the goal."""
    if None in (err["median"], err["worst"]):
        return "n/a (too few held-out variants)"
    miss = max(err["median"], err["worst"]) - GOALS["error"]
    verdict = "met" if miss <= 0 else f"NOT met: {miss:.1%} over"
    return f"{err['median']:.1%} / {err['worst']:.1%} ({verdict})"


def _speedup_cell(st):
    if "infeasible" in st:
        return f"infeasible (>= {st['speedup_goal']}x: NOT met: {st['infeasible']}"
    return (f"{st['latency_speedup']:.2f}x (>= {st['speedup_goal']}x: "
            f"{'met' if st['speedup_met'] else 'NOT met'}; uncalibrated "
            f"{st['uncalibrated_speedup']:.2f}x")


def _at_a_glance(result):
    """The goals table: a row per runtime, a column per model (speedup and held-out error)."""
    models = result["models"]
    lines = ["## Goals at a glance", "",
             "| runtime | " + " | ".join(
                 f"{m['model']} (batch {_batch(m['model'], 'tf')})" for m in models) + " |",
             "|---|" + "---|" * len(models)]
    for runtime in result["runtimes"]:
        cells = []
        for m in models:
            st = next((st for st in m["studies"] if st["what"] == runtime), None)
            cells.append("-" if st is None else st["skipped"] if "skipped" in st else
                         f"{_speedup_cell(st)}); error {_error_cell(st['latency_model']['error'])}")
        lines.append(f"| {runtime} ({_backend(runtime)}) | " + " | ".join(cells) + " |")
    return lines + ["", f"Speedup: `precrop(latency={BUDGET}, calibrate=2)` measured against the "
                    "original, interleaved, in the runtime its latency model was fitted for; "
                    "goal >= 1.8x on float runtimes, >= 1.6x on int8 ones, >= 1.7x for the "
                    "training step. Error: the latency model's held-out error, median / worst "
                    "(goal <= 10% both).", ""]


def _machine_line(result):
    m = result["machine"]
    others = "".join(
        f" Child process under {backend}: "
        f"{', '.join(f'{k} {v}' for k, v in info.items() if k.startswith((backend, 'omp')))}."
        for backend, info in result.get("machines", {}).items() if info)
    return (f"{'QUICK RUN (tiny settings; not for quoting). ' if result['quick'] else ''}"
            f"Machine: {m['cpu']}, {m['usable_cpus']} usable CPUs, TF {m['tensorflow']}, Keras "
            f"{m['keras']}, load average at start "
            f"{', '.join(f'{x:.1f}' for x in m['load_average_at_start'])}.{others} Latency "
            f"models: {result['fit']['variants']} variants, {result['fit']['rounds']} rounds; "
            f"plans measured over {result['rounds']} interleaved rounds"
            f"{'' if result.get('sweep', True) else ' (no FLOPs sweep)'}.")


def _goal_row(model, st):
    """A study's row of the detailed goals table (or its skip reason)."""
    head = f"| {model} | {st['what']} (batch {st['batch']}) | "
    if "skipped" in st:
        return head + f"{st['skipped']} | | | | |"
    fit = st["latency_model"]
    goal_s = fit["fit_goal_seconds"]
    fit_cell = f"{fit['fit_seconds']:.0f}" + (
        f" ({goal_s:.0f}: {'met' if fit['fit_seconds'] <= goal_s else 'NOT met'})"
        if goal_s and st["what"] != "train" else "")
    head += f"{fit_cell} | {_error_cell(fit['error'])} | {_timing.plan_error(fit['error'])} | "
    if "infeasible" in st:
        return head + f"{_speedup_cell(st)}) | - |"
    return (head + f"{_speedup_cell(st)}; calibration {len(st['calibration']['rounds'])} "
            f"rounds, {st['calibration_seconds']:.0f} s) | {st['objective_latency_plan']:.1f} vs "
            f"{_fmt_objective(st['objective_flops_plans_at_equal_speed'])} |")


def _study_lines(model, st):
    """A study's section: its latency model and the measured plans."""
    fit = st["latency_model"]
    lines = ["", f"## {model}, {st['what']} (batch {st['batch']})", "",
             f"Timed under the {st['backend']} backend on {st['device']}. Latency model: block "
             f"{fit['block']}, ridge {fit['ridge']:g}, fitted in "
             f"{fit['fit_seconds']:.0f} s; error on held-out variants median "
             f"{_timing.share(fit['error']['median'])}, worst {_timing.share(fit['error']['worst'])} "
             f"(on fitted ones {_timing.share(fit['error']['train_median'])} / "
             f"{_timing.share(fit['error']['train_worst'])}; on its last refinement plans "
             f"{_timing.plan_error(fit['error'])}); {fit['refinement_plans']} of its "
             f"{len(fit['variants'])} variants are refinement plans.", ""]
    if "infeasible" in st:
        return lines + [f"No latency={BUDGET} plan: {st['infeasible']}"]
    lines += ["| model | params | MACs ratio | objective | ms per batch | speedup | "
              "predicted time ratio | measured time ratio | prediction error |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in st["rows"]:
        lines.append(
            f"| {r['label']} | {r['params']:,} | {r['macs_ratio']:.3f} | "
            f"{r['objective']:.1f} | {r['seconds']['median'] * 1e3:.2f} | "
            f"{r['speedup']:.2f}x | {r['predicted_time_ratio']:.3f} | "
            f"{r['measured_time_ratio']:.3f} | {r['prediction_error']:.1%} |")
    return lines


def _markdown(result):
    lines = ["# Latency models and latency budgets", "", _machine_line(result), "",
             *_at_a_glance(result), "## Per study", "",
             "| model | runtime | fit s (goal) | held-out error median / worst (goal <= 10%) | "
             "error on its last refinement plans | "
             f"latency={BUDGET} speedup (goal) | objective: latency plan vs FLOPs plans at "
             "equal speed |",
             "|---|---|---|---|---|---|---|"]
    lines += [_goal_row(row["model"], st) for row in result["models"] for st in row["studies"]]
    lines += ["", "Fit time goals apply to inference fits on a quiet 2-core "
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
            if "skipped" not in st:
                lines += _study_lines(row["model"], st)
    lines += ["", f"Command: `{result['command']}`; total {result['seconds']:.0f} s."]
    return "\n".join(lines) + "\n"


def _parse():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="resnet20 only (unless --models), tiny fits and few rounds")
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), help="models to run")
    parser.add_argument("--runtimes", nargs="+", choices=RUNTIMES, default=DEFAULT_RUNTIMES,
                        help="where to time (default: tf tflite train); jax and torch run in a "
                             "child process under their Keras backend")
    parser.add_argument("--no_sweep", action="store_true",
                        help="skip the FLOPs sweep: the latency plans and the baseline only")
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS,
                        help="folder for latency.json/.md (default runtimes) or "
                             "latency_runtimes.json/.md (default benchmarks/results)")
    parser.add_argument("--json_out", type=pathlib.Path,
                        help="(internal) a child process: write this backend's studies here")
    args = parser.parse_args()
    args.runtimes = list(dict.fromkeys(args.runtimes))
    return args


def _child_main(args, names):
    """A child process: this backend's studies per model, written to ``--json_out``."""
    result = {"machine": _timing.machine_info(), "models": []}
    for name in names:
        result["models"].append(_bench_model(name, args.runtimes, args.quick, not args.no_sweep))
        args.json_out.write_text(json.dumps(result, indent=2) + "\n")


def _write(result, args, start):
    """Writes the JSON and markdown results (after every step: keeps partial runs)."""
    result["seconds"] = time.perf_counter() - start
    stem = "latency" if set(args.runtimes) == set(DEFAULT_RUNTIMES) else "latency_runtimes"
    if not set(result["model_names"]) <= set(DEFAULT_MODELS):  # its own files, not the CNNs'
        stem = "_".join([stem, *result["model_names"]])
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    text = _markdown(result)
    (args.out / f"{stem}.md").write_text(text)
    return text


def main():
    args = _parse()
    names = args.models or (["resnet20"] if args.quick else list(DEFAULT_MODELS))
    if args.json_out:
        return _child_main(args, names)
    start, here = time.perf_counter(), keras.backend.backend()
    result = {
        "what": "latency models (fit time, held-out error) and latency=0.5 plans vs FLOPs "
                "plans: measured throughput / training-step speedup and SynExp objective",
        "quick": args.quick, "runtimes": args.runtimes, "sweep": not args.no_sweep,
        "command": " ".join(["python", "benchmarks/bench_latency.py"] + sys.argv[1:]),
        "machine": _timing.machine_info(), "machines": {},
        "fit": FIT[args.quick], "rounds": ROUNDS[args.quick], "models": [], "model_names": names,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    local = [r for r in args.runtimes if _backend(r) == here]
    for name in names:
        result["models"].append(_bench_model(name, local, args.quick, not args.no_sweep))
        text = _write(result, args, start)
    others = {}
    for runtime in args.runtimes:
        if _backend(runtime) != here:
            others.setdefault(_backend(runtime), []).append(runtime)
    for backend, runtimes in others.items():
        _merge(result, backend, *_child(backend, runtimes, args, names), args.runtimes)
        text = _write(result, args, start)
    print(text)


if __name__ == "__main__":
    main()
