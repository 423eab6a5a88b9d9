"""The kinds of budget: what each bounds, and how the library and the command line name it.

One table, :data:`KINDS`, declares every kind of budget the package takes:
the cost row it bounds (the key of ``Plan.budgets`` and of the solver's
budgets), the keyword of its ratio of the original and of its absolute form,
what those count in words, the profile total a ratio is of, and the command
line's help. :func:`keras_precrop.plan` resolves its budget arguments by it,
:func:`keras_precrop.compare` records them by it, and the command line makes
its budget flags from it; a new kind is a row here, a cost row that counts
it, and its keywords in ``plan``'s signature (which a test checks against
this table).

The module imports nothing heavy: the command line reads it to build its
parser before NumPy or Keras load. Checking a budget's value is
:func:`keras_precrop.budget.costs.resolve_budget`'s.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class BudgetKind:
    """One kind of budget.

    Attributes:
        row: the cost row it bounds (``"params"``, ``"macs"``, ``"latency"``).
        ratio: the keyword (and command-line flag) of its ratio of the original
            (``"flops"``).
        ratio_of: what that ratio is of, in words (``"FLOPs"``).
        absolute: the keyword (and flag) of its absolute form (``"max_macs"``),
            or ``None`` where it has none.
        unit: what the absolute form counts, in words (``"MACs"``).
        total: the :class:`~keras_precrop.budget.costs.ModelProfile` attribute
            that holds the original model's total (``"total_macs"``); ``None``
            for a time, which a latency model predicts.
        help: the command line's help of the ratio flag.
        absolute_help: the command line's help of the absolute flag.
    """

    row: str
    ratio: str
    ratio_of: str
    absolute: str | None = None
    unit: str | None = None
    total: str | None = None
    help: str = ""
    absolute_help: str = ""

    @property
    def timed(self):
        """Whether the budget is of time, as a latency model predicts it (not a count)."""
        return self.total is None

    @property
    def counts_macs(self):
        """Whether the budget depends on MACs (so on the input's spatial size): all but parameters."""
        return self.total != "total_params"


KINDS = (
    BudgetKind("params", "params", "parameters", "max_params", "parameters", "total_params",
               help="parameter budget, ratio of the original",
               absolute_help="absolute parameter budget"),
    BudgetKind("macs", "flops", "FLOPs", "max_macs", "MACs", "total_macs",
               help="FLOP budget, ratio of the original", absolute_help="absolute MAC budget"),
    BudgetKind("latency", "latency", "predicted time",
               help="time budget, ratio of the original's predicted time"),
)


def of_row(row):
    """The kind that bounds cost row ``row``, or ``None`` for a row no budget argument names."""
    return next((kind for kind in KINDS if kind.row == row), None)


def arguments():
    """Every budget keyword: the ratios, then the absolute forms (``params``, ``flops``,
    ``latency``, ``max_params``, ``max_macs``)."""
    return [kind.ratio for kind in KINDS] + [kind.absolute for kind in KINDS if kind.absolute]


def given(values):
    """``{keyword: value}`` of every budget argument, read from ``values`` (a call's ``locals()``)."""
    return {name: values[name] for name in arguments()}


def counting_macs(values):
    """``{keyword: value}`` of the budget arguments in ``values`` that count MACs or time."""
    names = [n for kind in KINDS if kind.counts_macs for n in (kind.ratio, kind.absolute) if n]
    return {name: values.get(name) for name in names}


def either(words):
    """``"a, b or c"``: ``words`` as one of them is asked for."""
    words = list(words)
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"
