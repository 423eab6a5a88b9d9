"""``importance="activation"``: Minitron's activation magnitude ranks the kept channels.

Checked against references computed here with NumPy: an MLP's hidden neurons
kept are those of the largest mean |activation| over the data (read from an
intermediate ``keras.Model``), an attention layer's heads (or per-head
dimensions) those of the largest mean |attention context| (the heads'
outputs, computed from the layer's weights); one-shot, during a
``GradualPruning`` fit and from the command line. A neuron with large
weights that never activates goes first, where L1 keeps it.
"""

import keras
import numpy as np
import pytest

import keras_precrop as kp
from keras_precrop import _cli_flags, cli, gradual
from keras_precrop.graph.walker import walk
from keras_precrop.planning import planned_widths
from tests.test_attention import _attention_model

L = keras.layers


def _np(x):
    return np.asarray(keras.ops.convert_to_numpy(x))


def _mlp(seed=0):
    """6 inputs -> 12 ReLU neurons (``hidden``) -> 8 ReLU neurons (``second``) -> 3 logits."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((6,))
    h = L.Dense(12, activation="relu", name="hidden")(inputs)
    h = L.Dense(8, activation="relu", name="second")(h)
    return keras.Model(inputs, L.Dense(3, name="out")(h))


def _data(shape, classes, n=64, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, *shape)).astype("float32"), rng.integers(0, classes, n)


def _mean_abs(model, layer, x):
    """Each neuron's mean |activation| over ``x``, from an intermediate model."""
    return np.abs(_np(keras.Model(model.input, model.get_layer(layer).output)(x))).mean(0)


def _kept_columns(original, pruned, axis=-1):
    """The original kernel's indices along ``axis`` that the pruned kernel holds."""
    a, b = (np.moveaxis(_np(k), axis, 0) for k in (original, pruned))
    kept = [i for i in range(len(a)) if any(np.allclose(a[i], row) for row in b)]
    assert len(kept) == len(b)
    return kept


def _top(scores, k):
    return sorted(np.argsort(-scores, kind="stable")[:k].tolist())


def test_kept_neurons_are_those_of_largest_mean_activation():
    model = _mlp()
    x, y = _data((6,), 3)
    plan = kp.plan(model, params=0.7, ignore=["out"])  # hidden alone: second reads it, out is kept
    small = kp.apply_plan(model, plan, weights="keep", importance="activation", data=(x, y))
    assert small.get_layer("second").units == 8 and small.get_layer("hidden").units < 12
    kept = _kept_columns(model.get_layer("hidden").kernel, small.get_layer("hidden").kernel)
    assert kept == _top(_mean_abs(model, "hidden", x), len(kept))
    by_l1 = kp.apply_plan(model, plan, weights="keep", data=None)
    assert kept != _kept_columns(model.get_layer("hidden").kernel, by_l1.get_layer("hidden").kernel)


def test_a_neuron_that_never_activates_is_dropped_though_l1_keeps_it():
    model = _mlp()
    hidden = model.get_layer("hidden")
    kernel, bias = _np(hidden.kernel), _np(hidden.bias)
    kernel[:, 0] *= 20
    bias[0] = -1000.0  # below zero on every example: ReLU gives 0
    hidden.kernel.assign(kernel)
    hidden.bias.assign(bias)
    x, y = _data((6,), 3)
    assert _mean_abs(model, "hidden", x)[0] == 0
    plan = kp.plan(model, params=0.7, ignore=["out"])
    by_activation = kp.apply_plan(model, plan, weights="keep", importance="activation", data=(x, y))
    by_l1 = kp.apply_plan(model, plan, weights="keep", importance="l1")
    assert 0 not in _kept_columns(hidden.kernel, by_activation.get_layer("hidden").kernel)
    assert 0 in _kept_columns(hidden.kernel, by_l1.get_layer("hidden").kernel)


def test_a_model_built_for_any_image_size_is_ranked_on_the_data_s_size():
    """The plan walks a copy at a defined size; the activations come from the model itself."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((None, None, 3))
    h = L.Conv2D(10, 3, padding="same", activation="relu", name="a")(inputs)
    h = L.Conv2D(6, 3, padding="same", name="b")(h)
    model = keras.Model(inputs, L.Dense(3, name="head")(L.GlobalAveragePooling2D()(h)))
    x, y = _data((12, 12, 3), 3, n=16)
    plan = kp.plan(model, params=0.7, ignore=["head"])
    small = kp.apply_plan(model, plan, weights="keep", importance="activation", data=(x, y))
    kept = _kept_columns(model.get_layer("a").kernel, small.get_layer("a").kernel)
    assert len(kept) < 10
    assert kept == _top(_mean_abs(model, "a", x).mean((0, 1)), len(kept))


def _context_magnitudes(model, x, attention):
    """b0_mha's attention context (each head's output) on ``x``, computed here from its weights:
    mean |context| per head, or per index of the head dimension under ``"head_dims"``."""
    mha = model.get_layer("b0_mha")
    h = _np(keras.Model(model.inputs, model.get_layer("b0_ln1").output)([x]))
    q, k, v = (np.einsum("btc,chd->bthd", h, _np(d.kernel)) + _np(d.bias)
               for d in (mha._query_dense, mha._key_dense, mha._value_dense))
    logits = np.einsum("bqhd,bkhd->bhqk", q / np.sqrt(mha.key_dim), k)
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    context = np.abs(np.einsum("bhqk,bkhd->bqhd", weights, v))
    return context.mean((0, 1, 3)) if attention == "heads" else context.mean((0, 1, 2))


@pytest.mark.parametrize("attention", ["heads", "head_dims"])
def test_kept_heads_are_those_of_largest_mean_context(attention):
    model = _attention_model(heads=4, key_dim=6)
    x, y = _data((9, 24), 5, n=16)
    others = [layer.name for layer in model.layers if "mha" not in layer.name
              and not isinstance(layer, L.InputLayer)]
    plan = kp.plan(model, params=0.8, ignore=others, attention=attention)
    small = kp.apply_plan(model, plan, weights="keep", importance="activation", data=(x, y))
    axis = 1 if attention == "heads" else 2  # of the value kernel (channels, heads, head dim)
    kept = _kept_columns(model.get_layer("b0_mha")._value_dense.kernel,
                         small.get_layer("b0_mha")._value_dense.kernel, axis)
    assert 1 <= len(kept) < (4 if attention == "heads" else 6)
    assert kept == _top(_context_magnitudes(model, x, attention), len(kept))


@pytest.mark.parametrize("build", ["mlp", "attention"])
def test_an_identity_plan_keeps_the_outputs_and_the_model_is_unchanged(build):
    model = _mlp() if build == "mlp" else _attention_model()
    x, y = _data((6,) if build == "mlp" else (9, 24), 3 if build == "mlp" else 5, n=16)
    before = [_np(w) for w in model.weights]
    same = kp.apply_plan(model, kp.plan(model, params=1.0), weights="keep", importance="activation",
                         data=(x, y))
    inputs = x if build == "mlp" else [x]  # the attention model's inputs are a list
    np.testing.assert_allclose(_np(same(inputs)), _np(model(inputs)), atol=1e-5)
    for b, w in zip(before, model.weights):
        np.testing.assert_array_equal(b, _np(w))
    assert all("call" not in layer.__dict__ for layer in
               model._flatten_layers(include_self=True, recursive=True))  # its own calls back


def test_gradual_pruning_masks_the_neurons_of_least_mean_activation():
    model = _mlp()
    x, y = _data((6,), 3)
    model.compile(keras.optimizers.SGD(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    plan = kp.plan(model, params=0.7, ignore=["out"])
    reference = _mean_abs(model, "hidden", x[:32])  # of the weights the first step ranks
    pruning = kp.GradualPruning(plan, end_step=0, importance="activation", data=(x[:32], y[:32]),
                                verbose=0)
    model.fit(x, y, batch_size=16, epochs=1, callbacks=[pruning], verbose=0)
    masks = {w.path: m for w, m in pruning._masks}
    kept = np.flatnonzero(masks[model.get_layer("hidden").kernel.path].any(0)).tolist()
    assert kept == _top(reference, len(kept))
    assert pruning.finalize().get_layer("hidden").units == len(kept) < 12


def test_without_data_the_argument_is_named_in_one_wording_everywhere():
    model = _mlp()
    plan = kp.plan(model, params=0.7)
    said = (r"^importance='activation' needs data=: it ranks the channels by the activations of "
            r"a few batches of inputs \(x, or \(x, y\): labels are not read\)\.$")
    with pytest.raises(kp.ArgumentError, match=said):
        kp.precrop(model, params=0.7, weights="keep", importance="activation")
    with pytest.raises(kp.ArgumentError, match=said):
        kp.GradualPruning(plan, end_step=2, importance="activation")
    graph = walk(model)
    with pytest.raises(kp.ArgumentError, match=said):  # a direct call, past the entry points' check
        gradual.channel_masks(graph, planned_widths(graph, plan, model), "activation")


def test_the_command_line_prunes_with_it(tmp_path, capsys):
    assert "activation" in _cli_flags.GRADUAL_IMPORTANCE and "activation" not in _cli_flags.IMPORTANCE
    model = _mlp()
    model.save(tmp_path / "trained.keras")
    x, y = _data((6,), 3, n=128)
    np.savez(tmp_path / "data.npz", x_train=x, y_train=y)
    out = str(tmp_path / "small.keras")
    assert cli.main(["prune-trained", str(tmp_path / "trained.keras"), "--params", "0.7",
                     "--importance", "activation", "--data", str(tmp_path / "data.npz"),
                     "--epochs", "1", "--no-distill", "--batch_size", "32", "--out", out]) == 0
    small = keras.models.load_model(out)
    assert small.count_params() == kp.apply_plan(model, kp.plan(model, params=0.7)).count_params()
