"""The one table of channel rankings: each importance criterion by name, with what it needs.

Every place that ranks channels reads this table and takes a name of it or
a ranking object: ``weights="keep"`` (``kp.apply_plan``, ``kp.precrop``,
``kp.reconfigure``), ``kp.GradualPruning(importance=...)``, ``kp.hub`` and
the command line's ``--importance`` choices (and so its help and the docs,
built from it). :func:`register_importance` adds a ranking of the user's,
which every one of them takes from then on.

A ranking scores the channels of one weight at a time (a conv's filters, a
normalization's scale, the next conv's input slices, ...);
``transfer/importance.py`` sums each channel's scores over every layer of
its coupled group, each layer's share divided by its mean. What a ranking
``needs`` decides where it can rank:

* ``"weights"``: the weights alone (``"l1"``, ``"l2"``, ``"bn_scale"``);
  everywhere;
* ``"data"``: a few ``(x, y)`` batches given as ``data=``, from which
  ``transfer/taylor.py`` takes the loss gradients (``"taylor"``, on every
  backend) or ``transfer/activation.py`` the activations' magnitudes
  (``"activation"``, what a ranking's ``reads`` says): not in ``kp.hub``
  per block, whose backbones output features, not logits (a homogeneous
  plan ranks the whole task, as ``kp.precrop`` does), nor in
  ``keras-precrop precrop``, which loads no data;
* ``"seed"``: chance (``"random"``, seeded by ``seed=``): not during fit,
  which ranks anew at every update.

This module imports nothing heavy (the command line reads it for ``--help``):
the errors module, which loads NumPy, is imported where an error is raised.
"""

from __future__ import annotations

import re

from keras_precrop._views import NameView
from keras_precrop.errors import ArgumentError

NEEDS = ("weights", "data", "seed")
# Where rankings are taken, and the kinds of ranking (``kind_of``) each place can serve.
PLACES = {
    "kp.precrop/reconfigure/apply_plan": ("weights", "data", "activations", "seed"),
    "kp.GradualPruning": ("weights", "data", "activations"),
    "kp.hub": ("weights", "activations", "seed"),
    "keras-precrop precrop/reconfigure": ("weights", "seed"),
    "keras-precrop prune-trained": ("weights", "data", "activations"),
}
# Why a Python entry point cannot serve a kind (the command line offers only what it can).
_WHY_NOT = {
    ("kp.GradualPruning", "seed"): "draws channels at random, but GradualPruning ranks them anew "
                                   "at every update, so each update would mask other channels",
    ("kp.hub", "data"): "ranks channels by the loss gradients of the model's outputs on data= "
                        "labels, but kp.hub prunes per block the backbone, whose outputs are "
                        "features, not logits (a homogeneous plan of a task takes it)",
}
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")


class Importance:
    """A ranking of channels, called on one weight's channels at a time.

    Its call depends on what it ``needs``: ``"weights"``: ``ranking(rows)``,
    where ``rows`` is a float64 array with one row per channel index along
    one of the weight's channel axes (that channel's slice of the weight,
    flattened), returns one score per row; ``"data"``: ``ranking(rows,
    grads)``, ``grads`` the loss gradient in the same layout, one per batch
    of ``data=``, returns one row of scores per batch (summed per channel,
    then taken in absolute value and summed over the batches), or, for one
    that ``reads`` activations, ``ranking(magnitudes)``, one row per batch
    of the mean ``|activation|`` at each index (``transfer/activation.py``
    says which activation scores which axis), returns such rows; ``"seed"``:
    ``ranking(rng, count)`` returns ``count`` scores, one per channel of the
    model, drawn from the NumPy generator ``rng``. Higher scores are kept.

    Attributes:
        name: its name in the table (``None`` for an object given directly).
        needs: ``"weights"``, ``"data"`` or ``"seed"`` (see the module docstring).
        reads: for a ranking that needs data, what it reads from the batches:
            ``"gradients"`` (the loss gradients) or ``"activations"``.
        summary: what it ranks by, in a few words (the command line's help).
        covers: for a ranking that scores only some weights (:meth:`weighs`),
            which ones, in words; a plan that cuts a channel none of them
            touches is refused (the channel would score 0 and go first).
    """

    needs = "weights"
    reads = "gradients"
    summary = ""
    covers = None

    def __init__(self, name=None):
        self.name = name

    @property
    def given(self):
        """What the user gave for it: its name, or the ranking itself (the fields of an error)."""
        return self.name

    @property
    def needs_labels(self):
        """Whether its ``data=`` batches must hold labels: loss gradients need them, activations
        do not (inputs alone serve, e.g. for a backbone without a head)."""
        return self.needs == "data" and self.reads == "gradients"

    def missing_data(self):
        """The error for this ranking given no ``data=`` (one wording for every place that checks)."""
        if self.needs_labels:
            what = "the loss gradients of a few (x, y) batches"
        else:
            what = "the activations of a few batches of inputs (x, or (x, y): labels are not read)"
        return ArgumentError("{importance} needs {data:=}: it ranks the channels by " + what + ".",
                             importance=self.given)

    def weighs(self, layer, weight):
        """Whether ``weight`` of ``layer`` is scored (default: every trainable weight with channels)."""
        return True

    def __repr__(self):
        return repr(self.given)

    def __str__(self):
        return str(self.given)


class _L1(Importance):
    summary = "the L1 norm of the weights that write and read each channel"

    def __call__(self, rows):
        return abs(rows).sum(1)


class _L2(Importance):
    summary = "the L2 norm of those weights"

    def __call__(self, rows):
        import numpy as np  # noqa: PLC0415  (the table loads for --help, without NumPy)

        return np.sqrt(np.square(rows).sum(1))


class _Taylor(Importance):
    needs = "data"
    summary = "first-order Taylor, |activation x gradient| on training batches"

    def __call__(self, rows, grads):
        # sum w * dL/dw over the weights that write (read) a channel is the written (read)
        # activation times its gradient: a layer is linear in those weights.
        return [(rows * g).sum(1) for g in grads]


class _Activation(Importance):
    needs = "data"
    reads = "activations"
    summary = ("Minitron's activation magnitude, the mean |activation| of each channel, head and "
               "neuron on the data batches")

    def __call__(self, magnitudes):
        # The mean |activation| per index is the score itself: the batches' rows are summed.
        return magnitudes


class _BNScale(_L1):
    summary = "the scales (gamma) of the BatchNormalization layers that write each channel"
    covers = "the scale (gamma) of the normalization layer that writes them"

    def weighs(self, layer, weight):
        return weight is getattr(layer, "gamma", None)


class _Random(Importance):
    needs = "seed"
    summary = "random channels, the control of an experiment"

    def __call__(self, rng, count):
        return rng.random(count)


class _Given(Importance):
    """A user's function or object, with its need and, where it has one, its ``weighs``."""

    def __init__(self, name, ranking, needs):
        super().__init__(name)
        self.ranking, self.needs = ranking, needs
        self.summary = ((getattr(ranking, "__doc__", None) or "").strip().splitlines() or [""])[0]
        weighs = getattr(type(ranking), "weighs", None)
        if callable(weighs) and weighs is not Importance.weighs:  # it scores only some weights
            self.covers = getattr(ranking, "covers", None) or f"the weights {name or ranking!r} weighs"

    def __call__(self, *args):
        return self.ranking(*args)

    def weighs(self, layer, weight):
        method = getattr(self.ranking, "weighs", None)
        return True if not callable(method) else bool(method(layer, weight))

    @property
    def given(self):
        return self.ranking if self.name is None else self.name


_BUILT_IN = {"l1": _L1, "l2": _L2, "taylor": _Taylor, "activation": _Activation,
             "bn_scale": _BNScale, "random": _Random}
_TABLE = {name: cls(name) for name, cls in _BUILT_IN.items()}


def kind_of(ranking):
    """What a place must give ``ranking`` (the values of :data:`PLACES`): its ``needs``, or
    ``"activations"`` for one that needs data but reads no loss (no labels, no logits)."""
    return "data" if ranking.needs_labels else "activations" if ranking.needs == "data" else (
        ranking.needs)


class Names(NameView):
    """The names of the table, read anew at every use, so that a ranking registered later is
    offered too (an ``argparse`` ``choices=``).

    Args:
        place: only those that rank at this key of :data:`PLACES`.
        needs: only those of these needs.
    """

    def __init__(self, place=None, needs=None):
        self.place, self.needs = place, needs

    def _names(self):
        return tuple(name for name, ranking in _TABLE.items()
                     if (self.place is None or kind_of(ranking) in PLACES[self.place])
                     and (self.needs is None or ranking.needs in self.needs))


IMPORTANCE = Names()  # every name of the table


def register_importance(name, importance, *, needs=None):
    """Add a channel ranking to the table: every entry point takes ``name`` from then on.

    ``kp.precrop(..., weights="keep", importance=name)``, ``kp.apply_plan``,
    ``kp.reconfigure``, ``kp.GradualPruning(importance=name)``, ``kp.hub``
    and the command line run in the same process (``keras_precrop.cli.main``)
    all read the table, each where the ranking's need can be met (the
    table's ``PLACES``). Instead of a name, each of them also takes the
    ranking itself, unregistered.

    Example::

        kp.register_importance("max", lambda rows: np.abs(rows).max(axis=1))
        small = kp.precrop(trained, params=0.5, weights="keep", importance="max")

    Args:
        name: letters, digits, ``_`` and ``-``, starting with a letter; not
            a built-in ranking's name (``"l1"``, ``"l2"``, ``"taylor"``,
            ``"activation"``, ``"bn_scale"``, ``"random"``). Registering a name again replaces
            the ranking registered under it before.
        importance: a function or callable object, called as its need says:
            ``"weights"``: ``importance(rows)``, ``rows`` a float64 array with
            one row per channel (the channel's slice of one weight,
            flattened), returning one score per row; ``"data"``:
            ``importance(rows, grads)`` with ``grads`` the loss gradients on
            the batches of ``data=`` in the same layout, returning one row of
            scores per batch; ``"seed"``: ``importance(rng, count)``, one
            score per channel of the model from the NumPy generator ``rng``.
            Each channel's scores are summed over every layer that writes or
            reads it (each layer's share divided by its mean); higher is kept.
            An object may also have ``weighs(layer, weight)``, to score only
            the weights for which it returns True (as ``"bn_scale"`` scores
            the normalization scales), and ``needs``.
        needs: ``"weights"``, ``"data"`` or ``"seed"``; default:
            ``importance.needs`` where it has one, else ``"weights"``.

    Raises:
        ArgumentError: a name that is not one, or a built-in's; an
            ``importance`` that cannot be called; an unknown need.
    """
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise _error("{name} must be a name of letters, digits, '_' and '-' that starts with a "
                            "letter (the command line's --importance takes it).", name=name)
    if name in _BUILT_IN:
        raise _error(f"{{name}} is a built-in ranking; register yours under another name "
                            f"than {list(_BUILT_IN)}.", name=name)
    _TABLE[name] = _ranking(importance, needs, name)


def _ranking(importance, needs, name=None):
    """``importance`` (a function or object) as an :class:`Importance` of the table's kind."""
    if isinstance(importance, Importance) and needs is None and name is None:
        return importance
    if not callable(importance):
        raise _error("{importance} must be a name of the table, one of "
                            f"{list(IMPORTANCE)}, or a callable ranking (see "
                            "kp.register_importance).", importance=importance)
    needs = getattr(importance, "needs", "weights") if needs is None else needs
    if needs not in NEEDS:
        raise _error(f"{{needs}} must be one of {list(NEEDS)}: what the ranking is called with.",
                            needs=needs)
    return _Given(name, importance, needs)


def criterion(importance, place=None):
    """The :class:`Importance` that ``importance`` (a name of the table, or a ranking) stands for.

    Args:
        importance: a name of the table, or a callable ranking (see
            :func:`register_importance`); ``None`` is ``"l1"``.
        place: a key of :data:`PLACES`, where it is to rank; ``None``:
            anywhere (the need is not checked).

    Raises:
        ArgumentError: a name the table does not hold (listing the table), or
            a ranking whose need ``place`` cannot meet (saying why, and which
            rankings can).
    """
    if importance is None:
        importance = "l1"
    if isinstance(importance, str):
        if importance not in _TABLE:
            raise _error(f"{{importance}} is unknown; use one of {list(IMPORTANCE)}, or "
                                "register yours with kp.register_importance.", importance=importance)
        ranking = _TABLE[importance]
    else:
        ranking = _ranking(importance, None)
    kind = kind_of(ranking)
    if place is not None and kind not in PLACES[place]:
        why = _WHY_NOT.get((place, kind), f"needs {ranking.needs}, which {place} cannot give")
        raise _error(f"{{importance}} {why}; use one of {list(Names(place))}.",
                            importance=importance)
    return ranking


def _error(template, **arguments):
    """An :class:`~keras_precrop.errors.ArgumentError` (its module loads NumPy: only on an error)."""
    from keras_precrop.errors import ArgumentError  # noqa: PLC0415  (NumPy: not for --help)

    return ArgumentError(template, **arguments)
