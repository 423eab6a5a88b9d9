"""The keras-precrop command line, run in-process and as a console script."""

import json
import os
import shutil
import subprocess

import keras
import numpy as np
import pytest

import keras_precrop as kp
from keras_precrop import _cli_flags, _startup, cli
from keras_precrop.cli import main
from tests.conftest import run_python, saved_trained_model

# What pip writes for the entry point keras-precrop=keras_precrop.cli:main.
CONSOLE_SCRIPT = """\
import re
import sys
from keras_precrop.cli import main
if __name__ == "__main__":
    sys.argv[0] = re.sub(r"(-script\\.pyw|\\.exe)?$", "", sys.argv[0])
    sys.exit(main())
"""


def test_list(capsys):
    assert main(["list"]) == 0
    assert capsys.readouterr().out.split() == kp.models.list()


def test_profile_prints_table_and_json(capsys, tmp_path):
    assert main(["profile", "resnet20", "--json", str(tmp_path / "p.json")]) == 0
    out = capsys.readouterr().out
    assert "stem_conv (Conv2D)" in out and "Total params: 274,042" in out
    assert json.loads((tmp_path / "p.json").read_text())["total_params"] == 274_042


def test_precrop_writes_model_and_plan_then_applies_it(capsys, tmp_path):
    out_model, out_plan = tmp_path / "small.keras", tmp_path / "plan.json"
    assert main(["precrop", "resnet20", "--params", "0.3", "--out", str(out_model),
                 "--plan", str(out_plan)]) == 0
    assert "Params: 274,042 ->" in capsys.readouterr().out
    plan = kp.Plan.from_json(str(out_plan))
    small = keras.models.load_model(out_model)
    assert small.count_params() == plan.params <= 0.3 * 274_042
    again = tmp_path / "again.keras"
    assert main(["precrop", "--model", "resnet20", "--apply", str(out_plan), "--out", str(again)]) == 0
    assert keras.models.load_model(again).count_params() == plan.params


def test_balance_flag_reaches_the_plan(capsys, tmp_path):
    out_plan = tmp_path / "plan.json"
    assert main(["precrop", "resnet20", "--params", "0.11", "--plan", str(out_plan)]) == 0
    free = kp.Plan.from_json(str(out_plan))
    assert main(["precrop", "resnet20", "--params", "0.11", "--balance", "2", "--plan", str(out_plan)]) == 0
    balanced = kp.Plan.from_json(str(out_plan))
    assert free.solver["balance_max"] > 8 and balanced.solver["balance_max"] <= 2.3
    assert balanced.params <= 0.11 * 274_042


def test_reconfigure_efficientnet_saves_loadable_model(tmp_path):
    out = tmp_path / "m.keras"
    assert main(["reconfigure", "--model", "efficientnet_b0", "--params", "0.8", "--flops", "1.0",
                 "--out", str(out)]) == 0
    model = keras.models.load_model(out)
    original = kp.models.get("efficientnet_b0")
    assert model.count_params() == pytest.approx(0.8 * original.count_params(), rel=0.0125)
    assert kp.profile(model).total_macs <= kp.profile(original).total_macs


def _table_rows(out):
    """``{layer name: {column: (before, after)}}`` from a plan table."""
    lines = [line for line in out.splitlines() if line.startswith("| ")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[1:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        changes = [tuple(cell.split(" -> ")) * (2 // len(cell.split(" -> "))) for cell in cells[1:]]
        rows[cells[0].split(" (")[0]] = dict(zip(header[1:], changes))
    return rows


def test_plan_table_shows_in_and_out_channels_of_the_rebuilt_model(capsys, tmp_path):
    out_model, out_plan = tmp_path / "m.keras", tmp_path / "plan.json"
    assert main(["precrop", "resnet20", "--params", "0.5", "--out", str(out_model),
                 "--plan", str(out_plan)]) == 0
    out = capsys.readouterr().out
    rows = _table_rows(out)
    original, rebuilt = kp.models.get("resnet20"), keras.models.load_model(out_model)
    kernels = (keras.layers.Conv2D, keras.layers.Dense)
    convs = [layer for layer in rebuilt.layers if isinstance(layer, kernels)]
    assert convs and any(layer.name in rows for layer in convs)
    for layer in convs:
        before = original.get_layer(layer.name).kernel.shape
        if layer.name not in rows:  # unchanged, hence hidden
            assert tuple(layer.kernel.shape) == tuple(before)
            continue
        row = rows[layer.name]
        # The table's channels are the kernels' input and output axes.
        assert row["In channels"] == (str(before[-2]), str(layer.kernel.shape[-2]))
        assert row["Out channels"] == (str(before[-1]), str(layer.kernel.shape[-1]))
        assert row["Params"][1] == f"{layer.count_params():,}"
    # Hidden rows are announced, and --all shows them.
    costly = [row for row in kp.Plan.from_json(str(out_plan)).layers if row["params"] or row["macs"]]
    hidden = len(costly) - len(rows)
    assert hidden > 0 and f"{hidden} unchanged layers not shown (--all shows them)." in out
    assert main(["precrop", "resnet20", "--apply", str(out_plan), "--all"]) == 0
    out = capsys.readouterr().out
    assert len(_table_rows(out)) == len(costly) and "not shown" not in out


def _model_with_permute(path):
    """A model whose Permute layer the walker refuses unless it is ignored."""
    inputs = keras.Input((8, 8, 3))
    x = keras.layers.Conv2D(8, 3, name="b")(inputs)
    x = keras.layers.Conv2D(4, 3, name="c")(x)
    x = keras.layers.Permute((2, 1, 3), name="perm")(x)
    x = keras.layers.Conv2D(4, 3, name="d")(x)
    keras.Model(inputs, keras.layers.GlobalAveragePooling2D()(x)).save(path)
    return str(path)


@pytest.mark.parametrize("argv,message", [
    (["--flops", "0"],
     "--flops 0 must be a positive, finite ratio of the original model's FLOPs (e.g. 0.5)."),
    (["--params", "-1"], "--params -1 must be a positive, finite ratio"),
    (["--params", "nan"], "--params nan must be a positive, finite ratio"),
    (["--max_macs", "0"], "--max_macs 0 must be a positive, finite number of MACs."),
    (["--params", "1.5"], "--params 1.5 asks for 150% of the original model's parameters, but PreCrop "
     "only removes channels: the model would come back unchanged. Use reconfigure (PreConfig) to let "
     "layers grow."),
    (["--params", "50"], "--params 50 asks for 5000% of the original model's parameters"),
    (["--params", "0.5", "--flops", "1.2"], "--flops 1.2 asks for 120% of the original model's FLOPs"),
    (["--max_params", "1e9"], "--max_params 1000000000 asks for more than the original model's "
     "274,042 parameters"),
    (["--params", "0.5", "--max_params", "1000"],
     "Give either --params 0.5 (a ratio) or --max_params 1000 (an absolute count), not both."),
    ([], "Give at least one budget: --params, --flops, --latency, --max_params or --max_macs."),
    (["--latency", "0"], "--latency 0 must be a positive, finite ratio of the original model's "
     "predicted time (e.g. 0.5)."),
    (["--params", "0.5", "--round_to", "0"], "--round_to 0 must be a positive integer."),
    (["--params", "0.5", "--calibrate", "1"],
     "--calibrate 1 calibrates a latency budget; give --latency too."),
    (["--params", "0.5", "--balance", "0.5"], "--balance 0.5 must be a factor >= 1 (e.g. 2) or None."),
    (["--params", "0.5", "--balance", "2", "--mode", "layerwise"],
     "--balance 2 needs --mode exact (the width program); --mode layerwise sets widths by its own rule."),
    (["--params", "0.5", "--ignore", "lstm,gru"],
     "--ignore gru,lstm names no layer of model 'resnet20'"),
])
def test_errors_name_the_flags_the_user_typed(argv, message, capsys):
    assert main(["precrop", "resnet20", *argv]) == 1
    out, err = capsys.readouterr()
    assert out == ""  # no table of an unchanged model
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"keras-precrop: error: {message}"), lines


def test_every_keyword_translated_to_a_flag_is_a_flag_of_that_name():
    options = vars(_cli_flags.parser().parse_args(["precrop", "resnet20"]))
    assert set(cli._FLAGS) <= set(options)


def test_library_hints_speak_flags(capsys, tmp_path):
    path = _model_with_permute(tmp_path / "m.keras")
    assert main(["precrop", path, "--params", "0.5"]) == 1
    err = capsys.readouterr().err
    assert "--ignore perm" in err and "ignore=" not in err, err
    assert main(["precrop", path, "--params", "0.7", "--ignore", "perm"]) == 0


def _error_line(argv, capsys):
    """The one error line of a command that must fail without printing a table."""
    assert main(argv) == 1
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("keras-precrop: error: "), lines
    return lines[0].removeprefix("keras-precrop: error: ")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A resnet20 plan (``--params 0.5``) and a latency model of resnet20, as JSON files.

    The latency model is fitted to a stand-in clock (time = parameters), so
    that it is a valid file made in seconds.
    """
    folder = tmp_path_factory.mktemp("saved")
    assert main(["precrop", "resnet20", "--params", "0.5", "--plan", str(folder / "plan.json")]) == 0
    resnet = kp.models.get("resnet20")
    lm = kp.latency_model(resnet, variants=6, verbose=0,
                          timer=lambda models: {k: float(m.count_params()) for k, m in models.items()})
    lm.to_json(folder / "lm.json")
    return {"plan": str(folder / "plan.json"), "lm": str(folder / "lm.json"), "folder": folder}


@pytest.mark.parametrize("argv", [
    ["--params", "0.5"], ["--flops", "0.25"], ["--max_params", "1e5"], ["--max_macs", "1000000"],
    ["--latency", "0.5"], ["--latency_model", "LM"], ["--mode", "paper"], ["--round_to", "8"],
    ["--min_channels", "2"], ["--balance", "2"], ["--batch_size", "8"], ["--runtime", "tflite"],
    ["--training"], ["--variants", "8"], ["--rounds", "2"], ["--calibrate", "2"],
])
def test_apply_refuses_what_the_plan_fixes(argv, saved, capsys):
    argv = [saved["lm"] if a == "LM" else a for a in argv]
    out = saved["folder"] / "refused.keras"
    err = _error_line(["precrop", "resnet20", "--apply", saved["plan"], *argv, "--out", str(out)],
                      capsys)
    typed = " ".join(argv).replace("1e5", "100000")
    assert err == f"{typed} has no effect with --apply: the plan fixes the widths."
    assert not out.exists()


def test_apply_checks_residual_and_ignore_against_the_plan(saved, capsys):
    plan = saved["plan"]
    assert _error_line(["precrop", "resnet20", "--apply", plan, "--residual", "tie"], capsys) == (
        f"--residual tie does not match --apply {plan}, a plan made with --residual prefix.")
    assert _error_line(["reconfigure", "resnet20", "--apply", plan, "--ignore", "stem_conv"],
                       capsys) == (
        f"--ignore stem_conv does not match --apply {plan}, a plan made without --ignore.")
    # The plan's own values are what --apply uses anyway: accepted.
    out = saved["folder"] / "same.keras"
    assert main(["precrop", "resnet20", "--apply", plan, "--residual", "prefix", "--ignore", "",
                 "--out", str(out)]) == 0
    capsys.readouterr()
    assert keras.models.load_model(out).count_params() == kp.Plan.from_json(plan).params


def test_precrop_apply_refuses_a_plan_that_grows(saved, capsys):
    folder = saved["folder"]
    grows = str(folder / "grows.json")
    assert main(["reconfigure", "resnet20", "--params", "0.8", "--flops", "1.0",
                 "--plan", grows]) == 0
    capsys.readouterr()
    grown = [v for v in kp.Plan.from_json(grows).variables if v["new"] > v["width"]]
    assert grown, "a PreConfig plan at params 0.8 grows some width"
    out = folder / "grown.keras"
    err = _error_line(["precrop", "resnet20", "--apply", grows, "--out", str(out)], capsys)
    v = grown[0]
    assert err == (f"--apply {grows} grows {len(grown)} width(s) (e.g. {v['name']} from "
                   f"{v['width']} to {v['new']} channels), and precrop only removes channels; "
                   f"apply it with `keras-precrop reconfigure MODEL --apply {grows}`.")
    assert not out.exists()
    # The command that makes such plans applies it.
    assert main(["reconfigure", "resnet20", "--apply", grows, "--out", str(out)]) == 0
    capsys.readouterr()
    assert keras.models.load_model(out).count_params() == kp.Plan.from_json(grows).params


@pytest.mark.parametrize("argv,message", [
    (["--params", "0.5", "--batch_size", "64"],
     "--batch_size 64 has no effect without --latency: nothing is timed."),
    (["--flops", "0.5", "--training"], "--training has no effect without --latency: nothing is timed."),
    (["--params", "0.5", "--latency_model", "LM", "--runtime", "tflite"],
     "--runtime tflite has no effect with --latency_model: that latency model is timed already."),
    (["--latency", "0.5", "--latency_model", "LM", "--variants", "8"],
     "--variants 8 has no effect with --latency_model: that latency model is timed already."),
])
def test_timing_flags_are_refused_where_nothing_is_timed(argv, message, saved, capsys):
    argv = [saved["lm"] if a == "LM" else a for a in argv]
    assert _error_line(["precrop", "resnet20", *argv], capsys) == message


def test_input_shape_and_classes_are_refused_for_a_saved_model(tmp_path, capsys):
    path = str(tmp_path / "m.keras")
    kp.models.get("resnet20").save(path)
    for command in (["profile"], ["latency"], ["precrop", "--params", "0.5"]):
        assert _error_line([*command, path, "--input_shape", "64,64,3"], capsys) == (
            "--input_shape 64,64,3 has no effect on a saved model: its file fixes the input "
            "shape and classes.")
        assert _error_line([*command, "--model", path, "--num_classes", "100"], capsys).startswith(
            "--num_classes 100 has no effect on a saved model")
    # For a zoo model they build it.
    assert main(["profile", "resnet20", "--input_shape", "64,64,3", "--num_classes", "100"]) == 0
    out = capsys.readouterr().out
    assert f"Total params: {kp.models.get('resnet20', num_classes=100).count_params():,}" in out
    assert f"{64 * 64 * 16 * 27:,}" in out  # the stem's MACs at 64x64: 3x3x3 kernels, 16 filters


@pytest.mark.parametrize("argv,message", [
    (["latency", "resnet20", "--variants", "3"], "--variants 3 must be an integer >= 6"),
    (["latency", "resnet20", "--rounds", "0"], "--rounds 0 must be a positive integer"),
    (["latency", "resnet20", "--batch_size", "0"], "--batch_size 0 must be a positive integer"),
    (["latency", "resnet20", "--training", "--runtime", "tflite"],
     "--training times a training step, which only --runtime tf runs"),
    (["precrop", "resnet20", "--latency", "0.5", "--variants", "5"],
     "--variants 5 must be an integer >= 6"),
    (["reconfigure", "resnet20", "--latency", "0.9", "--runtime", "tflite", "--training"],
     "--training times a training step, which only --runtime tf runs"),
])
def test_latency_model_errors_name_the_timing_flags(argv, message, capsys):
    assert _error_line(argv, capsys) == message


def test_json_files_of_the_wrong_kind_are_named_by_their_flag(saved, tmp_path, capsys):
    profile_json = tmp_path / "profile.json"
    assert main(["profile", "resnet20", "--json", str(profile_json)]) == 0
    capsys.readouterr()
    missing = str(tmp_path / "missing.json")
    assert _error_line(["precrop", "resnet20", "--apply", missing], capsys) == (
        f"--apply {missing}: No such file or directory")
    assert _error_line(["precrop", "resnet20", "--apply", str(profile_json)], capsys).startswith(
        f"--apply {profile_json} does not hold a plan (file '{profile_json}' is not a Plan JSON: "
        "Plan data lacks fields")
    assert _error_line(["precrop", "resnet20", "--latency", "0.5", "--latency_model", missing],
                       capsys) == f"--latency_model {missing}: No such file or directory"
    # JSON text of kp.latency_model options: the command line takes them as timing flags.
    err = _error_line(["precrop", "resnet20", "--latency", "0.5", "--latency_model",
                       '{"variants": 8}'], capsys)
    assert err.startswith('--latency_model {"variants": 8} does not hold a latency model (')
    assert err.endswith("; `keras-precrop latency MODEL --json FILE` writes one, or leave "
                        "--latency_model out to measure one with the timing flags.")
    err = _error_line(["precrop", "resnet32", "--latency", "0.5", "--latency_model", saved["lm"]],
                      capsys)
    assert err.startswith(f"--latency_model {saved['lm']} was fitted on model 'resnet20'")
    assert "kp." not in err
    assert err.endswith("fit one for this model with `keras-precrop latency MODEL --json FILE`.")
    unwritable = str(tmp_path / "no_such_folder" / "p.json")
    assert main(["profile", "resnet20", "--json", unwritable]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.splitlines() == [  # before the work, not after it
        f"keras-precrop: error: --json {unwritable}: cannot write into {tmp_path / 'no_such_folder'} "
        "(no such folder, or not writable); create it or pick another path."]


def test_profile_table_counts_the_layers_it_hides(capsys):
    model = kp.models.get("resnet20")
    free = [layer for layer in model.layers
            if layer.count_params() == 0 and not isinstance(layer, keras.layers.InputLayer)]
    assert main(["profile", "resnet20"]) == 0
    out = capsys.readouterr().out
    assert f"{len(free)} layers without params or MACs not shown (--all shows them)." in out
    assert not any(f"| {layer.name} (" in out for layer in free)
    assert main(["profile", "resnet20", "--all"]) == 0
    out = capsys.readouterr().out
    assert "not shown" not in out
    assert all(f"| {layer.name} ({type(layer).__name__})" in out for layer in free)


def test_reconfigure_may_grow_where_precrop_may_not(capsys):
    assert main(["reconfigure", "resnet20", "--params", "1.5"]) == 0
    assert "Params: 274,042 -> " in capsys.readouterr().out


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A small trained classifier saved as .keras, to prune with kept weights."""
    path = tmp_path_factory.mktemp("trained") / "trained.keras"
    saved_trained_model(path)
    return str(path)


@pytest.mark.parametrize("flags, options", [
    ([], dict(importance="l1")),
    (["--weights", "keep", "--importance", "l2"], dict(importance="l2")),
    (["--importance", "random", "--seed", "3"], dict(importance="random", seed=3)),
    (["--importance", "bn_scale"], dict(importance="bn_scale")),
])
def test_a_saved_model_keeps_its_trained_weights_by_default(flags, options, trained, tmp_path,
                                                            capsys):
    out = tmp_path / "small.keras"
    assert main(["precrop", trained, "--params", "0.5", *flags, "--out", str(out)]) == 0
    assert (f"weights kept: the trained channels {options['importance']} ranks first"
            in capsys.readouterr().out)
    model = keras.models.load_model(trained, compile=False)
    expected = kp.precrop(model, params=0.5, weights="keep", **options)
    small = keras.models.load_model(out, compile=False)
    assert [w.shape for w in small.weights] == [w.shape for w in expected.weights]
    for got, want in zip(small.get_weights(), expected.get_weights()):
        assert (got == want).all()
    fresh = kp.precrop(model, params=0.5)
    assert not all((a == b).all() for a, b in zip(small.get_weights(), fresh.get_weights()))


def test_weights_fresh_starts_a_saved_model_over_and_seed_fixes_it(trained, tmp_path, capsys):
    out = tmp_path / "fresh.keras"
    assert main(["precrop", trained, "--params", "0.5", "--weights", "fresh", "--seed", "4",
                 "--out", str(out)]) == 0
    assert "params; fresh weights, --seed 4)" in capsys.readouterr().out
    model = keras.models.load_model(trained, compile=False)
    expected = kp.precrop(model, params=0.5, seed=4)
    for got, want in zip(keras.models.load_model(out, compile=False).get_weights(),
                         expected.get_weights()):
        assert (got == want).all()
    # A zoo model starts fresh without being told.
    zoo = tmp_path / "zoo.keras"
    assert main(["precrop", "resnet20", "--params", "0.5", "--seed", "4", "--out", str(zoo)]) == 0
    assert "params; fresh weights, --seed 4)" in capsys.readouterr().out
    for got, want in zip(keras.models.load_model(zoo).get_weights(),
                         kp.precrop(kp.models.get("resnet20"), params=0.5, seed=4).get_weights()):
        assert (got == want).all()


def test_weights_are_kept_when_a_plan_is_applied_too(trained, tmp_path, capsys):
    plan, out = str(tmp_path / "plan.json"), tmp_path / "small.keras"
    assert main(["precrop", trained, "--flops", "0.5", "--plan", plan]) == 0
    assert main(["precrop", trained, "--apply", plan, "--out", str(out)]) == 0
    capsys.readouterr()
    model = keras.models.load_model(trained, compile=False)
    expected = kp.apply_plan(model, kp.Plan.from_json(plan), weights="keep")
    for got, want in zip(keras.models.load_model(out, compile=False).get_weights(), expected.get_weights()):
        assert (got == want).all()


@pytest.mark.parametrize("argv, message", [
    (["--params", "0.5", "--weights", "keep"],
     "--weights keep has no effect without --out: the plan is the same, only the saved model has "
     "weights."),
    (["--params", "0.5", "--seed", "1"],
     "--seed 1 has no effect without --out: the plan is the same, only the saved model has weights."),
    (["--params", "0.5", "--weights", "fresh", "--importance", "l2", "--out", "OUT"],
     "--importance l2 has no effect with --weights fresh: no channel keeps a trained weight."),
    (["--params", "0.5", "--seed", "3", "--out", "OUT"],
     "--seed 3 seeds nothing here: with --weights keep every weight comes from the model, "
     "--importance l1 ranks channels without chance, and no layer draws at random; leave --seed out."),
    (["--params", "0.5", "--out", "SMALL.h5"],
     "--out SMALL.h5: a rebuilt model is saved as a .keras file (Keras' legacy .h5 format cannot "
     "load its ChannelSlice and PrefixAdd layers); use e.g. --out SMALL.keras."),
])
def test_weight_flags_are_refused_where_they_would_do_nothing(argv, message, trained, tmp_path,
                                                              capsys):
    out = tmp_path / "small.keras"
    argv = [str(out) if a == "OUT" else a.replace("SMALL", str(tmp_path / "small")) for a in argv]
    assert _error_line(["precrop", trained, *argv], capsys) == message.replace(
        "SMALL", str(tmp_path / "small"))
    assert list(tmp_path.iterdir()) == []


def test_weights_keep_needs_a_trained_model_file(tmp_path, capsys):
    out = tmp_path / "small.keras"
    assert _error_line(["precrop", "resnet20", "--params", "0.5", "--weights", "keep", "--out", str(out)],
                       capsys) == ("--weights keep keeps a trained model's weights, and resnet20 is a "
                                   "zoo model with fresh ones; give a trained .keras file.")
    assert _error_line(["precrop", "resnet20", "--params", "0.5", "--importance", "l2", "--out",
                        str(out)], capsys) == (
        "--importance l2 has no effect on zoo model resnet20, whose weights are fresh anyway: no "
        "channel keeps a trained weight.")
    assert not out.exists()


def test_taylor_importance_is_not_offered(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["precrop", "resnet20", "--params", "0.5", "--importance", "taylor"])
    assert exit_.value.code == 2
    choices = "(choose from 'l1', 'l2', 'bn_scale', 'random')"
    assert f"invalid choice: 'taylor' {choices}" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["precrop", "--help"])
    assert "importance='taylor', data=(x, y)" in " ".join(capsys.readouterr().out.split())


def test_a_plan_of_another_model_is_refused_before_anything_is_printed(saved, tmp_path, capsys):
    err = _error_line(["precrop", "resnet32", "--apply", saved["plan"]], capsys)
    assert err.startswith(f"--apply {saved['plan']} does not fit resnet32: Plan for 'resnet20' "
                          "does not fit model 'resnet32'"), err


def test_the_parser_offers_the_library_s_own_choices():
    from keras_precrop.budget.modes import FLOOR_ON, MODES
    from keras_precrop.comparison import DEFAULT_MODES
    from keras_precrop.graph.attention import ATTENTION
    from keras_precrop.latency.timing import RUNTIMES
    from keras_precrop.transfer import IMPORTANCE

    flags = _cli_flags
    assert (set(flags.MODES), flags.FLOOR_ON, flags.DEFAULT_MODES, flags.RUNTIMES, flags.ATTENTION) == (
        set(MODES), FLOOR_ON, DEFAULT_MODES, RUNTIMES, ATTENTION)
    assert set(_cli_flags.IMPORTANCE) == set(IMPORTANCE) - {"taylor", "activation"}


@pytest.mark.parametrize("argv,match", [
    (["precrop", "nosuch", "--params", "0.5"], "Unknown model"),
    (["precrop", "missing.keras", "--params", "0.5"], "no such model file"),
    (["profile", "resnet20", "--input_shape", "a,b"], "input_shape"),
    (["profile", "resnet20", "--input_shape", "32,32"],
     "--input_shape 32,32 must be (height, width, channels) of positive ints."),
    (["profile", "resnet20", "--num_classes", "0"], "--num_classes 0 must be a positive int."),
    (["precrop", "resnet20", "--params", "0.5", "--plan", "/nonexistent_dir/plan.json"],
     "--plan /nonexistent_dir/plan.json: cannot write into /nonexistent_dir"),
    (["profile"], "give the model once"),
])
def test_bad_arguments_give_one_error_line(argv, match, capsys):
    assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("keras-precrop: error:") and match in err[0]


def test_a_file_keras_cannot_load_is_named_as_the_model(tmp_path, capsys):
    """An existing file that is no .keras archive: not Keras' 'File not found'."""
    path = tmp_path / "corrupt.keras"
    path.write_text("not a zip")
    assert main(["profile", str(path)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"keras-precrop: error: MODEL {path} is no model Keras can load"), err


@pytest.mark.skipif(shutil.which("keras-precrop") is None, reason="console script not installed")
def test_console_script_is_quiet_on_errors():
    done = subprocess.run(["keras-precrop", "precrop", "resnet20", "--params", "0"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "keras-precrop: error: --params 0 must be a positive, finite ratio of the original "
        "model's parameters (e.g. 0.5)."]


def _both_forms(args, tmp_path):
    """``(stdout, stderr)`` of ``python -m keras_precrop ARGS`` and of the console script.

    Both run in a fresh interpreter on this checkout, with no TensorFlow log
    level set, as from a user's shell.
    """
    script = tmp_path / "keras-precrop"
    script.write_text(CONSOLE_SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TF_CPP")}
    results = []
    for command in (["-m", "keras_precrop"], [str(script)]):
        done = run_python(command + args, env=env, cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
        results.append((done.stdout, done.stderr))
    return results


def _assert_same_and_quiet(results):
    (module_out, module_err), (script_out, script_err) = results
    assert module_out == script_out and module_out
    assert module_err == script_err == "", module_err + script_err


def test_both_command_forms_list_the_zoo_quietly(tmp_path):
    results = _both_forms(["list"], tmp_path)
    _assert_same_and_quiet(results)
    assert results[0][0].split() == kp.models.list()


@pytest.mark.slow
def test_both_command_forms_profile_quietly(tmp_path):
    results = _both_forms(["profile", "resnet20"], tmp_path)
    _assert_same_and_quiet(results)
    assert "Total params: 274,042" in results[0][0]


@pytest.mark.parametrize("argv,orig_argv,expected", [
    (["/usr/bin/keras-precrop", "list"], ["python", "/usr/bin/keras-precrop", "list"], True),
    ([r"C:\env\Scripts\keras-precrop.exe", "list"], [], True),
    (["-m", "list"], ["python", "-m", "keras_precrop", "list"], True),
    (["-m"], ["python", "-W", "ignore", "-mkeras_precrop.cli"], True),
    (["/env/keras_precrop/__main__.py", "list"], ["python", "-m", "keras_precrop", "list"], True),
    (["-m", "-q"], ["python", "-m", "pytest", "-q"], False),
    (["-c"], ["python", "-c", "import keras_precrop"], False),
    (["train.py"], ["python", "train.py"], False),
    ([], [], False),
])
def test_only_the_command_is_recognized_as_the_command(argv, orig_argv, expected):
    assert _startup.is_command(argv, orig_argv) is expected


# -- a fast start: --help and argument errors import neither TensorFlow nor Keras ---------------

HEAVY = ("tensorflow", "keras", "jax", "torch", "numpy")


@pytest.mark.parametrize("argv, code", [
    (["--help"], 0), (["precrop", "--help"], 0), (["compare", "--help"], 0),
    (["latency", "--help"], 0), (["precrop", "resnet20", "--mode", "bogus"], 2), ([], 2),
])
def test_help_and_argument_errors_load_no_heavy_module(argv, code):
    done = run_python(["-c", (
        "import json, sys\n"
        "import keras_precrop.cli as c\n"
        f"try:\n    c.main({argv!r})\nexcept SystemExit as e:\n    code = e.code\n"
        f"print(json.dumps([code, sorted({{m.split('.')[0] for m in sys.modules}} & {set(HEAVY)!r})]),"
        " file=sys.stderr)\n")])
    assert json.loads(done.stderr.strip().splitlines()[-1]) == [code, []], done.stderr[-2000:]
    if code == 0:
        assert done.stdout.startswith("usage: keras-precrop")


def test_the_package_s_names_load_on_use_and_its_layers_register_with_keras_imported_after(tmp_path):
    """``import keras_precrop`` loads no Keras; Keras imported later still loads its models."""
    model = kp.precrop(_residual(), params=0.4, seed=0)
    assert {"ChannelSlice", "PrefixAdd"} <= {type(layer).__name__ for layer in model.layers}
    model.save(tmp_path / "small.keras")
    x = np.random.default_rng(0).normal(size=(2, 8, 8, 3)).astype("float32")
    np.save(tmp_path / "x.npy", x)
    done = run_python(["-c", (
        "import json, sys\n"
        "import keras_precrop as kp\n"
        "light = 'keras' in sys.modules or 'tensorflow' in sys.modules\n"
        "import keras, numpy as np\n"
        f"small = keras.models.load_model({str(tmp_path / 'small.keras')!r})\n"
        f"y = np.asarray(small(np.load({str(tmp_path / 'x.npy')!r}))).tolist()\n"
        "names = all(getattr(kp, name) is not None for name in kp.__all__)\n"
        "print(json.dumps([light, y, names, kp.precrop.__module__]))\n")])
    assert done.returncode == 0, done.stderr[-3000:]
    light, y, names, module = json.loads(done.stdout.strip().splitlines()[-1])
    assert light is False and names is True and module == "keras_precrop.planning"
    np.testing.assert_allclose(y, model(x), rtol=1e-5, atol=1e-6)


def _residual():
    """A small residual CNN whose pruned copy has a ChannelSlice and a PrefixAdd."""
    x = keras.Input((8, 8, 3))
    stem = keras.layers.Conv2D(8, 3, padding="same", name="stem")(x)
    h = keras.layers.Conv2D(8, 3, padding="same", name="a")(keras.layers.ReLU()(stem))
    h = keras.layers.Conv2D(8, 3, padding="same", name="b")(keras.layers.Add(name="add")([stem, h]))
    return keras.Model(x, keras.layers.Dense(3)(keras.layers.GlobalAveragePooling2D()(h)))


def test_attention_head_dims_from_the_command_line(tmp_path, capsys):
    """``--attention head_dims`` plans narrower heads; ``--apply`` with another --attention is refused."""
    from tests.test_attention import _attention_model

    model_path, plan_path = tmp_path / "mha.keras", tmp_path / "plan.json"
    _attention_model().save(model_path)
    assert cli.main(["precrop", str(model_path), "--params", "0.6", "--attention", "head_dims",
                     "--plan", str(plan_path), "--out", str(tmp_path / "small.keras")]) == 0
    plan = kp.Plan.from_json(plan_path)
    assert plan.attention == "head_dims"
    small = keras.models.load_model(tmp_path / "small.keras")
    assert small.get_layer("b0_mha").num_heads == 4
    assert small.get_layer("b0_mha").key_dim == plan.widths["b0_mha"] < 6
    assert "attention=head_dims" in capsys.readouterr().out
    assert _error_line(["precrop", str(model_path), "--apply", str(plan_path), "--attention",
                        "heads"], capsys) == (
        f"--attention heads does not match --apply {plan_path}, a plan made with --attention head_dims.")
