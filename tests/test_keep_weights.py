"""Pruning a trained model: the surviving channels keep their weights (issue 29).

Each check has a reference of its own: the original model's outputs (a plan
that keeps every width must compute what the original does, streams
permuted or not), scores computed here by hand from the weights (L1) or from
activations and their gradients taken with TensorFlow's tape (Taylor), and
the original weights themselves (every weight of a pruned model must be the
original's at one index per position along each axis, found here by value).
"""

import keras
import numpy as np
import pytest

import keras_precrop as kp
from tests.conftest import assert_matches_plan, layers_by_path, mixed_cnn
from tests.test_applications import CONSTRUCTORS, MIN_SIZE

L = keras.layers


def randomize(model, seed=0, kernels=False):
    """Random values in the biases and BatchNormalization weights and statistics, which start out
    constant, so a wrong copy shows. With ``kernels``, every float weight instead holds the numbers
    1..size in a random order: distinct, so each value tells where it was (too large to run)."""
    rng = np.random.default_rng(seed)
    for w in model.weights:
        if "float" not in str(w.dtype) or w.path.startswith("normalization"):
            continue
        shape = tuple(w.shape)
        if kernels:
            w.assign((rng.permutation(int(np.prod(shape))) + 1).reshape(shape).astype(w.dtype))
        elif w.name in ("moving_variance", "gamma"):
            w.assign(rng.uniform(0.5, 1.5, shape).astype(w.dtype))
        elif w.name in ("moving_mean", "beta", "bias"):
            w.assign(rng.normal(0, 0.1, shape).astype(w.dtype))
    return model


def outputs(model, x):
    return np.asarray(model(x, training=False))


def assert_same_function(model, new, x, tol=1e-5):
    """``new`` computes ``model``'s outputs, to ``tol`` relative to their largest magnitude."""
    a, b = outputs(model, x), outputs(new, x)
    assert a.shape == b.shape
    assert np.abs(a - b).max() <= tol * max(1.0, np.abs(a).max()), np.abs(a - b).max()


def _block_diagonal(kernel, groups):
    """A grouped kernel ``(..., c_in / groups, c_out)`` over all ``c_in`` inputs (zero across groups)."""
    a, n = kernel.shape[-2:]
    full = np.zeros(kernel.shape[:-2] + (a * groups, n), kernel.dtype)
    b = n // groups
    for j in range(groups):
        full[..., j * a:(j + 1) * a, j * b:(j + 1) * b] = kernel[..., j * b:(j + 1) * b]
    return full


def _lookup(flat, values):
    """Where each of ``values`` is in ``flat`` (a flat position) and whether it occurs there once.

    Weights that ``randomize(kernels=True)`` filled hold 1..size, so an array of positions by
    value finds them at once; other weights are sorted.
    """
    keys = flat.astype(np.int64)
    if flat.size and (keys == flat).all() and keys.min() >= 1 and keys.max() <= flat.size:
        where = np.zeros(flat.size + 1, np.int64)
        where[keys] = np.arange(flat.size)
        counts = np.bincount(keys, minlength=flat.size + 1)
        asked = np.clip(values, 0, flat.size).astype(np.int64)
        assert (asked == values).all() and counts[asked].all(), "a value that is not the original's"
        return where[asked], counts[asked] == 1
    sorted_values, first, counts = np.unique(flat, return_index=True, return_counts=True)
    pos = np.minimum(np.searchsorted(sorted_values, values), len(sorted_values) - 1)
    assert (sorted_values[pos] == values).all(), "a value that is not the original's"
    return first[pos], counts[pos] == 1


def gathered_indices(old, new):
    """The index along each axis of ``old`` that each index of ``new`` was taken from.

    Every value of ``new`` is looked up in ``old``; the positions it was found at must be an outer
    product of one index per position along each axis, ``new == old[np.ix_(*indices)]``. Values
    that occur more than once in ``old`` are found but not placed (``-1`` where none is placed).
    """
    old, new = np.asarray(old), np.asarray(new)
    if new.ndim == 0:  # a scalar (a count) is copied as is
        assert new == old
        return []
    found, once = _lookup(old.ravel(), new.ravel())
    unique = once.reshape(new.shape)
    coords = np.unravel_index(found, old.shape)
    indices = []
    for axis in range(new.ndim):
        rows = np.moveaxis(coords[axis].reshape(new.shape), axis, 0).reshape(new.shape[axis], -1)
        mask = np.moveaxis(unique, axis, 0).reshape(new.shape[axis], -1)
        low = np.where(mask, rows, np.iinfo(np.int64).max).min(1)
        high = np.where(mask, rows, -1).max(1)
        placed = mask.any(1)
        assert (low[placed] == high[placed]).all(), f"axis {axis} is not one slice"
        assert len(set(low[placed])) == placed.sum(), f"axis {axis} repeats an index"
        indices.append(np.where(placed, low, -1))
    return indices


def assert_sliced(model, new):
    """Every weight of every layer of ``new`` is a slice of the same layer's original weight.

    Layers are paired by their place (:func:`layers_by_path`: a subclassed model's or a
    composite's sublayers by the names its trace gives them, as the rebuilt model has them).
    """
    old_layers = dict(layers_by_path(model))
    checked = 0
    for path, layer in layers_by_path(new):
        old = old_layers.get(path)
        if old is None or not layer.weights:
            continue
        groups = getattr(layer, "groups", 1)
        for w_old, w_new in zip(old.weights, layer.weights):
            a, b = np.asarray(w_old), np.asarray(w_new)
            if groups > 1 and w_old.name == "kernel" and a.shape[-2] > 1:
                a, b = _block_diagonal(a, old.groups), _block_diagonal(b, groups)
            gathered_indices(a, b)
            checked += 1
    assert checked


# -- a plan that keeps every width computes what the original computes ------------------


def _identity_plan(model, **options):
    plan = kp.plan(model, params=1.0, **options)
    assert all(v["new"] == v["width"] for v in plan.variables)
    return plan


def test_an_identity_plan_with_kept_weights_is_the_original_and_permutes_its_streams():
    model = randomize(kp.models.get("resnet20"))
    x = np.random.default_rng(1).normal(size=(4, 32, 32, 3)).astype("float32")
    plan = _identity_plan(model)
    new = kp.apply_plan(model, plan, weights="keep")
    assert_same_function(model, new, x)
    # The streams are permuted (best channels first), in every writer and reader alike.
    stem_old, stem_new = (np.asarray(m.get_layer("stem_conv").kernel) for m in (model, new))
    (_, _, _, perm) = gathered_indices(stem_old, stem_new)
    assert sorted(perm) == list(range(16)) and list(perm) != list(range(16))
    (_, _, rows, _) = gathered_indices(*(np.asarray(m.get_layer("stage1_block1_conv1").kernel)
                                         for m in (model, new)))
    assert list(rows) == list(perm)
    # Under residual="tie" nothing is permuted: the weights are the original's.
    tied = kp.apply_plan(model, _identity_plan(model, residual="tie"), weights="keep")
    for a, b in zip(model.weights, tied.weights):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert_same_function(model, tied, x, tol=0)


@pytest.mark.parametrize("name", ["MobileNetV2", *(pytest.param(name, marks=pytest.mark.slow)
                                                    for name in ("EfficientNetB0", "DenseNet121"))])
def test_an_identity_plan_keeps_keras_applications(name):
    keras.utils.set_random_seed(0)
    model = getattr(keras.applications, name)(input_shape=(64, 64, 3), weights=None, classes=10,
                                              classifier_activation=None)
    randomize(model)
    x = np.random.default_rng(1).normal(size=(2, 64, 64, 3)).astype("float32")
    assert_same_function(model, kp.apply_plan(model, _identity_plan(model), weights="keep"), x)


def test_every_layout_keeps_its_function_and_slices():
    """Depthwise with a multiplier, separable, transpose, concatenation, flatten into dense."""
    model = randomize(mixed_cnn())
    x = np.random.default_rng(1).normal(size=(3, 8, 8, 3)).astype("float32")
    assert_same_function(model, kp.apply_plan(model, _identity_plan(model), weights="keep"), x)
    for importance in ("l1", "l2", "random"):
        small = kp.precrop(randomize(model, kernels=True), params=0.5, weights="keep",
                           importance=importance)
        assert_matches_plan(model, small.precrop_plan, small)
        assert_sliced(model, small)
    kernels = {name: gathered_indices(*(np.asarray(m.get_layer(name).weights[i]) for m in (model, small)))
               for name, i in (("c1", 0), ("dw", 0), ("pw", 0), ("sep", 0), ("tr", 0), ("fc", 0))}
    kernels["sep_pointwise"] = gathered_indices(*(np.asarray(m.get_layer("sep").pointwise_kernel)
                                                  for m in (model, small)))
    # The channels agree wherever a tensor is written and read: the stream a = relu(bn1(c1)) is
    # read by the depthwise conv (2 channels per input, read in turn by the pointwise conv) and,
    # added to pw's output, by the separable conv; the concatenation [stream, sep] is read by the
    # transposed conv (kernel (..., out, in)), whose output the dense layer reads behind a flatten.
    stream, dw_channels = kernels["c1"][3], kernels["dw"][2]
    assert list(dw_channels) == list(stream)
    assert list(kernels["pw"][2]) == [2 * c + m for c in dw_channels for m in range(2)]
    assert list(kernels["pw"][3]) == list(stream[:len(kernels["pw"][3])])
    assert list(kernels["sep"][2]) == list(stream)
    concat = list(stream) + [8 + c for c in kernels["sep_pointwise"][3]]
    assert list(kernels["tr"][3]) == concat
    assert list(kernels["fc"][0]) == [p * 5 + c for p in range(16) for c in kernels["tr"][2]]


def test_a_flattened_stream_is_read_in_its_permuted_order():
    """A dense layer behind a flatten reads each pixel's channels in the stream's new order."""
    keras.utils.set_random_seed(0)
    x = keras.Input((4, 4, 3))
    s = L.ReLU()(L.BatchNormalization(name="bn")(L.Conv2D(6, 3, padding="same", name="c1")(x)))
    s = L.Add()([s, L.Conv2D(6, 3, padding="same", name="c2")(s)])
    s = L.Add()([s, L.Conv2D(6, 1, name="c3")(s)])
    model = randomize(keras.Model(x, L.Dense(3, name="fc")(L.Flatten()(s))))
    new = kp.apply_plan(model, _identity_plan(model), weights="keep")
    perm = gathered_indices(*(np.asarray(m.get_layer("c1").kernel) for m in (model, new)))[3]
    assert list(perm) != list(range(6))
    assert_same_function(model, new, np.random.default_rng(1).normal(size=(2, 4, 4, 3)).astype("float32"))


def test_a_pruned_model_prunes_again_with_its_weights():
    """Its ChannelSlices and PrefixAdds keep prefixes of streams already narrower than their writers."""
    once = kp.precrop(randomize(kp.models.get("resnet20")), flops=0.5, weights="keep")
    assert {"ChannelSlice", "PrefixAdd"} <= {type(layer).__name__ for layer in once.layers}
    x = np.random.default_rng(1).normal(size=(2, 32, 32, 3)).astype("float32")
    assert_same_function(once, kp.apply_plan(once, _identity_plan(once), weights="keep"), x)
    twice = kp.precrop(randomize(once, kernels=True), params=0.5, weights="keep")
    assert_matches_plan(once, twice.precrop_plan, twice)
    assert_sliced(once, twice)


# -- the kept channels are the best ones, by scores computed here -------------------


def _block_model():
    """conv-BN-ReLU, conv-BN-ReLU into a residual add with a 1x1 conv, pooled into a dense head."""
    keras.utils.set_random_seed(0)
    x = keras.Input((6, 6, 3))
    h = L.ReLU(name="r1")(L.BatchNormalization(name="bn1")(L.Conv2D(8, 3, padding="same", name="c1")(x)))
    s = L.ReLU(name="r2")(L.BatchNormalization(name="bn2")(L.Conv2D(6, 3, padding="same", name="c2")(h)))
    s = L.Add(name="add")([s, L.Conv2D(6, 1, name="c3")(s)])
    return keras.Model(x, L.Dense(4, name="fc")(L.GlobalAveragePooling2D(name="gap")(s)))


def _share(*per_channel):
    """One layer's share of a channel score: its magnitudes summed, divided by their mean."""
    total = np.sum(per_channel, axis=0)
    return total / total.mean()


def _l1_scores(model):
    """The L1 scores of c1's channels and of the stream's (c2, bn2, c3, the add), by hand."""
    w = {v.path: np.abs(np.asarray(v, np.float64)) for v in model.weights}
    first = (_share(w["c1/kernel"].sum((0, 1, 2)), w["c1/bias"]) + _share(w["bn1/gamma"], w["bn1/beta"])
             + _share(w["c2/kernel"].sum((0, 1, 3))))
    stream = (_share(w["c2/kernel"].sum((0, 1, 2)), w["c2/bias"]) + _share(w["bn2/gamma"], w["bn2/beta"])
              + _share(w["c3/kernel"].sum((0, 1, 3))) + _share(w["c3/kernel"].sum((0, 1, 2)), w["c3/bias"])
              + _share(w["fc/kernel"].sum(1)))
    return first, stream


def _kept(model, new):
    """The original channels of c1 (its filters), of c2, c3 (their filters) and of the head's rows."""
    idx = {name: gathered_indices(*(np.asarray(m.get_layer(name).kernel) for m in (model, new)))
           for name in ("c1", "c2", "c3", "fc")}
    return idx["c1"][3], idx["c2"][3], idx["c3"][3], idx["fc"][0]


def _top(score, k):
    return sorted(np.argsort(-score)[:k])


def test_tied_groups_keep_their_top_l1_channels():
    model = randomize(_block_model(), kernels=True)
    first, stream = _l1_scores(model)
    small = kp.precrop(model, params=0.5, mode="uniform", residual="tie", weights="keep")
    c1, c2, c3, fc = _kept(model, small)
    assert 0 < len(c1) < 8 and 0 < len(c2) < 6
    assert list(c1) == _top(first, len(c1))
    assert list(c2) == list(c3) == list(fc) == _top(stream, len(c2))
    # Every kept kernel slice is the original's at those channels.
    for name, ins, outs in (("c1", range(3), c1), ("c2", c1, c2), ("c3", c2, c3)):
        np.testing.assert_array_equal(small.get_layer(name).kernel,
                                      np.asarray(model.get_layer(name).kernel)[:, :, ins][..., outs])
    np.testing.assert_array_equal(small.get_layer("bn2").moving_mean,
                                  np.asarray(model.get_layer("bn2").moving_mean)[c2])


def test_a_stream_is_ordered_by_its_score_and_each_member_keeps_a_prefix():
    model = randomize(_block_model(), kernels=True)
    _, stream = _l1_scores(model)  # prefix mode: c3 writes and the head reads its own prefix
    order = list(np.argsort(-stream))
    small = kp.precrop(model, params=0.5, mode="uniform", weights="keep")
    _, c2, c3, fc = _kept(model, small)
    assert 6 > len(c2) > len(c3)  # the writer c3 and the head read shorter prefixes
    for kept in (c2, c3, fc):
        assert list(kept) == order[:len(kept)]


def _taylor_scores(model, x, y):
    """First-order Taylor scores of c1's and the stream's channels from activations and their
    gradients, taken with TensorFlow's tape (the stream as c3 reads it is a tensor of its own)."""
    import tensorflow as tf

    layer = model.get_layer
    with tf.GradientTape() as tape:
        a1 = layer("c1")(x)
        y1 = layer("bn1")(a1, training=False)
        r1 = layer("r1")(y1)
        a2 = layer("c2")(r1)
        y2 = layer("bn2")(a2, training=False)
        s = layer("r2")(y2)
        s_read = tf.identity(s)  # the stream as c3 reads it
        a3 = layer("c3")(s_read)
        g = layer("gap")(s + a3)
        logits = layer("fc")(g)
        loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))
    tensors = [a1, y1, r1, a2, y2, s_read, a3, g]  # recorded: they depend on the weights
    grads = tape.gradient(loss, tensors)
    shares = [_share(np.abs(np.sum(np.asarray(t * d, np.float64), axis=tuple(range(len(t.shape) - 1)))))
              for t, d in zip(tensors, grads)]
    return sum(shares[:3]), sum(shares[3:])


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="the reference uses TF's tape")
def test_taylor_keeps_the_channels_with_the_largest_activation_times_gradient():
    model = randomize(_block_model())
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(8, 6, 6, 3)).astype("float32"), rng.integers(0, 4, 8)
    first, stream = _taylor_scores(model, x, y)
    small = kp.precrop(model, params=0.5, mode="uniform", residual="tie", weights="keep",
                       importance="taylor", data=(x, y))
    c1, c2, _, _ = _kept(model, small)
    assert list(c1) == _top(first, len(c1))
    assert list(c2) == _top(stream, len(c2))


def test_random_importance_is_seeded():
    model = randomize(_block_model(), kernels=True)
    plan = kp.plan(model, params=0.5, mode="uniform", residual="tie")
    chosen = [_kept(model, kp.apply_plan(model, plan, weights="keep", importance="random", seed=seed))[0]
              for seed in (0, 0, 1, 2)]
    assert list(chosen[0]) == list(chosen[1])
    assert any(list(c) != list(chosen[0]) for c in chosen[2:])


# -- grouped convolutions, growing layers, open input sizes, saving ------------------


def _grouped_model():
    """A grouped conv (4 groups) between a conv and a concatenation of both."""
    keras.utils.set_random_seed(0)
    x = keras.Input((8, 8, 3))
    a = L.ReLU()(L.BatchNormalization(name="bn1")(L.Conv2D(8, 3, padding="same", name="c1")(x)))
    g = L.Conv2D(12, 3, padding="same", groups=4, name="grouped")(a)
    g = L.ReLU()(L.BatchNormalization(name="bn2")(g))
    c = L.Concatenate()([a, g])
    return keras.Model(x, L.Dense(3, name="fc")(L.GlobalAveragePooling2D()(c)))


def test_a_grouped_conv_keeps_each_group_its_own_channels():
    model = randomize(_grouped_model())
    x = np.random.default_rng(1).normal(size=(3, 8, 8, 3)).astype("float32")
    assert_same_function(model, kp.apply_plan(model, _identity_plan(model), weights="keep"), x)
    small = kp.precrop(randomize(model, kernels=True), params=0.5, weights="keep")
    assert_matches_plan(model, small.precrop_plan, small)
    assert_sliced(model, small)
    ins = gathered_indices(*(np.asarray(m.get_layer("c1").kernel) for m in (model, small)))[3]
    outs = gathered_indices(*(np.asarray(m.get_layer("bn2").gamma) for m in (model, small)))[0]
    for kept, width in ((ins, 8), (outs, 12)):  # new group j holds channels of original group j
        assert len(kept) % 4 == 0 and len(kept) < width
        new_group = np.arange(len(kept)) // (len(kept) // 4)
        assert (np.asarray(kept) // (width // 4) == new_group).all()
    rows = gathered_indices(*(np.asarray(m.get_layer("fc").kernel) for m in (model, small)))[0]
    assert list(rows) == list(ins) + [8 + c for c in outs]  # the concatenation, part by part


def _self_applied_conv():
    """A 1x1 convolution applied twice, the second time to its own output: in and out one group."""
    keras.utils.set_random_seed(0)
    x = keras.Input((8, 8, 3))
    shared = L.Conv2D(8, 1, name="shared")
    h = shared(shared(L.Conv2D(8, 3, padding="same", name="stem")(x)))
    return keras.Model(x, L.Dense(10, name="head")(L.GlobalAveragePooling2D()(h)))


@pytest.mark.parametrize("build", [lambda: kp.models.get("resnet20"), mixed_cnn, _grouped_model,
                                   _self_applied_conv],
                         ids=["resnet20", "mixed_cnn", "grouped", "self_applied"])
def test_widened_layers_start_silent(build):
    """PreConfig with kept weights: new channels start from the initializer and the weights that
    read them at zero, so the widened model computes the original's outputs."""
    model = randomize(build())
    size = model.input.shape[1]
    wide = kp.reconfigure(model, params=1.5, mode="uniform", weights="keep")
    assert all(v["new"] >= v["width"] for v in wide.precrop_plan.variables)
    assert any(v["new"] > v["width"] for v in wide.precrop_plan.variables)
    x = np.random.default_rng(1).normal(size=(3, size, size, 3)).astype("float32")
    assert_same_function(model, wide, x)
    assert_matches_plan(model, wide.precrop_plan, wide)


def test_widening_into_a_normalization_over_channels_is_refused():
    keras.utils.set_random_seed(0)
    x = keras.Input((8, 8, 3))
    h = L.LayerNormalization(name="ln")(L.Conv2D(8, 3, padding="same", name="c1")(x))
    h = L.Conv2D(4, 3, padding="same", name="c3")(L.Conv2D(16, 3, padding="same", name="c2")(h))
    model = keras.Model(x, L.Dense(3, name="fc")(L.GlobalAveragePooling2D()(h)))
    with pytest.raises(kp.ArgumentError, match="weights='keep' cannot widen the channels of 'ln'") as err:
        kp.reconfigure(model, params=1.0, flops=1.0, mode="layerwise", weights="keep")
    assert err.value.arguments == {"weights": "keep", "ignore": ["ln"]}


def test_an_open_input_size_keeps_the_weights_through_its_copies():
    """``apply_plan`` plans a copy at a defined size and copies the result back to the open size."""
    keras.utils.set_random_seed(0)
    x = keras.Input((None, None, 3))
    h = L.ReLU()(L.BatchNormalization(name="bn")(L.Conv2D(8, 3, padding="same", name="c1")(x)))
    h = L.Conv2D(6, 3, padding="same", name="c2")(h)
    model = randomize(keras.Model(x, L.Dense(3, name="fc")(L.GlobalAveragePooling2D()(h))))
    rng = np.random.default_rng(1)
    data = rng.normal(size=(4, 12, 12, 3)).astype("float32"), rng.integers(0, 3, 4)
    same = kp.apply_plan(model, _identity_plan(model), weights="keep")
    assert tuple(same.input.shape) == (None, None, None, 3)
    assert_same_function(model, same, data[0])
    for options in (dict(), dict(importance="taylor", data=data)):
        small = kp.precrop(model, params=0.5, weights="keep", **options)
        assert tuple(small.input.shape) == (None, None, None, 3)
        assert_sliced(model, small)


def test_an_open_input_size_keeps_its_input_dtype():
    """uint8 images in, rescaled by the model: the copies at a defined size and back keep the dtype."""
    keras.utils.set_random_seed(0)
    x = keras.Input((None, None, 3), dtype="uint8", name="image")
    h = L.Conv2D(8, 3, padding="same", name="c1")(L.Rescaling(1 / 255.0)(x))
    model = keras.Model(x, L.Dense(3, name="fc")(L.GlobalAveragePooling2D()(h)))
    images = np.random.default_rng(0).integers(0, 255, (2, 5, 5, 3)).astype("uint8")
    for plan in (_identity_plan(model), kp.plan(model, params=0.5)):
        small = kp.apply_plan(model, plan, weights="keep")
        assert small.inputs[0].dtype == "uint8"
    assert_same_function(model, kp.apply_plan(model, _identity_plan(model), weights="keep"), images)


def test_a_weight_frozen_alone_stays_frozen():
    """``weight.trainable = False`` on one weight of a trainable layer: the layer's config, which the
    rebuild reads, does not say so; the kept weight carries its flag."""
    model = _block_model()
    model.get_layer("fc").bias.trainable = False
    model.get_layer("c1").kernel.trainable = False
    small = kp.precrop(model, params=0.5, weights="keep")
    assert [w.path for w in small.trainable_weights] == [w.path for w in model.trainable_weights]
    assert [w.path for w in model.trainable_weights if w.path in ("fc/bias", "c1/kernel")] == []


def test_layers_the_rebuild_inserts_take_the_model_s_dtype_policy():
    """A ``PrefixAdd`` or ``ChannelSlice`` the rebuild adds computes in the policy of the layer it
    stands for, not in the global policy of the moment the model is pruned."""
    def pruned(build_policy, prune_policy):
        try:
            keras.config.set_dtype_policy(build_policy)
            model = kp.models.get("resnet20")
            plan = kp.plan(model, params=0.3)
            keras.config.set_dtype_policy(prune_policy)
            return kp.apply_plan(model, plan)
        finally:
            keras.config.set_dtype_policy("float32")

    for build, prune in (("float32", "mixed_float16"), ("mixed_float16", "float32")):
        inserted = [layer for layer in pruned(build, prune).layers
                    if type(layer).__name__ in ("PrefixAdd", "ChannelSlice")]
        assert inserted and {layer.dtype_policy.name for layer in inserted} == {build}


def test_a_model_with_kept_weights_saves_and_loads(tmp_path):
    model = randomize(kp.models.get("resnet20"))
    small = kp.precrop(model, params=0.5, weights="keep")
    small.save(tmp_path / "small.keras")
    loaded = keras.saving.load_model(tmp_path / "small.keras")
    for a, b in zip(small.weights, loaded.weights):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    x = np.random.default_rng(1).normal(size=(2, 32, 32, 3)).astype("float32")
    np.testing.assert_array_equal(outputs(loaded, x), outputs(small, x))


# -- fine-tuning ----------------------------------------------------------------------


def test_fine_tune_trains_the_student_alone_and_distilled():
    teacher = randomize(_block_model())
    student = kp.precrop(teacher, params=0.5, weights="keep")
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(8, 6, 6, 3)).astype("float32"), rng.integers(0, 4, 8)
    teacher_weights = [np.asarray(w) for w in teacher.weights]
    for options, logged in ((dict(), "loss"), (dict(teacher=teacher, alpha=0.3), "distillation_loss")):
        before = [np.asarray(w) for w in student.trainable_weights]
        history = kp.fine_tune(student, (x, y), epochs=1, batch_size=8, verbose=0, **options)
        assert logged in history.history and np.isfinite(history.history["loss"][0])
        assert any((np.asarray(w) != b).any() for w, b in zip(student.trainable_weights, before))
    assert teacher.trainable  # Distiller froze it; fine_tune gives it back
    for w, before in zip(teacher.weights, teacher_weights):
        np.testing.assert_array_equal(np.asarray(w), before)
    with pytest.raises(kp.ArgumentError, match="share variables"):
        kp.fine_tune(teacher, (x, y), teacher=teacher)


class _Batches(keras.utils.PyDataset):
    """``(x, y)`` in batches of ``size``: data with a length, not an array."""

    def __init__(self, x, y, size):
        super().__init__()
        self.x, self.y, self.size = x, y, size

    def __len__(self):
        return -(-len(self.x) // self.size)

    def __getitem__(self, i):
        part = slice(i * self.size, (i + 1) * self.size)
        return self.x[part], self.y[part]


def test_fine_tune_decays_the_learning_rate_to_zero_over_its_epochs():
    """The rate starts at ``learning_rate`` and reaches 0 at the last step (arrays: ceil(n / batch)
    steps an epoch; a dataset: its length); a schedule passed in is used as given."""
    student = kp.precrop(randomize(_block_model()), params=0.5, weights="keep")
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(20, 6, 6, 3)).astype("float32"), rng.integers(0, 4, 20)
    kp.fine_tune(student, (x, y), epochs=2, batch_size=8, learning_rate=0.05, verbose=0)
    assert int(student.optimizer.iterations) == 6  # 2 epochs of ceil(20 / 8) batches
    assert float(student.optimizer.learning_rate) == pytest.approx(0.0)
    schedule = student.optimizer._learning_rate
    assert float(schedule(0)) == pytest.approx(0.05) and float(schedule(3)) == pytest.approx(0.025)
    kp.fine_tune(student, _Batches(x, y, 5), epochs=1, learning_rate=0.05, verbose=0)
    assert float(student.optimizer.learning_rate) == pytest.approx(0.0)  # 4 batches, rate 0 at the 4th
    constant = keras.optimizers.schedules.ExponentialDecay(0.02, 1000, 1.0)
    kp.fine_tune(student, (x, y), epochs=1, batch_size=8, learning_rate=constant, verbose=0)
    assert float(student.optimizer.learning_rate) == pytest.approx(0.02)
    with pytest.raises(kp.ArgumentError, match="learning_rate=-1"):
        kp.fine_tune(student, (x, y), learning_rate=-1)
    with pytest.raises(kp.ArgumentError, match="learning_rate=True"):
        kp.fine_tune(student, (x, y), learning_rate=True)


# -- every keras.applications constructor ----------------------------------------


def _check_application(name):
    """``weights="keep"`` at half the parameters: the plan's counts, each weight a slice of the original's."""
    size = MIN_SIZE.get(name, 32)
    keras.utils.set_random_seed(0)
    model = getattr(keras.applications, name)(input_shape=(size, size, 3), weights=None)
    randomize(model, kernels=True)
    small = kp.precrop(model, params=0.5, mode="exact", weights="keep")
    assert_matches_plan(model, small.precrop_plan, small)
    assert_sliced(model, small)
    keras.backend.clear_session()


def test_kept_weights_of_an_application_sample():
    """The default suite's sample: the smallest constructor."""
    _check_application("MobileNetV3Small")


@pytest.mark.slow
@pytest.mark.parametrize("name", CONSTRUCTORS)
def test_kept_weights_of_every_application(name):
    _check_application(name)


def test_an_ignored_reader_of_a_residual_stream_reads_it_whole():
    """An ignored layer keeps its channels: no view narrows the stream it reads (it did under
    residual='prefix': its input was sliced, and its kept weights were cut to the slice)."""
    keras.utils.set_random_seed(0)
    x = keras.Input((12,))
    h = keras.layers.Dense(16, name="stem")(x)
    for i in range(3):
        h = keras.layers.Add()([h, keras.layers.Dense(16, name=f"w{i}")(h)])
    model = keras.Model(x, keras.layers.Dense(4, name="head")(h))
    plan = kp.plan(model, params=0.75, ignore=["w1", "head"])
    assert {v["name"]: v["new"] for v in plan.variables}.get("w1:in", 16) == 16
    small = kp.apply_plan(model, plan, weights="keep")
    assert small.get_layer("w1").kernel.shape[0] == small.get_layer("stem").units
