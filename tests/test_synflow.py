"""SynFlow (``keras_precrop.pai.synflow``) against closed forms and independent loops."""

import keras
import numpy as np
import pytest

from keras_precrop import models, pai
from tests.conftest import count_kept, count_total, grouped_cnn, kernel_mask, mixed_cnn, mlp

L = keras.layers


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
    model = mlp()
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
    for _ in range(25):  # gain ~50 per layer: R ~ 1e42 overflows float32
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
        model = mlp(seed=5)
    finally:
        keras.config.set_dtype_policy("float32")
    assert model.layers[1].compute_dtype == "float16"
    weights = [v.numpy().astype(np.float64) for v in model.weights]
    expected = _mlp_flow_scores(weights, [np.ones(w.shape) for w in weights])
    for g, e in zip(pai.synflow_scores(model).values(), expected):
        np.testing.assert_allclose(g, e, rtol=1e-5)


@pytest.mark.parametrize("schedule", ["exponential", "linear"])
def test_synflow_iterations_match_independent_loop(schedule):
    model = mlp(widths=(6, 9, 8, 4))
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
        parts = np.split(keep, np.cumsum([w.size for w in weights])[:-1])
        masks = [a.reshape(w.shape).astype(float) for a, w in zip(parts, weights)]
    got = pai.synflow(model, density, iterations=rounds, schedule=schedule, dtype="float64", verbose=0)
    for g, e in zip(got.values(), masks):
        np.testing.assert_array_equal(g, e)


def test_synflow_is_data_free_deterministic_and_leaves_model_alone():
    model = mixed_cnn(seed=3)
    before = [v.numpy().copy() for v in model.weights]
    first = pai.synflow(model, 0.1, iterations=10, verbose=0)
    again = pai.synflow(mixed_cnn(seed=3), 0.1, iterations=10, verbose=0)
    other = pai.synflow(mixed_cnn(seed=4), 0.1, iterations=10, verbose=0)
    assert all(np.array_equal(first[p], again[p]) for p in first)
    assert not all(np.array_equal(first[p], other[p]) for p in first)
    assert count_kept(first) == round(0.1 * count_total(first))
    for v, b in zip(model.weights, before):
        np.testing.assert_array_equal(v.numpy(), b)


def test_synflow_resnet20_one_percent_avoids_layer_collapse(resnet20):
    masks = pai.synflow(resnet20, 0.01, verbose=0)
    assert count_kept(masks) == round(0.01 * count_total(masks))
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
    shuffled_flow = pai.synflow_scores(resnet20, shuffled)
    assert sum(np.count_nonzero(s) for s in shuffled_flow.values()) < count_kept(shuffled)


@pytest.mark.slow
def test_synflow_resnet110_stays_finite():
    keras.utils.set_random_seed(0)
    model = models.get("resnet110")
    scores = pai.synflow_scores(model)
    total = sum(s.sum() for s in scores.values())
    assert np.isfinite(total) and total > np.finfo(np.float32).max  # would overflow float32
    masks = pai.synflow(model, 0.01, iterations=5, verbose=0)
    assert count_kept(masks) == round(0.01 * count_total(masks))


def _relu_chain(cap):
    """conv -> BN -> ReLU(max_value=cap) x 3 -> dense; ``cap=None`` is the plain-ReLU twin."""
    inputs = keras.Input((8, 8, 3))
    x = inputs
    for i in range(3):
        x = keras.layers.Conv2D(8, 3, padding="same", name=f"conv{i}")(x)
        x = keras.layers.BatchNormalization(name=f"bn{i}")(x)
        x = keras.layers.ReLU(max_value=cap, name=f"relu{i}")(x)
    x = keras.layers.Conv2D(8, 1, activation="relu6" if cap else "relu", name="conv_act")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(4, name="head")(x))


def test_synflow_treats_capped_relus_as_relus():
    # With ReLU6 the all-positive flow (about 1e3 here) would saturate at 6 and
    # zero every gradient behind it; the reference is the same net with ReLUs.
    keras.utils.set_random_seed(3)
    capped = _relu_chain(6.0)
    plain = _relu_chain(None)
    plain.set_weights(capped.get_weights())
    masks = pai.synflow(capped, 0.2, iterations=10, verbose=0)
    expected = pai.synflow(plain, 0.2, iterations=10, verbose=0)
    assert masks.keys() == expected.keys()
    for path in masks:
        np.testing.assert_array_equal(masks[path], expected[path], err_msg=path)
    assert all(mask.sum() > 0 for mask in masks.values())
    assert [layer.max_value for layer in capped.layers if isinstance(layer, keras.layers.ReLU)] == [6.0] * 3


def test_synflow_scores_grouped_kernels():
    model = grouped_cnn()
    masks = pai.synflow(model, 0.3, iterations=5, verbose=0)
    total = sum(m.size for m in masks.values())
    assert sum(m.sum() for m in masks.values()) == round(0.3 * total)
    assert kernel_mask(masks, "grouped").shape == (3, 3, 4, 24)
