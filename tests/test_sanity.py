"""The check functions of ``experiments/sanity.py`` against independent references.

Formulas against Keras' own initializers' draws, the init check against
rebuilds with and without planted bugs, mask decoding against
``MaskConstraint``'s encoder, and the mask and cost counts against a saved
masked model whose counts are known by construction.
"""

import sys

import keras
import numpy as np
import pytest

import keras_precrop as kp
from keras_precrop import pai
from keras_precrop.training.constraints import MaskConstraint
from tests.conftest import REPO

sys.path.insert(0, str(REPO / "experiments"))
import sanity  # noqa: E402

L = keras.layers


@pytest.mark.parametrize(
    "initializer",
    [
        keras.initializers.HeNormal(seed=1),
        keras.initializers.HeUniform(seed=1),
        keras.initializers.GlorotNormal(seed=1),
        keras.initializers.GlorotUniform(seed=1),
        keras.initializers.LecunNormal(seed=1),
        keras.initializers.LecunUniform(seed=1),
        keras.initializers.VarianceScaling(2.0, "fan_in", "untruncated_normal", seed=1),
        keras.initializers.VarianceScaling(1.0 / 3.0, "fan_out", "uniform", seed=1),
        keras.initializers.VarianceScaling(0.5, "fan_avg", "truncated_normal", seed=1),
    ],
    ids=lambda init: f"{type(init).__name__}-{init.get_config().get('mode', '')}",
)
@pytest.mark.parametrize("shape", [(3, 3, 24, 40), (96, 10)])
def test_formula_std_matches_keras_draws(initializer, shape):
    drawn = np.asarray(initializer(shape))
    formula = sanity.formula_std(keras.initializers.serialize(initializer), shape)
    # 3.6e3 to 8.6e3 draws: the RMS is within 3% of the std with overwhelming probability.
    assert np.sqrt(np.mean(drawn**2)) == pytest.approx(formula, rel=0.03)


def test_formula_std_refuses_other_initializers():
    with pytest.raises(ValueError, match="RandomNormal"):
        sanity.formula_std(keras.initializers.serialize(keras.initializers.RandomNormal()), (3, 3))


def _convnet():
    inputs = keras.Input((8, 8, 3))
    x = L.Conv2D(64, 3, padding="same", kernel_initializer="he_normal", name="conv1")(inputs)
    x = L.BatchNormalization(name="bn1")(x)
    x = L.ReLU()(x)
    x = L.Conv2D(64, 3, padding="same", kernel_initializer="he_normal", name="conv2")(x)
    x = L.BatchNormalization(name="bn2")(x)
    x = L.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, L.Dense(10, name="head")(x))


def test_check_init_passes_a_rebuild_and_catches_planted_bugs():
    keras.utils.set_random_seed(0)
    reference = _convnet()
    model = kp.precrop(reference, params=0.3)
    assert model.get_layer("conv2").kernel.shape[2] < 64  # the fan-in did change
    fine = sanity.check_init(model, reference)
    assert fine["ok"], fine["worst"]
    assert fine["detectable_if_kept"] >= 1
    assert fine["telling"]["name"] == "conv2"

    # Bug 1: the rebuilt layers keep the original weights (a prefix slice, the original fan-in's scale).
    for name in ("conv1", "conv2", "head"):
        new, old = model.get_layer(name).kernel, reference.get_layer(name).kernel.numpy()
        new.assign(old[tuple(slice(0, d) for d in new.shape)])
    copied = sanity.check_init(model, reference)
    assert not copied["ok"]
    assert set(copied["copied"]) == {"conv1", "conv2", "head"}
    conv2 = next(row for row in copied["layers"] if row["name"] == "conv2")
    assert conv2["ratio"] == pytest.approx(conv2["ratio_if_kept"], rel=0.05)
    assert abs(conv2["z"]) > sanity.Z_LIMIT

    # Bug 2: fresh values at the wrong scale, a BN that does not start at 1, two equal kernels.
    model = kp.precrop(reference, params=0.3)
    model.get_layer("conv2").kernel.assign(model.get_layer("conv2").kernel * 0.7)
    model.get_layer("bn1").gamma.assign(np.full(model.get_layer("bn1").gamma.shape, 2.0, "float32"))
    broken = sanity.check_init(model, reference)
    assert broken["worst"]["name"] == "conv2" and broken["worst"]["ratio"] == pytest.approx(0.7, rel=0.05)
    assert broken["batchnorm_not_at_init"] == ["bn1"]
    assert not broken["ok"]


def test_decode_mask_inverts_mask_constraint_encoding():
    mask = np.random.default_rng(0).integers(0, 2, size=(3, 3, 5, 7))
    config = MaskConstraint(mask).get_config()
    np.testing.assert_array_equal(sanity.decode_mask(config["mask"], config["shape"]), mask)


def test_check_masks_and_recount_on_a_saved_masked_model(tmp_path):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8, 8, 3))
    x = L.Conv2D(4, 3, padding="same", use_bias=False, name="conv")(inputs)
    x = L.GlobalAveragePooling2D()(x)
    model = keras.Model(inputs, L.Dense(5, name="head")(x))
    masks = pai.magnitude(model, 0.25)
    pruned = sum(int(m.size - m.sum()) for m in masks.values())
    pai.apply_masks(model, masks)
    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss="mse")
    model.fit(np.random.rand(16, 8, 8, 3), np.random.rand(16, 5), epochs=2, verbose=0)
    path = tmp_path / "model.keras"
    model.save(path)
    results = {"original_params": model.count_params(), "params": model.count_params() - pruned}

    loaded = keras.saving.load_model(path, compile=False)
    held = sanity.check_masks(loaded, path, results)
    assert held["ok"] and held["kernel_zeros"] == held["masked"] == pruned
    assert held["kernel_weights"] == 3 * 3 * 3 * 4 + 4 * 5
    density = {name: np.count_nonzero(m) / m.size for name, m in masks.items()}
    macs = 8 * 8 * 3 * 3 * 3 * 4 * density["conv/kernel"] + 4 * 5 * density["head/kernel"]
    assert sanity.recount(loaded) == (results["params"], round(macs))

    # A mask that did not hold: a pruned weight became nonzero.
    kernel = loaded.get_layer("conv").kernel
    kernel.assign(kernel.numpy() + (masks["conv/kernel"] == 0) * 0.5)
    broken = sanity.check_masks(loaded, path, results)
    assert not broken["ok"] and broken["nonzero_under_mask"] == int(np.sum(masks["conv/kernel"] == 0))


def test_accuracy_counts_argmax_hits():
    inputs = keras.Input((3,))
    model = keras.Model(inputs, L.Dense(3, kernel_initializer="identity", bias_initializer="zeros")(inputs))
    images = np.random.default_rng(1).normal(size=(50, 3)).astype("float32")
    labels = np.random.default_rng(2).integers(0, 3, size=50)
    assert sanity.accuracy(model, images, labels, batch_size=7) == np.mean(np.argmax(images, 1) == labels)


def test_check_densities_compares_figure_4s_models_with_synexp(resnet20):
    """Random masks at SynExp's densities pass within a filter's share; masks at one global
    density (another density program) and PreCrop's paper rule show their differences."""
    flags = {"model": "resnet20", "params_budget": 0.1, "flops_budget": None, "densities": "synexp"}
    targets = kp.plan(resnet20, params=0.1, mode="paper").solver["layer_densities_solved"]
    assert sanity.check_densities(resnet20, {**flags, "densities": None}) is None  # not a figure-4 run

    def masked(densities):
        model = keras.models.clone_model(resnet20)
        model.set_weights(resnet20.get_weights())
        return pai.apply_masks(model, pai.random_masks(resnet20, densities, "filter", seed=0))

    row = sanity.check_densities(masked({f"{n}/kernel": d for n, d in targets.items()}), flags)
    assert row["layers"] == len(targets) == 22
    # A kernel keeps whole 3x3 filters: within half a filter of its target, 1 / (2 * 16 * 16) at most.
    assert abs(row["worst_diff"]) <= 1 / 512 and row["mean_abs_diff"] < 1e-3
    uniform = sanity.check_densities(masked(0.1), flags)  # stem and shortcuts keep 10%, not SynExp's 100%
    assert targets[uniform["worst_layer"]] == uniform["worst_target"] == 1.0
    assert uniform["worst_diff"] == pytest.approx(-0.9, abs=1 / 96)

    cropped = kp.precrop(resnet20, params=0.1, mode="paper")
    row = sanity.check_densities(cropped, {**flags, "densities": None, "plan_options": {"mode": "paper"}})
    kernels = {layer.name: layer.kernel.shape for layer in cropped.layers if hasattr(layer, "kernel")}
    name = row["worst_layer"]
    realized = np.prod(kernels[name]) / np.prod(resnet20.get_layer(name).kernel.shape)
    assert row["worst_diff"] == pytest.approx(realized - targets[name])
