"""``refit=True``: every linear projection of a cut model refit by least squares on ``data=``.

Checked against references computed here: an identity plan refit computes
the original's outputs; the last projection's kernel and bias are NumPy's
least-squares solution from the pruned model's own inputs to the original's
logits; a projection whose input is not cut gets back exactly the kept
columns of the original's kernel; the refit model is nearer the original
than the cut one, per projection and end to end; the user's model is not
changed; bad combinations are refused naming the argument.
"""

import keras
import numpy as np
import pytest

import keras_precrop as kp
from keras_precrop.errors import ArgumentError, DataError
from keras_precrop.transfer.refit import ROWS_PER_UNKNOWN, RefitWarning
from tests.test_activation_importance import _mlp, _np

L = keras.layers


def _attention(seed=0):
    """A residual block: Dense stream, MultiHeadAttention, LayerNorm, GELU MLP, logits."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((8, 16))
    x = L.Dense(32, activation="relu", name="stem")(inputs)
    x = L.LayerNormalization(name="ln")(x + L.MultiHeadAttention(4, 8, name="mha")(x, x))
    h = L.Dense(64, activation="gelu", name="fc1")(x)
    x = x + L.Dense(32, name="fc2")(h)
    return keras.Model(inputs, L.Dense(10, name="logits")(L.GlobalAveragePooling1D()(x)))


def _batches(shape, n=256, size=64, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, *shape)).astype("float32")
    y = rng.integers(0, 3, n)
    return x, [(x[i:i + size], y[i:i + size]) for i in range(0, n, size)]


def _mse(a, b):
    return float(np.mean((a - b) ** 2))


@pytest.mark.parametrize("attention", ["heads", "head_dims"])
def test_identity_plan_refit_computes_the_originals_outputs(attention):
    model = _attention()
    x, data = _batches((8, 16))
    plan = kp.plan(model, params=1.0, attention=attention)
    same = kp.apply_plan(model, plan, weights="keep", data=data, refit=True)
    np.testing.assert_allclose(_np(same(x)), _np(model(x)), atol=1e-4)


def test_last_projection_is_numpys_least_squares_and_an_uncut_input_keeps_its_columns():
    model = _mlp()
    x, data = _batches((6,))
    small = kp.precrop(model, params=0.5, weights="keep", data=data, refit=True)
    # "out" reads the pruned "second": NumPy's least squares from those inputs to the logits
    inputs = _np(keras.Model(small.input, small.get_layer("second").output)(x))
    design = np.concatenate([inputs, np.ones((len(x), 1))], axis=1).astype(np.float64)
    solution = np.linalg.lstsq(design, _np(model(x)).astype(np.float64), rcond=None)[0]
    out = small.get_layer("out")
    fitted = np.concatenate([_np(out.kernel), _np(out.bias)[None]]).astype(np.float64)
    np.testing.assert_allclose(design @ fitted, design @ solution, atol=1e-3)  # a solution too
    dead = ~design.any(axis=0)  # inputs the data never move (ReLUs off): the carried rows, kept
    assert dead.any()
    carried = kp.apply_plan(model, small.precrop_plan, weights="keep").get_layer("out")
    np.testing.assert_array_equal(_np(out.kernel)[dead[:-1]], _np(carried.kernel)[dead[:-1]])
    live = ~dead
    np.testing.assert_allclose(fitted[live], solution[live], atol=1e-3)  # where it is unique
    # "hidden" reads the model's inputs, which no cut touches: an exact fit, the kept columns
    kernel, kept = _np(model.get_layer("hidden").kernel), _np(small.get_layer("hidden").kernel)
    columns = [int(np.argmin(np.abs(kernel - col[:, None]).sum(0))) for col in kept.T]
    np.testing.assert_allclose(kept, kernel[:, columns], atol=1e-4)
    np.testing.assert_allclose(_np(small.get_layer("hidden").bias),
                               _np(model.get_layer("hidden").bias)[columns], atol=1e-4)


def test_what_the_data_do_not_determine_keeps_the_carried_weights():
    """An input that never varies in ``data=`` leaves its rows of the fit free: an identity plan
    keeps the original's there (a ridge toward zero would drop them), so the refit model still
    computes the original's outputs on inputs where it does vary."""
    model = _mlp()
    x, data = _batches((6,))
    data = [(np.concatenate([np.zeros_like(bx[:, :1]), bx[:, 1:]], axis=1), by) for bx, by in data]
    same = kp.apply_plan(model, kp.plan(model, params=1.0), weights="keep", data=data, refit=True)
    np.testing.assert_allclose(_np(same(x)), _np(model(x)), atol=1e-4)  # x[:, 0] varies here


def test_projections_data_has_too_few_rows_for_keep_their_weights_and_are_named():
    """Fewer than ROWS_PER_UNKNOWN rows per unknown: the projection keeps its carried weights
    and a RefitWarning names it with the examples it wants; the others are refit."""
    model = _mlp()
    x, data = _batches((6,), n=24, size=8)  # 24 rows: "out" reads 4 + 1 unknowns, "hidden" 7
    plan = kp.plan(model, params=0.5)
    cut = kp.apply_plan(model, plan, weights="keep")
    with pytest.warns(RefitWarning) as caught:
        refit = kp.apply_plan(model, plan, weights="keep", data=data, refit=True, verbose=0)
    [message] = [str(w.message) for w in caught if w.category is RefitWarning]
    unknowns = {n: refit.get_layer(n).kernel.shape[0] + 1 for n in ("hidden", "second", "out")}
    assert 0 < sum(24 < ROWS_PER_UNKNOWN * c for c in unknowns.values()) < len(unknowns)
    for name, count in unknowns.items():
        short = 24 < ROWS_PER_UNKNOWN * count
        assert (f"'{name}' (24 rows for {count} unknowns" in message) == short, message
        weights = zip(refit.get_layer(name).weights, cut.get_layer(name).weights)
        assert all(np.array_equal(_np(a), _np(b)) for a, b in weights) == short, name
    assert "24 examples" in message and "pass more examples in data=" in message


def test_frozen_and_constrained_projections_keep_their_carried_weights():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((6,))
    h = L.Dense(12, activation="relu", name="hidden")(inputs)
    h = L.Dense(8, activation="relu", name="frozen", trainable=False)(h)
    h = L.Dense(8, activation="relu", name="nonneg", kernel_constraint="non_neg")(h)
    model = keras.Model(inputs, L.Dense(3, name="out")(h))
    _, data = _batches((6,))
    plan = kp.plan(model, params=0.5)
    cut = kp.apply_plan(model, plan, weights="keep")
    refit = kp.apply_plan(model, plan, weights="keep", data=data, refit=True, verbose=0)
    for name, kept in (("frozen", True), ("nonneg", True), ("out", False)):
        weights = zip(refit.get_layer(name).weights, cut.get_layer(name).weights)
        assert all(np.array_equal(_np(a), _np(b)) for a, b in weights) == kept, name
    assert not refit.get_layer("frozen").trainable


@pytest.mark.parametrize("attention", ["heads", "head_dims"])
def test_projections_whose_inputs_are_not_cut_get_the_carried_weights(attention):
    """Query, key and value read the model's inputs, which no cut touches: their exact fit is the
    carried kernel (the query rescaled where each head keeps fewer dimensions)."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8, 16))
    attended = L.MultiHeadAttention(4, 8, name="mha")(inputs, inputs)
    model = keras.Model(inputs, L.Dense(10, name="out")(L.GlobalAveragePooling1D()(attended)))
    _, data = _batches((8, 16))
    plan = kp.plan(model, params=0.6, mode="uniform", attention=attention)
    carried, refit = (kp.apply_plan(model, plan, weights="keep", **more)
                      for more in ({}, {"data": data, "refit": True}))
    assert carried.get_layer("mha").get_config() != model.get_layer("mha").get_config()  # cut
    for name in ("_query_dense", "_key_dense", "_value_dense"):
        for a, b in zip(*(getattr(m.get_layer("mha"), name).weights for m in (carried, refit))):
            np.testing.assert_allclose(_np(b), _np(a), atol=1e-5)


def test_refit_is_nearer_the_original_per_projection_and_end_to_end():
    model = _attention()
    x, data = _batches((8, 16))
    plan = kp.plan(model, params=0.5)
    cut = kp.apply_plan(model, plan, weights="keep")
    refit = kp.apply_plan(model, plan, weights="keep", data=data, refit=True)
    reference = _np(model(x))
    assert _mse(_np(refit(x)), reference) < 0.5 * _mse(_np(cut(x)), reference)
    # the logits layer's refit beats the cut's own kernel on the refit model's inputs
    with_cut_head = keras.models.clone_model(refit)
    with_cut_head.set_weights(refit.get_weights())
    for w, value in zip(with_cut_head.get_layer("logits").weights, cut.get_layer("logits").weights):
        w.assign(value)
    assert _mse(_np(refit(x)), reference) <= _mse(_np(with_cut_head(x)), reference)


def test_the_users_model_is_not_changed():
    model = _attention()
    x, data = _batches((8, 16))
    before, outputs = [_np(w) for w in model.weights], _np(model(x))
    kp.precrop(model, params=0.5, weights="keep", importance="activation", data=data, refit=True)
    for w, value in zip(model.weights, before):
        np.testing.assert_array_equal(_np(w), value)
    assert all("call" not in layer.__dict__ for layer in model._flatten_layers())
    np.testing.assert_array_equal(_np(model(x)), outputs)


@pytest.mark.parametrize("call, words", [
    (lambda m, d: kp.precrop(m, params=0.5, data=d, refit=True), ["refit=True", "weights='keep'"]),
    (lambda m, d: kp.precrop(m, params=0.5, weights="keep", refit=True), ["refit=True", "data="]),
    (lambda m, d: kp.precrop(m, params=0.5, weights="keep", data=d, refit="yes"), ["refit='yes'"]),
    (lambda m, d: kp.precrop(m, params=0.5, weights="keep", data=d), ["data=", "refit=True"]),
    (lambda m, d: kp.reconfigure(m, params=1.5, weights="keep", data=d, refit=True),
     ["refit=True", "upper=1.0"]),
    (lambda m, d: kp.precrop(m, params=0.5, weights="keep", data=d, refit=True, verbose=True),
     ["verbose=True", "0 (silent)"]),
    (lambda m, d: kp.apply_plan(m, kp.plan(m, params=0.5), weights="keep", data=d, refit=True,
                                verbose=3), ["verbose=3"]),
])
def test_bad_combinations_are_refused_naming_the_argument(call, words):
    model = _mlp()
    _, data = _batches((6,))
    with pytest.raises(ArgumentError) as err:
        call(model, data)
    for word in words:
        assert word in str(err.value)


def test_verbose_sets_the_refits_progress_and_nothing_else(capsys):
    model = _mlp()
    _, data = _batches((6,))
    weights, lines = {}, {}
    for verbose in (0, 1, 2):
        small = kp.precrop(model, params=0.5, weights="keep", data=data, refit=True, verbose=verbose)
        weights[verbose], lines[verbose] = small.get_weights(), capsys.readouterr().out.splitlines()
    assert lines[0] == []
    for verbose in (1, 2):
        assert lines[verbose][0] == "Refitting 3 projections by least squares on 4 batches"
        assert lines[verbose][-1].startswith("3/3")
        for a, b in zip(weights[verbose], weights[0]):
            np.testing.assert_array_equal(a, b)
    assert len(lines[2]) == 2  # a line at the end, no bar as it goes


def test_a_vit_task_refit_per_block_and_homogeneous(capsys):
    keras_hub = pytest.importorskip("keras_hub")
    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.ViTBackbone(
        image_shape=(16, 16, 3), patch_size=4, num_layers=2, num_heads=2, hidden_dim=16,
        mlp_dim=32, dropout_rate=0.0, attention_dropout=0.0, layer_norm_epsilon=1e-6)
    task = keras_hub.models.ViTImageClassifier(backbone=backbone, num_classes=3, preprocessor=None)
    x, data = _batches((16, 16, 3), n=128)
    reference = _np(task(x))
    for homogeneous in (False, True):
        cut = kp.hub.precrop(task, flops=0.5, homogeneous=homogeneous, weights="keep")
        capsys.readouterr()
        refit = kp.hub.precrop(task, flops=0.5, homogeneous=homogeneous, weights="keep",
                               data=data, refit=True, verbose=0)
        assert capsys.readouterr().out == ""  # verbose=0 reaches the refit either way
        assert type(refit) is type(task)
        if homogeneous:  # the whole task refit: nearer the original's logits
            assert _mse(_np(refit(x)), reference) < _mse(_np(cut(x)), reference)
        else:  # the backbone refit: nearer the original backbone's features (their width kept)
            features = _np(task.backbone(x))
            assert _mse(_np(refit.backbone(x)), features) < _mse(_np(cut.backbone(x)), features)
            # then the head, to the original's logits from those features: NumPy's least squares
            # (a LayerNorm's outputs sum to a constant: one direction is free, and rcond leaves it)
            tokens = _np(refit.backbone(x))[:, 0]  # the class token the head reads
            design = np.concatenate([tokens, np.ones((len(tokens), 1))], axis=1)
            solution = np.linalg.lstsq(design, reference, rcond=1e-6)[0]
            np.testing.assert_allclose(_np(refit(x)), design @ solution, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("options", [{"importance": "activation"}, {"refit": True},
                                     {"importance": "activation", "refit": True}])
def test_inputs_alone_serve_where_no_labels_are_read(options):
    """A refit and the activation ranking read no labels: batches of inputs alone (an array, a
    tf.data.Dataset, a list of arrays or of (x,) tuples) give the model (x, y) batches give."""
    tf = pytest.importorskip("tensorflow")
    model = _mlp()
    x, data = _batches((6,))
    reference = kp.precrop(model, params=0.5, weights="keep", data=data, verbose=0, **options)
    for inputs in ([b for b, _ in data], [(b,) for b, _ in data],
                   tf.data.Dataset.from_tensor_slices(x).batch(64)):
        small = kp.precrop(model, params=0.5, weights="keep", data=inputs, verbose=0, **options)
        for a, b in zip(small.get_weights(), reference.get_weights()):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    whole = kp.precrop(model, params=0.5, weights="keep", data=x, verbose=0, **options)
    pair = kp.precrop(model, params=0.5, weights="keep", data=(x, data[0][1].repeat(4)),
                      verbose=0, **options)  # one batch of every row either way
    for a, b in zip(whole.get_weights(), pair.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_labels_are_asked_for_only_where_a_loss_is_differentiated():
    model = _mlp()
    x, data = _batches((6,))
    with pytest.raises(DataError, match=r"data= must give \(x, y\) batches"):
        kp.precrop(model, params=0.5, weights="keep", importance="taylor", data=[x[:64]])
    with pytest.raises(ArgumentError, match=r"importance='activation' needs data=.*labels are "
                                            "not read"):
        kp.precrop(model, params=0.5, weights="keep", importance="activation")
    unread = [(b, np.full(len(b), 99)) for b, _ in data]  # labels no class of the model's: unread
    small = kp.precrop(model, params=0.5, weights="keep", importance="activation", data=unread)
    assert small.count_params() == small.precrop_plan.params
