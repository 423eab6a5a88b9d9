"""The loss gradients that rankings needing data (Taylor importance) score channels by.

A ranking of the table (``criteria.py``) whose ``needs`` is ``"data"`` is
called with the gradients of the cross-entropy of the model's outputs on
the batches of ``data=``, one set per batch; every entry point
(``apply_plan``, ``precrop``, ``GradualPruning``) takes them here, after
checking ``data=`` against the model. The backends' gradient machinery is
the training wing's (``training/gradients.py``), shared with the pruning
baselines of ``keras_precrop.pai``.
"""

from __future__ import annotations

import functools

from keras_precrop.training import gradients as _gradients
from keras_precrop.training._user_data import outputs_probabilities


def taylor_gradients(model, data, defined=None):
    """The loss gradients of ``defined``'s trainable weights: ``{id(weight): array}`` per batch.

    They are computed on ``model``, whose input size is the data's;
    ``defined`` is ``model`` (the default) or its copy at a defined spatial
    size, with the same weights in the same order. ``model`` is not changed
    (its BatchNorm statistics neither). The outputs are taken as logits, or
    as probabilities for a model that ends in a softmax (taken as logits,
    they would rank channels by a wrong gradient).

    Args:
        model: the model to differentiate.
        data: an ``(x, y)`` batch or an iterable of them, checked against
            the model (``training._user_data.check_data``).
        defined: the model whose weights the keys are (default ``model``).
    """
    defined = model if defined is None else defined
    ids = [id(w) for w in defined.trainable_weights]
    batches = list(_gradients.batches(data))
    loss = functools.partial(_gradients.cross_entropy,
                             from_logits=not outputs_probabilities(model, batches[0][0]))
    return [dict(zip(ids, _gradients.weight_gradients(_loss(model, x, y, loss), model.trainable_weights)))
            for x, y in batches]


def _loss(model, x, y, loss):
    """The loss of ``model``'s outputs on one batch, as a function of nothing (what is differentiated)."""
    return lambda: _gradients.loss_value(model, loss, x, y, training=False)
