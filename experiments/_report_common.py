"""What every section of ``experiments/report.py``'s page reads the grids with.

A grid's entries with their finished runs and pending seeds, an entry's
summary over seeds, the grid table, and the claims' rule that compares two
summaries (``_compare``, ``_verdict``); ``GRIDS`` is the folder of the grids.
"""

import json
import pathlib
import statistics

import run as _run  # experiments/run.py: grid loading and run ids

GRIDS = pathlib.Path(__file__).resolve().parent / "grids"


def _label(flags):
    """A short human label of a grid entry: ``precrop_params (exact)``, ``random weight synexp``."""
    parts = [flags["method"]]
    for key in ("mode", "granularity", "densities", "residual", "round_to"):
        if flags.get(key) is not None:
            parts.append(str(flags[key]))
    if flags.get("balance") is not None:
        parts.append(f"balance {flags['balance']}")
    if flags.get("plan_file") is not None:
        parts.append(pathlib.Path(flags["plan_file"]).stem)
    return " ".join(parts[:1]) + (f" ({', '.join(parts[1:])})" if parts[1:] else "")


def _entries(grid_name, runs):
    """Per grid entry: label, flags, finished results (one per seed) and the seeds pending."""
    path = GRIDS / f"{grid_name}.json"
    entries = {}
    for flags in _run.load_grid(path):  # an entry's seeds differ in the seed (and values made of it)
        entry = entries.setdefault(
            flags["entry"], {"flags": flags, "label": _label(flags), "results": [], "pending": []}
        )
        name = _run.run_id(flags)
        if name in runs:
            entry["results"].append(runs[name])
        else:
            entry["pending"].append(flags["seed"])
    return sorted(entries.values(), key=lambda entry: entry["flags"]["entry"])  # the grid's order


def _mean_std(values):
    if not values:
        return None, None
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def _summary(entry):
    """Mean accuracy etc. of one entry's finished runs (None when none finished)."""
    results = entry["results"]
    if not results:
        return None
    acc, std = _mean_std([100 * r["final_accuracy"] for r in results])
    return {
        "acc": acc,
        "std": std,
        "train": statistics.mean(100 * r["history"][-1]["accuracy"] for r in results),
        "n": len(results),
        "params": statistics.mean(r["params"] for r in results),
        "params_ratio": statistics.mean(r["params_ratio"] for r in results),
        "macs_ratio": statistics.mean(r["macs_ratio"] for r in results),
        "epochs": results[0]["epochs"],
        "minutes": statistics.mean(r["train_time_s"] for r in results) / 60,  # over restarts
    }


def _acc(summary):
    """``mean ± std`` of a summary's test accuracy, as every table and claim line prints it."""
    return f"{summary['acc']:.2f} ± {summary['std']:.2f}"


def _budget(flags):
    """``params 0.1, flops 0.2``: the budgets that a grid entry sets ("" for none)."""
    return ", ".join(f"{k} {flags[k]}" for k in ("params", "flops") if flags.get(k) is not None)


def _table(entries):
    lines = [
        "| method | budget | params | params ratio | MACs ratio | accuracy % | train % | n | epochs "
        "| train min |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for entry in entries:
        budget = _budget(entry["flags"])
        s = _summary(entry)
        pending = f" (pending seeds {entry['pending']})" if entry["pending"] else ""
        if s is None:
            lines.append(f"| {entry['label']} | {budget or '-'} | | | | pending{pending} | | 0 | | |")
            continue
        lines.append(
            f"| {entry['label']} | {budget or '-'} | {s['params']:,.0f} | {s['params_ratio']:.4f} | "
            f"{s['macs_ratio']:.4f} | {_acc(s)}{pending} | {s['train']:.2f} | "
            f"{s['n']} | {s['epochs']} | "
            f"{s['minutes']:.1f} |"
        )
    return lines


def _descriptions(*grids):
    """The grids' descriptions (``experiments/grids/<name>.json``), each a paragraph of the page."""
    return [line for grid in grids
            for line in (json.loads((GRIDS / f"{grid}.json").read_text())["description"], "")]


def _find(entries, **flags):
    """The summaries of the entries whose flags include ``flags``."""
    return [(e, _summary(e)) for e in entries if all(e["flags"].get(k) == v for k, v in flags.items())]


def _one(entries, **flags):
    """The summary of the one entry whose flags include ``flags`` (None if absent or unfinished)."""
    found = _find(entries, **flags)
    return found[0][1] if found else None


def _compare(a, b):
    """``(difference of means, tolerance, n_a, n_b)`` of two summaries (None if either is missing).

    The tolerance is the sum of the two standard deviations: a difference within
    it is "no difference" at this number of seeds.
    """
    if a is None or b is None:
        return None
    return a["acc"] - b["acc"], a["std"] + b["std"], a["n"], b["n"]


def _verdict(rows, want):
    """Joins per-point comparisons into one verdict.

    ``want`` is ``"match"`` (every difference >= -tolerance) or ``"beat"``
    (every difference > 0 and at least one > tolerance). A point counts once
    it has two seeds on both sides. One counted point that fails settles the
    claim ("not reproduced"); otherwise every point must count, else "pending".
    """
    counted = [r for r in rows if r is not None and min(r[2], r[3]) >= 2]
    fails = [r for r in counted if (r[0] < -r[1] if want == "match" else r[0] <= 0)]
    if fails:
        return f"not reproduced (fails at {len(fails)} of {len(rows)} points so far)"
    if not rows or len(counted) < len(rows):
        so_far = f"; {len(counted)} of {len(rows)} points counted, none fails" if counted else ""
        return f"pending (fewer than 2 seeds on some point{so_far})"
    ok = want == "match" or any(d > tol for d, tol, *_ in rows)
    return "reproduced" if ok else "not reproduced"


def _fmt_row(row):
    """``+d pp (tol t, n i/j)``, marked *close* where a third seed would tell most.

    A point is close when the side with fewer seeds has exactly two and the
    difference is within the tolerance: two seeds cannot tell the two apart.
    """
    if row is None:
        return "pending"
    d, tol, n_a, n_b = row
    close = min(n_a, n_b) == 2 and abs(d) <= tol
    return f"{d:+.2f} pp (tol {tol:.2f}, n {n_a}/{n_b}{', close' if close else ''})"


def _fmt_rows(rows, labels):
    return "; ".join(f"{label}: {_fmt_row(r)}" for label, r in zip(labels, rows))


def _mean_curve(entry):
    """Test accuracy (%) after each epoch, mean over an entry's finished seeds (as long as the shortest)."""
    curves = [[100 * row["val_accuracy"] for row in r["history"]] for r in entry["results"]]
    return [statistics.mean(curve[i] for curve in curves) for i in range(min(map(len, curves)))]


def _skipped(skipped):
    """The runs sanity.py skipped, by reason: ``why (n runs: a, b)``, most common reason first."""
    by_why = {}
    for row in skipped:
        by_why.setdefault(row["why"], []).append(row["run"])
    return "; ".join(
        f"{why} ({len(runs)} run{'s' * (len(runs) > 1)}: {', '.join(runs)})"
        for why, runs in sorted(by_why.items(), key=lambda item: -len(item[1]))
    )
