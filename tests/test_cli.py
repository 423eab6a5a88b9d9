"""The keras-precrop command line, run in-process and as a console script."""

import json
import os
import shutil
import subprocess

import keras
import pytest

import keras_precrop as kp
from keras_precrop import _startup
from keras_precrop.cli import main
from tests.conftest import run_python

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


def test_reconfigure_efficientnet_saves_loadable_model(tmp_path):
    out = tmp_path / "m.keras"
    assert main(["reconfigure", "--model", "efficientnet_b0", "--params", "0.8", "--flops", "1.0",
                 "--out", str(out)]) == 0
    model = keras.models.load_model(out)
    original = kp.models.get("efficientnet_b0")
    assert model.count_params() == pytest.approx(0.8 * original.count_params(), rel=0.0125)
    assert kp.profile(model).total_macs <= kp.profile(original).total_macs


@pytest.mark.parametrize("argv,match", [
    (["precrop", "resnet20", "--params", "-1"], "positive"),
    (["precrop", "nosuch", "--params", "0.5"], "Unknown model"),
    (["precrop", "resnet20"], "at least one budget"),
    (["precrop", "missing.keras", "--params", "0.5"], "no such model file"),
    (["profile", "resnet20", "--input_shape", "a,b"], "input_shape"),
    (["profile"], "give the model once"),
])
def test_bad_arguments_give_one_error_line(argv, match, capsys):
    assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("keras-precrop: error:") and match in err[0]


@pytest.mark.skipif(shutil.which("keras-precrop") is None, reason="console script not installed")
def test_console_script_is_quiet_on_errors():
    done = subprocess.run(["keras-precrop", "precrop", "resnet20", "--params", "0"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "keras-precrop: error: params budget must be a positive finite number, got 0.0"]


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
    (["-m", "-q"], ["python", "-m", "pytest", "-q"], False),
    (["-c"], ["python", "-c", "import keras_precrop"], False),
    (["train.py"], ["python", "train.py"], False),
    ([], [], False),
])
def test_only_the_command_is_recognized_as_the_command(argv, orig_argv, expected):
    assert _startup.is_command(argv, orig_argv) is expected
