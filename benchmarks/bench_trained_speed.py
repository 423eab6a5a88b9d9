"""Benchmark: measured CPU speedup of every trained structured model of one network's 10-epoch grids.

The experiments' figures put accuracy against MACs; this measures what the
trained models' widths buy in wall-clock time, so ``experiments/report.py``
can put accuracy against measured speedup (section "Against uniform width
scaling"). For every finished run under ``--runs`` (a ``results.json``) of
method ``precrop_params``, ``precrop_flops``, ``preconfig`` or ``precrop_plan``
at ``--epochs`` on ``--model``:

* re-plan the model it trained from its flags with the current library
  (``kp.plan`` at its ``params_budget``/``flops_budget`` with its
  ``plan_options``: mode, balance, round_to, residual; widths capped at the
  original for PreCrop as ``kp.precrop`` caps them, uncapped for PreConfig
  as ``kp.reconfigure``) or, for ``precrop_plan`` (the latency plans), load
  its ``--plan_file`` by name from ``experiments/plans``, and skip it, with
  a note, unless the plan's params equal the trained model's
  (``results.json``'s ``params``): a plan the library no longer makes is
  not the model that was trained;
* build each distinct plan once (runs whose plans have the same widths,
  e.g. the seeds of one grid entry, share a model);
* time the original model and every rebuilt one interleaved in one process
  with the library's timing (``keras_precrop.latency.runner``, TensorFlow
  runtime, inference on a fixed random batch; ``keras_precrop.latency.interleaved``,
  round-robin with the order rotated each round).

Speedup = the median over rounds of the original's time / the model's time
in the same round (same-round pairs saw the same machine load). Masked runs
(SynFlow etc.) are not timed: their kernels are dense, so they run at the
original's cost (1.0x).

``--model vit_cifar`` times issue 61's ViT pruned at initialization instead
(``experiments/vit_at_init.py``'s runs of methods ``precrop`` and ``uniform``:
the teacher's architecture re-planned at the run's budget and mode, or its
calibrated latency plan loaded by name), against the unpruned architecture.

Usage::

    python benchmarks/bench_trained_speed.py                    # ~3 min on 2 cores, quiet machine
    python benchmarks/bench_trained_speed.py --model mobilenet_v2_cifar
    python benchmarks/bench_trained_speed.py --runs ../main/experiments/runs
    python benchmarks/bench_trained_speed.py --model vit_cifar   # needs keras_hub
    python benchmarks/bench_trained_speed.py --limit 3 --rounds 2 --out /tmp/speed   # smoke run

Writes ``trained_speed_<model>.json`` (per run id: params, MACs, median
seconds and speedup; the machine and settings) and ``trained_speed_<model>.md``
into ``--out`` (default ``benchmarks/results``): a file per network, which
``experiments/report.py`` reads together. Take a real measurement on a quiet machine
(pause the training: ``experiments/run.py``'s docstring says how).
"""

import argparse
import json
import os
import pathlib
import re
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import _timing  # noqa: E402
import keras_precrop as kp  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "experiments"))
import train_vit_teacher  # noqa: E402  (the ViT's architecture; it imports keras_hub when building)

RESULTS = REPO / "benchmarks" / "results"
PLANS = REPO / "experiments" / "plans"  # where the grids keep the plan files they train
# The structured methods of examples/train_cifar.py that plan from budgets, and the cap on widths
# their library call sets (precrop: only removes channels; reconfigure: lets layers grow).
UPPER = {"precrop_params": 1.0, "precrop_flops": 1.0, "preconfig": None}
PLAN_METHOD = "precrop_plan"  # trains the widths of a plan file (the latency plans)
VIT = "vit_cifar"  # issue 61's ViT: experiments/vit_at_init.py's runs, its methods' modes
VIT_MODES = {"precrop": "auto", "uniform": "uniform"}
ORIGINAL = _timing.ORIGINAL


def _log(*args):
    print(*args, file=sys.stderr, flush=True)


def stem(run_id):
    """A run id less its seed: ``resnet20-precrop_params-params0.1-modeexact-ep10``."""
    return re.sub(r"-s\d+$", "", run_id)


def base_model(model):
    """The unpruned network the runs of ``model`` cut: a zoo model, or the ViT teacher's
    architecture (``experiments/train_vit_teacher.py``, initialized from seed 0)."""
    return train_vit_teacher.build(0) if model == VIT else kp.models.get(model)


def _timed(name, result, model):
    """Whether run ``name`` (its ``result``) is a structured run of ``model`` this benchmark times."""
    if model == VIT:
        return name.startswith(f"{VIT}-") and result.get("method") in VIT_MODES
    return result.get("method") in (*UPPER, PLAN_METHOD) and result.get("model") == model


def structured_runs(runs_dir, model, epochs):
    """``{run id: results}`` of the finished structured runs of ``model`` at ``epochs``, sorted by id."""
    found = {}
    for path in sorted(pathlib.Path(runs_dir).glob("*/results.json")):
        result = json.loads(path.read_text())
        if _timed(path.parent.name, result, model) and result["epochs"] == epochs:
            found[path.parent.name] = result
    return found


def _plan_file(result):
    """The plan file a run trained (a latency plan's: ``plan_file`` of the grids, ``plan`` of
    vit_at_init.py), or None for a run planned from its budgets."""
    return result["plan_file"] if result["method"] == PLAN_METHOD else result.get("plan")


def replan(base, result):
    """The plan of the model a run trained: its plan file, found by name in ``PLANS`` (the run
    recorded the absolute path of the checkout that trained it), else made again from its flags by
    the current library."""
    if _plan_file(result):
        return kp.Plan.from_json(PLANS / pathlib.Path(_plan_file(result)).name)
    if result["method"] in VIT_MODES:
        budgets = result["budgets"]
        return kp.plan(base, params=budgets["params"], flops=budgets["flops"], upper=1.0,
                       mode=VIT_MODES[result["method"]])
    return kp.plan(base, params=result.get("params_budget"), flops=result.get("flops_budget"),
                   upper=UPPER[result["method"]], **result.get("plan_options") or {})


def distinct_plans(base, runs):
    """The distinct plans of ``runs``, and the runs that cannot be rebuilt.

    Returns:
        ``(plans, skipped)``: ``plans`` is a list of ``{"label", "plan",
        "runs"}`` (label: the first run's id less its seed; runs: the ids
        whose plans have exactly these widths), in run-id order;
        ``skipped`` is ``{run id: why}``.
    """
    plans, skipped = {}, {}
    for name, result in runs.items():
        try:
            plan = replan(base, result)
        except (kp.InfeasibleBudgetError, ValueError, OSError) as err:
            skipped[name] = f"cannot re-plan it: {type(err).__name__}: {err}"
            continue
        if plan.params != result["params"]:
            made = ("its plan file holds {:,} params" if _plan_file(result)
                    else "the current library plans {:,} params at its flags")
            skipped[name] = f"{made.format(plan.params)}, it trained {result['params']:,}"
            continue
        key = tuple(sorted(plan.widths.items()))
        plans.setdefault(key, {"label": stem(name), "plan": plan, "runs": []})["runs"].append(name)
    return list(plans.values()), skipped


def measure(base, plans, batch_size, rounds, target_s):
    """Times the original and every plan's rebuilt model, interleaved; fills each plan's timings.

    Returns:
        The original's ``_timing.summary`` of seconds per batch.
    """
    # apply_plan checks each rebuilt model's params and MACs against its plan.
    timed = _timing.against_original(base, {p["label"]: kp.apply_plan(base, p["plan"]) for p in plans},
                                     batch_size, rounds, target_s)
    for p in plans:
        p["seconds"], p["speedup"] = timed[p["label"]]
    return timed[ORIGINAL][0]


def _shown(path):
    """``path`` relative to the repository when inside it (a committed result names no home folder)."""
    path = path.resolve()
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def record(args, base_prof, original, plans, skipped, seconds):
    """The JSON document: settings, machine, the original's and each plan's timing, per run id."""
    def costs(params, macs):
        return {"params": params, "macs": macs, "macs_ratio": macs / base_prof.total_macs}

    runs = {name: {"plan": p["label"], **costs(p["plan"].params, p["plan"].macs),
                   "seconds": p["seconds"]["median"], "speedup": p["speedup"]}
            for p in plans for name in p["runs"]}
    return {
        "what": f"CPU inference time of the trained structured {args.model} models at {args.epochs} "
                "epochs, re-planned from their flags, vs the original model",
        "units": "seconds per batch (median over interleaved rounds); speedup = median over rounds "
                 "of the original's time / the model's time in the same round",
        "command": " ".join(["python", "benchmarks/bench_trained_speed.py", *sys.argv[1:]]),
        "settings": {"model": args.model, "epochs": args.epochs, "batch_size": args.batch_size,
                     "runtime": "tf", "training": False, "rounds": args.rounds,
                     "target_s": args.target_s, "limit": args.limit, "runs_dir": _shown(args.runs)},
        "machine": _timing.machine_info(),
        "seconds": seconds,
        "original": {**costs(base_prof.total_params, base_prof.total_macs), "seconds": original},
        "plans": [{"label": p["label"], "runs": p["runs"], **costs(p["plan"].params, p["plan"].macs),
                   "mode": p["plan"].mode_label, "seconds": p["seconds"], "speedup": p["speedup"]}
                  for p in plans],
        "runs": runs,
        "skipped": skipped,
    }


def markdown(result):
    """The table of ``record``'s document: one row per plan, then the runs not timed."""
    s = result["settings"]
    lines = _timing.table_head(
        f"Measured speedup of the trained {s['model']} models ({s['epochs']} epochs)", result,
        "Speedup: median over rounds of the original's time / the model's in the same round; ideal: "
        "original MACs / MACs.", "plan | seeds | mode | params | MACs ratio | ideal | median ms | speedup",
        "---|---|---|---:|---:|---:|---:|---:") + [
        f"| {ORIGINAL} | - | - | {result['original']['params']:,} | 1.000 | 1.00x | "
        f"{result['original']['seconds']['median'] * 1e3:.2f} | 1.00x |",
    ]
    for p in result["plans"]:
        seeds = ", ".join(name.rsplit("-s", 1)[1] for name in p["runs"])
        lines.append(f"| {p['label']} | {seeds} | {p['mode']} | {p['params']:,} | {p['macs_ratio']:.3f} | "
                     f"{1 / p['macs_ratio']:.2f}x | {p['seconds']['median'] * 1e3:.2f} | "
                     f"{p['speedup']:.2f}x |")
    if result["skipped"]:
        lines += ["", "Not timed:", "", *(f"- {name}: {why}." for name, why in result["skipped"].items())]
    return "\n".join(lines + ["", f"Command: `{result['command']}`; {result['seconds']:.0f} s."]) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=pathlib.Path, default=REPO / "experiments" / "runs",
                        help="folder of the runs (one folder per run id with its results.json)")
    parser.add_argument("--model", default="resnet20",
                        help=f"zoo model whose runs are timed, or {VIT} (vit_at_init.py's runs)")
    parser.add_argument("--epochs", type=int, default=10, help="the schedule whose runs are timed")
    parser.add_argument("--batch-size", type=int, default=64, help="inference batch")
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds")
    parser.add_argument("--target-s", type=float, default=0.3, help="seconds per sample (inner loop)")
    parser.add_argument("--limit", type=int, default=None, help="time only the first N distinct plans")
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS,
                        help="folder for trained_speed_<model>.json/.md (default benchmarks/results)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    base = base_model(args.model)
    runs = structured_runs(args.runs, args.model, args.epochs)
    plans, skipped = distinct_plans(base, runs)
    _log(f"{len(runs)} runs, {len(plans)} distinct plans, {len(skipped)} skipped")
    plans = plans[:args.limit]
    original = measure(base, plans, args.batch_size, args.rounds, args.target_s)
    result = record(args, kp.profile(base), original, plans, skipped, time.perf_counter() - start)
    _timing.write_result(args.out, f"trained_speed_{args.model}", result, markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
