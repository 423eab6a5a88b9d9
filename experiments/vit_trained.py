"""Issue 61's evidence from a trained model: the CIFAR-10 ViT teacher pruned, then trained on.

The teacher (``train_vit_teacher.py``) is pruned to a budget (``--flops``, a ratio, or
``--plan``) by one of these arms, then trained for ``--epochs``
with Torch-Pruning's arm's recipe (``tp_vit.py``'s defaults): AdamW (lr 1e-3,
weight decay 0.05, epsilon 1e-7), cosine decay to 0 without warm-up, batch
128, and with ``--distill`` a ``keras.distillation.Distiller`` of the
unpruned teacher (KL of the softmaxes at temperature 4 times T^2, weight
``1 - alpha`` = 0.5), the same loss ``tp_vit.py`` writes in PyTorch:

* ``oneshot``: ``kp.apply_plan(teacher, plan, weights="keep")`` (L1), then
  fine-tuning; ``--refit``: with every linear projection refit by least
  squares to the teacher's outputs on 4 training batches (``refit=True``)
  before the fine-tuning;
* ``gradual``: a ``kp.GradualPruning`` callback masks the teacher's channels
  down to the plan over the first ``--gradual_epochs`` (cubic schedule, an
  update every 50 steps), training goes on masked, and ``finalize()``
  rebuilds the smaller model (checked to score what the masked one does);
* ``scratch``: the plan's widths freshly initialized and trained alone
  (``--distill`` still distils from the teacher): what the kept weights are
  worth.

``--layout homogeneous`` prunes with one config for every block
(``kp.hub.precrop``: a ``ViTImageClassifier`` again) in place of the
solver's widths per block (``kp.plan`` of the whole task, a functional
model). A latency budget is a calibrated plan made once on a quiet machine
(``--plan``, a plan JSON of ``experiments/latency_plans.py --model vit_cifar``),
so the arms prune to one plan, timed once.

Writes ``results.json`` (test accuracy, accuracy right after pruning,
parameters, MACs as the plan counts them (TensorFlow's count, attention
products included), widths) into ``experiments/runs/<run name>``; a killed
run resumes after its last finished epoch (``kp.train.fit``).

Example::

  setsid nohup nice -n 19 python experiments/vit_trained.py --arm gradual --flops 0.5 \\
      --epochs 3 --distill --seed 0 > vit_gradual.log 2>&1 &
"""

import argparse
import pathlib
import sys
import time

import keras

import keras_precrop as kp
from keras_precrop.training.finetune import distiller

ROOT = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
import train_vit_teacher as _teacher  # noqa: E402  (data, recipe, fit, results)

ARMS = ("oneshot", "gradual", "scratch")
TEACHER = "experiments/runs/vit_cifar-teacher-ep15-s{seed}/final_model.keras"


def run_name(args):
    """The run's directory name: ``vit_cifar-gradual-flops0.5-distill-ep3-s0`` (``-teacher-s0``
    added where ``--teacher`` is not the seed's own)."""
    budget = f"flops{args.flops}" if args.flops is not None else pathlib.Path(args.plan).stem
    parts = [args.arm, budget, args.layout if args.layout != "per_block" else None,
             f"mode{args.mode}" if args.mode != "auto" else None,
             "headdims" if args.attention == "head_dims" else None,
             f"imp{args.importance}" if args.importance != "l1" else None,
             "refit" if args.refit else None,
             "distill" if args.distill else None, f"gradual{args.gradual_epochs}"
             if args.arm == "gradual" else None, f"ep{args.epochs}", f"s{args.seed}"]
    if args.teacher != TEACHER:  # another seed's teacher (or another file): its folder's seed part
        parts.append("teacher-" + pathlib.Path(args.teacher).parent.name.rsplit("-", 1)[-1])
    return "vit_cifar-" + "-".join(p for p in parts if p)


def load_teacher(args):
    """A fresh copy of the teacher ``.keras`` (each arm and the Distiller get their own)."""
    import keras_hub  # noqa: F401  (registers the teacher's classes for loading)

    return keras.models.load_model(ROOT.parent / args.teacher.format(seed=args.seed), compile=False)


def plan_of(teacher, args):
    """The plan every per-block arm prunes to (``kp.plan`` of the whole task)."""
    if args.flops is not None:
        return kp.plan(teacher, flops=args.flops, mode=args.mode, attention=args.attention)
    return kp.Plan.from_json(args.plan)


def student_of(args, steps, train):
    """``(model to train, GradualPruning or None, plan)`` of ``args.arm``; a ranking that needs
    data ranks on the first 4 training batches."""
    teacher = load_teacher(args)
    if args.layout == "homogeneous":
        if args.arm == "gradual":
            raise SystemExit("--arm gradual prunes to a per-block plan: use --layout per_block")
        if args.flops is None:
            raise SystemExit("--layout homogeneous prunes to --flops (a --plan is per block)")
        small = kp.hub.precrop(teacher, homogeneous=True, flops=args.flops, mode=args.mode,
                               weights="keep" if args.arm == "oneshot" else None)
        return small, None, small.precrop_plan
    plan = plan_of(teacher, args)
    ranking = {"importance": args.importance}
    if args.importance in ("taylor", "activation"):
        ranking["data"] = train.take(4)
    if args.refit:
        if args.arm != "oneshot":
            raise SystemExit("--refit refits a one-shot cut: use --arm oneshot")
        ranking.update(data=train.take(4), refit=True)
    if args.arm == "gradual":
        pruning = kp.GradualPruning(plan, end_step=round(args.gradual_epochs * steps), verbose=1,
                                    **ranking)
        return teacher, pruning, plan
    keep = {"weights": "keep", **ranking} if args.arm == "oneshot" else {"seed": args.seed}
    return kp.apply_plan(teacher, plan, **keep), None, plan


def trained(student, args, steps):
    """What ``fit`` trains, compiled with the recipe: ``student`` or its Distiller."""
    model = distiller(student, load_teacher(args), alpha=args.alpha) if args.distill else student
    _teacher.compile_teacher(model, steps, args.epochs, warmup_epochs=0)
    return model


def finalized(pruning, result, test):
    """The model ``pruning`` rebuilds, once it scores what the masked model scored in the fit's
    last evaluation (to 0.2 pp; after the fit, a cut norm no longer computes over the kept
    channels alone, so the masked model is not evaluated again)."""
    masked = 100 * result.final_accuracy
    small = pruning.finalize()
    _teacher.compile_teacher(small, 1, 1)  # to evaluate it
    rebuilt = _teacher.accuracy(small, test)
    if abs(rebuilt - masked) > 0.2:
        raise RuntimeError(f"the rebuilt model scores {rebuilt:.2f}%, the masked one {masked:.2f}%")
    return small


def main(argv=None):
    """Prunes the teacher, trains (or resumes) one arm and writes its results."""
    args = parse_args(argv)
    model_dir = pathlib.Path(args.model_dir or ROOT / "runs" / run_name(args))
    train, test = _teacher.cifar10(args)
    steps = args.steps_per_epoch or int(train.cardinality())
    student, pruning, plan = student_of(args, steps, train)
    _teacher.compile_teacher(student, 1, 1)  # to evaluate it
    pruned_accuracy = _teacher.accuracy(student, test)
    model = trained(student, args, steps)
    start = time.time()
    result = _teacher.fit(model, train, test, model_dir, args,
                          callbacks=[pruning] if pruning else ())
    small = finalized(pruning, result, test) if pruning else student  # compiled either way
    record = {
        "arm": args.arm, "layout": args.layout, "teacher": args.teacher.format(seed=args.seed),
        "budgets": {"flops": args.flops,
                    "latency": plan.solver.get("latency_calibration", {}).get("target")},
        "plan": args.plan, "mode": plan.mode if args.plan else args.mode,
        "attention": plan.attention,
        "importance": args.importance, "refit": args.refit, "distill": args.distill,
        "alpha": args.alpha, "gradual_epochs": args.gradual_epochs if pruning else None,
        "epochs": args.epochs, "seed": args.seed, "pruned_accuracy": pruned_accuracy,
        "test_accuracy": _teacher.accuracy(small, test), "params": small.count_params(),
        "original_params": plan.original["params"], "macs": plan.macs,
        "original_macs": plan.original["macs"], "widths": plan.widths,
        "train_seconds_this_call": time.time() - start,
    }
    _teacher.write_results(model_dir, "vit_trained.py", record)


def parse_args(argv=None):
    """The command line (see the module's docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--arm", choices=ARMS, required=True)
    parser.add_argument("--layout", choices=("per_block", "homogeneous"), default="per_block")
    budget = parser.add_mutually_exclusive_group(required=True)
    budget.add_argument("--flops", type=float, help="MACs budget, a ratio")
    budget.add_argument("--plan", help="a plan JSON (a calibrated latency plan)")
    parser.add_argument("--mode", default="auto", help="kp.plan's mode with --flops (uniform: "
                        "every width at one ratio, the layout Torch-Pruning's uniform pruning takes)")
    parser.add_argument("--attention", choices=("heads", "head_dims"), default="heads",
                        help="kp.plan's attention= with --flops: whole heads, or each head's dimension")
    parser.add_argument("--importance", default="l1", choices=("l1", "taylor", "activation"),
                        help="how kept channels are ranked (oneshot, gradual); data: 4 train batches")
    parser.add_argument("--refit", action="store_true",
                        help="--arm oneshot, per block: refit every projection by least squares on "
                        "4 train batches (those a ranking that reads data reads)")
    parser.add_argument("--teacher", default=TEACHER, help="{seed}: the run's seed")
    parser.add_argument("--distill", action="store_true")
    parser.add_argument("--alpha", type=float, default=0.5, help="the supervised loss' weight")
    parser.add_argument("--gradual_epochs", type=float, default=1.0,
                        help="--arm gradual: epochs over which the masks reach the plan")
    _teacher.add_run_arguments(parser, epochs=3)
    return parser.parse_args(argv)


if __name__ == "__main__":
    main()
