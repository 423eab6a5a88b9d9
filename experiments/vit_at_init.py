"""Issue 61's evidence at initialization: the CIFAR-10 ViT pruned before training, trained from scratch.

The model is the teacher's architecture (``train_vit_teacher.py``: keras_hub's
``ViTImageClassifier``, 32x32, patch 4, 6 x 4 heads, hidden 128, MLP 256),
freshly initialized from ``--seed``, then cut to a budget before any training
by one of:

* ``precrop``: ``kp.precrop`` of the whole task (the solver's widths per block:
  heads, MLP neurons and the hidden stream), a functional model;
* ``uniform``: the same with ``mode="uniform"``, one width factor for every
  width (the width-multiplier baseline);
* ``homogeneous``: ``kp.hub.precrop`` with ``homogeneous=True``, the same
  widths in every block, a ``ViTImageClassifier`` of a new config.

A latency budget at initialization is a calibrated plan made once on a quiet
machine (``--plan``, a plan JSON of ``experiments/latency_plans.py --model
vit_cifar``: the teacher's architecture, so its plans are this model's), so
that no timing runs beside training: ``--method precrop`` takes the plan of
``mode="auto"``, ``--method uniform`` that of ``mode="uniform"``.

It trains with the teacher's recipe (AdamW, warm-up and cosine) for
``--epochs`` and writes ``results.json`` (test accuracy, parameters, MACs,
the plan's widths) into ``experiments/runs/<run name>``; a killed run resumes
after its last finished epoch (``kp.train.fit``). Timing the arms against
each other is ``benchmarks``' job (interleaved, on a quiet machine).

Example::

  setsid nohup nice -n 19 python experiments/vit_at_init.py --method precrop \\
      --params 0.5 --seed 0 > vit_precrop_s0.log 2>&1 &
"""

import argparse
import pathlib
import sys
import time

import keras_precrop as kp

ROOT = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
import train_vit_teacher as _teacher  # noqa: E402  (the architecture and recipe)

METHODS = ("precrop", "uniform", "homogeneous")


def run_name(args):
    """The run's directory name: ``vit_cifar-precrop-params0.5-ep10-s0`` (a plan's: its file stem)."""
    budget = pathlib.Path(args.plan).stem if args.plan else "".join(
        f"{kind}{getattr(args, kind)}" for kind in ("params", "flops", "latency")
        if getattr(args, kind) is not None)
    return f"vit_cifar-{args.method}-{budget}-ep{args.epochs}-s{args.seed}"


def pruned(model, args):
    """``(model cut at initialization by args.method to args' budget, its plan)``."""
    budgets = {kind: getattr(args, kind) for kind in ("params", "flops", "latency")
               if getattr(args, kind) is not None}
    if args.latency is not None:
        budgets["latency_model"] = {"batch_size": _teacher.RECIPE["batch_size"], "verbose": 0}
    if args.plan:
        plan = plan_of(args)
        return kp.apply_plan(model, plan, seed=args.seed), plan
    if args.method == "homogeneous":
        small = kp.hub.precrop(model, homogeneous=True, **budgets)
    else:
        small = kp.precrop(model, mode="uniform" if args.method == "uniform" else "auto",
                           seed=args.seed, **budgets)
    return small, small.precrop_plan


def plan_of(args):
    """``args.plan`` read, checked to be the layout ``args.method`` names."""
    plan = kp.Plan.from_json(args.plan)
    if args.method == "homogeneous" or (plan.mode == "uniform") != (args.method == "uniform"):
        raise SystemExit(f"--plan {args.plan} is a plan of mode={plan.mode!r}: --method "
                         f"{'uniform' if plan.mode == 'uniform' else 'precrop'} takes it")
    return plan


def budgets_of(args, plan):
    """The run's budgets as given, or a plan's calibrated latency target."""
    if args.plan:
        return {"params": None, "flops": None,
                "latency": plan.solver.get("latency_calibration", {}).get("target")}
    return {k: getattr(args, k) for k in ("params", "flops", "latency")}


def main(argv=None):
    """Prunes, trains (or resumes) one run and writes its results."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--method", choices=METHODS, required=True)
    budget = parser.add_mutually_exclusive_group(required=True)
    for kind in ("params", "flops", "latency"):
        budget.add_argument(f"--{kind}", type=float, help=f"{kind} budget, a ratio")
    budget.add_argument("--plan", help="a plan JSON (a calibrated latency plan)")
    _teacher.add_run_arguments(parser, epochs=10)
    args = parser.parse_args(argv)
    model_dir = pathlib.Path(args.model_dir or ROOT / "runs" / run_name(args))
    train, test = _teacher.cifar10(args)
    original = _teacher.build(args.seed)
    model, plan = pruned(original, args)
    _teacher.compile_teacher(model, args.steps_per_epoch or int(train.cardinality()), args.epochs)
    start = time.time()
    result = _teacher.fit(model, train, test, model_dir, args)
    record = {
        "method": args.method, "budgets": budgets_of(args, plan), "plan": args.plan,
        "epochs": args.epochs, "seed": args.seed,
        "test_accuracy": _teacher.accuracy(result.model, test),
        "params": result.model.count_params(), "original_params": original.count_params(),
        "macs": plan.macs, "original_macs": plan.original["macs"], "mode": plan.mode,
        "widths": plan.widths, "train_seconds_this_call": time.time() - start,
    }
    _teacher.write_results(model_dir, "vit_at_init.py", record)


if __name__ == "__main__":
    main()
