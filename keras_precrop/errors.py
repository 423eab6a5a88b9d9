"""The package's exceptions, with the user's arguments as structured fields.

Every error a user can cause by an argument is an :class:`ArgumentError`: it
keeps the arguments it is about (``{"flops": 0}``), their order and the
sentence around them, so each front end names them as the user typed them.
Python shows ``flops=0 must be a positive ratio ...``; the command line shows
``--flops 0 must be a positive ratio ...`` (``keras_precrop/cli.py``) without
parsing message text.
"""

from __future__ import annotations

import numbers
import string


class _NameOnly:
    """The value of an argument a message names without a value (``params=``, ``--params``)."""

    def __repr__(self):
        return ""

    __str__ = __repr__


NAME_ONLY = _NameOnly()


def is_number(value):
    """Whether ``value`` is a real number as Keras takes one: a Python ``int`` or ``float`` or a
    NumPy scalar (``np.float32(0.1)``, ``np.int64(3)``, which are no ``float`` or ``int``).

    A bool is not one, though Python and NumPy count ``True`` as 1: no caller
    means ``learning_rate=True``. Finiteness and range are the caller's to check.
    """
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def is_integer(value):
    """Whether ``value`` is a whole number as Keras takes one (``3``, ``np.int64(3)``); not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def spelled(name, value):
    """``name=value`` as a Python caller wrote the argument (numpy scalars as numbers)."""
    if type(value).__module__ == "numpy" and not getattr(value, "shape", None):  # a scalar
        value = value.item()  # (numpy is not imported here: the command line's errors load none)
    return f"{name}={value!r}"


class _Field:
    """A placeholder's argument, formatted by its spec (see :class:`ArgumentError`)."""

    def __init__(self, name, value, spell, front):
        self.name, self.value, self.spell, self.front = name, value, spell, front

    def __format__(self, spec):
        if spec == "=":
            return self.spell(self.name, NAME_ONLY)
        if spec == "subject":  # Python: the bare name (its value follows in {got})
            return self.name if self.front == "python" else self.spell(self.name, self.value)
        value = _CONSTANTS.get(spec, spec) if spec else self.value  # {homogeneous:False}: a bool
        return self.spell(self.name, value)


# Values a placeholder's spec writes as Python's constants ({homogeneous:False}), not strings.
_CONSTANTS = {"True": True, "False": False, "None": None}


class ArgumentError(ValueError):
    """A bad argument: the message names it, and the fields keep it.

    The message is a template whose placeholders name arguments: ``{flops}``
    shows the argument with the user's value (``flops=0``, ``--flops 0``),
    ``{mode:exact}`` the argument with another value (``mode='exact'``,
    ``--mode exact``), ``{latency:=}`` its name alone (``latency=``,
    ``--latency``), and ``{remedy}`` the front end's own advice. A message
    whose subject is the argument writes ``{variants:subject} must be an
    integer >= 6{got}``: ``variants must be an integer >= 6, got 3`` in
    Python, ``--variants 3 must be an integer >= 6`` on the command line.

    Attributes:
        template: the message, with its placeholders.
        arguments: ``{name: value}`` of the user's arguments the message is
            about, in order; the first is the one at fault.
        limit: the bound the value broke, where there is one (e.g. the
            smallest feasible budget), else ``None``.
        remedy: ``{"python": text, "cli": text}``: what to do, as each front
            end says it (the ``{remedy}`` placeholder), or ``None``.

    Args:
        template: as above; a plain sentence when it has no placeholder.
        limit: as above.
        remedy: as above.
        **arguments: the arguments, as ``name=value``.
    """

    def __init__(self, template, *, limit=None, remedy=None, **arguments):
        self.template = template
        self.arguments = arguments
        self.limit = limit
        self.remedy = remedy
        super().__init__(self.format(spelled))

    @property
    def argument(self):
        """The name of the argument at fault (the first named), or ``None``."""
        return next(iter(self.arguments), None)

    @property
    def value(self):
        """The value of :attr:`argument`, or ``None``."""
        return self.arguments.get(self.argument)

    def format(self, spell, front="python"):
        """The message with each argument written by ``spell(name, value)``.

        Args:
            spell: writes one argument, e.g. as ``name=value`` or ``--name value``;
                it gets :data:`NAME_ONLY` for an argument named without a value.
            front: whose ``remedy`` fills ``{remedy}`` (``"python"`` or ``"cli"``).
        """
        names = {field.partition(":")[0] for _, field, _, _ in string.Formatter().parse(
            self.template) if field}
        if not names:
            return self.template
        values = {n: _Field(n, self.arguments.get(n, NAME_ONLY), spell, front) for n in names}
        if "remedy" in names:
            values["remedy"] = (self.remedy or {}).get(front, "")
        if "got" in names:
            values["got"] = f", got {self.value!r}" if front == "python" else ""
        return self.template.format(**values)

    def __reduce__(self):
        return _rebuild_error, (type(self), self.template, self.limit, self.remedy,
                                self.arguments)


def _rebuild_error(cls, template, limit, remedy, arguments):
    """Unpickles an :class:`ArgumentError` subclass (keyword-only fields)."""
    return cls(template, limit=limit, remedy=remedy, **arguments)


class ArgumentTypeError(ArgumentError, TypeError):
    """An argument of the wrong type (a string where a ratio belongs, ...)."""


class InfeasibleBudgetError(ArgumentError):
    """No widths meet the budgets within the bounds (min widths, caps).

    ``arguments`` names the budget (and the option that makes it infeasible,
    e.g. ``min_channels``) where the caller knows it; ``limit`` is the smallest
    feasible value where it is known.
    """


class DataError(ArgumentError):
    """User data (``data=`` of Taylor importance, ``fine_tune``'s ``train_data=``) that does not
    fit the model: shape, dtype, labels, finiteness, emptiness; the message names the argument."""


class UnsupportedModelError(ValueError):
    """The model cannot be analysed (subclassed, undefined shapes, ...)."""


class UnsupportedLayerError(ArgumentError):
    """A layer's channel semantics are unknown to the walker.

    Where the remedy is to keep the layer fixed, ``arguments`` holds
    ``ignore=[layer name]``, which the message offers.
    """

    @classmethod
    def together(cls, errors, model_name):
        """One error for every layer a trace or walk refused, with the complete ``ignore=``.

        A model with several unsupported layers or operations is then fixed in
        one round, not one round per layer: each is named with what is wrong,
        and ``ignore=`` lists them all, ready to paste.

        Args:
            errors: the refusals, each with ``ignore=[names]`` among its arguments.
            model_name: the user's model's name.
        """
        if len(errors) == 1:
            return errors[0]
        names = list(dict.fromkeys(name for err in errors for name in err.arguments["ignore"]))
        lines = "\n".join(f"  - {_before_remedy(err)}" for err in errors)
        return cls(f"{len(errors)} layers or operations of model {model_name!r} are not "
                   f"supported:\n{lines}\nKeep the channels of all of them fixed with {{ignore}}, "
                   "or describe a layer's class with keras_precrop.register_handler(...).",
                   ignore=names)


def _before_remedy(error):
    """What an :class:`UnsupportedLayerError` says is wrong: its sentences before the remedy."""
    kept = []
    for sentence in error.template.split(". "):
        if "{" in sentence:
            break
        kept.append(sentence)
    return ". ".join(kept).rstrip(".") + "." if kept else f"{error.arguments['ignore']}."


class PlanMismatchError(ArgumentError):
    """A plan does not fit the model it is applied to."""


class RebuildMismatchError(PlanMismatchError):
    """The rebuilt model disagrees with its plan's per-layer prediction."""


class LatencyModelMismatchError(ArgumentError):
    """A latency model was fitted on another model (or other variables) than it is used for."""


class LossNotFiniteError(DataError):
    """Training whose loss became NaN or infinite (``fine_tune``): the message names the training
    data, the epoch and the batch, rather than a fit that returns weights that are no numbers.

    A subclass of :class:`DataError`: NaN or infinite values in the data past
    what was checked before training (the first batch of a dataset) are the
    usual cause; too high a learning rate is the other.
    """
