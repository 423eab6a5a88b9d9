"""Sections "Translation mode: which widths train best at equal cost" and "Against PreCrop's widths"
of ``experiments/report.py``'s page: the same PreCrop budget trained in several translation modes,
and uniform width scaling against PreCrop's modes, each pair judged by the claims' rule.
"""

from _report_common import _acc, _budget, _compare, _fmt_row, _summary

_MODE_COLUMNS = ("exact", "balance 2", "layerwise", "uniform")
# Flags that do not make another model to compare modes of (the modes themselves, the bookkeeping).
_NOT_THE_MODELS_FLAGS = ("mode", "balance", "seed", "grid", "entry", "code", "save_model")
# (challenger, incumbent): a difference is the first's mean less the second's.
_MODE_PAIRS = (("balance 2", "exact"), ("layerwise", "exact"), ("balance 2", "layerwise"),
               ("uniform", "exact"), ("uniform", "layerwise"), ("uniform", "balance 2"))


def _outcome(row, name, other):
    """The claims' rule on one pair: ``row`` is ``_compare`` of ``name``'s and ``other``'s summaries.

    Returns:
        The name of the one that leads by more than the tolerance, ``"tie"``
        within it, or None while either side has fewer than 2 seeds.
    """
    if row is None or min(row[2], row[3]) < 2:
        return None
    if abs(row[0]) <= row[1]:
        return "tie"
    return name if row[0] > 0 else other


def _mode_points(entries):
    """The PreCrop models that ``entries`` train in two or more translation modes.

    Entries are the same model in another mode when every flag but the mode
    and the bookkeeping agrees (model, budgets, epochs, round_to, ...).

    Returns:
        ``[(epochs, budget), {mode: summary, or None while unfinished}]``
        pairs in the order of ``entries``; a mode is ``exact``,
        ``layerwise``, ``uniform`` or ``balance 2`` (exact mode with
        ``plan(balance=2)``).
    """
    points = {}
    for e in entries:
        flags = e["flags"]
        if not flags["method"].startswith("precrop_") or flags.get("mode") not in _MODE_COLUMNS:
            continue
        mode = flags["mode"]
        if flags.get("balance") is not None:
            if (mode, flags["balance"]) != ("exact", 2):  # no column for it
                continue
            mode = "balance 2"
        same = tuple(sorted((k, str(v)) for k, v in flags.items() if k not in _NOT_THE_MODELS_FLAGS))
        points.setdefault(same, ((flags["epochs"], _budget(flags)), {}))[1][mode] = _summary(e)
    return [point for point in points.values() if len(point[1]) > 1]


def _mode_cell(modes, mode):
    if mode not in modes:
        return "-"
    s = modes[mode]
    return "pending" if s is None else f"{_acc(s)} (n {s['n']})"


# What plan(mode="auto") picks for PreCrop under each kind of budget: a point with a FLOPs budget
# is of the second kind (tests check both picks against the library's, and that every FLOPs budget
# of the grids binds, which is what auto asks).
_AUTO_PICKS = (("a parameter budget", "exact"), ("a FLOPs budget", "layerwise"))


def _modes(entries):
    """Which translation mode trains best at equal cost: exact, balanced exact or layerwise.

    Every PreCrop budget of ``entries`` (any grid, any schedule) trained in
    two or more modes is a point; each pair of modes there is compared by the
    claims' rule. Points with a FLOPs budget and points without one are
    judged apart, each against the mode ``plan(mode="auto")`` picks there.
    """
    lines = [
        "## Translation mode: which widths train best at equal cost",
        "",
        "The SynExp objective cannot see bottlenecks; exact mode's optimum has some (e.g. "
        "`stage3_block2_conv1` 64 -> 3 -> 50 at params 0.11). Layerwise mode is the paper's sqrt(p) rule; "
        "`balance 2` is exact mode with adjacent width ratios at most 2x apart (`plan(balance=2)`); "
        "`uniform` scales every width by one factor (`plan(mode=\"uniform\")`, the width-multiplier "
        "baseline: a candidate, never `auto`'s pick; section \"Against uniform width scaling\"). "
        "Every PreCrop budget trained in two or more modes, on either schedule; each pair of modes is "
        "compared with the rule above (2+ seeds each, a difference beyond the sum of the stds).",
        "",
        "| epochs | budget | exact | exact, balance 2 | layerwise | uniform |",
        "|---:|---|---|---|---|---|",
    ]
    pairs = []  # (kind, the two modes, the winner or None for a tie, what the verdict says)
    for (epochs, budget), modes in _mode_points(entries):
        lines.append(
            f"| {epochs} | {budget} | " + " | ".join(_mode_cell(modes, m) for m in _MODE_COLUMNS) + " |"
        )
        kind = _AUTO_PICKS[1 if "flops" in budget else 0][0]
        for name, other in _MODE_PAIRS:
            row = _compare(modes.get(name), modes.get(other))
            winner = _outcome(row, name, other)
            if winner is None:
                continue
            if winner == "tie":
                pairs.append((kind, (name, other), None, ""))
                continue
            loser = other if winner == name else name
            pairs.append((kind, (name, other), winner,
                          f"at {epochs} epochs, {budget}: {winner} beats {loser} by {abs(row[0]):.2f} pp "
                          f"(tol {row[1]:.2f})"))
    if not pairs:
        return lines + ["", "Verdict: pending (fewer than 2 seeds).", ""]
    ties = sum(winner is None for _, _, winner, _ in pairs)
    said = [text for *_, text in pairs if text] + [f"{ties} of {len(pairs)} compared pairs tie"]
    lines += ["", f"Verdict: {'; '.join(said)}.", ""]
    for kind, pick in _AUTO_PICKS:
        outcomes = [winner for k, modes, winner, _ in pairs if k == kind and pick in modes]
        lines += [_auto_verdict(kind, pick, outcomes), ""]
    return lines


def _auto_verdict(kind, pick, outcomes):
    """One sentence: does ``pick`` (``mode="auto"``'s mode under ``kind``) win or lose compared pairs?

    ``outcomes`` has the winner (None for a tie) of every compared pair that ``pick`` is in. A pick
    that loses a pair is supported no longer; one that wins more pairs than it loses is still the
    better of the modes compared, which the sentence says, so a single loss is not read as a rout.
    """
    beaten_by = sorted({w for w in outcomes if w not in (None, pick)})
    lost = sum(w not in (None, pick) for w in outcomes)
    won = outcomes.count(pick)
    head = f"Under {kind}, `mode=\"auto\"` picks `{pick}`"
    if not outcomes:
        return f"{head}; no pair with it is compared yet."
    pairs = f"{len(outcomes)} compared pair{'s' * (len(outcomes) != 1)} with it"
    if lost:
        judged = ("mixed evidence, more wins than losses" if won > lost
                  else "the evidence is against that pick")
        return (f"{head}, which wins {won} and loses {lost} of the {pairs} (to {', '.join(beaten_by)}): "
                f"{judged}.")
    return (f"{head}, which loses none of the {pairs} and wins {won}"
            + (": the evidence supports that pick." if won else ": so far ties only."))


_AGAINST_UNIFORM = ("exact", "layerwise")  # core's modes that grid uniform's budgets are judged against


def _cost_cell(modes, mode):
    """A mode's accuracy cell (``_mode_cell``) with the trained model's MACs ratio."""
    s = modes.get(mode)
    return _mode_cell(modes, mode) + ("" if s is None else f", MACs {s['macs_ratio']:.3f}")


def _against_cell(modes, name):
    """``(cell, outcome)`` of ``name`` against uniform at one budget: ``_outcome``'s word, the numbers."""
    row = _compare(modes.get(name), modes.get("uniform"))
    if row is None:
        return "pending", None
    winner = _outcome(row, name, "uniform")
    said = "pending" if winner is None else "tie" if winner == "tie" else f"{winner} leads"
    return f"{said}: {_fmt_row(row)}", winner


def _against_tally(name, outcomes):
    """One mode's line of the verdict: leads, losses and ties against uniform over the budgets."""
    compared = [w for w in outcomes if w is not None]
    pending = len(outcomes) - len(compared)
    if not compared:
        return f"{name} vs uniform: pending at every budget (fewer than 2 seeds on a side)"
    return (f"{name} vs uniform: {name} leads at {compared.count(name)}, uniform at "
            f"{compared.count('uniform')}, {compared.count('tie')} tie of {len(compared)} compared "
            f"budget{'s' * (len(compared) != 1)}" + (f" ({pending} pending)" if pending else ""))


def _against_uniform(uniform, core, names=_AGAINST_UNIFORM, where="grid core"):
    """Each budget of grid ``uniform`` against the PreCrop modes ``names`` that ``core`` (``where``
    says whose entries they are) trains there.

    The same model but for the mode (``_mode_points``) is the same budget;
    each pair is judged by the claims' rule (``_outcome``). A side with
    fewer than 2 seeds is shown with its numbers and judged pending.
    """
    lines = [
        f"**Against PreCrop's widths.** Each budget above against {where}'s {' and '.join(names)} PreCrop "
        "at the same budget: test accuracy mean ± std (n seeds) and the trained model's MACs ratio; "
        f"*d* is {' or '.join(name + chr(39) + 's' for name in names)} mean less uniform's, judged with "
        "the claims' rule (a lead beyond "
        "tol, the sum of the two stds, with 2+ seeds a side; fewer: pending). Under a parameter budget a "
        "width factor shrinks every layer alike, so its MACs ratio stays near its params ratio, while "
        "PreCrop keeps the early layers wider (few parameters, many MACs at full resolution): uniform "
        "keeps far fewer MACs at equal parameters, and about as many parameters at equal MACs.",
        "",
        "| budget | uniform | " + " | ".join(names) + " | "
        + " | ".join(f"{name} vs uniform: d" for name in names) + " |",
        "|---|---|" + "---|" * 2 * len(names),
    ]
    points = [(label, modes) for label, modes in _mode_points(uniform + core) if "uniform" in modes]
    outcomes = {name: [] for name in names}
    for (_, budget), modes in points:
        cells = [_cost_cell(modes, mode) for mode in ("uniform", *names)]
        for name in names:
            cell, winner = _against_cell(modes, name)
            cells.append(cell)
            outcomes[name].append(winner)
        lines.append(f"| {budget} | " + " | ".join(cells) + " |")
    if not points:
        return lines + ["", f"Verdict: pending ({where} trains none of these budgets yet).", ""]
    tallies = [_against_tally(name, found) for name, found in outcomes.items()]
    return lines + ["", f"Verdict: {'; '.join(tallies)}.", ""]
