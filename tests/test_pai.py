"""Tests for keras_precrop.pai: pruners, masks, masked training and random granularities."""

import json
import math
import os
import pathlib
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_precrop import models, pai

L = keras.layers
REPO = pathlib.Path(__file__).resolve().parents[1]


# -- model builders --------------------------------------------------------


def _mlp(seed=0, widths=(5, 7, 6, 3)):
    """Bias-free ReLU MLP: SynFlow has a closed form on it."""
    keras.utils.set_random_seed(seed)
    x = inputs = keras.Input((widths[0],))
    for i, w in enumerate(widths[1:]):
        x = L.Dense(w, use_bias=False, name=f"d{i}")(x)
        if i < len(widths) - 2:
            x = L.ReLU()(x)
    return keras.Model(inputs, x)


def _tiny_cnn(dtype="float64", seed=0):
    """Conv (tanh) -> BN -> Flatten -> Dense, smooth so finite differences work."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((5, 5, 2), dtype=dtype)
    x = L.Conv2D(3, 3, padding="same", activation="tanh", dtype=dtype, name="conv")(inputs)
    x = L.BatchNormalization(dtype=dtype, name="bn")(x)
    x = L.Flatten(dtype=dtype)(x)
    x = L.Dense(4, dtype=dtype, name="fc")(x)
    return keras.Model(inputs, x)


def _mixed_cnn(seed=0):
    """Every kernel layout (conv, depthwise with multiplier 2, separable, transpose, dense after flatten), plus dropout."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((8, 8, 3))
    a = L.Conv2D(8, 3, padding="same", name="c1")(inputs)
    a = L.BatchNormalization(name="bn1")(a)
    a = L.ReLU()(a)
    b = L.DepthwiseConv2D(3, padding="same", depth_multiplier=2, name="dw")(a)
    b = L.Conv2D(8, 1, name="pw")(b)
    s = L.Add()([a, b])
    c = L.SeparableConv2D(6, 3, padding="same", name="sep")(s)
    d = L.Concatenate()([s, c])
    d = L.Dropout(0.1)(L.AveragePooling2D(2)(d))  # its seed state is an int variable
    t = L.Conv2DTranspose(5, 3, strides=1, padding="same", name="tr")(d)
    f = L.Flatten()(t)
    out = L.Dense(4, name="fc")(f)
    return keras.Model(inputs, out)


def _small_classifier(seed=0):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((8, 8, 3))
    x = L.Conv2D(8, 3, padding="same", use_bias=False, name="c1")(inputs)
    x = L.BatchNormalization(name="bn1")(x)
    x = L.ReLU()(x)
    x = L.Conv2D(8, 3, padding="same", name="c2", kernel_constraint=keras.constraints.MaxNorm(0.5, axis=[0, 1, 2]))(x)
    x = L.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, L.Dense(3, name="fc")(x))


@pytest.fixture(scope="module")
def resnet20():
    keras.utils.set_random_seed(0)
    return models.get("resnet20")


def _kept(masks):
    return int(sum(np.count_nonzero(m) for m in masks.values()))


def _size(masks):
    return int(sum(np.size(m) for m in masks.values()))


# -- prunable weights and thresholding ------------------------------------------


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
    mixed = pai.prunable_weights(_mixed_cnn())
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
    n = _size(masks)
    assert _kept(masks) == round(density * n)
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


# -- SynFlow ------------------------------------------------------------------------


def _mlp_flow_scores(weights, masks):
    """Closed form: R = 1^T |W_L| ... |W_1| 1 (Keras kernels are (in, out))."""
    mats = [np.abs(w) * m for w, m in zip(weights, masks)]
    forward = [np.ones(mats[0].shape[0])]
    for w in mats:
        forward.append(forward[-1] @ w)
    backward = [np.ones(mats[-1].shape[1])]
    for w in reversed(mats):
        backward.insert(0, w @ backward[0])
    return [np.abs(w * np.outer(forward[i], backward[i + 1])) for i, w in enumerate(mats)]


def test_synflow_scores_match_closed_form():
    model = _mlp()
    weights = [v.numpy().astype(np.float64) for v in model.weights]
    rng = np.random.default_rng(1)
    masks = [(rng.random(w.shape) < 0.7).astype(np.float64) for w in weights]
    masks_by_path = dict(zip(pai.prunable_weights(model), masks))
    expected = _mlp_flow_scores(weights, masks)
    for dtype, rtol in (("float64", 1e-12), ("auto", 1e-5), ("float32", 1e-5)):
        got = pai.synflow_scores(model, masks_by_path, dtype=dtype)
        for g, e in zip(got.values(), expected):
            np.testing.assert_allclose(g, e, rtol=rtol, atol=0)


def test_synflow_auto_precision_falls_back_to_float64():
    keras.utils.set_random_seed(0)
    x = inputs = keras.Input((64,))
    for i in range(25):  # gain ~50 per layer: R ~ 1e42 overflows float32
        x = L.Dense(64, use_bias=False, kernel_initializer=keras.initializers.RandomNormal(stddev=1.0))(x)
    model = keras.Model(inputs, x)
    auto = pai.synflow_scores(model)
    exact = pai.synflow_scores(model, dtype="float64")
    assert sum(s.sum() for s in exact.values()) > 1e38
    for p in exact:
        np.testing.assert_array_equal(auto[p], exact[p])
    with pytest.raises(FloatingPointError, match="float64"):
        pai.synflow_scores(model, dtype="float32")


def test_synflow_runs_a_float32_copy_of_a_mixed_precision_model():
    keras.config.set_dtype_policy("mixed_float16")
    try:
        model = _mlp(seed=5)
    finally:
        keras.config.set_dtype_policy("float32")
    assert model.layers[1].compute_dtype == "float16"
    weights = [v.numpy().astype(np.float64) for v in model.weights]
    expected = _mlp_flow_scores(weights, [np.ones(w.shape) for w in weights])
    for g, e in zip(pai.synflow_scores(model).values(), expected):
        np.testing.assert_allclose(g, e, rtol=1e-5)


@pytest.mark.parametrize("schedule", ["exponential", "linear"])
def test_synflow_iterations_match_independent_loop(schedule):
    model = _mlp(widths=(6, 9, 8, 4))
    weights = [v.numpy().astype(np.float64) for v in model.weights]
    density, rounds = 0.2, 7
    n = sum(w.size for w in weights)
    masks = [np.ones(w.shape) for w in weights]
    for k in range(1, rounds + 1):
        d = density ** (k / rounds) if schedule == "exponential" else 1 - (1 - density) * k / rounds
        flat = np.concatenate([s.ravel() for s in _mlp_flow_scores(weights, masks)])
        alive = np.concatenate([m.ravel() for m in masks]) > 0
        order = np.lexsort((np.arange(n), -flat, ~alive))  # alive first, high score, low index
        keep = np.zeros(n, bool)
        keep[order[: round(d * n)]] = True
        masks = [a.reshape(w.shape).astype(float) for a, w in zip(np.split(keep, np.cumsum([w.size for w in weights])[:-1]), weights)]
    got = pai.synflow(model, density, iterations=rounds, schedule=schedule, dtype="float64", verbose=0)
    for g, e in zip(got.values(), masks):
        np.testing.assert_array_equal(g, e)


def test_synflow_is_data_free_deterministic_and_leaves_model_alone():
    model = _mixed_cnn(seed=3)
    before = [v.numpy().copy() for v in model.weights]
    first = pai.synflow(model, 0.1, iterations=10, verbose=0)
    again = pai.synflow(_mixed_cnn(seed=3), 0.1, iterations=10, verbose=0)
    other = pai.synflow(_mixed_cnn(seed=4), 0.1, iterations=10, verbose=0)
    assert all(np.array_equal(first[p], again[p]) for p in first)
    assert not all(np.array_equal(first[p], other[p]) for p in first)
    assert _kept(first) == round(0.1 * _size(first))
    for v, b in zip(model.weights, before):
        np.testing.assert_array_equal(v.numpy(), b)


def test_synflow_resnet20_one_percent_avoids_layer_collapse(resnet20):
    masks = pai.synflow(resnet20, 0.01, verbose=0)
    assert _kept(masks) == round(0.01 * _size(masks))
    emptied = [p for p, m in masks.items() if not m.any()]
    # Only 1x1 projection shortcuts, which a parallel conv branch bypasses, may
    # be emptied without disconnecting the network (the PyTorch reference loop
    # empties stage3's too, see benchmarks/results/synflow.md).
    assert all("shortcut" in p for p in emptied), emptied
    # The pruned network still carries synaptic flow from input to output ...
    flow = pai.synflow_scores(resnet20, masks)
    assert sum(s.sum() for s in flow.values()) > 0
    # ... while random pruning to the same density collapses a layer's worth of paths.
    shuffled = pai.random(resnet20, 0.01, seed=0)
    assert sum(np.count_nonzero(s) for s in pai.synflow_scores(resnet20, shuffled).values()) < _kept(shuffled)


@pytest.mark.slow
def test_synflow_resnet110_stays_finite():
    keras.utils.set_random_seed(0)
    model = models.get("resnet110")
    scores = pai.synflow_scores(model)
    total = sum(s.sum() for s in scores.values())
    assert np.isfinite(total) and total > np.finfo(np.float32).max  # would overflow float32
    masks = pai.synflow(model, 0.01, iterations=5, verbose=0)
    assert _kept(masks) == round(0.01 * _size(masks))


# -- SNIP and GraSP against finite differences ----------------------------------------


def _data(seed=0, n=6):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 5, 5, 2)), rng.integers(0, 4, n)


def _loss(model, batches):
    total = 0.0
    for x, y in batches:
        logits = model(x, training=False)
        total += float(tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)))
    return total


def _fd_grad(model, variables, batches, entries, eps=1e-6):
    """Central differences of the summed loss at the given flat ``entries`` of each variable."""
    grads = []
    for v, picked in zip(variables, entries):
        base = v.numpy()
        g = np.zeros(base.shape)
        for i in (np.unravel_index(k, base.shape) for k in picked):
            for sign in (1, -1):
                w = base.copy()
                w[i] += sign * eps
                v.assign(w)
                g[i] += sign * _loss(model, batches) / (2 * eps)
        v.assign(base)
        grads.append(g)
    return grads


def test_snip_scores_match_finite_differences():
    model = _tiny_cnn()
    batches = [_data(0), _data(1)]
    variables = list(pai.prunable_weights(model).values())
    rng = np.random.default_rng(0)
    entries = [rng.choice(v.numpy().size, 25, replace=False) for v in variables]
    fd = _fd_grad(model, variables, batches, entries)
    # The normalizer needs every gradient; take it from autodiff, checked entry-wise by FD below.
    with tf.GradientTape() as tape:
        loss = tf.add_n([
            tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, model(x, training=False), from_logits=True))
            for x, y in batches
        ])
    autodiff = [g.numpy() for g in tape.gradient(loss, variables)]
    total = sum(np.abs(v.numpy() * g).sum() for v, g in zip(variables, autodiff))
    got = pai.snip_scores(model, batches)
    for g, f, v, picked in zip(got.values(), fd, variables, entries):
        expected = np.abs(v.numpy().ravel()[picked] * f.ravel()[picked]) / total
        np.testing.assert_allclose(g.ravel()[picked], expected, rtol=1e-5, atol=1e-12)
    np.testing.assert_allclose(sum(g.sum() for g in got.values()), 1.0, rtol=1e-12)
    masks = pai.snip(model, batches, 0.3)
    flat = np.concatenate([g.ravel() for g in got.values()])
    kept = np.concatenate([m.ravel() for m in masks.values()]).astype(bool)
    assert kept.sum() == round(0.3 * flat.size) and flat[kept].min() >= flat[~kept].max()


def test_grasp_scores_match_hessian_gradient_finite_differences():
    model = _tiny_cnn()
    batches = [_data(2), _data(3)]
    temperature = 200.0
    variables = list(pai.prunable_weights(model).values())

    def grad(params):
        for v, p in zip(variables, params):
            v.assign(p)
        with tf.GradientTape() as tape:
            loss = tf.add_n([
                tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, model(x, training=False) / temperature, from_logits=True))
                for x, y in batches
            ])
        return [g.numpy() for g in tape.gradient(loss, variables)]

    base = [v.numpy() for v in variables]
    g = grad(base)
    eps = 1e-3 / max(np.abs(np.concatenate([a.ravel() for a in g])).max(), 1e-12)
    plus = grad([b + eps * d for b, d in zip(base, g)])
    minus = grad([b - eps * d for b, d in zip(base, g)])
    for v, b in zip(variables, base):
        v.assign(b)
    hg = [(p - m) / (2 * eps) for p, m in zip(plus, minus)]
    raw = [b * h for b, h in zip(base, hg)]
    norm = abs(sum(r.sum() for r in raw)) + 1e-10
    got = pai.grasp_scores(model, batches, temperature=temperature)
    scale = max(np.abs(r).max() for r in raw) / norm
    for s, r in zip(got.values(), raw):
        np.testing.assert_allclose(s, r / norm, rtol=1e-4, atol=1e-6 * scale)
    # GraSP prunes the lowest w * Hg (the paper removes the highest -w * Hg).
    masks = pai.grasp(model, batches, 0.25, temperature=temperature)
    flat = np.concatenate([s.ravel() for s in got.values()])
    kept = np.concatenate([m.ravel() for m in masks.values()]).astype(bool)
    assert flat[kept].min() >= flat[~kept].max()


def test_snip_and_grasp_accept_datasets_and_one_hot_labels():
    model = _tiny_cnn("float32")
    x, y = _data(0, n=8)
    x = x.astype("float32")
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(4)
    by_dataset = pai.snip_scores(model, ds)
    by_batches = pai.snip_scores(model, [(x[:4], y[:4]), (x[4:], y[4:])])
    one_hot = pai.snip_scores(model, [(x[:4], np.eye(4)[y[:4]]), (x[4:], np.eye(4)[y[4:]])])
    for p in by_dataset:
        np.testing.assert_allclose(by_dataset[p], by_batches[p], rtol=1e-5)
        np.testing.assert_allclose(one_hot[p], by_batches[p], rtol=1e-5)
    assert abs(sum(s.sum() for s in by_dataset.values()) - 1) < 1e-9
    one = pai.grasp(model, ds, 0.5, num_batches=1)
    assert _kept(one) == round(0.5 * _size(one))
    with pytest.raises(ValueError, match="infinite"):
        pai.snip(model, ds.repeat(), 0.5)


# -- masks: training, distribution, save/load --------------------------------------------


def _assert_masked(model, masks):
    weights = {v.path: v for v in model.weights}
    for path, mask in masks.items():
        w = weights[path].numpy()
        assert np.all(w[mask == 0] == 0), path
        if path.endswith("kernel"):  # biases start at zero
            assert np.count_nonzero(w[mask == 1]) == np.count_nonzero(mask), path


def test_masks_survive_sgd_momentum_weight_decay_and_keras_round_trip(tmp_path):
    model = _small_classifier()
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
    model = _small_classifier()
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
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2")
    out = subprocess.run([sys.executable, "-c", _MIRRORED], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "OK 10" in out.stdout


# -- random masks at several granularities ------------------------------------------


@pytest.mark.parametrize("builder", ["resnet20", "mixed"])
@pytest.mark.parametrize("granularity", ["weight", "filter", "channel"])
def test_random_masks_hit_layer_densities_within_one_unit(builder, granularity, resnet20):
    model = resnet20 if builder == "resnet20" else _mixed_cnn()
    rng = np.random.default_rng(0)
    targets = {p: float(rng.uniform(0.05, 0.9)) for p in pai.prunable_weights(model)}
    masks = pai.random_masks(model, targets, granularity, seed=0)
    shapes = {v.path: tuple(v.shape) for v in model.weights}
    for path, mask in masks.items():
        shape, n = shapes[path], mask.size
        kept = np.count_nonzero(mask)
        depthwise = path in ("dw/kernel", "sep/depthwise_kernel")
        if granularity == "weight":
            assert kept == round(targets[path] * n)
        elif granularity == "filter":
            unit = math.prod(shape[:-2])
            assert abs(kept - targets[path] * n) <= unit / 2 + 1e-9, path
            assert kept % unit == 0
        else:
            unit = math.prod(shape[:-2]) * (shape[-1] if depthwise else max(shape[-2], shape[-1]))
            assert abs(kept - targets[path] * n) <= unit, path
            # Whole channels: the kernel mask is an outer product of channel masks.
            in_axis, out_axis = (-1, -2) if path == "tr/kernel" else (-2, -1)
            if len(shape) == 2:
                in_axis, out_axis = 0, 1
            io = np.moveaxis(mask, (in_axis, out_axis), (-2, -1)).reshape(-1, shape[in_axis], shape[out_axis])
            assert (io == io[0]).all(), path
            rows, cols = io[0].any(axis=1), io[0].any(axis=0)
            np.testing.assert_array_equal(io[0], np.outer(rows, cols))


def test_channel_masks_align_along_channel_groups(resnet20):
    densities = {p: 0.3 for p in pai.prunable_weights(resnet20)}
    masks = pai.random_masks(resnet20, densities, "channel", seed=2)

    def outs(p):
        return masks[p].any(axis=(0, 1, 2))

    def ins(p):
        return masks[p].any(axis=(0, 1, 3))

    pairs = [
        ("stage1_block1_conv1/kernel", "stage1_block1_conv2/kernel"),  # through BN + ReLU
        ("stem_conv/kernel", "stage1_block2_conv1/kernel"),  # along the residual stream
        ("stage1_block3_conv2/kernel", "stage2_block1_shortcut_conv/kernel"),
    ]
    for writer, reader in pairs:
        w, r = outs(writer), ins(reader)
        assert np.all(w <= r) or np.all(r <= w), (writer, reader)  # nested channel sets


def test_remove_detached_matches_synaptic_flow(resnet20):
    """A kept weight is attached iff it carries synaptic flow in the linearized net.

    Exact on ResNet-20 (32x32 maps, every kernel tap sees real pixels). On the
    small mixed model single spatial positions matter (4x4 maps, a sparse
    Dense after Flatten) while connectivity is tracked per channel, so there
    the removal is only guaranteed to keep every weight that carries flow.
    """
    for granularity in ("weight", "channel"):
        masks = pai.random_masks(resnet20, 0.02, granularity, seed=4)
        cleaned = pai.remove_detached(resnet20, masks)
        flow = pai.synflow_scores(resnet20, masks)
        assert _kept(cleaned) < _kept(masks)
        for path in masks:
            expected = (masks[path] > 0) & (flow[path] > 0)
            np.testing.assert_array_equal(cleaned[path] > 0, expected, err_msg=path)
    mixed = _mixed_cnn()
    for granularity in ("weight", "channel"):
        masks = pai.random_masks(mixed, 0.08, granularity, seed=4)
        cleaned = pai.remove_detached(mixed, masks)
        flow = pai.synflow_scores(mixed, masks)
        assert _kept(cleaned) < _kept(masks)
        for path in masks:
            assert np.all(cleaned[path] <= masks[path]), path
            assert np.all(cleaned[path][flow[path] > 0] == 1), path
    # Removing detached weights twice changes nothing.
    once = pai.random_masks(resnet20, 0.02, "channel", remove_detached=True, seed=5)
    assert _kept(pai.remove_detached(resnet20, once)) == _kept(once)


def test_random_and_random_masks_are_seeded(resnet20):
    a, b, c = (pai.random(resnet20, 0.1, seed=s) for s in (1, 1, 2))
    assert all(np.array_equal(a[p], b[p]) for p in a) and not all(np.array_equal(a[p], c[p]) for p in a)
    assert _kept(a) == round(0.1 * _size(a))
    d, e = (pai.random_masks(resnet20, 0.2, "filter", seed=7) for _ in range(2))
    assert all(np.array_equal(d[p], e[p]) for p in d)


# -- reports and errors -------------------------------------------------------------


def test_layer_densities_and_sparsity_report(resnet20):
    masks = pai.random_masks(resnet20, 0.25, "weight", seed=0)
    densities = pai.layer_densities(masks)
    assert all(abs(d - 0.25) < 1 / 400 for d in densities.values())
    report = pai.sparsity_report(masks, resnet20)
    for path in masks:
        assert path in report
    kept = _kept(masks)
    assert f"{kept:,}" in report and f"{_size(masks):,}" in report
    pruned = _size(masks) - kept
    assert f"{resnet20.count_params() - pruned:,}" in report


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
    x, y = _data(0)
    x[0, 0, 0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        pai.snip(_tiny_cnn(), (x, y), 0.5)


def _se_cnn(seed=0):
    """A squeeze-excite gate (Multiply) and a 1-channel spatial gate on conv features."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((6, 6, 3))
    a = L.Conv2D(8, 3, padding="same", name="a")(inputs)
    gate = L.Dense(8, activation="sigmoid", name="gate")(L.GlobalAveragePooling2D(keepdims=True)(a))
    x = L.Multiply(name="se_multiply")([a, gate])
    spatial = L.Conv2D(1, 1, activation="sigmoid", name="spatial")(x)
    x = L.Multiply(name="spatial_multiply")([x, spatial])
    x = L.Conv2D(6, 3, name="b")(x)
    return keras.Model(inputs, L.Dense(2, name="fc")(L.Flatten()(x)))


def test_gated_models_keep_every_weight_that_carries_flow():
    model = _se_cnn()
    for granularity in ("weight", "channel"):
        masks = pai.random_masks(model, 0.1, granularity, seed=1)
        cleaned = pai.remove_detached(model, masks)
        flow = pai.synflow_scores(model, masks)
        assert _kept(cleaned) < _kept(masks)
        for path in masks:
            assert np.all(cleaned[path] <= masks[path]), path
            assert np.all(cleaned[path][flow[path] > 0] == 1), path
    masks = pai.random_masks(model, 0.3, "channel", seed=0)
    # The gate's output channels follow the features it multiplies.
    a_out, gate_out = masks["a/kernel"].any(axis=(0, 1, 2)), masks["gate/kernel"].any(axis=0)
    assert np.all(a_out <= gate_out) or np.all(gate_out <= a_out)


def test_unsupported_layer_is_named():
    inputs = keras.Input((6, 6, 3))
    a = L.Conv2D(4, 3, name="a")(inputs)
    x = L.Permute((2, 1, 3), name="odd_permute")(a)
    model = keras.Model(inputs, L.Dense(2, name="fc")(L.Flatten()(x)))
    with pytest.raises(ValueError, match="odd_permute.*Permute"):
        pai.random_masks(model, 0.5, "channel")
    masks = pai.random_masks(model, 0.5, "weight", seed=0)  # weight level needs no graph
    with pytest.raises(ValueError, match="odd_permute"):
        pai.remove_detached(model, masks)
