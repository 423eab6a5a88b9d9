"""A keras_hub task pruned while it trains, back as the task's own classes (issue 61, item 4).

``kp.hub.plan`` gives the plan ``kp.hub.precrop`` builds with; under a
homogeneous plan ``kp.hub.GradualPruning.finalize`` re-creates the task from a
new config. Checked against independent references: the plan ``kp.hub.precrop``
made, Keras' ``count_params()``, the masked task's outputs as the fit left it
(recorded before the callback gives the norms their own calls back), the
keras_hub class and config of the result, a ``.keras`` round trip with
keras_hub alone, and ``prune-trained`` on the command line.
"""

import keras
import numpy as np
import pytest

import keras_precrop as kp
from tests.test_gradual_norms import _Outputs
from tests.test_hub_text import _classifier
from tests.test_hub_vit import _vit

keras_hub = pytest.importorskip("keras_hub")


def _data(n=32, seed=1):
    rng = np.random.default_rng(seed)
    return rng.random((n, 32, 32, 3)).astype("float32"), rng.integers(0, 10, n)


def test_the_hub_plan_is_the_plan_precrop_builds_with():
    model = _vit()
    for homogeneous in (True, False):
        the_plan = kp.hub.plan(model, params=0.5, homogeneous=homogeneous)
        built = kp.hub.precrop(model, params=0.5, homogeneous=homogeneous).precrop_plan
        assert the_plan.model_name == built.model_name
        assert the_plan.widths == built.widths and the_plan.params == built.params
        assert kp.hub.configures(the_plan) is homogeneous
    assert kp.hub.plan(model, params=0.5, homogeneous=False).model_name == model.backbone.name


def test_the_hub_plan_refuses_what_precrop_refuses_by_name():
    with pytest.raises(TypeError, match="hub.plan.*'weights'"):
        kp.hub.plan(_vit(), params=0.5, weights="keep")
    with pytest.raises(kp.ArgumentError, match="attention='head_dims'.*homogeneous=False"):
        kp.hub.plan(_vit(), params=0.5, attention="head_dims")


def _pruned_in_fit(model, the_plan, data=None):
    """``model`` fitted two epochs of four steps on ``data`` (default: 32 images) under
    ``kp.hub.GradualPruning(the_plan)``, which reaches the plan at step 4: the finalized task,
    8 inputs and the masked task's outputs on them at the end of the fit (its norms over the
    kept channels)."""
    x, y = _data() if data is None else data
    model.compile(keras.optimizers.Adam(1e-2),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    first = keras.tree.map_structure(lambda a: a[:8], x)
    record = _Outputs(model, first)
    pruning = kp.hub.GradualPruning(the_plan, end_step=4, frequency=2, verbose=0)
    model.fit(x, y, batch_size=8, epochs=2, callbacks=[record, pruning], verbose=0)
    return pruning.finalize(), first, record.outputs


def test_a_task_pruned_while_it_trains_comes_back_as_its_own_classes(tmp_path):
    model = _vit()
    the_plan = kp.hub.plan(model, params=0.5)
    small, x, masked = _pruned_in_fit(model, the_plan)
    assert type(small) is type(model) and type(small.backbone) is type(model.backbone)
    config = the_plan.solver["hub_config"]
    assert {key: small.backbone.get_config()[key] for key in config} == config
    assert config["hidden_dim"] < 32 and small.count_params() == the_plan.params
    np.testing.assert_allclose(small(x), masked, atol=1e-5)
    path = tmp_path / "small.keras"
    small.save(path)
    again = keras.models.load_model(path)  # keras_hub's own classes: nothing of this package
    assert type(again) is type(model)
    np.testing.assert_allclose(again(x), masked, atol=1e-5)


def test_a_task_of_open_input_length_comes_back_as_its_own_class():
    """BERT's token inputs have open length: the walk is at a defined one, the task keeps its
    own (a functional model around the task, its class lost, before)."""
    model = _classifier()
    rng = np.random.default_rng(2)
    x = {"token_ids": rng.integers(1, 100, (32, 16)).astype("int32"),
         "segment_ids": np.zeros((32, 16), "int32"), "padding_mask": np.ones((32, 16), "int32")}
    the_plan = kp.hub.plan(model, params=0.5)
    small, first, masked = _pruned_in_fit(model, the_plan, (x, rng.integers(0, 3, 32)))
    assert type(small) is type(model) and type(small.backbone) is type(model.backbone)
    assert small.backbone.hidden_dim < 32 and small.count_params() == the_plan.params
    assert small.inputs[0].shape == (None, None)  # the task's own open length
    np.testing.assert_allclose(small(first), masked, atol=1e-5)


def test_per_block_widths_prune_the_backbone_inside_the_task():
    model = _vit()
    the_plan = kp.hub.plan(model, params=0.5, homogeneous=False)
    small, x, masked = _pruned_in_fit(model, the_plan)
    assert type(small) is type(model) and isinstance(small.backbone, kp.hub.PrunedBackbone)
    assert small.backbone.count_params() == the_plan.params < model.backbone.count_params()
    np.testing.assert_allclose(small(x), masked, atol=1e-5)
    head = model.get_layer("predictions").get_weights()  # trained by the fit, carried whole
    for new, old in zip(small.get_layer("predictions").get_weights(), head, strict=True):
        np.testing.assert_array_equal(new, old)


def test_a_per_block_plan_of_the_whole_task_is_refused_naming_the_callback_that_takes_it():
    model = _vit()
    x, y = _data(8)
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    pruning = kp.hub.GradualPruning(kp.plan(model, params=0.5), end_step=1, verbose=0)
    with pytest.raises(kp.ArgumentError, match="whole graph per block.*kp.GradualPruning"):
        model.fit(x, y, batch_size=8, epochs=1, callbacks=[pruning], verbose=0)


def _saved_task(tmp_path):
    x, y = _data(64)
    np.savez(tmp_path / "data.npz", x_train=x, y_train=y, x_test=x[:16], y_test=y[:16])
    model = _vit()
    model.save(tmp_path / "vit.keras")
    return model, str(tmp_path / "vit.keras"), str(tmp_path / "data.npz")


def test_prune_trained_writes_a_task_of_the_same_keras_hub_classes(tmp_path, capsys):
    from keras_precrop.cli import main

    model, saved, data = _saved_task(tmp_path)
    out = str(tmp_path / "small.keras")
    assert main(["prune-trained", saved, "--params", "0.5", "--data", data, "--epochs", "2",
                 "--batch_size", "16", "--out", out]) == 0
    small = keras.models.load_model(out)
    assert type(small) is type(model) and type(small.backbone) is type(model.backbone)
    config = kp.hub.plan(model, params=0.5).solver["hub_config"]
    assert {key: small.backbone.get_config()[key] for key in config} == config
    assert f"Model written to {out}: {small.count_params():,} params" in capsys.readouterr().out


def test_prune_trained_refit_trains_the_hub_cut_refit_on_the_first_examples(tmp_path, capsys,
                                                                             monkeypatch):
    """--refit on a task: the model that trains is ``kp.hub.apply_plan(..., refit=True)`` on the
    first training examples, of the task's own classes and new config."""
    from keras_precrop.cli import main

    model, saved, data = _saved_task(tmp_path)
    x, y = _data(64)
    entered, fine_tune = [], kp.fine_tune

    def spy(student, *args, **kwargs):
        entered.append((student, student.predict(x[:8], verbose=0)))
        return fine_tune(student, *args, **kwargs)

    monkeypatch.setattr(kp, "fine_tune", spy)
    assert main(["prune-trained", saved, "--params", "0.5", "--refit", "--importance", "activation",
                 "--data", data, "--epochs", "1", "--batch_size", "32",
                 "--out", str(tmp_path / "small.keras")]) == 0
    assert "Refitting" in capsys.readouterr().out
    (student, predicted), = entered
    the_plan = kp.hub.plan(model, params=0.5)
    batches = [(x[:32], y[:32]), (x[32:], y[32:])]
    expected = kp.hub.apply_plan(model, the_plan, weights="keep", importance="activation",
                                 data=batches, refit=True)
    config = the_plan.solver["hub_config"]
    assert type(student) is type(model)
    assert {key: student.backbone.get_config()[key] for key in config} == config
    np.testing.assert_allclose(predicted, expected.predict(x[:8], verbose=0), rtol=1e-3, atol=1e-4)
    cut = kp.hub.apply_plan(model, the_plan, weights="keep", importance="activation", data=batches)
    assert not np.allclose(predicted, cut.predict(x[:8], verbose=0), atol=1e-3)


def test_prune_trained_gives_per_block_widths_in_the_task_or_a_functional_model(tmp_path):
    """--no-homogeneous: the backbone per block inside the task, as ``precrop`` gives it; a plan of
    the task's whole graph (``kp.plan(task)``): a functional model."""
    from keras_precrop.cli import main

    model, saved, data = _saved_task(tmp_path)
    out, whole = str(tmp_path / "small.keras"), str(tmp_path / "whole.json")
    common = ["--data", data, "--epochs", "1", "--batch_size", "32", "--gradual_epochs", "0.5"]
    assert main(["prune-trained", saved, "--params", "0.5", "--no-homogeneous", *common,
                 "--out", out]) == 0
    small = keras.models.load_model(out)
    assert type(small) is type(model) and isinstance(small.backbone, kp.hub.PrunedBackbone)
    assert small.backbone.count_params() == kp.hub.plan(model, params=0.5, homogeneous=False).params
    kp.plan(model, params=0.5).to_json(whole)
    assert main(["prune-trained", saved, "--apply", whole, *common, "--out", out]) == 0
    small = keras.models.load_model(out)
    assert not isinstance(small, keras_hub.models.Task) and small.count_params() == kp.plan(
        model, params=0.5).params


def test_homogeneous_beside_a_plan_file_is_refused_by_flag(tmp_path, capsys):
    from keras_precrop.cli import main

    _, saved, data = _saved_task(tmp_path)
    plan_file = str(tmp_path / "plan.json")
    kp.hub.plan(keras.models.load_model(saved), params=0.5).to_json(plan_file)
    assert main(["prune-trained", saved, "--apply", plan_file, "--homogeneous", "--data", data,
                 "--epochs", "1", "--out", str(tmp_path / "small.keras")]) == 1
    assert f"--homogeneous has no effect with --apply {plan_file}" in capsys.readouterr().err


@pytest.mark.parametrize("homogeneous", [True, False])
def test_model_naming_the_backbone_still_gives_the_task(homogeneous):
    """``model=task.backbone`` (the model to prune, as kp.GradualPruning takes it): the result is
    still the fitted task's class (a bare PrunedBackbone, or a PlanMismatchError, before)."""
    model = _vit()
    the_plan = kp.hub.plan(model, params=0.5, homogeneous=homogeneous)
    x, y = _data(16)
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    pruning = kp.hub.GradualPruning(the_plan, end_step=2, frequency=1, model=model.backbone,
                                    verbose=0)
    model.fit(x, y, batch_size=8, epochs=1, callbacks=[pruning], verbose=0)
    small = pruning.finalize()
    assert type(small) is type(model) and small.count_params() < model.count_params()
