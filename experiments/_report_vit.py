"""Section "A vision transformer: the CIFAR-10 ViT (issue 61)" of ``experiments/report.py``'s page.

The ViT teachers (``train_vit_teacher.py``), the teacher pruned to a budget and
trained on by each way (``vit_trained.py``: one-shot, GradualPruning, the same
widths from scratch) beside Torch-Pruning on its PyTorch twin (``tp_vit.py``),
the issue's goals on those runs, and the ViT pruned at initialization
(``vit_at_init.py``). These runs belong to no grid: they are told apart by
their folder names (``vit_cifar-*``) and fields, and whatever has not run yet
shows as "pending", so the section is valid at any point of the evidence.
"""

import json
import pathlib
import statistics

from _report_common import _mean_std

# The ways of the trained-model tables, in row order: (label, vit_trained.py's arm and layout or
# ("tp", None) for tp_vit.py, listed as pending at the MACs point before any run).
_WAYS = (
    ("PreCrop one-shot (kept L1), per block", ("oneshot", "per_block"), True),
    ("PreCrop one-shot (kept L1), one config for every block", ("oneshot", "homogeneous"), True),
    ("PreCrop GradualPruning, per block", ("gradual", "per_block"), True),
    ("same widths from scratch, per block", ("scratch", "per_block"), True),
    ("same widths from scratch, one config for every block", ("scratch", "homogeneous"), False),
    ("Torch-Pruning on the twin", ("tp", None), True),
)
_TEACHER_SEEDS = (0, 1, 2)  # the teachers' seeds (train_vit_teacher.py, 15 epochs)
_MACS_POINT = ("flops", 0.5)  # the point every table starts from; Torch-Pruning's runs are there
_LATENCY_POINT = ("latency", 0.5)  # where issue 61 sets the trained goals
# tp_vit.py's arguments that make the recipe the PreCrop runs train with (vit_trained.py's own).
_TP_RECIPE = {"optimizer": "adamw", "lr": 0.001, "weight_decay": 0.05, "schedule": "cosine",
              "warmup_epochs": 0, "batch_size": 128, "distill": True, "alpha": 0.5, "temperature": 4.0}
_BEAT_TP_PP, _NEAR_TEACHER_PP = 1.0, 2.0  # issue 61's goals for 3 and 10 epochs
_EQUAL_TIME = 0.03  # at initialization: two rows' measured speedups this close take equal time
_REPO = pathlib.Path(__file__).resolve().parent.parent  # where a run's plan path starts
# The one-shot cuts of teacher s0 measured before any run: (file, the way's arm and layout, where its
# accuracy, params and MACs ratio are in the file: a key path each).
_CUTS = (
    ("vit_cut_at_once_teacher_s0.json", ("oneshot", "per_block"), (
        ("precrop_per_block", "accuracy_before_fine_tuning"), ("precrop_per_block", "params"),
        ("precrop_per_block", "macs_ratio"))),
    ("vit_cut_at_once_teacher_s0.json", ("oneshot", "homogeneous"), (
        ("hub_homogeneous", "accuracy_before_fine_tuning"), ("hub_homogeneous", "params"),
        ("hub_homogeneous", "macs_ratio"))),
    ("tp_vit_prepare_teacher_s0.json", ("tp", None), (("pruned_accuracy",), ("after", "params"),
                                                      ("macs_ratio",))),
)
_AT_INIT = {"precrop": "PreCrop (the solver's widths per block)",
            "uniform": "uniform widths (mode='uniform')",
            "homogeneous": "PreCrop, one config for every block (kp.hub.precrop)"}
_RECIPE = (
    "Every pruned teacher trains on with one recipe, in Keras (`vit_trained.py`) as in PyTorch "
    "(`tp_vit.py`): AdamW (lr 1e-3, weight decay 0.05), cosine decay to 0 without warm-up, batch 128, "
    "CIFAR-10 crop and flip (`kp.data`), and (*+ distillation*) KL distillation from the unpruned "
    "teacher (softmaxes at temperature 4, times T^2) weighted 0.5 against the labels' loss (alpha 0.5). "
    "Budgets are ratios of the teacher's MACs as TensorFlow counts them, attention products included "
    "(Torch-Pruning's ratio is found by bisection to that count). *after the cut*: test accuracy right "
    "after pruning, before any training (GradualPruning: the dense teacher, whose channels the masks "
    "then cut; from scratch: the fresh initialization); where no run has finished, teacher s0's cut as "
    "`vit_cut_at_once.py` and `tp_vit.py`'s prepare step measured it, marked (s0). *3 epochs*, "
    "*10 epochs*: final test accuracy of runs that long (separate runs, each with its own cosine "
    "schedule). Params: the trained pruned model's. Test accuracy % (mean ± std over seeds; n: seeds "
    "of the 3- and 10-epoch runs).")


def _vit(runs, results_dir, speed=None):
    """The section's lines: teachers, a table per pruning point of the trained teachers, the goals,
    the at-initialization table. ``runs``: ``{run folder: results}``; ``results_dir``: the folder of
    the one-shot cuts' JSON files; ``speed``: ``bench_trained_speed.py --model vit_cifar``'s record
    of the at-initialization runs (None before it ran)."""
    teachers = {name: r for name, r in runs.items() if name.startswith("vit_cifar-teacher-")}
    records = _records(runs)
    runs_dir = pathlib.Path(results_dir).parent / "runs"  # experiments/runs, beside results/
    lines = ["## A vision transformer: the CIFAR-10 ViT (issue 61)", "",
             *_teachers(teachers, runs, runs_dir), _RECIPE, "", *_superseded(runs)]
    points = sorted({r["point"] for r in records} | {_MACS_POINT},
                    key=lambda point: (point != _MACS_POINT, point[0] != "latency", point))
    cuts = _cuts(pathlib.Path(results_dir))
    for point in points:
        lines += _point_table(point, [r for r in records if r["point"] == point],
                              cuts if point == _MACS_POINT else {})
    return lines + _goals(records, teachers) + _at_init(runs, speed)


def _cell(values):
    """``mean ± std`` of accuracies (%), the mean alone for one value, "" for none."""
    mean, std = _mean_std(values)
    if mean is None:
        return ""
    return f"{mean:.2f}" if len(values) == 1 else f"{mean:.2f} ± {std:.2f}"


def _teachers(teachers, runs, runs_dir):
    """The teachers' table (seed, epochs, test accuracy, params, whether ``runs_dir`` keeps the
    trained model; the seeds of ``_TEACHER_SEEDS`` not finished yet as pending), their mean and,
    where a pruned run counted them, their MACs."""
    lines = ["### Teachers", "",
             "keras_hub's `ViTImageClassifier` on a `ViTBackbone` (32x32 input, patch 4, 6 layers of 4 "
             "heads, hidden width 128, MLP width 256), trained from scratch on CIFAR-10 with AdamW (lr 1e-3, "
             "weight decay 0.05, 2 warm-up epochs, cosine decay to 0, batch 128): the models every row "
             "below prunes.", "", "| seed | epochs | test accuracy % | params | trained model |",
             "|---:|---:|---:|---:|---|"]
    kept = {name: (runs_dir / name / "final_model.keras").exists() for name in teachers}

    def model_cell(name, r):
        if not kept[name]:
            return "not kept"
        again = r.get("retrained")
        return (f"retrained, {again['test_accuracy']:.2f}% (final_model.keras)" if again
                else "committed (final_model.keras)")

    lines += [f"| {r['seed']} | {r['epochs']} | {r['test_accuracy']:.2f} | {r['params']:,} | "
              f"{model_cell(name, r)} |"
              for name, r in sorted(teachers.items(), key=lambda item: (item[1]["seed"], item[1]["epochs"]))]
    rows = list(teachers.values())
    done = {r["seed"] for r in rows}
    lines += [f"| {seed} | | pending | | |" for seed in _TEACHER_SEEDS if seed not in done]
    if not all(kept.values()):
        lines += ["", "A teacher whose trained model is not kept was lost before it was committed: the "
                  "runs that pruned it stand as they were recorded, but cannot be repeated from it."]
    lines += _retrained(teachers, kept)
    accuracies = [r["test_accuracy"] for r in rows]
    lines += ["", f"Mean test accuracy: {_cell(accuracies)} % (n {len(accuracies)})." if accuracies
              else "Mean test accuracy: pending."]
    macs = [r["original_macs"] for name, r in sorted(runs.items())
            if name.startswith("vit_cifar-") and r.get("original_macs")]
    if macs:
        lines[-1] += f" MACs: {macs[0]:,} (TensorFlow's count, attention products included)."
    return lines + ["", "Reproduce: `python experiments/train_vit_teacher.py --seed S --epochs 15` "
                    f"(S = {', '.join(map(str, _TEACHER_SEEDS))}).", ""]


def _retrained(teachers, kept):
    """A paragraph on the teachers whose lost model was trained again by the same command (their
    ``results.json``'s ``retrained``: its test accuracy and note), or no lines."""
    again = {name: r for name, r in sorted(teachers.items()) if kept[name] and r.get("retrained")}
    if not again:
        return []
    said = "; ".join(f"{name}: {r['retrained']['test_accuracy']:.2f}% against the recorded "
                     f"{r['test_accuracy']:.2f}% ({r['retrained']['note']})" for name, r in again.items())
    return ["", "Retrained after its model was lost, by the same command, and kept since: " + said
            + ". The accuracy column is the recorded run's; runs made after the retraining prune the "
            "retrained model (their `results.json` says `teacher_retrained`), runs made before prune "
            "the lost one, and both count as that teacher's."]


def _superseded(runs):
    """A paragraph naming the runs left out of every table as recorded with a bug since fixed
    (their ``results.json`` says which, under ``"superseded"``), or no lines."""
    gone = {name: r["superseded"] for name, r in sorted(runs.items())
            if name.startswith("vit_cifar-") and r.get("superseded")}
    if not gone:
        return []
    said = "; ".join(f"`{name}` ({why})" for name, why in gone.items())
    return [f"Left out of the tables below, as run with a bug fixed since: {said}.", ""]


def _records(runs):
    """Every finished trained-teacher run (``vit_trained.py``'s and ``tp_vit.py``'s) as one kind
    of record: way (label, base, order), point, epochs, seed, accuracies, params, MACs ratio,
    teacher's folder, whether PreCrop pruned it, whether it trained with the shared recipe."""
    records = []
    for name, r in sorted(runs.items()):
        if r.get("superseded"):
            continue
        if name.startswith("vit_cifar-tp-") and r.get("test_accuracy") is not None:
            records.append(_tp_record(r))
        elif name.startswith("vit_cifar-") and "arm" in r:
            records.append(_trained_record(r))
    return _tp_at_latency(records)


def _tp_at_latency(records):
    """``records`` with Torch-Pruning's runs at the MACs ratio of a PreCrop run at latency=0.5
    (within 0.005) moved to that point: it takes no latency budget, so those stand against them.
    Plans of other layouts at the same latency have other MACs ratios: each may have its twin."""
    at_latency = [r["macs_ratio"] for r in records if r["precrop"] and r["point"] == _LATENCY_POINT]
    return [{**r, "point": _LATENCY_POINT, "point_macs": r["point"][1],
             "label": r["label"] + f" (MACs {r['point'][1]:g})"}
            if r["tp"] and any(abs(r["point"][1] - m) < 0.005 for m in at_latency) else r
            for r in records]


def _way(key):
    """``(label, index)`` of the way ``key`` (arm and layout) in ``_WAYS``."""
    index = next(i for i, (_, k, _) in enumerate(_WAYS) if k == key)
    return _WAYS[index][0], index


def _distilled(distill, alpha):
    """The label's recipe part: `` + distillation`` (with its alpha where not 0.5) or fine-tuning."""
    if not distill:
        return " + fine-tuning"
    return " + distillation" + ("" if alpha == 0.5 else f" (alpha {alpha:g})")


def _options(r):
    """The label's part for ``vit_trained.py``'s options other than their defaults (runs written
    before an option existed took its default): the plan's mode and attention, and a refit."""
    mode = r.get("mode", "auto")
    options = [f"mode='{mode}'"] * (mode != "auto")
    options += ["head dims (every head kept, narrower)"] * (r.get("attention", "heads") == "head_dims")
    options += ["refit by least squares"] * bool(r.get("refit"))
    return f" [{', '.join(options)}]" if options else ""


def _ranked(base, ranking):
    """A way's name with its ranking: one-shot names say "(kept L1)", the default; GradualPruning's,
    which ranks the channels it masks, gain "(ranked by ...)" where it is not L1."""
    if ranking == "l1":
        return base
    if "(kept L1)" in base:
        return base.replace("(kept L1)", f"(kept {ranking})")
    return f"{base} (ranked by {ranking})" if "GradualPruning" in base else base


def _trained_record(r):
    """A ``vit_trained.py`` run's record."""
    base, index = _way((r["arm"], r["layout"]))
    gradual = f" (cubic, masks over {r['gradual_epochs']:g} epoch(s))" if r["arm"] == "gradual" else ""
    kind = "flops" if r["budgets"].get("flops") is not None else "latency"
    label = _ranked(base, r.get("importance", "l1")) + _options(r) + gradual \
        + _distilled(r["distill"], r["alpha"])
    return {"label": label, "base": base, "order": index,
            "point": (kind, r["budgets"][kind]), "epochs": r["epochs"], "seed": r["seed"],
            "pruned": r.get("pruned_accuracy"), "acc": r["test_accuracy"], "params": r["params"],
            "macs_ratio": r["macs"] / r["original_macs"], "teacher": pathlib.Path(r["teacher"]).parent.name,
            "precrop": r["arm"] != "scratch", "tp": False, "recipe": r["distill"] and r["alpha"] == 0.5}


def _tp_record(r):
    """A ``tp_vit.py`` run's record (its MACs target is the point's flops budget)."""
    args = r["args"]
    base, index = _way(("tp", None))
    options = [f"group {args['importance'].upper()}", "global" if args["global_pruning"] else "uniform"]
    options += ["stream kept"] * bool(args["bottleneck"])
    options += [f"{args['head_pruning_ratio']:g} of the heads"] * bool(args["prune_num_heads"])
    schedule = {k: args[k] for k in ("optimizer", "lr", "weight_decay", "schedule", "warmup_epochs",
                                     "batch_size")}
    other = "" if all(_TP_RECIPE[k] == v for k, v in schedule.items()) else f", {json.dumps(schedule)}"
    return {"label": f"{base} ({', '.join(options)}){_distilled(args['distill'], args['alpha'])}{other}",
            "base": base, "order": index, "point": ("flops", args["macs"]), "epochs": args["epochs"],
            "seed": args["seed"], "pruned": r["pruned_accuracy"], "acc": r["test_accuracy"],
            "params": r["after"]["params"], "macs_ratio": r["macs_ratio"],
            "teacher": pathlib.Path(args["teacher"]).parent.name, "precrop": False, "tp": True,
            "recipe": all(args.get(k) == v for k, v in _TP_RECIPE.items())}


def _cuts(results_dir):
    """``{way label: (accuracy, params, MACs ratio)}`` of teacher s0's one-shot cuts measured
    before fine-tuning (the files of ``_CUTS`` that exist)."""
    cuts = {}
    for file, way, fields in _CUTS:
        path = results_dir / file
        if path.exists():
            found = json.loads(path.read_text())
            cuts[_way(way)[0]] = tuple(_at(found, keys) for keys in fields)
    return cuts


def _at(found, keys):
    """The value of ``found`` (nested dicts) at the key path ``keys``."""
    for key in keys:
        found = found[key]
    return found


def _point_title(point):
    """A pruning point as its table's heading says it: ``half its MACs (flops=0.5)``, ``latency=0.5``."""
    kind, value = point
    return "half its MACs (flops=0.5)" if point == _MACS_POINT else f"{kind}={value:g}"


def _point_table(point, records, cuts):
    """A pruning point's table: a row per way and recipe found, then the ways of ``_WAYS`` not run
    yet (at the MACs point), with the cut of ``cuts`` where it was measured."""
    lines = [f"### Trained ViT pruned to {_point_title(point)}", "",
             "| way | after the cut % | 3 epochs % | 10 epochs % | params | MACs ratio | n (3 / 10 ep) |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    labels = sorted({(r["order"], r["label"]) for r in records})
    for _, label in labels:
        found = [r for r in records if r["label"] == label]
        # A cut per teacher and seed (a data ranking's batches follow the seed).
        pruned = {(r["teacher"], r["seed"]): r["pruned"] for r in found if r["pruned"] is not None}
        epochs = {n: [r["acc"] for r in found if r["epochs"] == n] for n in (3, 10)}
        lines.append(f"| {label} | {_cell(list(pruned.values()))} | {_cell(epochs[3])} | {_cell(epochs[10])} "
                     f"| {statistics.mean(r['params'] for r in found):,.0f} "
                     f"| {statistics.mean(r['macs_ratio'] for r in found):.4f} "
                     f"| {len(epochs[3])} / {len(epochs[10])} |")
    shown = {r["base"] for r in records}
    for base, _, pending in _WAYS:
        if point == _MACS_POINT and pending and base not in shown:
            acc, params, macs = cuts.get(base, (None, None, None))
            cut = "" if acc is None else f"{acc:.2f} (s0)"
            lines.append(f"| {base} | {cut} | pending | pending | {'' if params is None else f'{params:,}'} "
                         f"| {'' if macs is None else f'{macs:.4f}'} | 0 / 0 |")
    budget = (f"--{point[0]} {point[1]:g}" if point[0] != "latency" else
              f"--plan experiments/plans/vit_cifar_tf_b64[_headdims]_latency{point[1]:g}_<mode>.json")
    others = ("; `python experiments/tp_vit.py --teacher experiments/runs/vit_cifar-teacher-ep15-sS/"
              "final_model.keras --macs 0.5 --epochs E --distill --seed S`; the cuts (s0): "
              "`python experiments/vit_cut_at_once.py` and `tp_vit.py`'s `prepare.json`"
              if point == _MACS_POINT else "")
    note = _teacher_note(records)
    return lines + ([""] + [note.strip()] if note else []) + [
                    "", "Reproduce: `python experiments/vit_trained.py --arm A [--layout homogeneous] "
                    "[--mode uniform] [--attention head_dims] [--importance activation] "
                    f"{budget} --epochs E --distill --seed S [--teacher T]` (A = oneshot, gradual, "
                    "scratch; E = 3, 10)"
                    f"{others}.", ""]


def _best(records, epochs):
    """``(label, accuracies, records)`` of the way with the best mean after ``epochs`` among those
    with 2+ seeds (else among all; None without any run that long)."""
    ways = {}
    for r in records:
        if r["epochs"] == epochs:
            ways.setdefault(r["label"], []).append(r)
    if not ways:
        return None
    paired = {label: found for label, found in ways.items() if len(found) >= 2} or ways
    label, found = max(paired.items(), key=lambda item: statistics.mean(r["acc"] for r in item[1]))
    return label, [r["acc"] for r in found], found


def _judged(met, n_a, n_b):
    """``**met**``/``**not met**``, "so far" while a side has fewer than 2 seeds."""
    verdict = "met" if met else "not met"
    return f"**{verdict}**" if min(n_a, n_b) >= 2 else f"**{verdict} so far** (fewer than 2 seeds)"


def _goals(records, teachers):
    """The issue's goals for the trained teacher: at latency=0.5 where PreCrop runs exist there,
    else at the MACs point (said so). Torch-Pruning takes no latency budget: at latency=0.5 its
    runs at the MACs ratio of the PreCrop runs there (within 0.005) stand against them."""
    at_latency = [r for r in records if r["precrop"] and r["point"] == _LATENCY_POINT]
    point = _LATENCY_POINT if at_latency else _MACS_POINT
    precrop = [r for r in records if r["precrop"] and r["point"] == point]
    if at_latency:
        tp = [r for r in records if r["tp"] and r["recipe"] and r["point"] == _LATENCY_POINT]
        macs = ", ".join(sorted({f"{r['point_macs']:.4f}" for r in tp})) or "none run yet"
        where = (f"latency=0.5 (Torch-Pruning, which takes no latency budget: its runs at the MACs "
                 f"ratio of a PreCrop plan there, {macs})")
    else:
        tp = [r for r in records if r["tp"] and r["recipe"] and r["point"] == _MACS_POINT]
        where = ("flops=0.5: no PreCrop run at latency=0.5 yet, where the issue sets them, so judged at "
                 "half the MACs")
    return ["### Goals", "", f"Issue 61's goals for the trained ViT, judged at {where}:", "",
            _beat_tp([r for r in precrop if r["recipe"]], tp), _near_teacher(precrop, teachers), ""]


def _beat_tp(precrop, tp):
    """The 3-epoch goal's line: the best PreCrop way (distilled, the shared recipe) at least 1 pp
    above Torch-Pruning's best way with the same recipe."""
    goal = (f"- 3 epochs, best PreCrop way (distilled) >= Torch-Pruning (same recipe) + {_BEAT_TP_PP:g} pp: ")
    theirs = _best(tp, 3)
    precrop, left_out = _covering(precrop, theirs)
    ours = _best(precrop, 3)
    if ours is None or theirs is None:
        waiting = [name for name, best in (("PreCrop", ours), ("Torch-Pruning", theirs)) if best is None]
        return goal + f"**pending** (no 3-epoch run of {' or '.join(waiting)} with the recipe yet)."
    margins = _margins_by_teacher(ours[2], theirs[2])
    difference = (statistics.mean(margins.values()) if margins
                  else statistics.mean(ours[1]) - statistics.mean(theirs[1]))
    verdict = _judged(difference >= _BEAT_TP_PP - 1e-9, len(ours[1]), len(theirs[1]))
    paired = ""
    if len(margins) > 1:
        paired = (" (the mean of the margins on each teacher both pruned: "
                  + ", ".join(f"{teacher} {margin:+.2f}" for teacher, margin in sorted(margins.items()))
                  + "; teachers differ by more than the runs on one)")
    return goal + (f"{verdict}: {ours[0]} {_cell(ours[1])} vs {theirs[0]} {_cell(theirs[1])}, "
                   f"{difference:+.2f} pp{paired} (n {len(ours[1])}/{len(theirs[1])})."
                   + _teacher_note(ours[2] + theirs[2]) + left_out)


def _covering(precrop, theirs):
    """``(records, sentence)``: the 3-epoch PreCrop runs of the ways that pruned every teacher
    ``theirs`` (Torch-Pruning's best way) pruned, and a sentence naming the ways left out.

    A way run on fewer teachers would be judged on the teachers it happened to meet: leaving out
    the one where both sides score alike lifts its mean margin without any better pruning.
    """
    if theirs is None:
        return precrop, ""
    needed = {r["teacher"] for r in theirs[2]}
    ways = {}
    for r in precrop:
        if r["epochs"] == 3:
            ways.setdefault(r["label"], set()).add(r["teacher"])
    short = {label: sorted(needed - met) for label, met in ways.items() if not needed <= met}
    if not short:
        return precrop, ""
    def margins(label):  # what the way's runs say beside Torch-Pruning's, on the teachers they met
        found = _margins_by_teacher([r for r in precrop if r["label"] == label and r["epochs"] == 3],
                                    theirs[2])
        return "".join(f", {teacher} {margin:+.2f} pp" for teacher, margin in found.items())

    said = "; ".join(f"{label} (no run on {', '.join(missing)}{margins(label)})"
                     for label, missing in sorted(short.items()))
    return ([r for r in precrop if r["label"] not in short],
            f" Left out, as not run on every teacher Torch-Pruning pruned: {said}.")


def _margins_by_teacher(ours, theirs):
    """``{teacher: mean accuracy of ours on it - theirs on it}`` over the teachers both pruned.

    A better teacher lifts every way that prunes it, so ways are compared on the same teacher and
    each teacher counts once, however many fine-tuning seeds ran on it.
    """
    def by_teacher(records):
        found = {}
        for r in records:
            found.setdefault(r["teacher"], []).append(r["acc"])
        return found

    a, b = by_teacher(ours), by_teacher(theirs)
    return {t: statistics.mean(a[t]) - statistics.mean(b[t]) for t in sorted(set(a) & set(b))}


def _teacher_note(records):
    """A sentence where some of ``records`` prune another seed's teacher than their own (their
    seeds then vary the fine-tuning and, for data rankings, the batches, not the teacher), else ""."""
    borrowed = sorted({(r["seed"], r["teacher"]) for r in records
                       if not r["teacher"].endswith(f"-s{r['seed']}")})
    if not borrowed:
        return ""
    said = ", ".join(f"seed {seed} on {teacher}" for seed, teacher in borrowed)
    return (f" Runs of another seed's teacher ({said}): those seeds vary the training after the cut "
            "(and a data ranking's batches), not the teacher.")


def _near_teacher(precrop, teachers):
    """The 10-epoch goal's line: the best PreCrop way within 2 pp of the mean of its seeds' teachers."""
    goal = f"- 10 epochs, best PreCrop way within {_NEAR_TEACHER_PP:g} pp of the teacher: "
    ours = _best(precrop, 10)
    if ours is None:
        return goal + "**pending** (no 10-epoch PreCrop run yet)."
    names = sorted({r["teacher"] for r in ours[2]})
    missing = [name for name in names if name not in teachers]
    if missing:
        return goal + f"**pending** (teacher {', '.join(missing)} not finished)."
    teacher = [teachers[name]["test_accuracy"] for name in names]
    difference = statistics.mean(ours[1]) - statistics.mean(teacher)
    verdict = _judged(difference >= -_NEAR_TEACHER_PP - 1e-9, len(ours[1]), len(teacher))
    return goal + (f"{verdict}: {ours[0]} {_cell(ours[1])} vs its teachers' {_cell(teacher)}, "
                   f"{difference:+.2f} pp (n {len(ours[1])}/{len(teacher)}).")


def _speedup(rows):
    """The median measured speedup of a table row's timed runs, or blank."""
    speed = _median_speedup(rows)
    return "" if speed is None else f"{speed:.2f}x"


_AT_INIT_COMMAND = ("`python experiments/vit_at_init.py --method M --params 0.5 --seed S`, M = precrop, "
                    "uniform, homogeneous; the latency rows: `--method M --plan experiments/plans/"
                    "vit_cifar_tf_b64_headdims_latency0.5_P.json`, (M, P) = (precrop, auto), (uniform, "
                    "uniform), plans calibrated once on a quiet machine; uniform at the measured time of "
                    "PreCrop's latency plan: `--method uniform --plan experiments/plans/"
                    "vit_cifar_tf_b64_headdims_flops0.234_uniform.json`, `kp.plan(model, flops=0.234, "
                    "mode=\"uniform\", attention=\"head_dims\")` of the teacher's architecture (the MACs "
                    "ratio of PreCrop's latency plan, which timed as fast untrained: 1.84x vs 1.83x, "
                    "interleaved)")


def _at_init(runs, speed=None):
    """The at-initialization table (``vit_at_init.py``): method x budget, or "pending"; the measured
    speedup of each row's models where ``speed`` (``bench_trained_speed.py``'s record) timed them."""
    lines = ["### The ViT pruned at initialization", ""]
    found = [{**r, "run": name} for name, r in sorted(runs.items())
             if name.startswith("vit_cifar-") and r.get("method") in _AT_INIT]
    if not found:
        return lines + [f"Pending: no run yet ({_AT_INIT_COMMAND}).", ""]
    groups = {}
    for r in found:
        key = (list(_AT_INIT).index(r["method"]), _at_init_budget(r), r["epochs"])
        groups.setdefault(key, []).append(r)
    timed = (speed or {}).get("runs", {})
    lines += ["The teacher's architecture freshly initialized, cut before training, trained with the "
              "teachers' recipe (2 warm-up epochs, cosine). *speedup*: the unpruned architecture's "
              "time / the row's, measured interleaved by `python benchmarks/bench_trained_speed.py "
              "--model vit_cifar` (TensorFlow, inference, batch "
              f"{(speed or {}).get('settings', {}).get('batch_size', 64)}; blank: not timed yet).", "",
              "| method | budget | epochs | test accuracy % | params | MACs ratio | speedup | n |",
              "|---|---|---:|---:|---:|---:|---:|---:|"]
    for (index, budget, epochs), group in sorted(groups.items()):
        lines.append(f"| {list(_AT_INIT.values())[index]} | {budget} | {epochs} "
                     f"| {_cell([r['test_accuracy'] for r in group])} "
                     f"| {statistics.mean(r['params'] for r in group):,.0f} "
                     f"| {statistics.mean(r['macs'] / r['original_macs'] for r in group):.4f} "
                     f"| {_speedup(_timed_rows(group, timed))} | {len(group)} |")
    return lines + ["", *_at_init_goal(groups, timed), f"Reproduce: {_AT_INIT_COMMAND}.", ""]


def _timed_rows(group, timed):
    """``bench_trained_speed.py``'s records of a table row's runs that it timed."""
    return [timed[r["run"]] for r in group if r["run"] in timed]


def _at_init_budget(r):
    """A run's budget as the table shows it: its budgets, or for a ``--plan`` run its plan file's
    (a calibrated latency target, else its params or MACs budget as a ratio of the original's)."""
    if not r.get("plan"):
        return ", ".join(f"{k} {v:g}" for k, v in r["budgets"].items() if v is not None)
    plan = json.loads((_REPO / r["plan"]).read_text())
    target = plan["solver"].get("latency_calibration", {}).get("target")
    if target is not None:
        return f"latency {target:g}"
    ratios = {("flops" if k == "macs" else k): v / plan["original"][k]
              for k, v in plan["budgets"].items() if v is not None}
    return ", ".join(f"{k} {v:.3g}" for k, v in ratios.items())


def _at_init_goal(groups, timed):
    """Issue 61's goal at initialization: PreCrop's layout never worse than uniform widths beyond the
    stds (the larger of the two; 0 for one seed), at equal budget and at equal measured time.

    Equal time is read from the interleaved benchmark (``timed``): a uniform row whose median speedup
    is within :data:`_EQUAL_TIME` of PreCrop's row at the same schedule. A latency budget's two plans,
    calibrated on another machine, may not take equal time here: their line says so.
    """
    precrop, uniform = list(_AT_INIT).index("precrop"), list(_AT_INIT).index("uniform")
    lines = []
    for (index, budget, epochs), group in sorted(groups.items()):
        if index != precrop:
            continue
        speed = _median_speedup(_timed_rows(group, timed))
        for (other_index, other_budget, other_epochs), other in sorted(groups.items()):
            if other_index != uniform or other_epochs != epochs:
                continue
            other_speed = _median_speedup(_timed_rows(other, timed))
            equal_time = None not in (speed, other_speed) and abs(speed / other_speed - 1) <= _EQUAL_TIME
            if other_budget == budget:
                where = f"{budget}, {epochs} epochs"
                if "latency" in budget and None not in (speed, other_speed) and not equal_time:
                    lines.append(_unjudged(where, group, other, speed, other_speed))
                    continue
            elif equal_time:
                where = (f"equal measured time ({budget} at {speed:.2f}x vs uniform's {other_budget} at "
                         f"{other_speed:.2f}x), {epochs} epochs")
            else:
                continue
            lines.append(_layout_verdict(where, group, other))
    return [*lines, ""] if lines else []


def _unjudged(where, group, other, speed, other_speed):
    """A line for a latency budget whose two plans do not take equal time here: the accuracies,
    no verdict (the goal compares layouts at equal measured time)."""
    a, b = (statistics.mean(r["test_accuracy"] for r in g) for g in (group, other))
    return (f"- {where}: not judged, the two plans do not take equal time on this CPU ({speed:.2f}x "
            f"vs {other_speed:.2f}x; calibrated on another): {a:.2f} vs {b:.2f}, {a - b:+.2f} pp (n "
            f"{len(group)}/{len(other)}).")


def _median_speedup(rows):
    """The median measured speedup of a row's timed runs, or None."""
    return statistics.median(row["speedup"] for row in rows) if rows else None


def _layout_verdict(where, group, other):
    """A goal line: PreCrop's runs ``group`` against uniform's ``other``, within the larger std."""
    (a, sa), (b, sb) = (_mean_std([r["test_accuracy"] for r in g]) for g in (group, other))
    tolerance = max(sa or 0.0, sb or 0.0)
    return (f"- {where}: PreCrop's layout never worse than uniform widths beyond the stds: "
            f"{_judged(a >= b - tolerance, len(group), len(other))}: {a:.2f} vs {b:.2f}, {a - b:+.2f} "
            f"pp (tolerance {tolerance:.2f}; n {len(group)}/{len(other)}).")
