"""Section "Pruning a trained model (issue 29)" of ``experiments/report.py``'s page, and the
table rows, goal and figure of accuracy per epoch of training pruned widths that the issue-43
sections (``_report_gradual``) share.
"""

import statistics

from _report_common import _descriptions, _entries, _find, _mean_curve, _mean_std, _summary
from _report_plots import _save, plt

# Issue 29 (grid keep_weights): each pruning point (label, the flags that pick its entries, its
# from-scratch twin's grid and flags, whether the goal is judged there). The FLOPs point is planned in
# the library's default mode, which under a FLOPs budget is layerwise (modes.auto_mode; the tests
# check the pick).
_KEEP_PLAN = "experiments/plans/resnet20_tf_b64_latency0.5_{}.json"
_KEEP_POINTS = tuple(
    (f"latency 0.5, {name} widths", {"plan_file": _KEEP_PLAN.format(mode)}, grid,
     {"plan_file": _KEEP_PLAN.format(mode)}, True)
    for mode, name, grid in (("auto", "exact", "uniform_latency"), ("uniform", "uniform", "uniform_latency"),
                             ("floor", "floor", "latency_floor"),
                             ("streamfloor", "stream floor", "latency_stream_floor"))
) + (("flops 0.2734", {"method": "precrop_flops", "flops": 0.2734}, "core",
      {"method": "precrop_flops", "flops": 0.2734, "mode": "layerwise"}, False),)
# How a pruned model is trained on (row label, flags of its entry): the recipe (learning rate 0.1),
# the control, then the first recipe (0.01, seed 3). A point shows the ways its grid entries have.
_KEEP_WAYS = (
    ("fine-tuned (l1 channels)", {"importance": "l1", "distill": None, "learning_rate": 0.1}),
    ("distilled (l1 channels)", {"importance": "l1", "distill": True, "learning_rate": 0.1}),
    ("random channels, fine-tuned (control)", {"importance": "random", "distill": None,
                                               "learning_rate": 0.1}),
    ("fine-tuned, lr 0.01", {"importance": "l1", "distill": None, "learning_rate": 0.01}),
    ("distilled, lr 0.01", {"importance": "l1", "distill": True, "learning_rate": 0.01}),
)
_KEEP_GOAL_WAYS = 2  # the goal counts the recipe's fine-tuned and distilled rows
_KEEP_GOAL = ("at latency=0.5, pruned and fine-tuned within 1 pp of the dense model after at most 3 "
              "epochs, and above the from-scratch 10-epoch model of the same widths")
_KEEP_GOAL_PP, _KEEP_GOAL_EPOCHS = 1.0, 3


def _epoch_stats(entry):
    """``{fine-tuning epoch: (mean, std)}`` of an entry's test accuracy (%) over its finished seeds,
    from each run's history (one row per epoch, as ``history.csv`` logged it); epoch 0 is the
    pruned model's before training (``pruned_accuracy``). Empty while no seed has finished."""
    results = entry["results"]
    if not results:
        return {}
    epochs = min(len(r["history"]) for r in results)
    stats = {e + 1: _mean_std([100 * r["history"][e]["val_accuracy"] for r in results])
             for e in range(epochs)}
    pruned = [100 * r["pruned_accuracy"] for r in results if r.get("pruned_accuracy") is not None]
    if len(pruned) == len(results):
        stats[0] = _mean_std(pruned)
    return stats


def _keep_n(entry):
    """The *n* cell: finished seeds, and the pending ones."""
    seeds = entry["pending"]
    word = "seed" if len(seeds) == 1 else "seeds"
    pending = f" ({word} {', '.join(map(str, seeds))} pending)" if seeds else ""
    return f"{len(entry['results'])}{pending}"


def _keep_row(point, label, entry, columns):
    """A row of the table; ``columns`` maps fine-tuning epochs (0-3) or ``10`` to ``(mean, std)``."""
    if entry is None or not entry["results"]:
        n = "0" if entry is None else _keep_n(entry)
        return f"| {point} | {label} | | not yet trained | | | | | {n} |"
    macs = statistics.mean(r["macs_ratio"] for r in entry["results"])
    spread = len(entry["results"]) > 1  # one seed has no spread to show
    cells = [(f"{columns[k][0]:.2f} ± {columns[k][1]:.2f}" if spread else f"{columns[k][0]:.2f}")
             if k in columns else "" for k in (0, 1, 2, 3, 10)]
    return f"| {point} | {label} | {macs:.4f} | {' | '.join(cells)} | {_keep_n(entry)} |"


def _keep_head(teachers, teacher):
    """The head of a pruned-from-a-trained-model table and its first row, the dense teachers'
    (``teachers``: their grid's entries; ``teacher``: the first one's summary)."""
    return ["| pruning point | model | MACs ratio | pruned | 1 | 2 | 3 | 10 | n |",
            "|---|---|---:|---:|---:|---:|---:|---:|---|",
            _keep_row("-", "dense teacher, from scratch", teachers[0] if teachers else None, _final(teacher))]


def _final(summary):
    """``{10: (mean, std)}`` of a from-scratch summary's final accuracy, the table's last column."""
    return {} if summary is None else {10: (summary["acc"], summary["std"])}


def _keep_goal(teacher, scratch, ways):
    """The goal's verdict at one latency point: ``(verdict, why)``.

    Met when a way of fine-tuning (``ways``: ``{label: entry}``) that has
    finished all its seeds (2 or more) has, after some epoch up to the third,
    a mean accuracy at most 1 pp below the dense teacher's and above the
    from-scratch model's; not met when all ways have finished and none does.
    The dense and from-scratch means count with 2 or more seeds.
    """
    waiting = [name for name, s in (("the dense teacher", teacher), ("the from-scratch model", scratch))
               if s is None or s["n"] < 2]
    done = {label: _epoch_stats(e) for label, e in ways.items()
            if len(e["results"]) >= 2 and not e["pending"]}
    waiting += [label for label in ways if label not in done]
    if teacher is None or scratch is None or teacher["n"] < 2 or scratch["n"] < 2:
        return "not yet measured", f"waiting for {', '.join(waiting)}"
    points = sorted(((stats[epoch][0], label, epoch) for label, stats in done.items()
                     for epoch in range(1, _KEEP_GOAL_EPOCHS + 1) if epoch in stats),
                    key=lambda point: (point[2], -point[0]))  # earliest epoch first, best way first
    for acc, label, epoch in points:
        if acc >= teacher["acc"] - _KEEP_GOAL_PP and acc > scratch["acc"]:
            return "met", (f"{label} after {epoch} epoch(s): {acc:.2f} vs dense {teacher['acc']:.2f} "
                           f"and from scratch {scratch['acc']:.2f}")
    if not points:
        return "not yet measured", f"waiting for {', '.join(waiting) or 'grid keep_weights'}"
    if waiting:
        return "not yet measured", f"not met so far; waiting for {', '.join(waiting)}"
    acc, label, epoch = max(points)
    return "not met", (f"best: {label} after {epoch} epoch(s), {acc:.2f} vs dense {teacher['acc']:.2f} "
                       f"({acc - teacher['acc']:+.2f} pp) and from scratch {scratch['acc']:.2f}")


def _point_ways(grids, entries, ways_of_point, twin_grid, twin_flags):
    """One pruning point's runs: ``(ways, epochs, twin)``: ``{label: entry}`` of the ways
    (``(label, grid, flags, epochs trained)``) found in ``grids``, ``{label: epochs trained}`` (their
    goal; None: none) and the from-scratch twin ``(entry, summary)`` found in ``entries[twin_grid]``
    (None if that grid lacks it)."""
    ways, epochs = {}, {}
    for label, grid, flags, trained in ways_of_point:
        found = _find(grids[grid], **flags)
        if found:
            ways[label], epochs[label] = found[0][0], trained
    twin = _find(entries[twin_grid], **twin_flags)
    return ways, epochs, (twin[0] if twin else None)


def _keep_point(keep, entries, point):
    """One pruning point: ``(ways, twin)``: ``{label: entry}`` of the ways its grid entries have, and
    the from-scratch twin ``(entry, summary)`` (None if its grid lacks it)."""
    _, flags, grid, twin_flags, _ = point
    ways_of_point = [(label, "keep_weights", {**flags, **way}, None) for label, way in _KEEP_WAYS]
    ways, _, twin = _point_ways({"keep_weights": keep}, entries, ways_of_point, grid, twin_flags)
    return ways, twin


# Line colors of the ways in a figure: matplotlib's tab20, dark shades first, without its greys
# (the from-scratch curve is grey).
_PALETTE = [plt.cm.tab20.colors[i] for i in (*range(0, 20, 2), *range(1, 20, 2)) if i not in (14, 15)]


def _plot_keep(teacher, points, path, labels=tuple(label for label, _ in _KEEP_WAYS), goals=None,
               twin_label="same widths from scratch"):
    """Test accuracy against epochs of training the pruned widths, one panel per pruning point:
    each way of fine-tuning (epoch 0: right after pruning) beside a from-scratch twin's 10-epoch
    curve (``twin_label`` names it: the same widths, unless said otherwise), and the dense teacher's
    accuracy (minus the goal's 1 pp), or where given ``goals`` (``{panel name: {epochs:
    accuracy %}}``) as stars in those panels."""
    drawn = [(name, ways, twin) for name, ways, twin in points if any(e["results"] for e in ways.values())]
    if not drawn:
        return False
    fig, axes = plt.subplots(1, len(drawn), figsize=(4.6 * len(drawn), 4), sharey=True, squeeze=False)
    colors = dict(zip(labels, _PALETTE))  # a way's color in every panel
    legends = []
    for ax, (name, ways, twin) in zip(axes[0], drawn):
        for label, entry in ways.items():
            stats = _epoch_stats(entry)
            if stats:
                epochs = sorted(stats)
                ax.plot(epochs, [stats[e][0] for e in epochs], marker="o", color=colors[label],
                        label=f"{label} (n {len(entry['results'])})")
        if twin is not None and twin[0]["results"]:
            mean = _mean_curve(twin[0])
            ax.plot(range(1, len(mean) + 1), mean, color="grey", ls=":", marker=".",
                    label=f"{twin_label} (n {len(twin[0]['results'])})")
        if teacher is not None:
            ax.axhline(teacher["acc"], color="k", lw=1, label="dense teacher")
            if goals is None:
                ax.axhline(teacher["acc"] - _KEEP_GOAL_PP, color="k", lw=1, ls="--", label="dense - 1 pp")
        if goals and name in goals:
            ax.plot(list(goals[name]), list(goals[name].values()), "k*", ms=9, ls="none", label="goal")
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("epochs of training the pruned widths")
        ax.grid(alpha=0.3)
        legends.append(ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(0, -0.16)))  # below
    axes[0][0].set_ylabel("test accuracy (%)")
    _save(fig, path, outside=legends)
    return True


def _keep_weights(runs, entries, figures):
    """Section "Pruning a trained model (issue 29)": test accuracy against fine-tuning epochs for each
    pruning point and way of fine-tuning (grid keep_weights), beside the dense teacher (grid
    keep_weights_teacher) and the same widths trained from scratch; a figure (into the folder
    ``figures``); the goal's verdicts."""
    keep, teachers = _entries("keep_weights", runs), _entries("keep_weights_teacher", runs)
    teacher = _summary(teachers[0]) if teachers else None
    lines = [
        "## Pruning a trained model (issue 29)", "",
        *_descriptions("keep_weights"),
        "Test accuracy % (mean ± std over seeds, n finished): *pruned* right after pruning, before any "
        "training; *1-3* after each epoch of one 3-epoch fine-tuning run (each run's `history.csv`); *10* "
        "after 10 epochs of the recipe from scratch: the dense teacher (the models pruned) and the same "
        "widths' PreCrop model (grids uniform_latency and core, seeds 0-1). MACs ratio of the trained model.",
        "",
    ] + _keep_head(teachers, teacher)
    goals, drawn = [], []
    for point in _KEEP_POINTS:
        ways, twin = _keep_point(keep, entries, point)
        lines += [_keep_row(point[0], label, entry, _epoch_stats(entry)) for label, entry in ways.items()]
        lines.append(_keep_row(point[0], f"from scratch (grid {point[2]})", twin and twin[0],
                               _final(twin and twin[1])))
        drawn.append((point[0], ways, twin))
        if point[4]:
            verdict, why = _keep_goal(teacher, twin and twin[1], dict(list(ways.items())[:_KEEP_GOAL_WAYS]))
            goals.append(f"- {point[0]}: **{verdict}** ({why}).")
    lines += ["", f"Goal: {_KEEP_GOAL}.", ""] + goals + [""]
    if _plot_keep(teacher, drawn, figures / "keep_weights.png"):
        lines += ["![keep_weights](figures/keep_weights.png)", ""]
    return lines
