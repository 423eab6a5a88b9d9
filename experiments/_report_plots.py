"""The figures of ``experiments/report.py``'s page: matplotlib on its file-only backend (Agg).

Accuracy against a cost per grid, one bar per entry, accuracy per epoch, and
the layout and saving that every figure of the page shares.
"""

import textwrap

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import run as _run  # noqa: E402  (experiments/run.py: which methods mask weights)
from _report_common import _budget, _mean_curve, _summary  # noqa: E402


def _plot(entries, x_key, path, title, xlabel):
    """Accuracy (mean ± std) against ``x_key`` of the summary (log scale), one series per method label."""
    series = {}
    for entry in entries:
        s = _summary(entry)
        if s is None:
            continue
        base = (
            entry["label"].split(" (")[0]
            if entry["flags"]["method"] in _run.MASKED
            else entry["label"]
        )
        series.setdefault(base, []).append((s[x_key], s["acc"], s["std"]))
    if not series:
        return False
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, points in sorted(series.items()):
        points.sort()
        xs, ys, es = zip(*points)
        ax.errorbar(xs, ys, yerr=es, marker="o", capsize=3, label=label)
    ax.set_xscale("log")
    _finish(fig, ax, xlabel, title, path)
    return True


def _plot_bars(entries, path, title):
    """Accuracy (mean ± std over seeds) of each finished entry, one bar each, in the grid's order:
    the figure of a grid plotted without a cost axis."""
    finished = [(e, s) for e in entries if (s := _summary(e)) is not None]
    if not finished:
        return False
    fig, ax = plt.subplots(figsize=(7, 1.3 + 0.4 * len(finished)))
    labels = []
    for entry, s in finished:
        budget = _budget(entry["flags"])
        labels.append(f"{entry['label']}{', ' + budget if budget else ''} (n {s['n']})")
    accs, stds = [s["acc"] for _, s in finished], [s["std"] for _, s in finished]
    rows = range(len(finished))  # positions, not labels: equal labels must not share a bar
    ax.barh(rows, accs, xerr=stds, capsize=3, color="tab:blue", alpha=0.7)
    ax.set_yticks(rows, labels)
    low = min(a - d for a, d in zip(accs, stds))
    ax.set_xlim(max(0.0, low - 5), min(100.0, max(a + d for a, d in zip(accs, stds)) + 3))
    ax.invert_yaxis()  # top down
    ax.set_xlabel("test accuracy (%)")
    fig.suptitle(textwrap.fill(title, 90), fontsize=9)
    ax.grid(axis="x", alpha=0.3)
    _save(fig, path)
    return True


def _finish(fig, ax, xlabel, title, path, legend=None):
    """Labels an accuracy plot, saves it to ``path`` and closes it (``legend``: ``ax.legend``'s
    placement, default matplotlib's best)."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(textwrap.fill(title, 60), fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, **(legend or {}))
    _save(fig, path)


def _save(fig, path, dpi=120, outside=()):
    """Lays out, writes and closes a figure; ``outside``: artists placed outside the axes (legends
    below them), left out of the layout (which would shrink the axes to fit them) and grown into the
    written image."""
    for artist in outside:
        artist.set_in_layout(False)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi, bbox_inches="tight" if outside else None,
                bbox_extra_artists=list(outside) or None)
    plt.close(fig)


def _plot_curves(entries, path, title):
    """Test accuracy after each epoch (mean over seeds), one line per finished entry."""
    finished = [e for e in entries if e["results"]]
    if not finished:
        return False
    fig, ax = plt.subplots(figsize=(6, 4))
    for entry in finished:
        mean = _mean_curve(entry)
        ax.plot(range(1, len(mean) + 1), mean, label=f"{entry['label']} (n {len(entry['results'])})")
    _finish(fig, ax, "epoch", title, path)
    return True
