"""Sections "What was checked to rule out a bug" (``experiments/sanity.py``'s checks) and "Runs
resumed before the data-order fix" of ``experiments/report.py``'s page.
"""

import re
import subprocess

from _report_common import _skipped


def _sanity_init(init):
    """``(table lines, conclusion or None)`` of the init-scale check, one row per plan."""
    lines = [
        "**Init scale of rebuilt layers**: every PreCrop/PreConfig plan of the grids (seed 0), built by "
        "the grid's pinned commit as `train_cifar.py` builds it. ratio = a kernel's RMS / the std its "
        "initializer's config gives at the *new* fan-in; z = standard errors from 1 (pass: |z| <= 5); "
        "*if kept* = the ratio had the weights kept the original layer's scale. BN must start at gamma 1, "
        "beta 0; no weight may be shared with or copied from the original model, no two kernels equal.",
        "",
        "| plan (resnet20, seed 0) | code | params (built / trained) | worst ratio (z, layer) "
        "| if kept: ratio (z, layer) | BN, shared, copied, equal | ok |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in init:
        plan = row["run"].split("-", 1)[1].rsplit("-ep", 1)[0]
        if "error" in row:
            lines.append(f"| {plan} | {row['code']} | cannot build it: {row['error']} | | | | **NO** |")
            continue
        worst, telling = row["worst"], row["telling"]
        faults = [row[key] for key in ("batchnorm_not_at_init", "shared", "copied", "duplicates")]
        trained = "-" if row["trained_params"] is None else f"{row['trained_params']:,}"
        lines.append(
            f"| {plan} | {row['code']} | {row['params']:,} / {trained} | "
            f"{worst['ratio']:.3f} ({worst['z']:+.1f}, {worst['name']}) | "
            f"{telling['ratio_if_kept']:.3f} ({telling['z_if_kept']:+.1f}, {telling['name']}) | "
            f"{', '.join(str(len(f)) for f in faults)} | {'yes' if row['ok'] else '**NO**'} |"
        )
    layers = [layer for row in init for layer in row.get("layers", ())]
    if not layers:
        return lines, None
    worst = max(layers, key=lambda r: abs(r["z"]))
    same = [row["params"] == row["trained_params"] for row in init if row.get("trained_params") is not None]
    return lines, (
        f"Init: {sum(row['ok'] for row in init)} of {len(init)} plans pass; the worst of {len(layers)} "
        f"kernels is {worst['name']} at ratio {worst['ratio']:.3f} (z {worst['z']:+.1f}), while the "
        f"original scale would have failed {sum(row.get('detectable_if_kept', 0) for row in init)} of them "
        f"(ratios down to {min(layer['ratio_if_kept'] for layer in layers):.3f}). The plan built here "
        f"has the trained model's params in {sum(same)} of the {len(same)} finished runs."
    )


def _sanity_masks(runs):
    """``(table lines, conclusion or None)`` of the mask check, one row per masked run."""
    masked = [row for row in runs if row["masks"]]
    lines = [
        "**Masks held through training**: exact zeros in the trained kernels of each masked run's "
        "`final_model.keras` vs the pruned weights `results.json` implies (`original_params - params`) "
        "and the masks stored in the model. Trained weights are never exactly zero, and nothing re-applies "
        "a mask after training starts; *starts* counts the run's (re)starts.",
        "",
        "| run | kernel weights | exact zeros | pruned per results.json | masked | nonzero under a mask "
        "| zeros outside masks | starts | ok |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in masked:
        m = row["masks"]
        lines.append(
            f"| {row['run']} | {m['kernel_weights']:,} | {m['kernel_zeros']:,} | "
            f"{m['pruned_per_results']:,} | {m['masked']:,} | {m['nonzero_under_mask']} | "
            f"{m['zeros_outside_mask']} | {row['starts']} | {'yes' if m['ok'] else '**NO**'} |"
        )
    if not masked:
        return lines, None
    return lines, (
        f"Masks: {sum(row['masks']['ok'] for row in masked)} of {len(masked)} masked runs keep exactly their "
        "masks' zeros."
    )


def _sanity_densities(runs):
    """``(table lines, conclusion)`` of figure 4's premise, the realized layer densities vs SynExp's
    (``([], None)`` when no run has them)."""
    rows = [row for row in runs if row.get("densities")]
    if not rows:
        return [], None
    lines = [
        "**Figure 4's layer densities**: the kept share of each Conv/Dense kernel of the run's "
        "`final_model.keras` (nonzero weights of a masked kernel; a narrower rebuilt kernel's size) out of "
        "the original kernel's, vs the density program's solution (`plan(mode=\"paper\")`) at the run's "
        "budget.",
        "",
        "| run | layers | mean absolute difference | worst layer: SynExp -> realized |",
        "|---|---:|---:|---|",
    ]
    for row in rows:
        d = row["densities"]
        lines.append(
            f"| {row['run']} | {d['layers']} | {d['mean_abs_diff']:.4f} | {d['worst_layer']}: "
            f"{d['worst_target']:.4f} -> {d['worst_target'] + d['worst_diff']:.4f} |"
        )
    worst = {}
    for row in rows:
        worst[row["method"]] = max(worst.get(row["method"], 0.0), abs(row["densities"]["worst_diff"]))
    return lines, (
        "Layer densities: the largest difference from SynExp's in a layer is "
        + "; ".join(f"{d:.4f} for {method}" for method, d in worst.items())
        + f" ({len(rows)} models)."
    )


def _sanity_eval(runs):
    """``(table lines, conclusion or None)`` of the re-evaluation, one row per saved model."""
    lines = [
        "**Independent re-evaluation**: each finished run's `final_model.keras`, loaded with "
        "`keras.saving.load_model` and evaluated on the CIFAR-10 test split normalized by the script itself; "
        "params = `count_params()` less exact zeros, MACs = `profile`'s scaled by kernel density.",
        "",
        "| run | final_accuracy | re-evaluated | difference (pp) | params (json / recount) "
        "| MACs (json / recount) |",
        "|---|---:|---:|---:|---|---|",
    ]
    for row in runs:
        e = row["eval"]
        lines.append(
            f"| {row['run']} | {100 * e['final_accuracy']:.2f} | {100 * e['accuracy']:.2f} | "
            f"{e['difference_pp']:+.3f} | {e['params']:,} / {e['params_recount']:,} | "
            f"{e['macs']:,} / {e['macs_recount']:,} |"
        )
    if not runs:
        return lines, None
    evals = [row["eval"] for row in runs]
    same = sum(e["params"] == e["params_recount"] and e["macs"] == e["macs_recount"] for e in evals)
    gap = max(abs(e["difference_pp"]) for e in evals)
    return lines, (
        f"Re-evaluation: the largest accuracy difference is {gap:.3f} pp "
        f"over {len(runs)} saved models; params and MACs agree for {same} of them."
    )


def _sanity_parts(data):
    """``(table lines, conclusion or None)`` of each check in ``sanity.json``'s ``data``, in page order."""
    parts = (_sanity_init(data["init"]), _sanity_masks(data["runs"]), _sanity_densities(data["runs"]),
             _sanity_eval(data["runs"]))
    return [(lines, conclusion) for lines, conclusion in parts if lines]


def _checked(data):
    """Under the claims: each check's conclusion (of ``_load_sanity()``'s ``data``), what rules out
    a bug behind a claim that fails."""
    if data is None:
        return []
    conclusions = [c for _, c in _sanity_parts(data) if c]
    return [
        '**Checked to rule out a bug** (section "What was checked to rule out a bug" below): '
        + " ".join(conclusions),
        "",
    ]


def _sanity(data):
    """The section that renders ``_load_sanity()``'s ``data``."""
    lines = ["## What was checked to rule out a bug", ""]
    if data is None:
        return lines + ["Not computed yet: run `python experiments/sanity.py`.", ""]
    lines += ["From `python experiments/sanity.py` (rerun it when runs finish).", ""]
    for part, conclusion in _sanity_parts(data):
        lines += [*part, *(["", conclusion] if conclusion else []), ""]
    if data["skipped"]:
        lines += ["Not checked: " + _skipped(data["skipped"]) + ".", ""]
    return lines


_DATA_ORDER_FIX = "7d3d106"  # train.fit skips the data passes of the epochs a backup restores


def _replayed_epochs(run_dir):
    """The epochs (from 1) that a restarted process of the run in ``run_dir`` trained first.

    Before commit ``_DATA_ORDER_FIX`` such an epoch read the first epoch's
    shuffle and augmentations again (a fresh pipeline's first draw).
    """
    epochs, restarted, starts = [], False, 0
    for line in (run_dir / "train.log").read_text(errors="replace").splitlines():
        if line.startswith("$ python"):
            starts += 1
            restarted = starts > 1
        elif restarted and (match := re.match(r"Epoch (\d+)/\d+$", line)):
            restarted = False
            epochs += [int(match.group(1))] if int(match.group(1)) > 1 else []
    return epochs


def _has_fix(commit, known, checkout):
    """Whether ``commit`` (a run's ``git_commit``) contains ``_DATA_ORDER_FIX``, by the git history
    of ``checkout`` (the experiments folder of a clone); ``known`` caches it."""
    if commit not in known:
        known[commit] = bool(commit) and subprocess.run(
            ["git", "merge-base", "--is-ancestor", _DATA_ORDER_FIX, commit], cwd=checkout,
            capture_output=True).returncode == 0
    return known[commit]


def _replayed(runs, checkout):
    """The section listing the finished runs that a restart made replay the first epoch's data
    (``checkout``: the experiments folder whose ``runs/<run>/train.log`` and git history tell)."""
    known, rows = {}, []
    for name, result in sorted(runs.items()):
        log = checkout / "runs" / name / "train.log"
        epochs = _replayed_epochs(log.parent) if log.exists() else []
        if epochs and not _has_fix(result.get("git_commit"), known, checkout):
            rows.append(f"| {name} | {', '.join(map(str, epochs))} | {100 * result['final_accuracy']:.2f} |")
    lines = ["## Runs resumed before the data-order fix", "",
             f"Before commit {_DATA_ORDER_FIX}, a run killed and restarted from its backup trained its "
             "next epoch on the first epoch's shuffle and augmentations again (the restarted process "
             "built its pipeline afresh, and a seeded pipeline draws each epoch from the count of its "
             "passes): one epoch of data repeated per restart, not a wrong model, but not the "
             "uninterrupted run either. These finished runs had such epochs (read from train.log); "
             "their numbers stand, each with this caveat.", ""]
    if not rows:
        return lines + ["None.", ""]
    return lines + ["| run | epochs replayed | test accuracy % |", "|---|---|---:|", *rows, ""]
