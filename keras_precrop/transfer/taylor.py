"""The batches of ``data=`` that rankings needing data score channels by, and their loss gradients.

A ranking of the table (``criteria.py``) whose ``needs`` is ``"data"`` is
called with the gradients of the cross-entropy of the model's outputs on
the batches of ``data=``, one set per batch (Taylor importance), or reads
the activations of the model on them (``"activation"``,
``activation.py``); every entry point (``apply_plan``, ``precrop``,
``GradualPruning``) takes the batches here, after checking ``data=``
against the model, and only what the ranking reads is computed. The
backends' gradient machinery is the training wing's
(``training/gradients.py``), shared with the pruning baselines of
``keras_precrop.pai``.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from keras_precrop.errors import NAME_ONLY, ArgumentError
from keras_precrop.training import gradients as _gradients
from keras_precrop.training._user_data import outputs_probabilities


def data_batches(model, data, defined=None):
    """The batches of ``data`` on ``model``, for a ranking that needs data: a :class:`DataBatches`.

    Iterated, it gives the loss gradients of ``defined``'s trainable weights,
    ``{id(weight): array}`` per batch (Taylor's, and those of the user's
    rankings that need data), computed on first use; a ranking that reads
    activations (``"activation"``) runs ``model`` on the batches instead.

    The gradients are computed on ``model``, whose input size is the
    data's; ``defined`` is ``model`` (the default) or its copy at a defined
    spatial size, with the same weights in the same order. ``model`` is not
    changed (its BatchNorm statistics neither). The outputs are taken as
    logits, or as probabilities for a model that ends in a softmax (taken as
    logits, they would rank channels by a wrong gradient).

    Args:
        model: the model to differentiate.
        data: an ``(x, y)`` batch or an iterable of them, checked against
            the model (``training._user_data.check_data``); inputs alone
            (``x``, or batches of it) where the ranking reads activations or
            only a refit reads them.
        defined: the model whose weights the keys are (default ``model``).
    """
    return DataBatches(model, list(_gradients.batches(data, labels=False)),
                       model if defined is None else defined)


class DataBatches(Sequence):
    """The ``(x, y)`` batches of ``data=`` on the model they fit; as a sequence, the loss gradients.

    Each ranking that needs data reads what it ranks by from here, and
    only that is computed: the loss gradients per batch (``"taylor"``,
    computed once, on first use) or the activations of a forward pass
    (``"activation"``: ``transfer/activation.py`` reads :attr:`model` and
    :attr:`batches`). It lives as long as the ranking of one call.

    Attributes:
        model: the model the batches fit.
        batches: the ``(x, y)`` batches, backend tensors (``y`` None for
            inputs alone).
        defined: the model whose weights the gradients' keys are.
    """

    def __init__(self, model, batches, defined):
        self.model, self.batches, self.defined = model, batches, defined
        self._gradients = None

    def __len__(self):
        return len(self.batches)

    def __getitem__(self, index):
        if self._gradients is None:
            self._gradients = self._computed()
        return self._gradients[index]

    def _computed(self):
        """``{id(weight of defined): gradient}`` of the loss on each batch."""
        outputs = getattr(self.model, "outputs", None) or ()
        if len(outputs) > 1:  # the loss is one cross-entropy of one output's logits
            raise ArgumentError(
                "{importance} ranks channels by the gradients of a cross-entropy on the model's "
                f"output, but model {self.model.name!r} has {len(outputs)} outputs "
                f"(of layers {', '.join(repr(t._keras_history[0].name) for t in outputs)}). Rank "
                "with importance='activation' (no loss) or 'l1', or prune a model of its "
                "classifier output alone.",
                importance="taylor")
        if any(y is None for _, y in self.batches):  # a later batch than the one checked
            raise ArgumentError("{data:=} must give (x, y) batches: {importance} differentiates a "
                                "loss of the labels, and a batch holds inputs alone.",
                                importance="taylor", data=NAME_ONLY)
        ids = [id(w) for w in self.defined.trainable_weights]
        loss = functools.partial(_gradients.cross_entropy, from_logits=not outputs_probabilities(
            self.model, self.batches[0][0]))
        return [dict(zip(ids, _gradients.weight_gradients(_loss(self.model, x, y, loss),
                                                          self.model.trainable_weights)))
                for x, y in self.batches]


def _loss(model, x, y, loss):
    """The loss of ``model``'s outputs on one batch, as a function of nothing (what is differentiated)."""
    return lambda: _gradients.loss_value(model, loss, x, y, training=False)
