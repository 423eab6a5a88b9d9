"""``keras.ops.split`` recorded in a functional graph: pieces of the channel axis.

A split of the channel axis keeps its proportions: into n equal sections the
tensor split moves in multiples of n and each piece is one n-th of it; at
explicit indices each piece keeps its share. Every model is checked against
references independent of the walker: Keras' ``count_params``, TensorFlow's
traced MACs, the rebuilt layers' own widths, a forward pass, a ``.keras``
round trip and, for the pruning baselines, synaptic flow.
"""

import math

import keras
import numpy as np
import pytest
from keras.src.ops.numpy import Split

import keras_precrop as kp
from keras_precrop import pai
from keras_precrop.latency.features import Features
from tests.conftest import assert_matches_plan, check_remove_detached, tf_macs
from tests.test_keep_weights import assert_same_function, assert_sliced, gathered_indices, randomize

L = keras.layers


def csp(sections, width=24):
    """CSP-style: split the stem's channels, a residual conv block on the last piece, concat back."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((12, 12, 3))
    x = L.Conv2D(width, 3, padding="same", name="stem")(inputs)
    x = L.BatchNormalization(name="stem_bn")(x)
    pieces = keras.ops.split(x, sections, axis=-1)
    last = pieces[-1]
    y = L.Conv2D(last.shape[-1], 3, padding="same", activation="relu", name="block")(last)
    y = L.Add(name="add")([y, last])
    x = L.Concatenate(name="concat")([*pieces[:-1], y])
    x = L.Conv2D(16, 1, activation="relu", name="transition")(x)
    return keras.Model(inputs, L.Dense(5, name="head")(L.GlobalAveragePooling2D()(x)))


def shuffled(sections, width=24):
    """A split whose pieces come back in reverse order (a channel shuffle), one through a conv."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((12, 12, 3))
    x = L.BatchNormalization(name="stem_bn")(L.Conv2D(width, 3, padding="same", name="stem")(inputs))
    pieces = keras.ops.split(x, sections, axis=-1)
    y = L.Conv2D(8, 3, padding="same", activation="relu", name="block")(pieces[0])
    x = L.Concatenate(name="concat")([*pieces[:0:-1], y, pieces[0]])
    x = L.Conv2D(16, 1, activation="relu", name="transition")(x)
    return keras.Model(inputs, L.Dense(5, name="head")(L.GlobalAveragePooling2D()(x)))


def spatial_split():
    """A split of the height axis: each half convolved, then stacked back."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((12, 12, 3))
    x = L.Conv2D(16, 3, padding="same", name="stem")(inputs)
    top, bottom = keras.ops.split(x, 2, axis=1)
    top = L.Conv2D(8, 3, padding="same", name="top")(top)
    bottom = L.Conv2D(8, 3, padding="same", name="bottom")(bottom)
    x = L.Concatenate(axis=1, name="stack")([top, bottom])
    return keras.Model(inputs, L.Dense(5, name="head")(L.GlobalAveragePooling2D()(x)))


def _split_tensors(model):
    """The tensor :func:`csp` splits and its pieces, read off the layers around the split.

    (The rebuild replays an equal split's operation object itself, which
    keeps its first model's tensors, so the op cannot say.)
    """
    pieces = model.get_layer("concat").input[:-1] + [model.get_layer("add").input[1]]
    return model.get_layer("stem_bn").output, pieces


def _split_widths(model):
    """(input channels, [piece channels]) of the model's split."""
    x, pieces = _split_tensors(model)
    return x.shape[-1], [t.shape[-1] for t in pieces]


SECTIONS = {"halves": 2, "thirds": 3, "indices": [16]}
BUDGETS = {
    "params": lambda m: kp.precrop(m, params=0.5),
    "flops": lambda m: kp.precrop(m, flops=0.5),
    "reconfigure": lambda m: kp.reconfigure(m, params=0.8, flops=1.0),
}


@pytest.mark.parametrize("sections", sorted(SECTIONS))
def test_profile_counts_split_models(sections):
    model = csp(SECTIONS[sections])
    prof = kp.profile(model)
    assert prof.total_params == model.count_params()
    assert prof.total_macs == tf_macs(model)


@pytest.mark.parametrize("budget", sorted(BUDGETS))
@pytest.mark.parametrize("sections", sorted(SECTIONS))
def test_pruned_split_keeps_proportions(sections, budget, tmp_path):
    model = csp(SECTIONS[sections])
    new = BUDGETS[budget](model)
    assert_matches_plan(model, new.precrop_plan, new)
    old_in, old_pieces = _split_widths(model)
    new_in, new_pieces = _split_widths(new)
    assert sum(new_pieces) == new_in
    # Every piece keeps its share of the tensor split.
    np.testing.assert_array_equal(np.multiply(new_pieces, old_in), np.multiply(old_pieces, new_in))
    if isinstance(SECTIONS[sections], int):
        assert new_in % SECTIONS[sections] == 0
    x = np.random.default_rng(0).normal(size=(2, 12, 12, 3)).astype("float32")
    out = keras.ops.convert_to_numpy(new(x))
    assert out.shape == (2, 5) and np.all(np.isfinite(out))
    new.save(tmp_path / "small.keras")
    loaded = keras.saving.load_model(tmp_path / "small.keras")
    np.testing.assert_allclose(keras.ops.convert_to_numpy(loaded(x)), out, rtol=1e-5, atol=1e-6)


def test_split_of_another_axis_keeps_channels():
    model = spatial_split()
    prof = kp.profile(model)
    assert prof.total_params == model.count_params()
    assert prof.total_macs == tf_macs(model)
    new = kp.precrop(model, params=0.5)
    assert_matches_plan(model, new.precrop_plan, new)
    assert new.get_layer("top").input.shape[-1] == new.get_layer("stem").filters
    x = np.zeros((1, 12, 12, 3), "float32")
    assert keras.ops.convert_to_numpy(new(x)).shape == (1, 5)


def test_residual_onto_unequal_piece_is_refused():
    """The 16-channel piece of a 24 = 8 + 16 split is two units of its group; the
    block writing into it is one unit of its own: no bound compares them."""
    model = csp([8])
    with pytest.raises(kp.UnsupportedLayerError, match=r"add.*split.*stem.*ignore=\['add'\]"):
        kp.profile(model)
    prof = kp.profile(model, ignore=["add"])
    assert prof.total_params == model.count_params()
    new = kp.precrop(model, params=0.9, ignore=["add"])
    assert_matches_plan(model, new.precrop_plan, new)


def test_split_of_a_concatenation_is_refused():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8, 8, 3))
    a = L.Conv2D(4, 3, name="a")(inputs)
    b = L.Conv2D(4, 3, name="b")(inputs)
    left, right = keras.ops.split(L.Concatenate(name="ab")([a, b]), 2, axis=-1)
    model = keras.Model(inputs, L.Add(name="sum")([left, right]))
    name = [op.name for op in model.operations if isinstance(op, Split)][0]
    with pytest.raises(kp.UnsupportedLayerError, match=rf"{name}.*concatenation.*ignore"):
        kp.profile(model)
    assert kp.profile(model, ignore=[name]).total_params == model.count_params()


@pytest.mark.parametrize("granularity", ["weight", "channel"])
def test_remove_detached_follows_split_pieces(granularity):
    model = csp(2)
    check_remove_detached(model, pai.random_masks(model, 0.1, granularity, seed=3))


@pytest.mark.parametrize("sections", sorted(SECTIONS))
def test_latency_features_count_the_rebuilt_split(sections):
    """The latency model's features of a plan are the rebuilt model's tensor sizes and MACs."""
    model = csp(SECTIONS[sections])
    new = kp.precrop(model, params=0.5)
    prof = kp.profile(model)
    widths = [v["new"] for v in new.precrop_plan.variables]
    features = Features.of(prof.graph)
    values = dict(zip(features.columns, features.matrix(widths, prof.cost.fixed)[0]))
    x, pieces = _split_tensors(new)
    assert values["in:Split"] == math.prod(x.shape[1:])
    assert values["out:Split"] == sum(math.prod(t.shape[1:]) for t in pieces)
    assert values["macs:Conv2D"] + values["macs:Dense"] == tf_macs(new)


# -- kept weights (issue 42): each piece is a sub-range of the tensor split ------------------

KEPT = {"csp_halves": (csp, 2), "csp_thirds": (csp, 3), "shuffled_halves": (shuffled, 2),
        "shuffled_indices": (shuffled, [16])}
X = np.random.default_rng(1).normal(size=(3, 12, 12, 3)).astype("float32")


def _pieces(width, sections, total=24):
    """``(start, end)`` of each piece of ``width`` channels split at ``sections`` (of ``total``)."""
    if isinstance(sections, int):
        ends = [width * (i + 1) // sections for i in range(sections)]
    else:
        ends = [i * width // total for i in sections] + [width]
    return list(zip([0, *ends[:-1]], ends))


@pytest.mark.parametrize("name", sorted(KEPT))
def test_kept_weights_through_a_split_keep_its_function(name):
    """A plan that keeps every width, and one that only widens, compute the original's outputs."""
    build, sections = KEPT[name]
    model = randomize(build(sections))
    plan = kp.plan(model, params=1.0)
    assert all(v["new"] == v["width"] for v in plan.variables)
    assert_same_function(model, kp.apply_plan(model, plan, weights="keep"), X)
    wide = kp.reconfigure(model, params=1.5, mode="uniform", weights="keep")
    assert any(v["new"] > v["width"] for v in wide.precrop_plan.variables)
    assert_matches_plan(model, wide.precrop_plan, wide)
    assert_same_function(model, wide, X)


@pytest.mark.parametrize("name", sorted(KEPT))
def test_kept_weights_of_each_piece_are_its_own_channels(name):
    """Pruned: every weight is a slice of the original's; each new piece keeps channels of its
    original piece, and the readers of a piece and of the concatenation read those channels."""
    build, sections = KEPT[name]
    model = randomize(build(sections), kernels=True)
    small = kp.precrop(model, params=0.6, weights="keep")
    assert_matches_plan(model, small.precrop_plan, small)
    assert_sliced(model, small)

    def kept(layer, weight, axis):
        return list(gathered_indices(*(np.asarray(getattr(m.get_layer(layer), weight))
                                       for m in (model, small)))[axis])

    stem = np.array(kept("stem", "kernel", 3))
    assert len(stem) < 24 and kept("stem_bn", "gamma", 0) == list(stem)
    old = _pieces(24, sections)
    parts = [stem[a:b] for a, b in _pieces(len(stem), sections)]
    for part, (a, b) in zip(parts, old):
        assert len(part) and ((part >= a) & (part < b)).all()
    piece = -1 if build is csp else 0  # the piece the block conv reads
    assert kept("block", "kernel", 2) == list(parts[piece] - old[piece][0])
    # The concatenation: csp's is the pieces in order (the last through a residual block, whose
    # add keeps its channels); shuffled's is the pieces reversed, the block's output, piece 0.
    if build is csp:
        concat = list(stem)
    else:
        offsets = np.cumsum([0] + [b - a for a, b in old[:0:-1]])
        concat = [*np.concatenate([p - a + o for p, (a, _), o in zip(parts[:0:-1], old[:0:-1], offsets)]),
                  *(np.array(kept("block", "kernel", 3)) + offsets[-1]),
                  *(parts[0] + offsets[-1] + 8)]
    assert kept("transition", "kernel", 2) == concat
    assert keras.ops.convert_to_numpy(small(X)).shape == (3, 5)
