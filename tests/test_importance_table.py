"""One table of channel rankings: a ranking registered from outside reaches every entry point.

A ranking of the user's (``kp.register_importance``) ranks the kept channels
of ``kp.precrop(weights="keep")``, ``kp.apply_plan``, ``kp.hub.apply_plan``,
``kp.GradualPruning`` during a real ``fit`` and the command line's
``--importance``: the channels each keeps are checked against a ranking
computed here with NumPy from the model's weights, and against the L1
ranking, which keeps others. Where a place cannot meet a ranking's need
(data in ``kp.hub`` and ``keras-precrop precrop``, chance during fit) the
table's need is what refuses it, naming ``importance=``; an unknown name
is refused with the table listed.
"""

import keras
import numpy as np
import pytest

import keras_precrop as kp
from keras_precrop import _cli_flags, cli
from keras_precrop.transfer import criteria

L = keras.layers


def _linf(rows):
    """The largest magnitude of the channel's weights."""
    return abs(rows).max(1)


@pytest.fixture(autouse=True)
def table(monkeypatch):
    """The table, restored after each test: what a test registers goes with it."""
    monkeypatch.setattr(criteria, "_TABLE", dict(criteria._TABLE))
    kp.register_importance("linf", _linf)


def _model():
    """conv_a's channels 0-4 hold one large weight each and little else (high L-inf, low L1),
    channels 5-9 many middling ones (the other way round), in conv_a and in conv_b's inputs."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8, 8, 3))
    x = L.Conv2D(10, 3, padding="same", use_bias=False, name="conv_a")(inputs)
    x = L.Conv2D(6, 3, padding="same", name="conv_b")(L.ReLU()(x))
    model = keras.Model(inputs, L.Dense(3, name="fc")(L.GlobalAveragePooling2D()(x)))
    rng = np.random.default_rng(1)
    for name, axis in (("conv_a", -1), ("conv_b", -2)):
        kernel = model.get_layer(name).kernel
        rows = np.moveaxis(rng.normal(0, 0.5, kernel.shape), axis, 0).copy()  # a channel a row
        flat = rows.reshape(len(rows), -1)
        flat[:5] *= 0.02
        flat[np.arange(5), rng.integers(0, flat.shape[1], 5)] = 3 + rng.random(5)
        kernel.assign(np.moveaxis(rows, 0, axis).astype("float32"))
    return model


def _kept_by(score_rows, model, width):
    """conv_a's channels a ranking keeps, computed here: ``score_rows`` of conv_a's filters and of
    conv_b's input slices, each layer's share divided by its mean, the ``width`` best, in order."""
    shares = []
    for name, axis in (("conv_a", -1), ("conv_b", -2)):
        kernel = keras.ops.convert_to_numpy(model.get_layer(name).kernel).astype(np.float64)
        rows = np.moveaxis(kernel, axis, 0).reshape(kernel.shape[axis], -1)
        share = np.abs(score_rows(rows))
        shares.append(share / share.mean())
    return np.sort(np.argsort(-sum(shares))[:width])


def _kept_in(small, model):
    """The original channels of conv_a that ``small`` kept (its filters, found in the original's)."""
    old = keras.ops.convert_to_numpy(model.get_layer("conv_a").kernel)
    new = keras.ops.convert_to_numpy(small.get_layer("conv_a").kernel)
    return np.array([int(np.flatnonzero((old == new[..., j:j + 1]).all((0, 1, 2)))[0])
                     for j in range(new.shape[-1])])


def _l1(rows):
    return np.abs(rows).sum(1)


def _l2(rows):
    return np.sqrt(np.square(rows).sum(1))


def test_a_registered_ranking_keeps_the_channels_it_ranks_first():
    model = _model()
    small = kp.precrop(model, params=0.5, weights="keep", importance="linf")
    width = small.get_layer("conv_a").filters
    assert 0 < width < 10
    expected = _kept_by(_linf, model, width)
    np.testing.assert_array_equal(_kept_in(small, model), expected)
    assert not np.array_equal(expected, _kept_by(_l1, model, width))  # l1 keeps others
    by_object = kp.precrop(model, params=0.5, weights="keep", importance=_linf)  # unregistered
    np.testing.assert_array_equal(_kept_in(by_object, model), expected)
    the_plan = small.precrop_plan
    for surface in (kp.apply_plan, kp.hub.apply_plan):
        np.testing.assert_array_equal(
            _kept_in(surface(model, the_plan, weights="keep", importance="linf"), model), expected)


@pytest.mark.parametrize("name, score_rows", [("l1", _l1), ("l2", _l2)])
def test_the_built_in_norms_keep_what_numpy_ranks_first(name, score_rows):
    model = _model()
    small = kp.precrop(model, params=0.5, weights="keep", importance=name)
    expected = _kept_by(score_rows, model, small.get_layer("conv_a").filters)
    np.testing.assert_array_equal(_kept_in(small, model), expected)


def test_gradual_pruning_masks_what_a_registered_ranking_ranks_last():
    model = _model()
    before = keras.ops.convert_to_numpy(model.get_layer("conv_a").kernel)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(16, 8, 8, 3)).astype("float32"), rng.integers(0, 3, 16)
    model.compile(keras.optimizers.SGD(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    the_plan = kp.plan(model, params=0.5)
    reference = keras.models.clone_model(model)
    reference.set_weights(model.get_weights())  # the weights the first update ranks
    pruning = kp.GradualPruning(the_plan, end_step=0, importance="linf", verbose=0)
    model.fit(x, y, batch_size=8, epochs=1, callbacks=[pruning], verbose=0)
    small = pruning.finalize()
    assert small.count_params() == the_plan.predicted["params"]
    np.testing.assert_allclose(keras.ops.convert_to_numpy(model(x[:4])),
                               keras.ops.convert_to_numpy(small(x[:4])), rtol=1e-4, atol=1e-4)
    width = small.get_layer("conv_a").filters
    mask = {w.path: m for w, m in pruning._masks}[model.get_layer("conv_a").kernel.path]
    kept = np.flatnonzero(mask.reshape(-1, 10).any(0))
    np.testing.assert_array_equal(kept, _kept_by(_linf, reference, width))
    assert not np.array_equal(kept, _kept_by(_l1, reference, width))
    assert not np.allclose(keras.ops.convert_to_numpy(model.get_layer("conv_a").kernel)[..., kept],
                           before[..., kept])  # the kept channels trained


def test_the_command_line_offers_and_uses_a_registered_ranking(tmp_path, capsys):
    model = _model()
    model.save(tmp_path / "trained.keras")
    out = str(tmp_path / "small.keras")
    assert cli.main(["precrop", str(tmp_path / "trained.keras"), "--params", "0.5",
                     "--importance", "linf", "--out", out]) == 0
    assert "the trained channels linf ranks first" in capsys.readouterr().out
    small = keras.models.load_model(out)
    expected = _kept_by(_linf, model, small.get_layer("conv_a").filters)
    np.testing.assert_array_equal(_kept_in(small, model), expected)
    for command in ("precrop", "prune-trained"):
        with pytest.raises(SystemExit):
            cli.main([command, "--help"])
        assert "linf: The largest magnitude of the channel's weights" in " ".join(
            capsys.readouterr().out.split())


def test_unknown_names_are_refused_with_the_table_listed(capsys):
    model = _model()
    table = r"\['l1', 'l2', 'taylor', 'activation', 'bn_scale', 'random', 'linf'\]"
    with pytest.raises(kp.ArgumentError, match=rf"importance='nope' is unknown; use one of {table}"):
        kp.precrop(model, params=0.5, weights="keep", importance="nope")
    with pytest.raises(kp.ArgumentError, match=rf"importance='nope' is unknown; use one of {table}"):
        kp.GradualPruning(kp.plan(model, params=0.5), end_step=2, importance="nope")
    with pytest.raises(SystemExit) as exit_:
        cli.main(["precrop", "resnet20", "--params", "0.5", "--importance", "nope"])
    assert exit_.value.code == 2
    assert ("invalid choice: 'nope' (choose from 'l1', 'l2', 'bn_scale', 'random', 'linf')"
            in capsys.readouterr().err)
    with pytest.raises(kp.ArgumentError, match="name='l1' is a built-in ranking"):
        kp.register_importance("l1", _linf)
    with pytest.raises(kp.ArgumentError, match="name='two words' must be a name"):
        kp.register_importance("two words", _linf)
    with pytest.raises(kp.ArgumentError, match="importance=3 must be a name of the table"):
        kp.precrop(model, params=0.5, weights="keep", importance=3)


def test_a_ranking_that_returns_other_than_a_score_per_channel_is_refused():
    kp.register_importance("sum", lambda rows: abs(rows).sum())
    with pytest.raises(kp.ArgumentError, match=r"importance='sum' must return \d+ scores, one per "
                       r"row it is given .*got shape \(1, 1\)"):
        kp.precrop(_model(), params=0.5, weights="keep", importance="sum")


def test_the_need_decides_where_a_ranking_ranks():
    """A data ranking of the user's: Taylor's own formula ranks as "taylor" does; kp.hub and the
    precrop command refuse it, prune-trained offers it. A chance ranking: refused during fit."""
    model = _model()
    rng = np.random.default_rng(0)
    data = (rng.normal(size=(8, 8, 8, 3)).astype("float32"), rng.integers(0, 3, 8))
    kp.register_importance("taylor_again", lambda rows, grads: [(rows * g).sum(1) for g in grads],
                           needs="data")
    the_plan = kp.plan(model, params=0.5)
    ours, theirs = (kp.apply_plan(model, the_plan, weights="keep", importance=name, data=data)
                    for name in ("taylor_again", "taylor"))
    np.testing.assert_array_equal(_kept_in(ours, model), _kept_in(theirs, model))
    with pytest.raises(kp.ArgumentError, match="importance='taylor_again' needs data="):
        kp.apply_plan(model, the_plan, weights="keep", importance="taylor_again")
    with pytest.raises(kp.ArgumentError, match="importance='taylor_again' ranks .*backbone"):
        kp.hub.apply_plan(model, the_plan, weights="keep", importance="taylor_again", data=data)
    assert "taylor_again" not in _cli_flags.IMPORTANCE and "taylor_again" in _cli_flags.GRADUAL_IMPORTANCE
    kp.register_importance("dice", lambda rng, count: rng.random(count), needs="seed")
    assert "dice" in _cli_flags.IMPORTANCE and "dice" not in kp.gradual.IMPORTANCE
    with pytest.raises(kp.ArgumentError, match="importance='dice' draws channels at random"):
        kp.GradualPruning(the_plan, end_step=2, importance="dice")
    small = kp.apply_plan(model, the_plan, weights="keep", importance="dice", seed=3)
    again = kp.apply_plan(model, the_plan, weights="keep", importance="random", seed=3)
    np.testing.assert_array_equal(_kept_in(small, model), _kept_in(again, model))



class _OneLayer:
    """The L1 norm of one layer's weights alone."""

    def __init__(self, layer):
        self.layer = layer

    def __call__(self, rows):
        return abs(rows).sum(1)

    def weighs(self, layer, weight):
        return layer.name == self.layer


def test_a_ranking_that_weighs_some_weights_scores_only_those_and_refuses_cuts_beyond_them():
    """conv_a's channels, cut by the plan, ranked by conv_b's input slices alone; fc's weights
    touch none of them, so a ranking of fc's weights alone is refused."""
    model = _model()
    kp.register_importance("by_conv_b", _OneLayer("conv_b"))
    small = kp.precrop(model, params=0.5, weights="keep", importance="by_conv_b")
    kernel = keras.ops.convert_to_numpy(model.get_layer("conv_b").kernel)
    slices = np.abs(np.moveaxis(kernel, -2, 0).reshape(10, -1)).sum(1)
    np.testing.assert_array_equal(_kept_in(small, model),
                                  np.sort(np.argsort(-slices)[:small.get_layer("conv_a").filters]))
    kp.register_importance("by_fc", _OneLayer("fc"))
    with pytest.raises(kp.ArgumentError, match="importance='by_fc' ranks channels by the weights "
                       "'by_fc' weighs, but the plan cuts channels that none of those weights "
                       "touches: 'conv_a'"):
        kp.precrop(model, params=0.5, weights="keep", importance="by_fc")
