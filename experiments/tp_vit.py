"""Torch-Pruning on a PyTorch twin of the CIFAR-10 ViT teacher (issue 61), resumably.

Issue 61 compares PreCrop on the keras_hub ViT teacher
(``experiments/train_vit_teacher.py``) with Torch-Pruning (TP) on the same
teacher in PyTorch. This script:

1. loads a teacher ``.keras``, converts it one for one to
   ``vit_twin.ViTTwin`` and checks the twin's CIFAR-10 test accuracy equals
   the teacher's within 0.1 pp (and says the largest logit difference);
2. prunes the twin with TP as TP's own ViT example does
   (``examples/transformers/prune_timm_vit.py``: group magnitude importance,
   L1 by default, a uniform ratio per layer or a global one, the fused
   ``qkv`` with ``num_heads``, head dimensions or whole heads, the
   classifier ignored), the ratio found by bisection so that the MACs (as
   TensorFlow counts the Keras model: attention products included) are at
   most ``--macs`` of the teacher's;
3. fine-tunes the pruned twin with the given recipe on ``kp.data``'s own
   CIFAR-10 pipeline (pad-4 crop, flip, the same normalization, batch 128,
   the last partial batch dropped), optionally distilled from the
   (unpruned) twin as the CNN comparison distils (KL of the softmaxes at
   temperature 4 times T^2, weight ``1 - alpha``), saving a checkpoint after
   every epoch: a killed run restarted with the same arguments goes on after
   its last finished epoch (the data order of an epoch after a restart is
   not the one an unbroken run would have seen);
4. writes ``results.json``: the accuracy after every epoch, MACs and
   parameters before and after (TP's ``count_ops_and_params``, which leaves
   the attention products out, and the TensorFlow-style count), the widths.

Example (the real run, low priority; the teacher must exist)::

  setsid nohup nice -n 19 python experiments/tp_vit.py \\
      --teacher experiments/runs/vit_cifar-teacher-ep15-s0/final_model.keras \\
      --macs 0.5 --epochs 3 --distill --seed 0 > tp_vit.log 2>&1 &

Smoke test: ``--steps_per_epoch 2 --eval_batches 2`` on any small teacher.
"""

import argparse
import copy
import json
import math
import os
import pathlib
import subprocess
import sys
import time
from importlib import metadata

import torch
import torch.nn.functional as F
import torch_pruning as tp

ROOT = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
import vit_twin  # noqa: E402  (experiments/vit_twin.py)

IMPORTANCE = {
    "l1": lambda: tp.importance.GroupMagnitudeImportance(p=1),
    "l2": lambda: tp.importance.GroupMagnitudeImportance(p=2),
    "random": tp.importance.RandomImportance,
}


def pruned(twin, ratio, *, importance="l1", global_pruning=False, bottleneck=False,
           prune_num_heads=False, head_pruning_ratio=0.0):
    """A copy of ``twin`` pruned by TP at channel ``ratio``, its ``num_heads`` set from the pruner.

    Args:
        twin: a :class:`vit_twin.ViTTwin` (not changed).
        ratio: TP's ``pruning_ratio``: the share of each group's channels
            removed (of all groups' together with ``global_pruning``).
        importance: ``"l1"``, ``"l2"`` (group magnitude) or ``"random"``.
        global_pruning: rank all groups together, as TP's ``--global_pruning``.
        bottleneck: prune inside the attention and MLP only, the residual
            stream kept whole, as TP's ``--bottleneck`` (every ``fc2`` ignored).
        prune_num_heads: remove whole heads (``head_pruning_ratio`` of them)
            and keep the head size, in place of TP's default of cutting
            every head's dimensions.
        head_pruning_ratio: the share of heads removed with ``prune_num_heads``.

    Returns:
        The pruned copy, in eval mode.
    """
    model = copy.deepcopy(twin).eval()
    example = torch.zeros(1, *_chw(model), device=next(model.parameters()).device)
    ignored = [model.head] + ([block.mlp.fc2 for block in model.blocks] if bottleneck else [])
    pruner = tp.pruner.BasePruner(
        model, example, importance=IMPORTANCE[importance](), global_pruning=global_pruning,
        pruning_ratio=ratio, ignored_layers=ignored, round_to=1,
        num_heads={attention.qkv: attention.num_heads
                   for attention in vit_twin.attention_layers(model)},
        prune_num_heads=prune_num_heads, prune_head_dims=not prune_num_heads,
        head_pruning_ratio=head_pruning_ratio if prune_num_heads else 0.0,
        unwrapped_parameters=[(model.cls_token, 2), (model.pos_embed, 2)])
    pruner.step()
    vit_twin.sync_heads(model, pruner)
    return model


def prune_to_macs(twin, target, steps=10, **options):
    """The TP pruning of ``twin`` with the smallest ratio whose MACs are at most ``target`` of its own.

    Bisection over TP's ``pruning_ratio`` (MACs fall as the ratio grows).

    Args:
        twin: a :class:`vit_twin.ViTTwin`.
        target: the MACs ratio to reach, in (0, 1].
        steps: bisection steps (0.8 / 2^10 of a ratio is a tenth of a channel in 128).
        **options: :func:`pruned`'s keyword arguments.

    Returns:
        ``(model, ratio)``: the pruned copy and TP's ``pruning_ratio`` that made it.
    """
    full = vit_twin.macs(twin)
    low, high = 0.0, 0.8  # beyond it TP leaves groups whole that would keep one channel
    best = pruned(twin, high, **options)
    if vit_twin.macs(best) > target * full:
        raise ValueError(f"TP cannot bring the MACs to {target} of the teacher's with "
                         f"these options (at ratio {high}: {vit_twin.macs(best) / full:.3f}).")
    for _ in range(steps):
        middle = (low + high) / 2
        candidate = pruned(twin, middle, **options)
        if vit_twin.macs(candidate) <= target * full:
            high, best = middle, candidate
        else:
            low = middle
    return best, high


def counts(model):
    """MACs and parameters of ``model`` per image: TP's count and the TensorFlow-style one."""
    example = torch.zeros(1, *_chw(model), device=next(model.parameters()).device)
    tp_macs, tp_params = tp.utils.count_ops_and_params(model, example)
    return {"macs": vit_twin.macs(model), "tp_macs": int(tp_macs), "tp_params": int(tp_params),
            "params": sum(p.numel() for p in model.parameters())}


def _chw(model):
    """The twin's input shape, channels first."""
    height, width, channels = model.config["image_shape"]
    return channels, height, width


def _torch_batch(images, labels, device):
    """A ``kp.data`` batch (NHWC TensorFlow tensors) as NCHW torch tensors on ``device``."""
    x = torch.from_numpy(images.numpy()).permute(0, 3, 1, 2).contiguous().to(device)
    return x, torch.from_numpy(labels.numpy()).long().to(device)


def check_twin(teacher, twin, test, device, eval_batches=None):
    """The teacher's and the twin's accuracy (%) on ``test`` and the largest logit difference."""
    import numpy as np

    correct_keras = correct_twin = total = 0
    largest = 0.0
    twin.eval()
    for index, (images, labels) in enumerate(test):
        if eval_batches and index >= eval_batches:
            break
        keras_logits = np.asarray(teacher(images, training=False))
        with torch.no_grad():
            twin_logits = twin(_torch_batch(images, labels, device)[0]).cpu().numpy()
        labels = labels.numpy()
        correct_keras += int((keras_logits.argmax(-1) == labels).sum())
        correct_twin += int((twin_logits.argmax(-1) == labels).sum())
        total += len(labels)
        largest = max(largest, float(np.abs(keras_logits - twin_logits).max()))
    return {"keras_accuracy": 100 * correct_keras / total,
            "twin_accuracy": 100 * correct_twin / total,
            "max_abs_logit_difference": largest, "examples": total}


def evaluate(model, test, device, eval_batches=None):
    """``model``'s top-1 accuracy (%) on ``test``."""
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for index, (images, labels) in enumerate(test):
            if eval_batches and index >= eval_batches:
                break
            x, y = _torch_batch(images, labels, device)
            correct += int((model(x).argmax(-1) == y).sum())
            total += len(y)
    return 100 * correct / total


def make_optimizer(model, args, steps_per_epoch):
    """The recipe's optimizer and per-step schedule (a ``LambdaLR``).

    AdamW as Keras' (epsilon 1e-7, decoupled decay on every weight); SGD as
    ``kp.fine_tune``'s (momentum 0.9, coupled L2 on the conv/linear kernels
    only). The rate warms up linearly for ``--warmup_epochs`` from 0, then
    decays to 0 over the remaining steps (cosine or linear) or stays.
    """
    if args.optimizer == "adamw":
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, eps=1e-7,
                                      weight_decay=args.weight_decay)
    else:
        kernels = [m.weight for m in model.modules() if isinstance(m, (torch.nn.Linear,
                                                                       torch.nn.Conv2d))]
        ids = {id(p) for p in kernels}
        rest = [p for p in model.parameters() if id(p) not in ids]
        optimizer = torch.optim.SGD([{"params": kernels, "weight_decay": args.weight_decay},
                                     {"params": rest, "weight_decay": 0.0}],
                                    lr=args.lr, momentum=0.9)
    warmup, total = args.warmup_epochs * steps_per_epoch, args.epochs * steps_per_epoch

    def factor(step):
        if step < warmup:
            return step / warmup
        progress = (step - warmup) / max(1, total - warmup)
        return {"cosine": 0.5 * (1 + math.cos(math.pi * min(1.0, progress))),
                "linear": max(0.0, 1 - progress), "constant": 1.0}[args.schedule]

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def distillation_loss(student_logits, teacher_logits, temperature):
    """``keras.distillation.LogitsDistillation``'s KL loss: KL(teacher || student) at T, times T^2."""
    return F.kl_div(F.log_softmax(student_logits / temperature, dim=-1),
                    F.softmax(teacher_logits / temperature, dim=-1),
                    reduction="batchmean") * temperature ** 2


def train_epoch(student, teacher, train, optimizer, schedule, args, device):
    """One epoch of (distilled) training; the mean loss and the training accuracy (%)."""
    student.train()
    loss_sum = correct = total = steps = 0
    for images, labels in train:
        if args.steps_per_epoch and steps >= args.steps_per_epoch:
            break
        x, y = _torch_batch(images, labels, device)
        logits = student(x)
        loss = F.cross_entropy(logits, y)
        if teacher is not None:
            with torch.no_grad():
                teacher_logits = teacher(x)
            loss = args.alpha * loss + (1 - args.alpha) * distillation_loss(
                logits, teacher_logits, args.temperature)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        loss_sum += loss.item()
        correct += int((logits.argmax(-1) == y).sum())
        total += len(y)
        steps += 1
    return {"loss": loss_sum / steps, "train_accuracy": 100 * correct / total}


def run_name(args):
    """The run's directory name under ``experiments/runs``."""
    teacher = pathlib.Path(args.teacher).resolve().parent.name
    parts = [f"vit_cifar-tp-{teacher}", f"macs{args.macs:g}", args.importance,
             "global" if args.global_pruning else "uniform"]
    if args.bottleneck:
        parts.append("bottleneck")
    if args.prune_num_heads:
        parts.append(f"heads{args.head_pruning_ratio:g}")
    if args.distill:
        parts.append(f"distill{args.alpha:g}")
    parts += [f"{args.optimizer}-lr{args.lr:g}", f"ep{args.epochs}", f"s{args.seed}"]
    return "-".join(parts)


def parse_args(argv=None):
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--teacher", required=True, help="the teacher's .keras file")
    parser.add_argument("--macs", type=float, default=0.5, help="target MACs ratio")
    parser.add_argument("--importance", choices=sorted(IMPORTANCE), default="l1")
    parser.add_argument("--global_pruning", action="store_true")
    parser.add_argument("--bottleneck", action="store_true", help="keep the residual stream")
    parser.add_argument("--prune_num_heads", action="store_true")
    parser.add_argument("--head_pruning_ratio", type=float, default=0.5)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--optimizer", choices=["adamw", "sgd"], default="adamw")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--weight_decay", type=float, default=0.05)
    parser.add_argument("--schedule", choices=["cosine", "linear", "constant"], default="cosine")
    parser.add_argument("--warmup_epochs", type=int, default=0)
    parser.add_argument("--batch_size", type=int, default=128)
    parser.add_argument("--distill", action="store_true")
    parser.add_argument("--alpha", type=float, default=0.5, help="the supervised loss' weight")
    parser.add_argument("--temperature", type=float, default=4.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data_dir", default=str(ROOT.parent.parent / "shared" / "tfds"))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps_per_epoch", type=int, help="a smoke test's short epochs")
    parser.add_argument("--eval_batches", type=int, help="a smoke test's short evaluations")
    parser.add_argument("--tolerance", type=float, default=0.1,
                        help="largest accepted accuracy difference (pp) of twin and teacher")
    parser.add_argument("--model_dir", help="default: experiments/runs/<run name>")
    return parser.parse_args(argv)


def load_teacher(path):
    """The Keras teacher, keras_hub's classes registered."""
    import keras
    import keras_hub  # noqa: F401  (registers the teacher's classes)

    return keras.saving.load_model(path, compile=False)


def prepare(args, model_dir, test, device):
    """Steps 1-2 (done once, kept in ``prepare.json`` and ``pruned.pt``): check, then prune."""
    record_path, pruned_path = model_dir / "prepare.json", model_dir / "pruned.pt"
    if record_path.exists() and pruned_path.exists():
        return json.loads(record_path.read_text())
    teacher = load_teacher(args.teacher)
    twin = vit_twin.from_keras(teacher).to(device)
    check = check_twin(teacher, twin, test, device, args.eval_batches)
    print(json.dumps(check), flush=True)
    if abs(check["keras_accuracy"] - check["twin_accuracy"]) > args.tolerance:
        raise SystemExit(f"The twin's accuracy differs from the teacher's by more than "
                         f"{args.tolerance} pp: {check}")
    options = {"importance": args.importance, "global_pruning": args.global_pruning,
               "bottleneck": args.bottleneck,
               "prune_num_heads": args.prune_num_heads,
               "head_pruning_ratio": args.head_pruning_ratio}
    student, ratio = prune_to_macs(twin, args.macs, **options)
    record = {"check": check, "tp_options": options, "tp_pruning_ratio": ratio,
              "before": counts(twin), "after": counts(student),
              "widths_before": vit_twin.widths(twin), "widths_after": vit_twin.widths(student),
              "pruned_accuracy": evaluate(student, test, device, args.eval_batches)}
    record["macs_ratio"] = record["after"]["macs"] / record["before"]["macs"]
    torch.save({"student": student.cpu(), "teacher": twin.cpu()}, pruned_path)
    record_path.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps({k: record[k] for k in ("tp_pruning_ratio", "macs_ratio", "after",
                                             "pruned_accuracy")}), flush=True)
    return record


def _save(path, state):
    """``torch.save`` through a temporary file, so a kill never leaves half a checkpoint."""
    temporary = path.with_name(path.name + ".tmp")
    torch.save(state, temporary)
    os.replace(temporary, path)


def fine_tune(args, model_dir, train, test, device):
    """Step 3: fine-tunes the pruned twin from its last checkpoint; the per-epoch history."""
    models = torch.load(model_dir / "pruned.pt", weights_only=False)
    checkpoint_path = model_dir / "checkpoint.pt"
    state = (torch.load(checkpoint_path, weights_only=False) if checkpoint_path.exists()
             else {"student": models["student"], "epoch": 0, "history": []})
    student = state["student"].to(device)
    teacher = models["teacher"].to(device).eval() if args.distill else None
    steps = args.steps_per_epoch or int(train.cardinality())
    optimizer, schedule = make_optimizer(student, args, steps)
    if "optimizer" in state:
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["schedule"])
    for epoch in range(state["epoch"], args.epochs):
        torch.manual_seed(args.seed * 1000 + epoch)
        start = time.time()
        row = train_epoch(student, teacher, train, optimizer, schedule, args, device)
        row.update(epoch=epoch + 1, test_accuracy=evaluate(student, test, device,
                                                           args.eval_batches),
                   seconds=time.time() - start, lr=schedule.get_last_lr()[0])
        state = {"student": student, "optimizer": optimizer.state_dict(),
                 "schedule": schedule.state_dict(), "epoch": epoch + 1,
                 "history": state["history"] + [row]}
        _save(checkpoint_path, state)
        print(json.dumps(row), flush=True)
    return state["history"]


def main(argv=None):
    """Runs (or resumes) one comparison run and writes its ``results.json``."""
    args = parse_args(argv)
    import tensorflow as tf

    try:
        tf.config.set_visible_devices([], "GPU")  # the GPU is PyTorch's
    except RuntimeError:  # TensorFlow already started in this process: it keeps its devices
        pass
    import keras_precrop as kp

    torch.manual_seed(args.seed)
    model_dir = pathlib.Path(args.model_dir or ROOT / "runs" / run_name(args))
    model_dir.mkdir(parents=True, exist_ok=True)
    device = torch.device(args.device)
    train = kp.data.load("cifar10", "train", args.batch_size, data_dir=args.data_dir,
                         seed=args.seed)
    test = kp.data.load("cifar10", "test", 500, data_dir=args.data_dir)
    prepared = prepare(args, model_dir, test, device)
    history = fine_tune(args, model_dir, train, test, device)
    record = {
        "method": "torch_pruning", "teacher": args.teacher, "args": vars(args), **prepared,
        "history": history, "test_accuracy": history[-1]["test_accuracy"] if history else None,
        "command": " ".join(["python", "experiments/tp_vit.py", *sys.argv[1:]]),
        "git_commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True,
                                     text=True, cwd=ROOT).stdout.strip(),
        "torch": torch.__version__, "torch_pruning": metadata.version("torch-pruning"),
        "device": str(device),
    }
    (model_dir / "results.json").write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps({"test_accuracy": record["test_accuracy"],
                      "macs_ratio": prepared["macs_ratio"]}))


if __name__ == "__main__":
    main()
