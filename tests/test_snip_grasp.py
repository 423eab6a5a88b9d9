"""SNIP and GraSP scores against finite differences."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_precrop import pai
from tests.conftest import count_kept, count_total, tiny_batch, tiny_cnn


def _loss(model, batches):
    total = 0.0
    for x, y in batches:
        logits = model(x, training=False)
        losses = keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)
        total += float(tf.reduce_mean(losses))
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
    model = tiny_cnn()
    batches = [tiny_batch(0), tiny_batch(1)]
    variables = list(pai.prunable_weights(model).values())
    rng = np.random.default_rng(0)
    entries = [rng.choice(v.numpy().size, 25, replace=False) for v in variables]
    fd = _fd_grad(model, variables, batches, entries)
    # The normalizer needs every gradient; take it from autodiff, checked entry-wise by FD below.
    with tf.GradientTape() as tape:
        loss = tf.add_n([
            tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
                y, model(x, training=False), from_logits=True))
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
    model = tiny_cnn()
    batches = [tiny_batch(2), tiny_batch(3)]
    temperature = 200.0
    variables = list(pai.prunable_weights(model).values())

    def grad(params):
        for v, p in zip(variables, params):
            v.assign(p)
        with tf.GradientTape() as tape:
            loss = tf.add_n([
                tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
                    y, model(x, training=False) / temperature, from_logits=True))
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
    model = tiny_cnn("float32")
    x, y = tiny_batch(0, n=8)
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
    assert count_kept(one) == round(0.5 * count_total(one))
    with pytest.raises(ValueError, match="infinite"):
        pai.snip(model, ds.repeat(), 0.5)
