"""keras_hub vision transformers through kp.hub (issue 61): homogeneous plans as new configs.

References: Keras' ``count_params()``, TensorFlow's MAC count, the keras_hub
class and config of the result, a ``.keras`` round trip with keras_hub
alone, the original's outputs (identity plans) and its weights (kept slices).
"""

import importlib
import json

import keras
import numpy as np
import pytest

import keras_precrop as kp
from tests.conftest import tf_macs

keras_hub = pytest.importorskip("keras_hub")


def _vit(layers=3, heads=4, hidden=32, mlp=64, task=True, seed=0):
    keras.utils.set_random_seed(seed)
    backbone = keras_hub.models.ViTBackbone(
        image_shape=(32, 32, 3), patch_size=8, num_layers=layers, num_heads=heads,
        hidden_dim=hidden, mlp_dim=mlp)
    if not task:
        return backbone
    return keras_hub.models.ViTImageClassifier(backbone=backbone, num_classes=10,
                                               preprocessor=None, activation=None)


def _images(n=2, seed=1):
    return np.random.default_rng(seed).random((n, 32, 32, 3)).astype("float32")


@pytest.mark.parametrize("budget", [{"params": 0.5}, pytest.param({"flops": 0.4}, marks=pytest.mark.slow)])
def test_a_vit_task_comes_back_as_keras_hub_classes_with_a_new_config(budget, tmp_path):
    model = _vit()
    small = kp.hub.precrop(model, **budget)
    backbone = small.backbone
    assert type(small) is type(model) and type(backbone) is type(model.backbone)
    plan = small.precrop_plan
    assert small.count_params() == plan.params and tf_macs(small) == plan.macs
    kind, ratio = next(iter(budget.items()))
    original = model.count_params() if kind == "params" else tf_macs(model)
    assert (plan.params if kind == "params" else plan.macs) <= ratio * original
    assert backbone.hidden_dim // backbone.num_heads == 32 // 4  # the head size is kept
    assert backbone.hidden_dim < 32 or backbone.mlp_dim < 64
    path = tmp_path / "small.keras"
    small.save(path)
    again = keras.models.load_model(path)  # keras_hub's own classes: nothing of this package
    assert type(again) is type(model)
    np.testing.assert_allclose(again(_images()), small(_images()), atol=1e-6)


def test_an_identity_plan_keeps_the_outputs():
    model = _vit()
    same = kp.hub.precrop(model, params=1.0, weights="keep")
    assert type(same.backbone) is type(model.backbone)
    np.testing.assert_allclose(same(_images()), model(_images()), atol=1e-5)


def _positions(new, old):
    """Where each of ``new``'s (distinct, random) values sits in ``old``."""
    where = [np.flatnonzero(old == value) for value in new]
    assert all(len(w) == 1 for w in where)
    return np.concatenate(where)


def test_kept_weights_are_slices_of_the_original():
    """Against the original's arrays: the class token says which hidden channels stay, each
    MLP's first bias which neurons; its kernel is the original's at those rows and columns."""
    model = _vit()
    small = kp.hub.precrop(model, params=0.5, weights="keep")
    old = {w.path: keras.ops.convert_to_numpy(w) for w in model.weights}
    new = {w.path: keras.ops.convert_to_numpy(w) for w in small.weights}
    token = next(path for path in old if path.endswith("class_token"))
    rows = _positions(new[token].ravel(), old[token].ravel())
    assert len(rows) == small.backbone.hidden_dim and (np.diff(rows) > 0).all()
    checked = 0
    for path in new:
        if path.endswith("mlp/dense_1/bias"):
            columns = _positions(new[path], old[path])
            kernel = path[:-len("bias")] + "kernel"
            np.testing.assert_array_equal(new[kernel], old[kernel][np.ix_(rows, columns)])
            checked += 1
    assert checked == 3


def test_per_block_widths_on_request_keep_the_heads_input():
    model = _vit()
    small = kp.hub.precrop(model, params=0.6, homogeneous=False)
    assert isinstance(small.backbone, kp.hub.PrunedBackbone)
    assert small.count_params() <= 0.6 * model.count_params() + model.count_params() * 0.02
    assert small.backbone.output.shape[-1] == 32  # the head reads the backbone's output widths


def test_homogeneous_on_a_bare_backbone_prunes_what_its_output_allows():
    backbone = _vit(task=False)
    small = kp.hub.precrop(backbone, params=0.8, homogeneous=True)
    assert type(small) is type(backbone)
    assert small.hidden_dim == 32 and small.num_heads == 4 and small.mlp_dim < 64


def test_homogeneous_refusals_name_the_argument():
    resnet = keras_hub.models.ResNetBackbone(
        input_conv_filters=[64], input_conv_kernel_sizes=[3], stackwise_num_filters=[64],
        stackwise_num_blocks=[1], stackwise_num_strides=[1], block_type="basic_block",
        use_pre_activation=False, image_shape=(32, 32, 3))
    with pytest.raises(kp.ArgumentError, match="homogeneous.*ViTBackbone"):
        kp.hub.precrop(resnet, params=0.5, homogeneous=True)
    with pytest.raises(kp.ArgumentError, match="seed"):
        kp.hub.precrop(_vit(), params=0.5, seed=3)
    with pytest.raises(kp.ArgumentError, match="homogeneous"):
        kp.hub.precrop(_vit(), params=0.5, homogeneous="yes")


def _mlp_blocks(blocks=3, width=16, mlp=32):
    keras.utils.set_random_seed(0)
    x = keras.Input((5, width))
    h = keras.layers.Dense(width, name="embed")(x)
    for b in range(blocks):
        u = keras.layers.Dense(mlp, activation="gelu", name=f"up{b}")(h)
        h = keras.layers.Add()([h, keras.layers.Dense(width, name=f"down{b}")(u)])
    return keras.Model(x, keras.layers.Dense(3, name="head")(keras.layers.GlobalAveragePooling1D()(h)))


def test_tie_keeps_one_width_ratio_per_class():
    model = _mlp_blocks()
    plan = kp.plan(model, params=0.5, residual="tie", tie=[["up0", "up1", "up2"]])
    widths = plan.widths
    assert widths["up0"] == widths["up1"] == widths["up2"] < 32
    small = kp.apply_plan(model, plan)
    assert small.count_params() == plan.params and tf_macs(small) == plan.macs
    assert plan.params <= 0.5 * model.count_params()


@pytest.mark.parametrize("tie, match", [
    ([["up0", "nope"]], "'nope'"),
    ([["up0", "up1"], ["up1", "up2"]], "two lists"),
    ([["up0"]], "two or more"),
])
def test_tie_refusals_name_the_argument(tie, match):
    with pytest.raises(kp.ArgumentError, match=match):
        kp.plan(_mlp_blocks(), params=0.5, residual="tie", tie=tie)


def test_tie_refuses_a_mode_that_sizes_layers_alone():
    with pytest.raises(kp.ArgumentError, match="mode"):
        kp.plan(_mlp_blocks(), params=0.5, residual="tie", tie=[["up0", "up1"]], mode="layerwise")


def test_an_index_that_keeps_the_channels_flows_one_that_takes_them_is_refused():
    keras.utils.set_random_seed(0)
    x = keras.Input((5, 8))
    h = keras.layers.Dense(8, name="embed")(x)
    token = h[:, 0, :]
    model = keras.Model(x, keras.layers.Dense(3, name="head")(token))
    prof = kp.profile(model)
    assert (prof.total_params, prof.total_macs) == (model.count_params(), tf_macs(model))
    plan = kp.plan(model, params=0.6)
    assert kp.apply_plan(model, plan).count_params() == plan.params
    half = keras.Model(x, keras.layers.Dense(3)(keras.layers.Dense(8)(x)[..., :4]))
    with pytest.raises(kp.UnsupportedLayerError, match="indexes the channel axis") as err:
        kp.profile(half)
    assert kp.profile(half, ignore=err.value.arguments["ignore"]).total_params == half.count_params()


def test_a_deit_task_prunes_into_a_new_config_too(tmp_path):
    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.DeiTBackbone(
        image_shape=(32, 32, 3), patch_size=8, num_layers=2, num_heads=2, hidden_dim=16,
        intermediate_dim=32)
    task = keras_hub.models.DeiTImageClassifier(backbone=backbone, num_classes=10, preprocessor=None)
    same = kp.hub.precrop(task, params=1.0, weights="keep")
    np.testing.assert_allclose(same(_images()), task(_images()), atol=1e-5)
    small = kp.hub.precrop(task, params=0.6, weights="keep")
    assert type(small) is type(task) and type(small.backbone) is type(backbone)
    assert small.count_params() == small.precrop_plan.params <= 0.6 * task.count_params()
    assert tf_macs(small) == small.precrop_plan.macs
    assert small.backbone.hidden_dim // small.backbone.num_heads == 8
    small.save(tmp_path / "deit.keras")
    again = keras.models.load_model(tmp_path / "deit.keras")
    np.testing.assert_allclose(again(_images()), small(_images()), atol=1e-6)


def _cli_pruned(tmp_path, *flags, model=None):
    """The task the command line writes for ``flags`` from a saved ViT task, and that task."""
    from keras_precrop import cli

    model = model or _vit()
    saved, out = tmp_path / "vit.keras", tmp_path / "small.keras"
    model.save(saved)
    assert cli.main(["precrop", str(saved), *flags, "--out", str(out), "--quiet"]) == 0
    return keras.models.load_model(out), model


def test_the_command_line_writes_a_keras_hub_task_of_the_same_classes(tmp_path):
    """A saved ViT task comes back from the command line as kp.hub.precrop makes it: the same
    keras_hub classes, a new config, the trained weights kept (--weights keep, l1, the default for
    a file), so it computes what kp.hub.precrop's does."""
    loaded, model = _cli_pruned(tmp_path, "--params", "0.5")
    small = kp.hub.precrop(model, params=0.5, weights="keep", importance="l1")
    assert type(loaded) is type(model) and type(loaded.backbone) is type(model.backbone)
    plain = lambda config: json.loads(json.dumps(config))  # noqa: E731  (a file's tuples are lists)
    assert plain(loaded.backbone.get_config()) == plain(small.backbone.get_config())
    assert loaded.count_params() == small.count_params() < model.count_params()
    np.testing.assert_allclose(loaded(_images()), small(_images()), atol=1e-6)


def test_the_command_line_gives_per_block_widths_and_replays_its_plan(tmp_path):
    """--no-homogeneous: the task around a PrunedBackbone, as kp.hub.precrop(homogeneous=False)
    makes it; the plan it writes, given back with --apply, makes the same model."""
    plan = tmp_path / "plan.json"
    loaded, model = _cli_pruned(tmp_path, "--params", "0.5", "--no-homogeneous", "--plan", str(plan))
    small = kp.hub.precrop(model, params=0.5, homogeneous=False, weights="keep")
    assert type(loaded) is type(model) and isinstance(loaded.backbone, kp.hub.PrunedBackbone)
    assert loaded.count_params() == small.count_params() < model.count_params()
    np.testing.assert_allclose(loaded(_images()), small(_images()), atol=1e-6)
    again, _ = _cli_pruned(tmp_path, "--apply", str(plan), model=model)
    np.testing.assert_allclose(again(_images()), loaded(_images()), atol=1e-6)


def test_homogeneous_on_a_model_of_no_keras_hub_class_is_refused_by_flag(capsys):
    from keras_precrop import cli

    assert cli.main(["precrop", "resnet20", "--params", "0.5", "--no-homogeneous"]) == 1
    error = capsys.readouterr().err
    assert "--no-homogeneous has no effect on resnet20" in error and "keras_hub" in error


def test_homogeneous_with_a_plan_is_refused_by_flag(tmp_path, capsys):
    """--apply's plan fixes the widths, and whether every block has the same: --homogeneous beside
    it would do nothing."""
    from keras_precrop import cli

    plan = tmp_path / "plan.json"
    model = _vit()
    kp.hub.precrop(model, params=0.5).precrop_plan.to_json(plan)
    model.save(tmp_path / "vit.keras")
    for typed in ("--homogeneous", "--no-homogeneous"):  # each named as typed
        argv = ["precrop", str(tmp_path / "vit.keras"), "--apply", str(plan), typed]
        assert cli.main(argv) == 1
        assert f"{typed} has no effect with --apply" in capsys.readouterr().err


@pytest.mark.parametrize(("flags", "python", "cli_says"), [
    (["--attention", "head_dims"], {"attention": "head_dims"},
     "pass --no-homogeneous for per-block widths"),
    (["--seed", "3"], {"seed": 3}, "leave --seed out, or prune per block (--no-homogeneous)"),
])
def test_homogeneous_refusals_name_flags_on_the_command_line(flags, python, cli_says, tmp_path,
                                                           capsys):
    """The command line's remedy is a flag (Python's: homogeneous=False), never a Python call."""
    from keras_precrop import cli

    model = _vit()
    with pytest.raises(kp.ArgumentError, match="homogeneous=False"):
        kp.hub.precrop(model, params=0.5, **python)
    model.save(tmp_path / "vit.keras")
    assert cli.main(["precrop", str(tmp_path / "vit.keras"), "--params", "0.5", *flags,
                     "--out", str(tmp_path / "small.keras")]) == 1
    error = capsys.readouterr().err
    assert cli_says in error and "homogeneous=False" not in error and "keras.utils" not in error


def test_a_budget_below_what_the_ties_hold_is_refused_without_an_impossible_remedy():
    """min_channels and round_to are 1: lowering them is no remedy (it was suggested, before)."""
    with pytest.raises(kp.InfeasibleBudgetError, match="raise the budget.$") as err:
        kp.hub.precrop(_vit(task=False), params=0.5, homogeneous=True)
    assert "lower min_channels" not in str(err.value) and "one attention head each" in str(err.value)


def test_the_command_line_writes_no_file_keras_cannot_load(tmp_path, capsys, monkeypatch):
    """A rebuilt layer that saves a config its class cannot load (here: the ViT embedding as it
    saved before its config was pinned, as a repaired keras_hub layer still does): the command
    line loads what it wrote, removes a file that does not load, and says what to do instead."""
    from keras_precrop import cli

    rebuild = importlib.import_module("keras_precrop.graph.rebuild")  # the package names a function so
    monkeypatch.setattr(rebuild, "_pin_config", lambda layer, config: None)
    saved, out = tmp_path / "vit.keras", tmp_path / "small.keras"
    _vit().save(saved)
    argv = ["precrop", str(saved), "--params", "0.5", "--no-homogeneous", "--out", str(out), "--quiet"]
    assert cli.main(argv) == 1
    assert not out.exists()
    error = capsys.readouterr().err
    assert f"--out {out}" in error and "cannot load it back" in error and "--homogeneous" in error


def test_the_homogeneous_plan_replays_into_the_same_task(tmp_path):
    """kp.hub.apply_plan of the plan kp.hub.precrop returned (of the whole task, and read back
    from its file) re-creates what precrop made: the same classes, config, parameters and, with
    kept weights, outputs; a bare backbone's homogeneous plan replays into its class too."""
    model = _vit()
    small = kp.hub.precrop(model, params=0.5, weights="keep")
    path = tmp_path / "plan.json"
    small.precrop_plan.to_json(path)
    for plan in (small.precrop_plan, kp.Plan.from_json(path), str(path)):
        again = kp.hub.apply_plan(model, plan, weights="keep")
        assert type(again) is type(model) and type(again.backbone) is type(model.backbone)
        assert again.backbone.get_config() == small.backbone.get_config()
        assert again.count_params() == small.count_params() < model.count_params()
        np.testing.assert_allclose(again(_images()), small(_images()), atol=1e-6)
    backbone = _vit(task=False)
    bare = kp.hub.precrop(backbone, params=0.8, homogeneous=True)
    again = kp.hub.apply_plan(backbone, bare.precrop_plan)
    assert type(again) is type(backbone) and again.get_config() == bare.get_config()


def test_a_plan_of_a_whole_task_the_config_cannot_say_is_refused_by_name():
    backbone = keras_hub.models.ResNetBackbone(
        input_conv_filters=[64], input_conv_kernel_sizes=[3], stackwise_num_filters=[64],
        stackwise_num_blocks=[1], stackwise_num_strides=[1], block_type="basic_block",
        use_pre_activation=False, image_shape=(32, 32, 3))
    task = keras_hub.models.ResNetImageClassifier(backbone=backbone, num_classes=10,
                                                  preprocessor=None)
    plan = kp.plan(task, params=0.6)
    with pytest.raises(kp.PlanMismatchError, match=r"whole task.*homogeneous=False"):
        kp.hub.apply_plan(task, plan)


def _layer_widths(backbone):
    """Each ViT width key's widths, read from the pruned backbone's layers."""
    return {"num_heads": {layer.num_heads for layer in backbone.layers
                          if isinstance(layer, keras.layers.MultiHeadAttention)},
            "mlp_dim": {layer.units for layer in backbone.layers if layer.name.endswith("_mlp_dense")},
            "hidden_dim": {backbone.output.shape[-1]}}


def _check_widths(backbone):
    """Where the layers agree, the attribute says their width; where they differ, it is absent."""
    widths = _layer_widths(backbone)
    for key, values in widths.items():
        if len(values) == 1:
            assert getattr(backbone, key) == next(iter(values)), key
        else:
            assert not hasattr(backbone, key), key
    return widths


@pytest.mark.parametrize("prune", [
    lambda model: kp.hub.precrop(  # block 1's MLP kept whole: the blocks' MLP widths differ
        model, params=0.6, homogeneous=False, ignore=["vit_encoder_transformer_block_1_mlp_dense"]),
    lambda model: kp.hub.reconfigure(model, params=0.8, homogeneous=False),
], ids=["precrop", "reconfigure"])
def test_per_block_widths_say_the_pruned_backbone_or_nothing(prune, tmp_path):
    model = _vit()
    small = prune(model)
    assert isinstance(small.backbone, kp.hub.PrunedBackbone)
    widths = _check_widths(small.backbone)
    assert widths != {"num_heads": {4}, "mlp_dim": {64}, "hidden_dim": {32}}  # it was pruned
    small.save(tmp_path / "small.keras")
    again = keras.models.load_model(tmp_path / "small.keras")
    assert _check_widths(again.backbone) == widths
    assert again.backbone.num_layers == 3 and list(again.backbone.image_shape) == [32, 32, 3]


def test_the_widths_of_a_re_pruned_backbone_say_its_layers():
    small = kp.hub.precrop(_vit(), params=0.6, homogeneous=False).backbone
    smaller = kp.hub.precrop(small, params=0.9)  # a PrunedBackbone, pruned once more
    assert _check_widths(small) != _check_widths(smaller)
    assert smaller.count_params() < small.count_params()


def test_an_unknown_attention_is_named_as_for_kp_precrop():
    model = _vit()
    with pytest.raises(kp.ArgumentError) as reference:
        kp.precrop(model, params=0.5, attention="head")
    with pytest.raises(kp.ArgumentError) as err:
        kp.hub.precrop(model, params=0.5, attention="head")
    assert str(err.value) == str(reference.value) and "'heads', 'head_dims'" in str(err.value)
    with pytest.raises(kp.ArgumentError, match="homogeneous=False"):  # a known one the config cannot say
        kp.hub.precrop(model, params=0.5, attention="head_dims")


@pytest.mark.parametrize("options", [{"round_to": 12}, {"min_channels": 20, "params": 0.55}])
def test_round_to_and_min_channels_hold_for_the_hidden_width_heads_set(options):
    """Homogeneous: the hidden width moves by whole heads of 8 channels; it still keeps round_to
    and min_channels (a hidden width of 16 under round_to=12 or min_channels=20, before)."""
    model = _vit()
    options = {"params": 0.5, **options}
    small = kp.hub.precrop(model, **options)
    backbone = small.backbone
    assert backbone.hidden_dim == 8 * backbone.num_heads
    assert backbone.hidden_dim % options.get("round_to", 1) == 0
    assert backbone.mlp_dim % options.get("round_to", 1) == 0
    assert min(backbone.hidden_dim, backbone.mlp_dim) >= options.get("min_channels", 1)
    assert small.count_params() == small.precrop_plan.params <= options["params"] * model.count_params()


def test_min_channels_the_heads_cannot_meet_within_the_budget_is_refused_by_name():
    """min_channels=20 needs 3 heads of 8 (hidden 24), over 45% of the parameters: refused, not
    a hidden width of 16."""
    with pytest.raises(kp.InfeasibleBudgetError, match="min_channels=20"):
        kp.hub.plan(_vit(), params=0.45, min_channels=20)


def test_a_vit_classifier_with_a_pre_logits_layer_prunes_into_a_new_config_of_the_task(tmp_path):
    """ViTImageClassifier(intermediate_dim=48) puts a Dense of 48 before its logits: the task's
    config says its width (refused as 'no config key for pre_logits', before)."""
    keras.utils.set_random_seed(0)
    model = keras_hub.models.ViTImageClassifier(
        backbone=_vit(task=False), num_classes=10, preprocessor=None, activation=None,
        intermediate_dim=48)
    small = kp.hub.precrop(model, params=0.5)
    assert type(small) is type(model) and small.get_config()["intermediate_dim"] < 48
    assert small.get_layer("pre_logits").units == small.get_config()["intermediate_dim"]
    assert small.count_params() == small.precrop_plan.params <= 0.5 * model.count_params()
    same = kp.hub.precrop(model, params=1.0, weights="keep")
    np.testing.assert_allclose(same(_images()), model(_images()), atol=1e-5)
    small.save(tmp_path / "small.keras")
    again = keras.models.load_model(tmp_path / "small.keras")
    assert again.get_config()["intermediate_dim"] == small.get_config()["intermediate_dim"]
    np.testing.assert_allclose(again(_images()), small(_images()), atol=1e-6)


def test_a_homogeneous_plan_ranks_the_whole_task_on_data():
    """A homogeneous plan is of the task, whose outputs are logits: Taylor and activation ranks
    take data= (refused as a backbone's features, before); per block Taylor stays refused."""
    model = _vit()
    data = (_images(8), np.arange(8) % 10)
    for importance in ("taylor", "activation"):
        same = kp.hub.precrop(model, params=1.0, weights="keep", importance=importance, data=data)
        np.testing.assert_allclose(same(_images()), model(_images()), atol=1e-5)
        small = kp.hub.precrop(model, params=0.5, weights="keep", importance=importance, data=data)
        assert type(small) is type(model) and small.count_params() == small.precrop_plan.params
    with pytest.raises(kp.ArgumentError, match="importance='taylor'.*per block the backbone"):
        kp.hub.precrop(model, params=0.5, homogeneous=False, weights="keep", importance="taylor",
                       data=data)


def test_per_block_the_backbone_is_ranked_by_its_activations_on_inputs_alone():
    """Activations need no logits: per block, kp.hub ranks the backbone by them on images
    alone, as kp.apply_plan ranks the bare backbone, and an identity plan changes nothing."""
    model, images = _vit(), _images(8)
    same = kp.hub.precrop(model, params=1.0, homogeneous=False, weights="keep",
                          importance="activation", data=images)
    np.testing.assert_allclose(same(_images()), model(_images()), atol=1e-5)
    small = kp.hub.precrop(model, params=0.5, homogeneous=False, weights="keep",
                           importance="activation", data=images)
    bare = kp.apply_plan(model.backbone, small.precrop_plan, weights="keep",
                         importance="activation", data=images)
    np.testing.assert_allclose(small.backbone(_images()), bare(_images()), atol=1e-5)
    assert small.backbone.count_params() == small.precrop_plan.params  # the plan is the backbone's


def test_one_layer_kept_whole_says_it_keeps_its_config_key_in_every_block():
    """Ignoring one block's MLP under homogeneous=True keeps mlp_dim in every block (and the
    stream it reads): the refusal says so and names the remedy (before: 'no prunable channels'
    alone); per block, the other blocks prune."""
    model = _vit()
    name = f"{model.backbone.name}_vit_encoder_transformer_block_1_mlp_dense"  # its place in the task
    with pytest.raises(kp.InfeasibleBudgetError, match=f"mlp_dim, as '{name}' is fixed.*"
                       "Use homogeneous=False"):
        kp.hub.precrop(model, params=0.6, ignore=[name])
    own = name.removeprefix(f"{model.backbone.name}_")  # the backbone's own name: taken too
    with pytest.raises(kp.InfeasibleBudgetError, match=f"mlp_dim, as '{name}' is fixed"):
        kp.hub.plan(model, params=0.6, ignore=own)
    for spelled in (name, own):
        small = kp.hub.precrop(model, params=0.6, ignore=[spelled], homogeneous=False)
        assert small.precrop_plan.ignore == [own]
        assert small.backbone.count_params() == small.precrop_plan.params
