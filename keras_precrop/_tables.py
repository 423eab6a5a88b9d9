"""Text tables in the style of ``model.summary()``, for profiles and plans."""


def table(rows):
    """Format rows as a box-drawing table like ``model.summary()``."""
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"

    def fmt(r):
        cells = [str(c).ljust(w) if i == 0 else str(c).rjust(w)
                 for i, (c, w) in enumerate(zip(r, widths))]
        return "| " + " | ".join(cells) + " |"

    return [rule, fmt(rows[0]), rule.replace("-", "="), *map(fmt, rows[1:]), rule]


def not_shown(count, what, show_all_hint):
    """The note under a table that leaves ``count`` layers out; no line if none.

    Args:
        count: how many layers the table leaves out.
        what: which they are, ``{s}`` where the plural's s goes
            (``"unchanged layer{s}"``).
        show_all_hint: how the caller shows the layers left out (``--all``).
    """
    if not count:
        return []
    return [f"{count} {what.format(s='s' * (count > 1))} not shown "
            f"({show_all_hint} shows {'them' if count > 1 else 'it'})."]


def kept_whole_lines(kept_whole):
    """The lines under a profile's or a plan's table that name each layer ``ignore="auto"`` kept
    whole and why (``{name: why}``): the user sees which parts of the model were not pruned."""
    return [f"Kept whole (auto): {name} - {why}" for name, why in kept_whole.items()]
