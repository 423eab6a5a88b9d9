"""The reference's two trivial pruners: weight magnitude and random scores."""

import numpy as np

from keras_precrop.pai import common


def magnitude(model, density, scope="global", include_bias=False, include_batchnorm=False):
    """Keeps the ``round(density * n)`` prunable weights of largest ``|w|``.

    Args:
        model: a built Keras model (not modified).
        density: fraction of prunable weights kept, in (0, 1].
        scope: ``"global"`` (one threshold) or ``"local"`` (per weight).
        include_bias: also prune biases.
        include_batchnorm: also prune BatchNorm gamma and beta.

    Returns:
        ``{weight path: float32 0/1 array}``.
    """
    common.check_density(density)
    weights = common.prunable_weights(model, include_bias, include_batchnorm)
    scores = {path: np.abs(np.asarray(v.numpy(), np.float64)) for path, v in weights.items()}
    return common.masks_from_scores(scores, density, scope)


def random(model, density, scope="global", seed=None, include_bias=False, include_batchnorm=False):
    """Keeps ``round(density * n)`` prunable weights chosen uniformly at random.

    With ``scope="global"`` the kept weights are a uniform random subset of
    all prunable weights (so every layer keeps about ``density`` of itself);
    with ``"local"`` each weight keeps exactly ``round(density * size)``. For
    given per-layer densities or coarser granularities use :func:`random_masks`.

    Args:
        model: a built Keras model (not modified).
        density: fraction of prunable weights kept, in (0, 1].
        scope: ``"global"`` or ``"local"``.
        seed: seed of the numpy generator; the same seed gives the same masks.
        include_bias: also prune biases.
        include_batchnorm: also prune BatchNorm gamma and beta.

    Returns:
        ``{weight path: float32 0/1 array}``.
    """
    common.check_density(density)
    rng = np.random.default_rng(seed)
    weights = common.prunable_weights(model, include_bias, include_batchnorm)
    scores = {path: rng.random(tuple(v.shape)) for path, v in weights.items()}
    return common.masks_from_scores(scores, density, scope)
