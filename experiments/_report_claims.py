"""Section "The paper's claims on this run" of ``experiments/report.py``'s page: one verdict per
claim of the paper (figures 2-6) with the numbers behind it, the regime the short schedule trains
in, and the same claims on the longer schedule of a lent GPU.
"""

import run as _run  # experiments/run.py: which methods mask weights
from _report_common import _acc, _compare, _find, _fmt_row, _fmt_rows, _one, _summary, _verdict

# (PreCrop budget, SynFlow density) of the points of figures 2 (params) and 3 (FLOPs): SynFlow's
# realized params / MACs ratios at its three densities.
_PARAMS_POINTS = ((0.308, 0.3), (0.1103, 0.1), (0.0411, 0.03))
_FLOPS_POINTS = ((0.5562, 0.3), (0.2734, 0.1), (0.0884, 0.03))


_PRECROP_CLAIMS = (  # label, method, budget flag, points, claim, "match"/"beat", point label
    ("PreCrop-Params", "precrop_params", "params", _PARAMS_POINTS, "matches SynFlow at equal parameters",
     "match", "SynFlow {}"),
    ("PreCrop-FLOPs", "precrop_flops", "flops", _FLOPS_POINTS, "beats SynFlow at equal FLOPs", "beat",
     "MACs of SynFlow {}"),
)


def _precrop_rows(entries):
    """Each PreCrop claim and mode, compared with SynFlow at the points that ``entries`` hold.

    Returns:
        ``(label, mode, claim, want, {point label: _compare row or None})`` tuples.
    """
    synflow = {e["flags"]["params"]: s for e, s in _find(entries, method="synflow")}
    found = []
    for label, method, key, points, claim, want, what in _PRECROP_CLAIMS:
        points = [(p, q) for p, q in points if _find(entries, method=method, **{key: p})]
        for mode in ("exact", "layerwise") if points else ():
            rows = {
                what.format(q): _compare(_one(entries, method=method, mode=mode, **{key: p}), synflow.get(q))
                for p, q in points
            }
            found.append((label, mode, claim, want, rows))
    return found


def _precrop_claims(entries):
    """The PreCrop-Params and PreCrop-FLOPs claim lines, over the points that ``entries`` hold."""
    return [
        f"- **{label} ({mode}) {claim}**: {_verdict(list(rows.values()), want)}. "
        + _fmt_rows(list(rows.values()), list(rows))
        for label, mode, claim, want, rows in _precrop_rows(entries)
    ]


def _across_schedules(short, long):
    """PreCrop minus SynFlow at the points both schedules trained with 2+ seeds on each side."""
    def epochs(entries):
        return next(r["epochs"] for e in entries for r in e["results"])

    def counted(row):
        return row is not None and min(row[2], row[3]) >= 2

    before = {(label, mode, point): row for label, mode, *_, rows in _precrop_rows(short)
              for point, row in rows.items() if counted(row)}
    said = [
        f"{label} ({mode}) at {point}: {before[label, mode, point][0]:+.2f} pp at {epochs(short)} epochs, "
        f"{row[0]:+.2f} pp at {epochs(long)}"
        for label, mode, *_, rows in _precrop_rows(long)
        for point, row in rows.items()
        if counted(row) and (label, mode, point) in before
    ]
    if not said:
        return []
    return ["PreCrop minus SynFlow where both schedules have 2+ seeds: " + "; ".join(said) + "."]


def _spread(summaries):
    """The range of the summaries' mean accuracies, in pp."""
    return max(s["acc"] for s in summaries) - min(s["acc"] for s in summaries)


def _granularity(entries):
    """``(spread, tol, done, n_ways)`` of figure 4's ways to realize one set of layer densities.

    The ways are the entries that prune randomly at a ``granularity`` and
    PreCrop's ``paper`` rule (a grid's SynFlow reference is not one); there are
    ``n_ways``. ``done`` lists ``(label, summary)`` of those with 2+ seeds;
    ``spread`` is the range of their means and ``tol`` twice their largest std
    (both None when fewer than two have 2+ seeds).
    """
    ways = [e for e in entries if "granularity" in e["flags"] or e["flags"].get("mode") == "paper"]
    done = [(e["label"], s) for e in ways if (s := _summary(e)) is not None and s["n"] >= 2]
    if len(done) < 2:
        return None, None, done, len(ways)
    return _spread([s for _, s in done]), 2 * max(s["std"] for _, s in done), done, len(ways)


def _granularity_claim(entries):
    """The claim line of figure 4 (a list of it; none when ``entries`` train none of its ways): the
    spread of the ways' mean accuracies against a tolerance.

    The verdict waits for 2 seeds on every way; before that, the line gives
    the spread so far of those that have them.
    """
    spread, tol, done, n_ways = _granularity(entries)
    if not n_ways:
        return []
    if len(done) == n_ways:
        verdict = "reproduced; " if spread <= tol else "not reproduced; "
    else:
        verdict = "pending (fewer than 2 seeds on some point)"
        verdict += f"; so far, over the {len(done)} of {n_ways} with 2+ seeds, " if spread is not None else ""
    return [
        "- **Granularity does not matter at equal layer densities** (weight, filter, channel, PreCrop): "
        + verdict
        + ("" if spread is None else f"spread of means {spread:.2f} pp vs tol (2 x largest std) {tol:.2f} pp")
        + ". "
        + "; ".join(f"{label}: {_acc(s)}" for label, s in done)
    ]


def _granularity_across(short, long):
    """The spread of figure 4's means on both schedules, over the ways both have with 2+ seeds."""
    before = dict(_granularity(short)[2])
    after = [(label, s) for label, s in _granularity(long)[2] if label in before]
    if len(after) < 2:
        return []
    labels = [label for label, _ in after]
    return [
        f"Spread of figure 4's means over {', '.join(labels)}: "
        f"{_spread([before[label] for label in labels]):.2f} pp at {before[labels[0]]['epochs']} epochs, "
        f"{_spread([s for _, s in after]):.2f} pp at {after[0][1]['epochs']}."
    ]


def _pareto_sweeps(pareto, paper):
    """``(name, points)`` of each FLOPs sweep of figure 5 that a grid trains, its points as
    ``_find`` gives them: PreCrop per mode (grid ``pareto``) and random weights at SynExp's
    densities (grid ``pareto_paper``, the paper's own way)."""
    sweeps = [(f"PreCrop ({mode})", _find(pareto, method="precrop_params", mode=mode))
              for mode in ("exact", "layerwise")]
    sweeps.append(("Random weights at SynExp's densities (the paper's way)", _find(paper)))
    return [(name, points) for name, points in sweeps if points]


def _pareto_rows(points, masked):
    """Each masked method of figure 5 against the point of a sweep that judges it.

    That point is the one with the most MACs not above the method's: picked
    by cost, never by accuracy, so no best-of-several noisy points flatters
    the sweep. The pick needs every point's MACs, so a row waits (None) until
    the method and every point of the sweep have a run.

    Args:
        points: ``(entry, summary)`` of the sweep's points.
        masked: ``(entry, summary)`` of the masked methods.

    Returns:
        ``{row label: _compare row, None, or the string that says no point
        costs as little}``.
    """
    rows = {}
    for entry, s in masked:
        method = entry["flags"]["method"]
        if s is None or any(p is None for _, p in points):
            rows[method] = None
            continue
        cheaper = [(p["macs_ratio"], e, p) for e, p in points if p["macs_ratio"] <= s["macs_ratio"]]
        label = f"{method} (MACs {s['macs_ratio']:.4f})"
        if not cheaper:
            rows[label] = "no point of the sweep at or below its MACs"
            continue
        macs, e, p = max(cheaper, key=lambda c: c[0])
        flops = e["flags"].get("flops")
        point = "no FLOPs budget" if flops is None else f"flops {flops}"
        rows[f"{label} vs {point} (MACs {macs:.4f})"] = _compare(p, s)
    return rows


def _pareto_claim(pareto, paper=()):
    """The claim lines of figure 5, one per FLOPs sweep: it beats every masked method of grid
    ``pareto`` at no more MACs (the paper: "dominates all other methods in terms of both accuracy
    and FLOPs reduction")."""
    masked = [(e, s) for e, s in _find(pareto) if e["flags"]["method"] in _run.MASKED]
    lines = []
    for name, points in _pareto_sweeps(pareto, paper):
        rows = _pareto_rows(points, masked)
        beyond = [label for label, row in rows.items() if isinstance(row, str)]
        compared = [row for row in rows.values() if not isinstance(row, str)]
        verdict = (f"not reproduced ({len(beyond)} of {len(rows)} methods cost less than every point)"
                   if beyond else _verdict(compared, "beat"))
        said = [f"{label}: {row if isinstance(row, str) else _fmt_row(row)}" for label, row in rows.items()]
        lines.append(f"- **{name} at 1.5e4 parameters beats every other method at no more MACs**: "
                     f"{verdict}. " + "; ".join(said))
    return lines


def _claims(core, thm, pareto, paper, preconfig):
    """One line per paper claim: verdict and the numbers behind it."""
    lines = [
        "## The paper's claims on this run",
        "",
        'Rule: differences are of mean final accuracy in percentage points (pp); "tol" is the sum of the '
        "two standard deviations. *Matches* = no point below -tol; *beats* = every point above 0 and one "
        "above tol. Both need 2 or more seeds on each side; a point with 2 seeds on its smaller side and a "
        "difference within tol is *close*: where a claim's verdict could turn on it, it gets a third seed.",
        "",
    ]
    lines += _precrop_claims(core)
    lines += _granularity_claim(thm)
    lines += _pareto_claim(pareto, paper)
    row = _compare(_one(preconfig, method="preconfig"), _one(preconfig, method="baseline"))
    lines.append(
        f"- **PreConfig gives equal or better accuracy at equal cost**: {_verdict([row], 'match')}. "
        + _fmt_rows([row], ["PreConfig - baseline"])
    )
    return lines + ["", *_underfit(core), ""]


def _train_minus_test(result):
    """The last epoch's training accuracy less the final test accuracy of a run, in pp."""
    return 100 * (result["history"][-1]["accuracy"] - result["final_accuracy"])


def _underfit(core):
    """A note on the regime the short schedule trains in: train vs test accuracy at the end."""
    gaps = [(_train_minus_test(r), r) for e in core for r in e["results"]]
    if not gaps:
        return []
    low, high = min(g for g, _ in gaps), max(g for g, _ in gaps)
    dense = [g for g, r in gaps if r["method"] == "baseline"]
    return [
        f"**Regime.** In the {len(gaps)} finished runs of figures 2-3, the last epoch's training "
        f"accuracy (running mean over the epoch, on augmented images) is {low:+.2f} to {high:+.2f} pp "
        "from the final test accuracy"
        + (f" ({', '.join(f'{g:+.2f}' for g in dense)} pp for the dense baseline)" if dense else "")
        + f": at {gaps[0][1]['epochs']} epochs every model underfits, so these comparisons measure how "
        "much each model learns in a short schedule, not the generalization at convergence that the "
        "paper's 160-epoch numbers measure. Claims that do not reproduce here may still hold there."
    ]


def _long(entries, core, thm):
    """The core claims (and figure 4's, where the grid ``long`` trains it) again on the longer
    schedule of a lent GPU, and how PreCrop's differences from SynFlow and figure 4's spread
    move from the CPU grids ``core`` and ``thm_comp``'s schedule to it."""
    results = [r for e in entries for r in e["results"]]
    if not results:
        return []
    lines = [
        f"**Longer schedule** ({results[0]['epochs']} epochs, {results[0]['backend']} backend on "
        f"{results[0]['device']}; section \"Longer schedule\" below):",
        "",
        *_precrop_claims(entries),
        *_granularity_claim(entries),
    ]
    gaps = [_train_minus_test(r) for r in results]
    return lines + [
        "",
        f"There the last epoch's training accuracy is {min(gaps):+.2f} to {max(gaps):+.2f} pp from the "
        "final test accuracy.",
        *_across_schedules(core, entries),
        *_granularity_across(thm, entries),
        "",
    ]
