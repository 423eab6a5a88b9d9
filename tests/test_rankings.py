"""Channel rankings beyond weight norms: BatchNormalization scales and Taylor during ``fit``.

* ``importance="bn_scale"`` keeps the channels with the largest ``|gamma|``
  (checked against ``numpy.argsort`` of the scales set by hand), in one shot
  (``kp.apply_plan``) and during ``fit``; a plan that cuts channels no
  normalization scale writes is refused, naming them;
* ``kp.GradualPruning(importance="taylor", data=...)`` masks exactly the
  channels a one-shot Taylor ranking picks from the same weights and
  gradients, which differ from the L1 ranking's; the finalized model
  computes what the masked one does.
"""

import keras
import numpy as np
import pytest

import keras_precrop as kp
from keras_precrop import gradual
from keras_precrop.graph.walker import walk
from keras_precrop.planning import data_batches, planned_widths
from tests.test_gradual import _fit_setup

L = keras.layers
GAMMA = np.array([0.1, -2.0, 0.5, 3.0, -0.05, 1.0, 0.2, -0.7, 0.9, -0.3], "float32")


def _conv_bn_model(bn=True, seed=0):
    """Two conv layers (with BatchNormalization or without), pooled into a dense head."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((8, 8, 3))
    x = L.Conv2D(10, 3, padding="same", use_bias=not bn, name="conv_a")(inputs)
    if bn:
        x = L.BatchNormalization(name="bn_a")(x)
    x = L.Conv2D(6, 3, padding="same", activation="relu", name="conv_b")(L.ReLU()(x))
    model = keras.Model(inputs, L.Dense(3, name="fc")(L.GlobalAveragePooling2D()(x)))
    if bn:  # the filters' norms rank the channels the other way round
        model.get_layer("bn_a").gamma.assign(GAMMA)
        kernel = model.get_layer("conv_a").kernel
        kernel.assign(keras.ops.convert_to_numpy(kernel) * 5 / np.abs(GAMMA))
    return model


def _top_gamma(width):
    """The channels of ``conv_a`` with the ``width`` largest ``|gamma|``, in their order."""
    return np.sort(np.argsort(-np.abs(GAMMA))[:width])


def test_bn_scale_keeps_the_channels_with_the_largest_scales():
    model = _conv_bn_model()
    the_plan = kp.plan(model, params=0.5)
    small = kp.apply_plan(model, the_plan, weights="keep", importance="bn_scale")
    kept = _top_gamma(small.get_layer("conv_a").filters)
    assert 0 < len(kept) < 10
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(small.get_layer("bn_a").gamma),
                                  GAMMA[kept])
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(small.get_layer("conv_a").kernel),
                                  keras.ops.convert_to_numpy(model.get_layer("conv_a").kernel)[..., kept])
    l1 = kp.apply_plan(model, the_plan, weights="keep", importance="l1")
    assert not np.array_equal(keras.ops.convert_to_numpy(l1.get_layer("bn_a").gamma), GAMMA[kept])


def test_bn_scale_refuses_channels_no_scale_writes():
    model = _conv_bn_model(bn=False)
    the_plan = kp.plan(model, params=0.5)
    with pytest.raises(kp.ArgumentError, match=r"importance='bn_scale'.*'conv_a'"):
        kp.apply_plan(model, the_plan, weights="keep", importance="bn_scale")
    x = np.random.default_rng(0).normal(size=(8, 8, 8, 3)).astype("float32")
    model.compile(keras.optimizers.SGD(0.1), "mse")
    before = [keras.ops.convert_to_numpy(w) for w in model.weights]
    pruning = kp.GradualPruning(the_plan, end_step=4, frequency=2, importance="bn_scale", verbose=0)
    with pytest.raises(kp.ArgumentError, match=r"importance='bn_scale'.*'conv_a'"):
        model.fit(x, np.ones((8, 3)), batch_size=4, callbacks=[pruning], verbose=0)
    for b, w in zip(before, model.weights):  # refused before any step trained
        np.testing.assert_array_equal(b, keras.ops.convert_to_numpy(w))
    scaled = _conv_bn_model()
    with pytest.raises(kp.ArgumentError, match="importance='bn_scale'") as error:
        kp.apply_plan(scaled, kp.plan(scaled, params=0.5, ignore=["conv_a"]), weights="keep",
                      importance="bn_scale")
    assert "'conv_b'" in str(error.value) and "'conv_a'" not in str(error.value)


def _masked_at_first_step(model, x, y, **options):
    """Fit one epoch masked to the plan from the first step on; the masks (by weight path)."""
    model.compile(keras.optimizers.SGD(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    the_plan = kp.plan(model, params=0.5)
    pruning = kp.GradualPruning(the_plan, end_step=0, verbose=0, **options)
    model.fit(x, y, batch_size=8, epochs=1, callbacks=[pruning], verbose=0)
    small = pruning.finalize()
    assert small.count_params() == the_plan.predicted["params"]
    np.testing.assert_allclose(keras.ops.convert_to_numpy(model(x[:4])),
                               keras.ops.convert_to_numpy(small(x[:4])), rtol=1e-4, atol=1e-4)
    return the_plan, {w.path: m for w, m in pruning._masks}


def test_bn_scale_during_fit_masks_the_smallest_scales():
    model = _conv_bn_model()
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(16, 8, 8, 3)).astype("float32"), rng.integers(0, 3, 16)
    _, masks = _masked_at_first_step(model, x, y, importance="bn_scale")
    mask = masks[model.get_layer("bn_a").gamma.path]
    np.testing.assert_array_equal(np.flatnonzero(mask), _top_gamma(int(mask.sum())))


def test_taylor_during_fit_masks_what_one_shot_taylor_picks():
    model, x, y = _fit_setup(6)
    data = (x[:16], y[:16])
    graph = walk(model)
    the_plan = kp.plan(model, params=0.5)
    targets = planned_widths(graph, the_plan, model)
    expected, _ = gradual.channel_masks(graph, targets, ("taylor", data_batches(model, data)))
    by_l1, _ = gradual.channel_masks(graph, targets, "l1")
    _, masks = _masked_at_first_step(model, x, y, importance="taylor", data=data)
    assert masks.keys() == {w.path for w, _ in expected}
    for w, mask in expected:
        np.testing.assert_array_equal(masks[w.path], mask)
    assert any(not np.array_equal(masks[w.path], m) for w, m in by_l1)


@pytest.mark.parametrize("options, name", [
    ({"importance": "taylor"}, "data="), ({"data": (np.zeros((2, 8, 8, 3)), np.zeros(2))}, "data="),
    ({"importance": "random"}, "importance="),
])
def test_ranking_arguments_name_themselves(options, name):
    model = _conv_bn_model()
    with pytest.raises(kp.ArgumentError, match=name):
        kp.GradualPruning(kp.plan(model, params=0.5), end_step=3, **options)


def test_taylor_data_that_does_not_fit_the_model_is_refused_before_training():
    model = _conv_bn_model()
    model.compile(keras.optimizers.SGD(0.01), "mse")
    pruning = kp.GradualPruning(kp.plan(model, params=0.5), end_step=2, importance="taylor",
                                data=(np.zeros((2, 5, 5, 1), "float32"), np.zeros(2)), verbose=0)
    before = [keras.ops.convert_to_numpy(w) for w in model.weights]
    with pytest.raises(kp.ArgumentError, match="data"):  # a DataError
        model.fit(np.zeros((4, 8, 8, 3)), np.zeros((4, 3)), callbacks=[pruning], verbose=0)
    for b, w in zip(before, model.weights):
        np.testing.assert_array_equal(b, keras.ops.convert_to_numpy(w))
