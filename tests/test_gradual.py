"""Gradual structured pruning during ``fit`` (``kp.GradualPruning``), against independent references.

* the schedule: the cubic and linear closed forms;
* masks: a model whose masked weights are zeroed computes what the rebuilt
  smaller model computes (a forward pass of each), on residual streams with
  prefix readers, concatenations, depthwise and squeeze-excite blocks;
* ``fit``: the masked weights are exactly zero after training, every kept
  weight still trained, the finalized model matches its plan (Keras'
  ``count_params``) and computes what the masked model computes, through a
  ``keras.distillation.Distiller`` too;
* training on with the finalized smaller model and the optimizer state
  carried over (``carry_optimizer``) ends where the masked model's training
  ends (SGD with momentum and a schedule, Adam, a Distiller);
* bad arguments name themselves.
"""

import keras
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import keras_precrop as kp
from keras_precrop import gradual
from keras_precrop.graph.rebuild import rebuild
from keras_precrop.graph.walker import walk
from keras_precrop.training import finetune
from keras_precrop.training.optimizers import SGDWithL2
from keras_precrop.transfer.carry import carry_weights
from tests.backend_scripts import gradual_fit
from tests.conftest import random_cnns

L = keras.layers


def _resnet_block_model(seed=0):
    """A stem, two residual blocks (one with squeeze-excite), a concat and a depthwise conv."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((8, 8, 3))
    x = L.ReLU()(L.BatchNormalization(name="stem_bn")(L.Conv2D(16, 3, padding="same", use_bias=False,
                                                                name="stem")(inputs)))
    for b in range(2):
        y = L.ReLU()(L.BatchNormalization(name=f"b{b}_bn1")(
            L.Conv2D(12, 3, padding="same", use_bias=False, name=f"b{b}_c1")(x)))
        y = L.BatchNormalization(name=f"b{b}_bn2")(
            L.Conv2D(16, 3, padding="same", use_bias=False, name=f"b{b}_c2")(y))
        if b == 1:
            g = L.GlobalAveragePooling2D(keepdims=True)(y)
            g = L.Conv2D(4, 1, activation="relu", name="se1")(g)
            y = L.Multiply()([y, L.Conv2D(16, 1, activation="sigmoid", name="se2")(g)])
        x = L.ReLU()(L.Add()([x, y]))
    c = L.Concatenate()([x, L.Conv2D(6, 1, name="side")(x)])
    c = L.DepthwiseConv2D(3, padding="same", name="dw")(c)
    out = L.Dense(5, name="fc")(L.GlobalAveragePooling2D()(c))
    return keras.Model(inputs, out)


def _masked_copy(model, masks):
    """A copy of ``model`` (same weights) with the masked weights zeroed."""
    copy = keras.models.clone_model(model)
    copy.set_weights(model.get_weights())
    twin = {id(w): c for w, c in zip(model.weights, copy.weights, strict=True)}
    for w, mask in masks:
        target = twin[id(w)]
        target.assign(keras.ops.convert_to_numpy(target) * mask)
    return copy


def _batch(shape, n=4, seed=1):
    return np.random.default_rng(seed).normal(size=(n, *shape[1:])).astype("float32")


def test_schedule_closed_forms():
    f = gradual.schedule_fraction
    assert f(0, 10, 110) == 0.0 and f(10, 10, 110) == 0.0
    assert f(60, 10, 110) == pytest.approx(1 - 0.5 ** 3)
    assert f(60, 10, 110, "linear") == pytest.approx(0.5)
    assert f(110, 10, 110) == 1.0 and f(500, 10, 110) == 1.0
    assert f(5, 5, 5) == 1.0 and f(4, 5, 5) == 0.0
    assert f(109, 10, 110, "final") == 0.0 and f(110, 10, 110, "final") == 1.0


def test_widths_interpolate_within_bounds():
    model = _resnet_block_model()
    the_plan = kp.plan(model, params=0.4)
    graph = walk(model, ignore=the_plan.ignore, residual=the_plan.residual)
    targets = [v["new"] for v in the_plan.variables]
    assert gradual.widths_at(graph.variables, targets, 0.0) == [v.width for v in graph.variables]
    assert gradual.widths_at(graph.variables, targets, 1.0) == targets
    for fraction in (0.2, 0.5, 0.9):
        widths = gradual.widths_at(graph.variables, targets, fraction)
        for w, v, t in zip(widths, graph.variables, targets):
            assert t <= w <= v.width and w % v.multiple == 0
            if v.bound is not None:
                assert w <= widths[v.bound]


def _assert_masks_match_rebuild(model, the_plan, fraction):
    graph = walk(model, ignore=the_plan.ignore, residual=the_plan.residual)
    targets = [v["new"] for v in the_plan.variables]
    return _assert_masks_match_rebuild_at(graph, gradual.widths_at(graph.variables, targets, fraction))


def _assert_masks_match_rebuild_at(graph, widths):
    model = graph.model
    masks, selection = gradual.channel_masks(graph, widths)
    small = rebuild(graph, widths)
    carry_weights(graph, small, widths, new_graph=walk(small, residual=graph.residual),
                  selection=selection)
    x = _batch(model.inputs[0].shape)
    masked = _masked_copy(model, masks)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(masked(x)),
                               keras.ops.convert_to_numpy(small(x)), rtol=1e-4, atol=1e-4)
    kept = sum(int(m.sum()) for _, m in masks)
    dropped = sum(int(m.size - m.sum()) for _, m in masks)
    assert small.count_params() < model.count_params() or widths == [v.width for v in graph.variables]
    return kept, dropped


@pytest.mark.parametrize("fraction", [0.5, 1.0])
def test_masked_model_computes_the_rebuilt_model(fraction):
    model = _resnet_block_model()
    kept, dropped = _assert_masks_match_rebuild(model, kp.plan(model, params=0.4), fraction)
    assert dropped > 0 and kept > 0


def _masks_match_rebuild_on(model):
    """Masks match the rebuild; a plan that cuts the channels a normalization mixes is refused
    naming that layer (masked zeros would still count in its statistics), and its masks match
    once the plan keeps the layer's channels (``ignore``)."""
    ignore = []
    while True:
        try:
            the_plan = kp.plan(model, params=0.5, ignore=ignore)
        except kp.InfeasibleBudgetError:
            return
        try:
            _assert_masks_match_rebuild(model, the_plan, 1.0)
            return
        except kp.ArgumentError as e:
            (name,) = e.arguments["ignore"]
            assert name not in ignore
            assert isinstance(model.get_layer(name), (L.LayerNormalization, L.GroupNormalization))
            ignore.append(name)


@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
@given(model=random_cnns())
def test_masks_match_rebuild_on_random_models(model):
    _masks_match_rebuild_on(model)


@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
@given(model=random_cnns(), seed=st.integers(0, 2**16))
def test_masks_match_rebuild_on_random_models_with_frozen_trained_layers(model, seed):
    """Half the layers, drawn at random, frozen with trained-like weights (offsets and statistics
    that map a zero channel to a nonzero one): their weights are masked too, and the masks still
    match the rebuild."""
    rng = np.random.default_rng(seed)
    for layer in model.layers:
        if layer.weights and rng.random() < 0.5:
            layer.set_weights([rng.uniform(0.5, 1.5, w.shape) if "variance" in w.path
                               else rng.normal(0.0, 0.5, w.shape) for w in layer.weights])
            layer.trainable = False
    _masks_match_rebuild_on(model)


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(model=random_cnns())
def test_masks_match_rebuild_on_many_random_models(model):
    _masks_match_rebuild_on(model)


def _normalized_model(norm):
    """A conv whose channels a normalization over the channel axis mixes, after a prunable conv."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8, 8, 3))
    x = L.Conv2D(16, 1, name="c")(L.Conv2D(12, 3, activation="relu", name="a")(inputs))
    x = norm(name="norm")(x)
    return keras.Model(inputs, L.Dense(5, name="fc")(L.GlobalAveragePooling2D()(x)))


@pytest.mark.parametrize("norm, refused", [
    (L.LayerNormalization, False), (lambda name: L.GroupNormalization(2, name=name), True)])
def test_channels_a_normalization_mixes_are_refused_to_masks_alone_then_kept_with_ignore(norm,
                                                                                         refused):
    # Regression (random_cnns' "norms" block): a masked channel is zero but still counts in a
    # LayerNormalization's mean and variance (or a group's), so the masked model computed
    # something else than the rebuilt one. Masks alone are refused, naming the layer; a fit
    # lends a LayerNormalization statistics over the kept channels (tests/test_gradual_norms.py),
    # and refuses a GroupNormalization before training.
    model, x, y = _normalized_model(norm), _batch((None, 8, 8, 3), 8), np.arange(8) % 5
    the_plan = kp.plan(model, params=0.3)
    assert next(v["new"] < v["width"] for v in the_plan.variables if v["name"] == "c")
    graph = walk(model)
    with pytest.raises(kp.ArgumentError, match=r"'norm'.*plan=.*ignore=\['norm'\]") as e:
        gradual.channel_masks(graph, [v["new"] for v in the_plan.variables])
    assert e.value.arguments["ignore"] == ["norm"]
    before = [keras.ops.convert_to_numpy(w) for w in model.weights]
    model.compile(keras.optimizers.SGD(0.1), "sparse_categorical_crossentropy")
    pruning = kp.GradualPruning(the_plan, end_step=2, frequency=1, verbose=0)
    if not refused:
        model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[pruning])
        assert pruning.finalize().count_params() == the_plan.predicted["params"]
        return
    with pytest.raises(kp.ArgumentError, match=r"'norm' \(GroupNormalization\)"):
        model.fit(x, y, epochs=1, verbose=0, callbacks=[pruning])
    for b, w in zip(before, model.weights, strict=True):  # refused before any step
        np.testing.assert_array_equal(b, keras.ops.convert_to_numpy(w))
    kept, dropped = _assert_masks_match_rebuild(model, kp.plan(model, params=0.5, ignore=["norm"]),
                                                1.0)
    assert kept > 0 and dropped > 0  # conv "a" still pruned


def test_masks_and_kept_weights_through_a_depthwise_conv_cut_to_one_channel():
    # Regression (random_cnns' "grouped" block on a 3-channel stream): a Conv2D with groups equal
    # to its 3 input channels, cut to one channel, is rebuilt with groups=1; carrying its weights
    # refused it ("no channel map") though each output still reads the one input channel.
    keras.utils.set_random_seed(0)
    inputs = keras.Input((6, 6, 3))
    x = L.Conv2D(9, 3, groups=3, padding="same", name="dw")(L.Conv2D(3, 3, name="a")(inputs))
    model = keras.Model(inputs, L.Dense(5, name="fc")(L.Flatten()(x)))
    graph = walk(model)
    widths = [1 if v.name == "a" else v.width for v in graph.variables]
    kept, dropped = _assert_masks_match_rebuild_at(graph, widths)
    assert kept > 0 and dropped > 0


def _fit_setup(seed=0):
    model = _resnet_block_model(seed)
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(32, 8, 8, 3)).astype("float32")
    y = rng.integers(0, 5, 32)
    return model, x, y


def test_fit_prunes_gradually_and_finalizes_exactly():
    model, x, y = _fit_setup()
    original = [keras.ops.convert_to_numpy(w) for w in model.trainable_weights]
    model.compile(keras.optimizers.SGD(0.01, momentum=0.9),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    the_plan = kp.plan(model, params=0.4)
    pruning = kp.GradualPruning(the_plan, end_step=6, frequency=2, verbose=0)
    model.fit(x, y, batch_size=4, epochs=2, callbacks=[pruning], verbose=0)  # 16 steps
    small = pruning.finalize()
    assert small.count_params() == the_plan.predicted["params"]
    masks, _ = gradual.channel_masks(pruning._graph, pruning._widths)
    for w, mask in pruning._masks:
        assert not np.any(keras.ops.convert_to_numpy(w)[mask == 0])
    trained = dict(zip([w.path for w in model.trainable_weights], original))
    for w, mask in pruning._masks:  # every kept weight still learns
        kept = mask == 1
        assert not np.allclose(keras.ops.convert_to_numpy(w)[kept], trained[w.path][kept])
    np.testing.assert_allclose(keras.ops.convert_to_numpy(model(x[:4])),
                               keras.ops.convert_to_numpy(small(x[:4])), rtol=1e-4, atol=1e-4)


def test_steps_per_execution_skips_no_update_and_reaches_the_plan():
    """Callbacks see every 4th step: the updates due in between (and end_step) still happen."""
    model, x, y = _fit_setup(5)
    model.compile(keras.optimizers.SGD(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  steps_per_execution=4)
    the_plan = kp.plan(model, params=0.5)
    pruning = kp.GradualPruning(the_plan, end_step=6, frequency=2, verbose=0)
    model.fit(x, y, batch_size=4, epochs=1, callbacks=[pruning], verbose=0)  # steps 4, 8
    small = pruning.finalize()
    assert small.count_params() == the_plan.predicted["params"]
    for w, mask in pruning._masks:
        assert not np.any(keras.ops.convert_to_numpy(w)[mask == 0])
    np.testing.assert_allclose(keras.ops.convert_to_numpy(model(x[:4])),
                               keras.ops.convert_to_numpy(small(x[:4])), rtol=1e-4, atol=1e-4)


def test_regrow_masks_only_at_updates():
    model, x, y = _fit_setup(1)
    model.compile(keras.optimizers.SGD(0.05, momentum=0.9),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    the_plan = kp.plan(model, params=0.5)
    pruning = kp.GradualPruning(the_plan, end_step=8, frequency=4, regrow=True, verbose=0)
    model.fit(x[:28], y[:28], batch_size=4, epochs=1, callbacks=[pruning], verbose=0)
    # 7 steps: masks made at steps 0 and 4, none since
    regrown = [np.any(keras.ops.convert_to_numpy(w)[m == 0]) for w, m in pruning._masks]
    assert any(regrown)  # trained back between updates
    with pytest.raises(kp.ArgumentError, match="end_step"):
        pruning.finalize()


def _unlearning_model_and_its_doomed_channels():
    """A model compiled not to learn (only a callback moves its weights), its data, a plan, the
    plan's final masks and the weights they cut, as they were before training."""
    model, x, y = _fit_setup(4)
    model.compile(keras.optimizers.SGD(0.0), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    the_plan = kp.plan(model, params=0.5)
    graph = walk(model)
    final, _ = gradual.channel_masks(graph, kp.planning.planned_widths(graph, the_plan, model))
    before = {w.path: keras.ops.convert_to_numpy(w) for w, _ in final}
    return model, (x, y), the_plan, final, before


def test_shrink_fades_the_channels_the_plan_leaves_out_then_masks_them():
    model, (x, y), the_plan, final, before = _unlearning_model_and_its_doomed_channels()
    pruning = kp.GradualPruning(the_plan, end_step=6, frequency=3, schedule="final", shrink=0.1,
                                verbose=0)
    model.fit(x, y, batch_size=8, epochs=1, callbacks=[pruning], verbose=0)  # steps 1-4
    for w, mask in final:  # faded at begin and after each of 4 steps; nothing masked yet
        now = keras.ops.convert_to_numpy(w)
        np.testing.assert_allclose(now[mask == 0], before[w.path][mask == 0] * 0.9 ** 5, rtol=1e-5)
        np.testing.assert_array_equal(now[mask == 1], before[w.path][mask == 1])
    model.fit(x, y, batch_size=8, epochs=1, callbacks=[pruning], verbose=0)  # steps 5-8
    small = pruning.finalize()
    assert small.count_params() == the_plan.predicted["params"]
    for w, mask in final:
        assert not np.any(keras.ops.convert_to_numpy(w)[mask == 0])
    np.testing.assert_allclose(keras.ops.convert_to_numpy(model(x[:4])),
                               keras.ops.convert_to_numpy(small(x[:4])), rtol=1e-4, atol=1e-4)


def test_shrink_waits_for_start_step():
    """``shrink`` fades between ``start_step`` and ``end_step``, not before."""
    model, (x, y), the_plan, final, before = _unlearning_model_and_its_doomed_channels()
    pruning = kp.GradualPruning(the_plan, start_step=4, end_step=8, frequency=2, schedule="final",
                                shrink=0.1, verbose=0)
    model.fit(x[:24], y[:24], batch_size=8, epochs=1, callbacks=[pruning], verbose=0)  # steps 1-3
    for w, _ in final:
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(w), before[w.path])
    model.fit(x[:16], y[:16], batch_size=8, epochs=1, callbacks=[pruning], verbose=0)  # steps 4-5
    for w, mask in final:  # faded after steps 4 and 5 (and at the fit's start, still step 3: not)
        np.testing.assert_allclose(keras.ops.convert_to_numpy(w)[mask == 0],
                                   before[w.path][mask == 0] * 0.9 ** 2, rtol=1e-5)


def test_a_model_argument_the_fit_does_not_train_is_refused_and_a_student_is_pruned():
    """``model=`` names the model to prune within the one fitted (here a Distiller's student); the
    schedule counts the fitted model's optimizer steps. A model the fit does not train is refused."""
    model, x, y = _fit_setup(2)
    distiller = keras.distillation.Distiller(
        teacher=_resnet_block_model(3), student=model,
        distillation_losses=keras.distillation.LogitsDistillation(temperature=4.0))
    distiller.compile(keras.optimizers.SGD(0.01), loss="sparse_categorical_crossentropy")
    the_plan = kp.plan(model, params=0.5)
    pruning = kp.GradualPruning(the_plan, end_step=4, frequency=2, model=model, verbose=0)
    distiller.fit(x, y, batch_size=8, epochs=2, callbacks=[pruning], verbose=0)
    small = pruning.finalize()
    assert small.count_params() == the_plan.predicted["params"]
    np.testing.assert_allclose(keras.ops.convert_to_numpy(model(x[:4])),
                               keras.ops.convert_to_numpy(small(x[:4])), rtol=1e-4, atol=1e-4)
    other, _, _ = _fit_setup(5)
    other.compile(keras.optimizers.SGD(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    elsewhere = kp.GradualPruning(kp.plan(model, params=0.5), end_step=4, model=model, verbose=0)
    with pytest.raises(kp.ArgumentError, match="model=.*does not train it"):
        other.fit(x, y, batch_size=8, epochs=1, callbacks=[elsewhere], verbose=0)


def test_an_optimizer_that_counted_past_the_schedule_is_refused(tmp_path):
    """The schedule counts ``optimizer.iterations``: a model saved compiled and loaded brings its
    count, and its first update would cut at once; refused, naming the steps to give instead."""
    model, x, y = _fit_setup(6)
    model.compile(keras.optimizers.SGD(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, batch_size=4, epochs=1, verbose=0)  # 8 steps
    model.save(tmp_path / "trained.keras")
    loaded = keras.models.load_model(tmp_path / "trained.keras")
    pruning = kp.GradualPruning(kp.plan(loaded, params=0.5), end_step=6, frequency=2, verbose=0)
    with pytest.raises(kp.ArgumentError, match=r"already 8 .*start_step=8, end_step=14"):
        loaded.fit(x, y, batch_size=4, epochs=1, callbacks=[pruning], verbose=0)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(loaded(x[:4])),
                                  keras.ops.convert_to_numpy(model(x[:4])))  # nothing masked
    shifted = kp.GradualPruning(kp.plan(loaded, params=0.5), start_step=8, end_step=14, frequency=2,
                                verbose=0)
    loaded.fit(x, y, batch_size=4, epochs=1, callbacks=[shifted], verbose=0)  # steps 9-16
    assert shifted.finalize().count_params() == shifted.plan.predicted["params"]


def test_fading_rebuilds_the_model_once_and_ranks_the_current_weights_at_every_update(monkeypatch):
    """The model rebuilt at the plan's widths (which the masks are carried through) is built once
    for all updates, none at full widths; the ranking still follows the training weights: the
    faded channels at the last update are those a fresh ``channel_masks`` picks from them."""
    model, x, y = _fit_setup(4)
    model.compile(keras.optimizers.SGD(0.05), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    the_plan = kp.plan(model, params=0.5)
    built = []
    monkeypatch.setattr(gradual, "rebuild", lambda *a, **k: built.append(a[1]) or rebuild(*a, **k))
    pruning = kp.GradualPruning(the_plan, end_step=12, frequency=2, schedule="final", shrink=0.1,
                                verbose=0)
    model.fit(x, y, batch_size=8, epochs=2, callbacks=[pruning], verbose=0)  # steps 1-8: 5 updates
    targets = kp.planning.planned_widths(walk(model), the_plan, model)
    assert built == [targets]
    fresh, _ = gradual.channel_masks(walk(model), targets)
    faded = {w.path: keras.ops.convert_to_numpy(f) < 1 for w, f in pruning._fading}
    assert faded and {w.path: m == 0 for w, m in fresh}.keys() == faded.keys()
    for w, mask in fresh:
        np.testing.assert_array_equal(faded[w.path], mask == 0)


def test_a_writer_channel_once_masked_stays_out_though_its_stream_channel_grows():
    """``regrow=False``: a residual writer narrower than its stream keeps its masked channels out,
    even where the stream's shared order, re-ranked, would hand one back (the stream's own channel
    made the strongest after the writer lost it); the zeros only grow, update after update."""
    model = gradual_fit.residual_cnn()
    x, y = gradual_fit.data(batches=8)
    model.compile(keras.optimizers.SGD(0.0), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    the_plan = kp.plan(model, params=0.2)  # the stream 16 -> 11, its writer c2 16 -> 9
    pruning = kp.GradualPruning(the_plan, end_step=6, frequency=2, schedule="linear", verbose=0)
    history, boosted = [], []

    class Boost(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            history.append({w.path: m.copy() for w, m in pruning._masks})
            masks = history[-1]
            lost = np.flatnonzero((masks.get("c2/bias", np.ones(16)) == 0)
                                  & (masks.get("stem_bn/gamma", np.ones(16)) == 1))
            if len(lost) and not boosted:  # the stream's channel j, which c2 no longer writes
                boosted.append(int(lost[0]))
                for w in (model.get_layer("stem").kernel, model.get_layer("stem_bn").gamma):
                    value = keras.ops.convert_to_numpy(w)
                    value[..., boosted[0]] *= 100.0
                    w.assign(value)

    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, callbacks=[pruning, Boost()], verbose=0)
    assert boosted and pruning._fraction == 1.0
    assert history[-1]["c2/bias"][boosted[0]] == 0 and not history[-1]["c2/kernel"][..., boosted[0]].any()
    for before, after in zip(history, history[1:]):
        for path, mask in before.items():
            assert not np.any(after[path][mask == 0]), path
    small = pruning.finalize()
    np.testing.assert_allclose(keras.ops.convert_to_numpy(model(x[:4])),
                               keras.ops.convert_to_numpy(small(x[:4])), rtol=1e-4, atol=1e-4)


def test_a_new_callback_on_a_masked_model_keeps_its_masked_channels_out():
    """A fit resumed with a new callback (``BackupAndRestore`` restores the masked weights, not the
    callback's ranking): the channels that are zero rank last, so the writer's masked channel stays
    out even where its stream channel is now the strongest."""
    model = gradual_fit.residual_cnn()
    x, y = gradual_fit.data(batches=3)
    model.compile(keras.optimizers.SGD(0.0), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    the_plan = kp.plan(model, params=0.2)
    first = kp.GradualPruning(the_plan, end_step=6, frequency=2, schedule="linear", verbose=0)
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, callbacks=[first], verbose=0)  # steps 1-3
    masks = {w.path: m for w, m in first._masks}
    lost = np.flatnonzero((masks["c2/bias"] == 0) & (masks.get("stem_bn/gamma", np.ones(16)) == 1))
    assert len(lost)
    for w in (model.get_layer("stem").kernel, model.get_layer("stem_bn").gamma):
        value = keras.ops.convert_to_numpy(w)
        value[..., lost[0]] *= 100.0
        w.assign(value)
    second = kp.GradualPruning(the_plan, end_step=6, frequency=2, schedule="linear", verbose=0)
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, callbacks=[second], verbose=0)  # 4-6
    assert second._fraction == 1.0
    again = {w.path: m for w, m in second._masks}
    for path, mask in masks.items():  # what the first callback masked stays masked
        assert not np.any(again[path][mask == 0]), path
    assert not keras.ops.convert_to_numpy(model.get_layer("c2").kernel)[..., lost[0]].any()


def test_frozen_layers_are_masked_too():
    """A trained BatchNormalization frozen (as transfer learning freezes them) writes its offset into
    a cut channel whatever its input; a frozen conv reads it. Their weights are masked like the
    trainable ones, so the masked model still computes the finalized one, and they stay frozen."""
    model, x, y = _fit_setup(7)
    rng = np.random.default_rng(7)
    for name in ("b0_bn1", "b0_c2"):
        layer = model.get_layer(name)
        if name == "b0_bn1":  # trained statistics and offset: a cut channel is not zero after it
            layer.set_weights([rng.uniform(0.5, 1.5, w.shape).astype("float32") for w in layer.weights])
        layer.trainable = False
    frozen = model.get_layer("b0_c2").kernel
    before = keras.ops.convert_to_numpy(frozen)
    model.compile(keras.optimizers.SGD(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    the_plan = kp.plan(model, params=0.4)
    pruning = kp.GradualPruning(the_plan, end_step=4, frequency=2, verbose=0)
    model.fit(x, y, batch_size=8, epochs=2, callbacks=[pruning], verbose=0)
    small = pruning.finalize()
    np.testing.assert_allclose(keras.ops.convert_to_numpy(model(x[:4])),
                               keras.ops.convert_to_numpy(small(x[:4])), rtol=1e-4, atol=1e-4)
    masks = {w.path: m for w, m in pruning._masks}
    assert "b0_bn1/beta" in masks and "b0_c2/kernel" in masks
    now = keras.ops.convert_to_numpy(frozen)
    kept = masks["b0_c2/kernel"] == 1
    np.testing.assert_array_equal(now[kept], before[kept])  # frozen: masked, never trained
    assert not now[~kept].any() and not model.get_layer("b0_c2").trainable


def test_distiller_student_is_pruned():
    model, x, y = _fit_setup(2)
    teacher = _resnet_block_model(3)
    distiller = keras.distillation.Distiller(
        teacher=teacher, student=model,
        distillation_losses=keras.distillation.LogitsDistillation(temperature=4.0),
        student_loss_weight=0.5)
    distiller.compile(keras.optimizers.SGD(0.01), loss="sparse_categorical_crossentropy")
    the_plan = kp.plan(model, params=0.5)
    teacher_weights = [keras.ops.convert_to_numpy(w) for w in teacher.weights]
    pruning = kp.GradualPruning(the_plan, end_step=4, frequency=2, verbose=0)
    distiller.fit(x, y, batch_size=8, epochs=2, callbacks=[pruning], verbose=0)
    small = pruning.finalize()
    assert small.count_params() == the_plan.predicted["params"]
    np.testing.assert_allclose(keras.ops.convert_to_numpy(model(x[:4])),
                               keras.ops.convert_to_numpy(small(x[:4])), rtol=1e-4, atol=1e-4)
    for before, w in zip(teacher_weights, teacher.weights):
        np.testing.assert_array_equal(before, keras.ops.convert_to_numpy(w))


def _optimizer(kind):
    return {"adam": lambda: keras.optimizers.Adam(0.01),
            "nadam": lambda: keras.optimizers.Nadam(0.01),  # a global variable Keras names itself
            "rmsprop": lambda: keras.optimizers.RMSprop(0.01, momentum=0.5, centered=True),
            "sgd": lambda: SGDWithL2(1e-3, momentum=0.9, learning_rate=keras.optimizers.schedules.
                                     PolynomialDecay(0.05, 24, 0.0))}[kind]()


def _fit_then_finalize(seed, kind, epochs, distill):
    """A model (or a Distiller's student) fitted with gradual pruning (masks final at step 4), the
    callback, its finalized smaller model and what fit trained."""
    model, x, y = _fit_setup(seed)
    trained = model
    if distill:
        trained = finetune.distiller(model, _resnet_block_model(seed + 1))
    trained.compile(_optimizer(kind), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    pruning = kp.GradualPruning(kp.plan(model, params=0.5), end_step=4, frequency=2, verbose=0)
    trained.fit(x, y, batch_size=4, epochs=epochs, shuffle=False, callbacks=[pruning], verbose=0)
    return pruning, pruning.finalize(), x, y


def _on_smaller(pruning, small, x, y, seed, kind, distill, carry=True):
    """``small`` trained on for epoch 2 (8 steps), the optimizer carried over (or fresh)."""
    trained = finetune.distiller(small, _resnet_block_model(seed + 1)) if distill else small
    trained.compile(_optimizer(kind), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    if carry:
        pruning.carry_optimizer(trained)
    before = [keras.ops.convert_to_numpy(w) for w in small.trainable_weights]
    trained.fit(x, y, batch_size=4, epochs=3, initial_epoch=2, shuffle=False, verbose=0)
    return before


@pytest.mark.parametrize("kind, distill", [
    ("adam", False), *(pytest.param(*case, marks=pytest.mark.slow)
                       for case in [("sgd", False), ("sgd", True), ("nadam", False), ("rmsprop", False)])])
def test_training_on_smaller_with_the_carried_optimizer_is_training_on_masked(kind, distill):
    """Masks final at step 4, then 8 more steps: of the masked model (reference), or of the
    finalized smaller model with the optimizer's state carried over (step count, momentum or
    Adam's moments sliced to the kept channels). The weights end the same; every kept weight
    trained on; a fresh optimizer (no carry) ends elsewhere, so the comparison can fail."""
    _, reference, _, _ = _fit_then_finalize(7, kind, epochs=3, distill=distill)
    pruning, small, x, y = _fit_then_finalize(7, kind, epochs=2, distill=distill)
    before = _on_smaller(pruning, small, x, y, 7, kind, distill)
    for w, ref in zip(small.weights, reference.weights, strict=True):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(w), keras.ops.convert_to_numpy(ref),
                                   rtol=1e-4, atol=1e-5, err_msg=w.path)
    for w, old in zip(small.trainable_weights, before):
        assert not np.allclose(keras.ops.convert_to_numpy(w), old), w.path
    pruning, fresh, x, y = _fit_then_finalize(7, kind, epochs=2, distill=distill)
    _on_smaller(pruning, fresh, x, y, 7, kind, distill, carry=False)
    gap = max(np.abs(keras.ops.convert_to_numpy(a) - keras.ops.convert_to_numpy(b)).max()
              for a, b in zip(fresh.trainable_weights, reference.trainable_weights))
    assert gap > 1e-3


def test_finalize_after_a_resumed_fit_that_trained_no_batch(tmp_path):
    """A run cut short after ``end_step`` and rerun: ``BackupAndRestore`` restores the masked model,
    ``fit`` trains no batch, and a new callback still finalizes a smaller model that computes what
    the masked one does (it masks at the restored step; the masked channels, zero, rank last)."""
    smalls = []
    for run in range(3):
        model, x, y = _fit_setup(10)
        model.compile(keras.optimizers.SGD(0.05, momentum=0.9),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        pruning = kp.GradualPruning(kp.plan(model, params=0.5), end_step=4, frequency=2, verbose=0)
        model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0,
                  callbacks=[keras.callbacks.BackupAndRestore(str(tmp_path), delete_checkpoint=False),
                             pruning])
        if run == 2:  # restored, then moved off its masks: refused, not cut silently
            for w in model.trainable_weights:
                w.assign(w + 0.01)
            with pytest.raises(kp.ArgumentError, match="would lose trained weights"):
                pruning.finalize()
            break
        smalls.append(pruning.finalize())
        masked = model
    assert pruning._updated_at == 8  # the reruns trained nothing: they ranked at the restored step
    assert [w.shape for w in smalls[1].weights] == [w.shape for w in smalls[0].weights]
    for small in smalls:  # the stream's order may differ (ranked later), not what it computes
        np.testing.assert_allclose(keras.ops.convert_to_numpy(small(x[:4])),
                                   keras.ops.convert_to_numpy(masked(x[:4])), rtol=1e-5, atol=1e-5)


def test_carry_optimizer_refuses_what_it_cannot_carry():
    pruning, small, _, _ = _fit_then_finalize(8, "sgd", epochs=1, distill=False)
    unfinalized = kp.GradualPruning(pruning.plan, end_step=4)
    with pytest.raises(kp.ArgumentError, match="finalize"):
        unfinalized.carry_optimizer(small)
    with pytest.raises(kp.ArgumentError, match="compiled"):
        pruning.carry_optimizer(small)
    other = _resnet_block_model(9)
    other.compile(_optimizer("sgd"), "mse")
    with pytest.raises(kp.ArgumentError, match="model="):
        pruning.carry_optimizer(other)
    small.compile(keras.optimizers.Adam(), "mse")
    with pytest.raises(kp.ArgumentError, match="optimizer='Adam'.*SGDWithL2"):
        pruning.carry_optimizer(small)
    small.compile(SGDWithL2(1e-3, momentum=0.9, use_ema=True), "mse")  # averages it never kept
    with pytest.raises(kp.ArgumentError, match=r"kinds \['average', 'momentum'\].*use_ema"):
        pruning.carry_optimizer(small)
    model, x, y = _fit_setup(8)
    model.compile(keras.optimizers.Lamb(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    by_lamb = kp.GradualPruning(kp.plan(model, params=0.5), end_step=2, frequency=1, verbose=0)
    model.fit(x[:8], y[:8], batch_size=4, epochs=1, callbacks=[by_lamb], verbose=0)
    smaller = by_lamb.finalize()
    smaller.compile(keras.optimizers.Lamb(0.01), "mse")
    with pytest.raises(kp.ArgumentError, match="optimizer='Lamb'.*whole tensors"):
        by_lamb.carry_optimizer(smaller)


def test_carry_optimizer_refuses_weights_that_share_a_path():
    """A layer named as one inside a nested model: Keras gives both kernels the path ``c/kernel``,
    so their slots share a name; refused rather than carried into the wrong weight."""
    keras.utils.set_random_seed(0)
    inner_in = keras.Input((6, 6, 8))
    inner = keras.Model(inner_in, L.Conv2D(8, 3, padding="same", name="c")(inner_in), name="blk")
    inputs = keras.Input((6, 6, 3))
    x = L.Conv2D(8, 3, padding="same", name="stem")(inputs)
    x = L.Conv2D(8, 3, padding="same", name="c")(inner(x))
    model = keras.Model(inputs, L.Dense(4, name="fc")(L.GlobalAveragePooling2D()(x)))
    model.compile(keras.optimizers.SGD(0.01, momentum=0.9),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = _fit_setup(0)[1][:, :6, :6], _fit_setup(0)[2]
    pruning = kp.GradualPruning(kp.plan(model, params=0.5), end_step=2, frequency=1, verbose=0)
    model.fit(x[:8], y[:8], batch_size=4, epochs=1, callbacks=[pruning], verbose=0)
    small = pruning.finalize()
    small.compile(keras.optimizers.SGD(0.01, momentum=0.9), "mse")
    with pytest.raises(kp.ArgumentError, match=r"\['c/bias', 'c/kernel'\] share their paths"):
        pruning.carry_optimizer(small)


@pytest.mark.parametrize("kwargs, name", [
    ({"end_step": -1}, "end_step"), ({"end_step": 5, "start_step": 6}, "end_step"),
    ({"end_step": 5, "frequency": 0}, "frequency"), ({"end_step": 5, "schedule": "exp"}, "schedule"),
    ({"end_step": 5, "importance": "taylor"}, "importance"), ({"end_step": 5, "regrow": 1}, "regrow"),
    ({"end_step": 5, "shrink": 1.0}, "shrink"), ({"end_step": 5, "shrink": "0.1"}, "shrink"),
])
def test_bad_arguments_name_themselves(kwargs, name):
    model = _resnet_block_model()
    with pytest.raises(kp.ArgumentError, match=f"{name}="):
        kp.GradualPruning(kp.plan(model, params=0.5), **kwargs)
    with pytest.raises(kp.ArgumentError, match="plan="):
        kp.GradualPruning("plan.json", end_step=3)
