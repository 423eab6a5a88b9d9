"""SNIP (Lee et al., 2019): connection sensitivity ``|w * dL/dw|`` on a data batch.

Follows the Synaptic-Flow reference (``SNIP.score``): the loss gradient is
summed over the given batches with the model in inference mode (the
reference calls ``model.eval()`` before every pruner), the score is the
absolute value of gradient times weight (the gradient with respect to a mask
of ones), normalized to sum to one, and the weights are pruned globally in a
single shot.
"""

import numpy as np

from keras_precrop.pai import common, gradients


def snip_scores(model, data, loss=None, include_bias=False, include_batchnorm=False, training=False,
                num_batches=None):
    """SNIP scores ``|w * sum_b dL_b/dw|`` normalized to sum to one.

    Args:
        model: a built Keras model returning logits.
        data: an ``(x, y)`` batch, a ``tf.data.Dataset`` or iterable of batches.
        loss: ``loss(y_true, y_pred)``; defaults to cross-entropy on logits.
        include_bias: also score biases.
        include_batchnorm: also score BatchNorm gamma and beta.
        training: run the model in training mode (batch statistics); the
            reference uses inference mode.
        num_batches: use at most this many batches of ``data``.

    Returns:
        ``{path: float64 array}`` for every prunable weight.
    """
    weights = common.prunable_weights(model, include_bias, include_batchnorm)
    variables = list(weights.values())
    total = [np.zeros(v.shape) for v in variables]
    for x, y in gradients.batches(data, num_batches):
        grads = gradients.weight_gradients(
            lambda x=x, y=y: gradients.loss_value(model, loss, x, y, training), variables
        )
        total = [t + g for t, g in zip(total, grads)]
    scores = {
        path: np.abs(np.asarray(v.numpy(), np.float64) * g) for (path, v), g in zip(weights.items(), total)
    }
    norm = sum(s.sum() for s in scores.values())
    if not np.isfinite(norm) or norm == 0:
        raise ValueError(
            f"SNIP scores sum to {norm}: the loss gradient is zero or not finite "
            "(check the labels, the loss and the model's weights)."
        )
    return {path: s / norm for path, s in scores.items()}


def snip(model, data, density, loss=None, scope="global", include_bias=False, include_batchnorm=False,
         training=False, num_batches=None):
    """Prunes ``model``'s weights to ``density`` by SNIP scores (single shot).

    Args:
        model: a built Keras model returning logits (not modified).
        data: an ``(x, y)`` batch, a ``tf.data.Dataset`` or iterable of batches.
        density: fraction of prunable weights kept, in (0, 1].
        loss: ``loss(y_true, y_pred)``; defaults to cross-entropy on logits.
        scope: ``"global"`` (the reference's default) or ``"local"``.
        include_bias: also prune biases.
        include_batchnorm: also prune BatchNorm gamma and beta.
        training: run the model in training mode; the reference does not.
        num_batches: use at most this many batches of ``data``.

    Returns:
        ``{weight path: float32 0/1 array}`` keeping ``round(density * n)`` weights.
    """
    common.check_density(density)
    scores = snip_scores(model, data, loss, include_bias, include_batchnorm, training, num_batches)
    return common.masks_from_scores(scores, density, scope)
