"""Gradients on every Keras backend, data batches and the loss SNIP and GraSP differentiate.

The code lives in ``keras_precrop.training.gradients``, where Taylor importance
(``keras_precrop.transfer``, which may not import this wing) takes its
gradients too; this module keeps the baselines' import path, and their
users', working.
"""

from keras_precrop.training.gradients import (
    BACKENDS,
    batches,
    compiled,
    cross_entropy,
    hessian_gradient_product,
    loss_value,
    precision,
    value_and_grad,
    weight_gradients,
)

__all__ = ["BACKENDS", "batches", "compiled", "cross_entropy", "hessian_gradient_product",
           "loss_value", "precision", "value_and_grad", "weight_gradients"]
