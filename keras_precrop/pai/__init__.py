"""Unstructured pruning-at-initialization baselines and masked training.

Every pruner returns masks as ``{weight path: float32 0/1 array}``, the paths
being ``keras.Variable.path`` (``"stem_conv/kernel"``) in model layer order::

    masks = keras_precrop.pai.synflow(model, 0.1)
    print(keras_precrop.pai.sparsity_report(masks, model))
    keras_precrop.pai.apply_masks(model, masks)   # then compile and fit as usual

Pruners (scores follow ganguli-lab/Synaptic-Flow): :func:`synflow` (data-free,
iterative), :func:`snip`, :func:`grasp` (need a data batch),
:func:`magnitude`, :func:`random`, and :func:`random_masks` for given
per-layer densities at weight, filter or channel granularity.
"""

from keras_precrop.pai.baselines import magnitude, random
from keras_precrop.pai.common import masks_from_scores, prunable_weights
from keras_precrop.pai.connectivity import remove_detached
from keras_precrop.pai.grasp import grasp, grasp_scores
from keras_precrop.pai.masks import MaskConstraint, apply_masks, check_masks, layer_densities, sparsity_report
from keras_precrop.pai.random_masks import random_masks
from keras_precrop.pai.snip import snip, snip_scores
from keras_precrop.pai.synflow import synflow, synflow_scores

__all__ = [
    "MaskConstraint",
    "apply_masks",
    "check_masks",
    "grasp",
    "grasp_scores",
    "layer_densities",
    "magnitude",
    "masks_from_scores",
    "prunable_weights",
    "random",
    "random_masks",
    "remove_detached",
    "snip",
    "snip_scores",
    "sparsity_report",
    "synflow",
    "synflow_scores",
]
