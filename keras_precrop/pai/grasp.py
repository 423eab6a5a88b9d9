"""GraSP (Wang et al., 2020): keep the weights that preserve gradient flow.

Follows the Synaptic-Flow reference (``GraSP.score``): with the logits divided
by a temperature of 200 and the model in inference mode, ``g`` is the loss
gradient summed over the batches (held constant), ``Hg`` the gradient of
``g . dL_b/dw`` summed over the batches (a Hessian-gradient product), and the
score is ``w * Hg`` divided by ``|sum(w * Hg)| + 1e-10``. The weights with the
*lowest* scores are pruned. This matches the GraSP paper, whose score is
``-w * Hg`` with the *highest* scores removed.
"""

import numpy as np

from keras_precrop.pai import common, gradients

_EPS = 1e-10


def grasp_scores(model, data, loss=None, temperature=200.0, include_bias=False, include_batchnorm=False,
                 training=False, num_batches=None):
    """GraSP scores ``w * Hg / (|sum(w * Hg)| + 1e-10)``; larger is kept.

    Args:
        model: a built Keras model returning logits.
        data: an ``(x, y)`` batch, a ``tf.data.Dataset`` or iterable of batches.
        loss: ``loss(y_true, y_pred)``; defaults to cross-entropy on logits.
        temperature: the logits are divided by this (the reference's 200).
        include_bias: also score biases.
        include_batchnorm: also score BatchNorm gamma and beta.
        training: run the model in training mode; the reference does not.
        num_batches: use at most this many batches of ``data``.

    Returns:
        ``{path: float64 array}`` for every prunable weight.
    """
    temperature = float(temperature)
    if not temperature > 0:
        raise ValueError(f"temperature must be positive, got {temperature!r}.")
    weights = common.prunable_weights(model, include_bias, include_batchnorm)
    variables = list(weights.values())
    data = gradients.batches(data, num_batches)

    def loss_of(x, y):
        return lambda: gradients.loss_value(model, loss, x, y, training, temperature)

    stopped = [np.zeros(v.shape) for v in variables]
    for x, y in data:
        stopped = [s + g for s, g in zip(stopped, gradients.weight_gradients(loss_of(x, y), variables))]

    hessian_grad = [np.zeros(v.shape) for v in variables]
    for x, y in data:
        products = gradients.hessian_gradient_product(loss_of(x, y), variables, stopped)
        hessian_grad = [h + p for h, p in zip(hessian_grad, products)]

    scores = {
        path: np.asarray(v.numpy(), np.float64) * h for (path, v), h in zip(weights.items(), hessian_grad)
    }
    norm = abs(sum(s.sum() for s in scores.values())) + _EPS
    return {path: s / norm for path, s in scores.items()}


def grasp(model, data, density, loss=None, temperature=200.0, scope="global", include_bias=False,
          include_batchnorm=False, training=False, num_batches=None):
    """Prunes ``model``'s weights to ``density`` by GraSP scores (single shot).

    Args:
        model: a built Keras model returning logits (not modified).
        data: an ``(x, y)`` batch, a ``tf.data.Dataset`` or iterable of batches.
        density: fraction of prunable weights kept, in (0, 1].
        loss: ``loss(y_true, y_pred)``; defaults to cross-entropy on logits.
        temperature: the logits are divided by this (the reference's 200).
        scope: ``"global"`` (the reference's default) or ``"local"``.
        include_bias: also prune biases.
        include_batchnorm: also prune BatchNorm gamma and beta.
        training: run the model in training mode; the reference does not.
        num_batches: use at most this many batches of ``data``.

    Returns:
        ``{weight path: float32 0/1 array}`` keeping ``round(density * n)`` weights.
    """
    common.check_density(density)
    scores = grasp_scores(model, data, loss, temperature, include_bias, include_batchnorm, training,
                          num_batches)
    return common.masks_from_scores(scores, density, scope)
