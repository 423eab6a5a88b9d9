"""Prunable weights, score thresholding and argument errors of ``keras_precrop.pai``."""

import keras
import numpy as np
import pytest

from keras_precrop import pai
from tests.conftest import count_kept, count_total, mixed_cnn, tiny_batch, tiny_cnn

L = keras.layers


def test_prunable_weights_are_kernels_in_layer_order(resnet20):
    expected = [
        layer.kernel.path
        for layer in resnet20.layers
        if isinstance(layer, (L.Conv2D, L.Dense))
    ]
    assert list(pai.prunable_weights(resnet20)) == expected
    with_bias = pai.prunable_weights(resnet20, include_bias=True, include_batchnorm=True)
    assert "classifier/bias" in with_bias and "stem_bn/gamma" in with_bias
    assert "stem_bn/moving_mean" not in with_bias
    mixed = pai.prunable_weights(mixed_cnn())
    assert list(mixed) == [
        "c1/kernel", "dw/kernel", "pw/kernel", "sep/depthwise_kernel",
        "sep/pointwise_kernel", "tr/kernel", "fc/kernel",
    ]


@pytest.mark.parametrize("density", [1.0, 0.5, 0.1, 0.013, 0.004])
def test_exact_count_with_all_scores_tied(density):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((4, 4, 3))
    x = L.Conv2D(7, 3, kernel_initializer="ones", name="a")(inputs)
    x = L.Flatten()(x)
    model = keras.Model(inputs, L.Dense(5, kernel_initializer="ones", name="b")(x))
    masks = pai.magnitude(model, density)  # every |w| is 1: all tied
    n = count_total(masks)
    assert count_kept(masks) == round(density * n)
    flat = np.concatenate([m.ravel() for m in masks.values()])
    assert flat[: round(density * n)].all() and not flat[round(density * n):].any()
    if min(round(density * m.size) for m in masks.values()) < 1:
        with pytest.raises(ValueError, match="keeps no weight"):
            pai.magnitude(model, density, scope="local")
    else:
        for m in pai.magnitude(model, density, scope="local").values():
            assert np.count_nonzero(m) == round(density * m.size)
            assert m.ravel()[: np.count_nonzero(m)].all()


def test_masks_from_scores_keeps_largest_and_local_scope():
    rng = np.random.default_rng(0)
    scores = {"a": rng.normal(size=(3, 4)), "b": rng.normal(size=(10,))}
    masks = pai.masks_from_scores(scores, 0.5, "global")
    flat = np.concatenate([scores["a"].ravel(), scores["b"]])
    kept = np.concatenate([masks["a"].ravel(), masks["b"]]).astype(bool)
    assert kept.sum() == 11 and flat[kept].min() > flat[~kept].max()
    local = pai.masks_from_scores(scores, 0.5, "local")
    assert local["a"].sum() == 6 and local["b"].sum() == 5


@pytest.mark.parametrize("density", [0.0, -0.1, 1.5, float("nan"), "x", None])
def test_bad_densities_raise(density, resnet20):
    with pytest.raises(ValueError, match="density"):
        pai.magnitude(resnet20, density)
    with pytest.raises(ValueError, match="density"):
        pai.synflow(resnet20, density, verbose=0)
    with pytest.raises(ValueError, match="density"):
        pai.random_masks(resnet20, {"stem_conv/kernel": density})


def test_bad_masks_and_arguments_raise(resnet20):
    good = pai.magnitude(resnet20, 0.5)
    with pytest.raises(ValueError, match="nope/kernel"):
        pai.apply_masks(resnet20, {"nope/kernel": np.ones(3)})
    with pytest.raises(ValueError, match="shape"):
        pai.apply_masks(resnet20, {"stem_conv/kernel": np.ones((3, 3))})
    bad = dict(good, **{"stem_conv/kernel": np.full((3, 3, 3, 16), 0.5)})
    with pytest.raises(ValueError, match="only 0 and 1"):
        pai.apply_masks(resnet20, bad)
    nan = good["stem_conv/kernel"].copy()
    nan[0, 0, 0, 0] = np.nan
    with pytest.raises(ValueError, match="only 0 and 1"):
        pai.check_masks(resnet20, {"stem_conv/kernel": nan})
    with pytest.raises(ValueError, match="granularity"):
        pai.random_masks(resnet20, 0.5, "block")
    with pytest.raises(ValueError, match="schedule"):
        pai.synflow(resnet20, 0.5, schedule="cosine", verbose=0)
    with pytest.raises(ValueError, match="scope"):
        pai.magnitude(resnet20, 0.5, scope="layer")
    with pytest.raises(ValueError, match="keeps no weight"):
        pai.magnitude(resnet20, 1e-9)
    with pytest.raises(ValueError, match="NaN"):
        pai.masks_from_scores({"a": np.array([1.0, np.nan])}, 0.5)
    x, y = tiny_batch(0)
    x[0, 0, 0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        pai.snip(tiny_cnn(), (x, y), 0.5)
