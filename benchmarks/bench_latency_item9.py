"""Benchmark (issue 60, item 9): latency plans on ONNX Runtime and PyTorch, before and after.

ResNet-20, batch 64, this CPU: for each runtime and setting, ``--runs`` times: fit a latency
model (``kp.latency_model``), plan ``kp.precrop(latency=0.5, calibrate=2)`` with it, then time
the kept plan against the original again, independently (interleaved rounds). Each row records
the latency model's error and whether its uniform variants timed monotone in width, the
calibration's rounds (budget -> measured ratio), the kept plan's measured ratio and its
independent re-measurement, its narrowest residual stream, and the warnings raised.

Settings:

* ``onnx/before``: ``round_to=1``, as the issue ran it.
* ``onnx/after``: ``round_to`` = ONNX Runtime's NCHWc block on this CPU (16 with AVX-512, 8 with
  AVX2; ``kp.latency.devices.nchwc_block()``): the latency model's variants and the plan on the
  widths its blocked convolutions run at.
* ``torch/before``: ``KERAS_BACKEND=torch``, OpenMP's default (active, spinning) wait policy.
* ``torch/after``: the same with ``OMP_WAIT_POLICY=PASSIVE`` (what the library's warning advises).
* ``onnx/floor``, ``torch/floor``: ``onnx/before`` and ``torch/after`` again, after the stream
  floor fix: ``mode="auto"``'s floor holds the residual streams at the uniform plan's widths *at
  the target* while calibration lowers the latency budget (before it, the floor followed the
  lowered budget down, and a stream could be cut to a few channels). The rows of the earlier
  settings are the evidence from before the fix, kept as they were.

Every setting runs in a child process of this script (the Keras backend and OpenMP's policy are
fixed at import). Pause other work on the machine first (the ViT training: ``kill -STOP``).

Usage::

    python benchmarks/bench_latency_item9.py              # 2 runs of each setting (~25 min)
    python benchmarks/bench_latency_item9.py --quick      # code check: tiny fits, 1 run (~3 min)
    python benchmarks/bench_latency_item9.py --settings onnx/before onnx/after

Writes ``latency_item9.json`` and ``latency_item9.md`` into ``--out`` (default
``benchmarks/results``; ``--quick`` writes into a temporary folder unless ``--out`` is given);
settings a previous run wrote there and this one does not rerun are kept, so they may be run one
at a time (each pause of other work short).
"""

import argparse
import json
import os
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
SETTINGS = {  # name -> (runtime, Keras backend, extra environment, round_to: "block" or 1)
    "onnx/before": ("onnx", "tensorflow", {}, 1),
    "onnx/after": ("onnx", "tensorflow", {}, "block"),
    "torch/before": ("torch", "torch", {}, 1),
    "torch/after": ("torch", "torch", {"OMP_WAIT_POLICY": "PASSIVE"}, 1),
    "onnx/floor": ("onnx", "tensorflow", {}, 1),
    "torch/floor": ("torch", "torch", {"OMP_WAIT_POLICY": "PASSIVE"}, 1),
}
FIXED = {"onnx/floor": "onnx/before", "torch/floor": "torch/after"}  # after the fix: the setting before

TARGET = 0.5
FIT = {False: dict(variants=16, rounds=3, refine_rounds=1), True: dict(variants=6, rounds=1,
                                                                        refine_rounds=1)}
CHECK_ROUNDS = {False: 9, True: 2}  # independent re-measurement of the kept plan


def _narrowest_stream(plan):
    """``"name kept/original"`` of the plan's residual stream cut deepest."""
    streams = [v for v in plan.variables if v["kind"] == "stream"]
    v = min(streams, key=lambda v: v["new"] / v["width"])
    return f"{v['name']} {v['new']}/{v['width']}"


def _floor(plan):
    """The streams' floor of the kept plan: its width factor, where it was computed (``"target"``
    after the fix; the budget of the kept plan's round before it) and the streams held at it."""
    return {key: plan.solver.get(key) for key in ("floor_ratio", "floor_at", "floor_binds")}


def _one_run(runtime, round_to, quick, seed):
    """One fit, calibrated plan and independent re-measurement, as a JSON-ready dict."""
    import keras_precrop as kp
    from keras_precrop.latency import timing

    model = kp.models.get("resnet20")
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lm = kp.latency_model(model, batch_size=64, runtime=runtime, round_to=round_to, seed=seed,
                              verbose=0, **FIT[quick])
        try:
            new = kp.precrop(model, latency=TARGET, latency_model=lm, calibrate=1 if quick else 2,
                             round_to=round_to, seed=0)
        except kp.InfeasibleBudgetError as err:  # refused: the row says why
            floor = re.search(r"smallest reachable latency ratio is ([0-9.]+)", str(err))
            return {"round_to": round_to, "seed": seed, "refused": f"latency={TARGET} infeasible, "
                    f"smallest reachable ratio {floor.group(1) if floor else '?'}",
                    "not_monotone": lm.error.get("not_monotone", [])}
    plan = new.precrop_plan
    calibration = plan.solver["latency_calibration"]
    fns = {"original": timing.runner(model, 64, runtime), "plan": timing.runner(new, 64, runtime)}
    samples = timing.interleaved(fns, CHECK_ROUNDS[quick], target_s=0.2)
    ratios = [p / o for p, o in zip(samples["plan"], samples["original"])]
    return {"round_to": round_to, "seed": seed, "seconds": time.perf_counter() - start,
            "error": {k: lm.error.get(k) for k in ("median", "worst", "plans_median", "plans_worst")},
            "not_monotone": lm.error.get("not_monotone", []),
            "predicted": plan.latency / plan.original[kp.latency.ROW],
            "rounds": calibration["rounds"], "kept": calibration["measured"],
            "met": calibration["met"], "independent": statistics.median(ratios),
            "original_ms": statistics.median(samples["original"]) * 1e3,
            "narrowest_stream": _narrowest_stream(plan), "floor": _floor(plan), "params": plan.params,
            "warnings": [f"{type(w.message).__name__}: {w.message}" for w in caught
                         if issubclass(w.category, (kp.latency.CalibrationWarning,
                                                    kp.latency.LatencyModelWarning))]}


def _child(args):
    """Runs one setting's runs in this process and writes them as JSON to ``args.child_out``."""
    runtime, _, _, round_to = SETTINGS[args.child]
    if round_to == "block":
        from keras_precrop.latency.devices import nchwc_block

        round_to = nchwc_block()
    runs = [_one_run(runtime, round_to, args.quick, seed) for seed in range(args.runs)]
    pathlib.Path(args.child_out).write_text(json.dumps(runs))


def _run_setting(name, args):
    """One setting's runs, in a child process with its Keras backend and environment."""
    _, backend, extra, _ = SETTINGS[name]
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "runs.json")
        command = [sys.executable, __file__, "--child", name, "--child-out", out,
                   "--runs", str(args.runs), *(["--quick"] if args.quick else [])]
        env = {**os.environ, "KERAS_BACKEND": backend, **extra}
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        if done.returncode:
            return {"failed": done.stderr[-2000:]}
        return {"runs": json.loads(pathlib.Path(out).read_text())}


def _rounds_text(rounds):
    return " → ".join(f"{r['budget']:.2f}:{r['measured']:.2f}" for r in rounds)


def markdown(result):
    """The result table: one row per run of each setting."""
    lines = ["# Latency plans on ONNX Runtime and PyTorch (issue 60, item 9)", "",
             f"ResNet-20, batch 64, `precrop(latency={TARGET}, calibrate=2)` with a latency model "
             f"fitted just before ({result['fit']}); machine: {result['machine']}. *rounds*: "
             "calibration rounds as budget:measured ratio; *kept*: the kept plan's ratio as "
             "calibration measured it; *again*: median ratio over "
             f"{result['check_rounds']} further interleaved rounds; *not monotone*: uniform "
             "variants timed more than 10% slower than a wider one; *stream floor*: the width factor "
             "the kept plan's residual streams were held at (*at target*: computed at the target's "
             "budgets, after the stream floor fix; else at the kept round's corrected budget; "
             "n/a: not recorded).", "",
             "| setting | run | round_to | orig. ms | held-out err. med/worst | plans err. | "
             "not monotone | predicted | rounds | kept | again | narrowest stream | stream floor "
             "| warnings |",
             "|---|---:|---:|---:|---|---:|---|---:|---|---:|---:|---|---|---|"]
    for name, setting in result["settings"].items():
        if "failed" in setting:
            lines.append(f"| {name} | - | failed: {setting['failed'][-200:]!r} |")
            continue
        for i, r in enumerate(setting["runs"], start=1):
            if "refused" in r:
                lines.append(f"| {name} | {i} | {r['round_to']} | refused: {r['refused']} |")
                continue
            e = r["error"]
            err = (f"{e['median']:.1%} / {e['worst']:.1%}" if e["median"] is not None else "n/a")
            plans = f"{e['plans_median']:.1%}" if e["plans_median"] is not None else "n/a"
            monotone = "; ".join(f"{p['narrower']} {p['ratio']:.2f}x {p['wider']}"
                                 for p in r["not_monotone"]) or "-"
            warned = ", ".join(sorted({w.split(":")[0] for w in r["warnings"]})) or "-"
            lines.append(f"| {name} | {i} | {r['round_to']} | {r['original_ms']:.0f} | {err} | "
                         f"{plans} | {monotone} | {r['predicted']:.2f} | {_rounds_text(r['rounds'])} "
                         f"| {r['kept']:.2f}{'' if r['met'] else ' (NOT met)'} | "
                         f"{r['independent']:.2f} | {r['narrowest_stream']} | {_floor_text(r)} | "
                         f"{warned} |")
    return "\n".join(lines + _fix_notes(result["settings"])
                     + ["", f"Command: `{result['command']}`; {result['seconds']:.0f} s."]) + "\n"


def _floor_text(run):
    floor = run.get("floor")
    if not floor or floor["floor_ratio"] is None:
        return "n/a" if floor is None else "-"
    return f"{floor['floor_ratio']:.2f}{' at target' if floor['floor_at'] == 'target' else ''}"


def _runs_text(runs):
    """Kept (re-measured; parameters) ratios and narrowest streams of a setting's planned runs."""
    planned = [r for r in runs if "refused" not in r]
    return (", ".join(f"{r['kept']:.2f}{'' if r['met'] else ' (NOT met)'} ({r['independent']:.2f}; "
                      f"{r['params']:,} params)" for r in planned) + "; narrowest streams "
            + ", ".join(r["narrowest_stream"] for r in planned)
            + (f"; {len(runs) - len(planned)} refused" if len(runs) > len(planned) else ""))


def _fix_notes(settings):
    """Lines comparing each setting run after the stream floor fix with its setting from before."""
    lines = []
    for new, old in FIXED.items():
        if "runs" in settings.get(new, {}) and "runs" in settings.get(old, {}):
            lines.append(f"* {new} (after the fix) against {old} (before): kept (again; params) "
                         f"{_runs_text(settings[new]['runs'])}; before: "
                         f"{_runs_text(settings[old]['runs'])}.")
    return ["", "After the stream floor fix (the streams held at the uniform plan's widths at the "
            "target while calibration lowers the budget):", "", *lines] if lines else []


def _machine():
    import platform

    from keras_precrop.latency.devices import cpu_name, nchwc_block

    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return (f"{cpu_name()} ({platform.machine()}), {len(os.sched_getaffinity(0))} usable CPUs, "
            f"ONNX Runtime NCHWc block {nchwc_block()}, load average at start {load}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--runs", type=int, default=2, help="runs of each setting")
    parser.add_argument("--quick", action="store_true", help="tiny fits, one run: a code check")
    parser.add_argument("--out", type=pathlib.Path, default=None)
    parser.add_argument("--child", choices=list(SETTINGS), help=argparse.SUPPRESS)
    parser.add_argument("--child-out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return _child(args)
    if args.quick and "--runs" not in (argv or sys.argv[1:]):
        args.runs = 1
    start = time.perf_counter()
    out = args.out or (pathlib.Path(tempfile.mkdtemp()) if args.quick else RESULTS)
    out.mkdir(parents=True, exist_ok=True)
    before = out / "latency_item9.json"  # settings run before (one at a time) are kept
    kept = json.loads(before.read_text())["settings"] if before.exists() else {}
    result = {"command": " ".join(["python", "benchmarks/bench_latency_item9.py", *(argv or sys.argv[1:])]),
              "fit": ", ".join(f"{k}={v}" for k, v in FIT[args.quick].items()),
              "check_rounds": CHECK_ROUNDS[args.quick], "machine": _machine(),
              "settings": {**kept, **{name: _run_setting(name, args) for name in args.settings}}}
    result["settings"] = {name: result["settings"][name] for name in SETTINGS
                          if name in result["settings"]}
    result["seconds"] = time.perf_counter() - start
    (out / "latency_item9.json").write_text(json.dumps(result, indent=2) + "\n")
    text = markdown(result)
    (out / "latency_item9.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
