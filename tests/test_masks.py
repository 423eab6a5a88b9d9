"""Masks (``keras_precrop.pai.masks``): training, distribution, save/load and reports."""

import json
import textwrap

import keras
import numpy as np

from keras_precrop import pai
from tests.conftest import count_kept, count_total, run_python, small_classifier


def _assert_masked(model, masks):
    weights = {v.path: v for v in model.weights}
    for path, mask in masks.items():
        w = weights[path].numpy()
        assert np.all(w[mask == 0] == 0), path
        if path.endswith("kernel"):  # biases start at zero
            assert np.count_nonzero(w[mask == 1]) == np.count_nonzero(mask), path


def test_masks_survive_sgd_momentum_weight_decay_and_keras_round_trip(tmp_path):
    model = small_classifier()
    masks = pai.random(model, 0.3, seed=0, include_bias=True)
    assert pai.apply_masks(model, masks) is model
    _assert_masked(model, masks)
    model.compile(
        keras.optimizers.SGD(0.05, momentum=0.9, weight_decay=5e-4),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(400, 8, 8, 3)).astype("float32"), rng.integers(0, 3, 400)
    before = {v.path: v.numpy().copy() for v in model.weights}
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)  # 50 steps
    assert int(model.optimizer.iterations.numpy()) == 50
    _assert_masked(model, masks)
    assert not np.allclose(before["c1/kernel"], model.get_layer("c1").kernel.numpy())
    # The existing MaxNorm constraint still applies, inside the mask.
    norms = np.sqrt((model.get_layer("c2").kernel.numpy() ** 2).sum(axis=(0, 1, 2)))
    assert norms.max() <= 0.5 + 1e-5

    path = tmp_path / "masked.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    for v, w in zip(model.weights, loaded.weights):
        np.testing.assert_array_equal(v.numpy(), w.numpy())
    constraint = loaded.get_layer("c1").kernel.constraint
    assert isinstance(constraint, pai.MaskConstraint)
    np.testing.assert_array_equal(constraint.mask, masks["c1/kernel"])
    assert isinstance(loaded.get_layer("c2").kernel.constraint.inner, keras.constraints.MaxNorm)
    loaded.fit(x[:80], y[:80], batch_size=8, epochs=1, verbose=0)
    _assert_masked(loaded, masks)


def test_mask_constraint_config_round_trips_exactly():
    rng = np.random.default_rng(0)
    for shape in [(3, 3, 5, 7), (13,), (1, 1, 1, 1)]:
        mask = (rng.random(shape) < 0.37).astype(np.float32)
        config = pai.MaskConstraint(mask).get_config()
        json.dumps(config)
        np.testing.assert_array_equal(pai.MaskConstraint.from_config(config).mask, mask)


def test_apply_masks_recompiles_cached_train_function():
    model = small_classifier()
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = np.ones((8, 8, 8, 3), "float32"), np.zeros(8)
    model.fit(x, y, verbose=0)  # traces a train function without constraints
    masks = pai.magnitude(model, 0.2)
    pai.apply_masks(model, masks)
    model.fit(x, y, epochs=2, verbose=0)
    _assert_masked(model, masks)


_MIRRORED = textwrap.dedent(
    """
    import numpy as np, tensorflow as tf, keras
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    from keras_precrop import pai
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        inputs = keras.Input((6, 6, 3))
        x = keras.layers.Conv2D(8, 3, name="c")(inputs)
        x = keras.layers.GlobalAveragePooling2D()(x)
        model = keras.Model(inputs, keras.layers.Dense(2, name="fc")(x))
        masks = pai.random(model, 0.3, seed=1)
        pai.apply_masks(model, masks)
        model.compile(keras.optimizers.SGD(0.1, momentum=0.9, weight_decay=1e-3), "mse")
    rng = np.random.default_rng(0)
    model.fit(rng.normal(size=(160, 6, 6, 3)), rng.normal(size=(160, 2)), batch_size=16, verbose=0)
    for layer in ("c", "fc"):
        var = model.get_layer(layer).kernel.value
        replicas = [v.numpy() for v in var.values]
        assert len(replicas) == 2
        for r in replicas:
            assert np.all(r[masks[layer + "/kernel"] == 0] == 0), layer
            assert np.count_nonzero(r) == np.count_nonzero(masks[layer + "/kernel"])
    print("OK", int(model.optimizer.iterations.numpy()))
    """
)


def test_masks_survive_mirrored_strategy_on_two_cpus():
    out = run_python(["-c", _MIRRORED])
    assert out.returncode == 0, out.stderr[-3000:]
    assert "OK 10" in out.stdout


def test_layer_densities_and_sparsity_report(resnet20):
    masks = pai.random_masks(resnet20, 0.25, "weight", seed=0)
    densities = pai.layer_densities(masks)
    assert all(abs(d - 0.25) < 1 / 400 for d in densities.values())
    report = pai.sparsity_report(masks, resnet20)
    for path in masks:
        assert path in report
    kept = count_kept(masks)
    assert f"{kept:,}" in report and f"{count_total(masks):,}" in report
    pruned = count_total(masks) - kept
    assert f"{resnet20.count_params() - pruned:,}" in report
