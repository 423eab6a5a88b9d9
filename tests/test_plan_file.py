"""Plan files: checked once as they are read, naming the file and the field; plan records and
budget kinds each declared in one place (issues 59 and 60)."""

import inspect
import json
import pathlib
import pickle

import keras
import pytest
from keras import layers as L

import keras_precrop as kp
from keras_precrop import _cli_flags, cli, planning, plans
from keras_precrop.budget import kinds
from keras_precrop.cli import main

REPO = pathlib.Path(__file__).resolve().parents[1]
OLD_PLAN = REPO / "tests" / "data" / "plan_v0_resnet20_params0.5.json"
# The committed plans the experiments apply (latency models and tables of plans lie beside them).
PLAN_FILES = [p for p in sorted((REPO / "experiments" / "plans").glob("*.json"))
              if "variables" in json.loads(p.read_text())]


def _cnn():
    x = keras.Input((16, 16, 3))
    h = L.Conv2D(8, 3, padding="same", name="conv1")(x)
    h = L.ReLU()(h)
    h = L.Conv2D(12, 3, padding="same", name="conv2")(h)
    h = L.GlobalAveragePooling2D()(h)
    return keras.Model(x, L.Dense(4, name="head")(h), name="cnn")


@pytest.fixture(scope="module")
def model():
    return _cnn()


@pytest.fixture(scope="module")
def plan_data(model):
    """A plan of ``model`` as its JSON file holds it."""
    return json.loads(kp.plan(model, params=0.5).to_json())


def _free(data):
    """The index of the first width variable the plan may change."""
    return next(i for i, v in enumerate(data["variables"]) if not v["fixed"])


def _edit(data, path, value):
    """A deep copy of ``data`` with the field at ``path`` (keys and indices) set to ``value``,
    or deleted where ``value`` is ``...``."""
    data = json.loads(json.dumps(data))
    *outer, last = path
    target = data
    for key in outer:
        target = target[key]
    if value is ...:
        del target[last]
    else:
        target[last] = value
    return data


def _write(tmp_path, data, name="plan.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data, indent=1))
    return path


# Hand edits, and the field each message names, with what it says of it.
BROKEN = [
    (("variables", "free", "new"), "abc", "variables[{free}].new must be a positive integer, got 'abc'"),
    (("variables", "free", "new"), 0, "variables[{free}].new must be a positive integer, got 0"),
    (("variables", "free", "new"), 8.0, "variables[{free}].new must be a positive integer, got 8.0"),
    (("variables", "free", "new"), True, "variables[{free}].new must be a positive integer, got true"),
    (("variables", "free", "new"), ..., "variables[{free}] lacks the field 'new'"),
    (("variables", "free"), "conv1", "variables[{free}] must be an object, got 'conv1'"),
    (("variables",), "conv1:8", "variables must be a list, got 'conv1:8'"),
    (("layers", 1, "params_new"), -5, "layers[1].params_new must be an integer >= 0, got -5"),
    (("layers", 1, "density"), "high", "layers[1].density must be a finite number or null, got 'high'"),
    (("residual",), "add", "residual must be 'prefix' or 'tie', got 'add'"),
    (("ignore",), ["stem", 3], "ignore[1] must be a string, got 3"),
    (("budgets", "params"), "half", "budgets.params must be a finite number or null, got 'half'"),
    (("original", "macs"), ..., "original lacks the field 'macs'"),
    (("input_shapes", 0, 1), "x", "input_shapes[0][1] must be a positive integer or null, got 'x'"),
    (("solver", "floor"), "1.0", "solver.floor must be a finite number, got '1.0'"),
]


@pytest.mark.parametrize("path, value, said", BROKEN, ids=[b[2].split(" ")[0] for b in BROKEN])
def test_a_hand_edited_plan_file_is_refused_naming_the_file_and_the_field(plan_data, tmp_path, path,
                                                                          value, said):
    free = _free(plan_data)
    path = tuple(free if key == "free" else key for key in path)
    file = _write(tmp_path, _edit(plan_data, path, value))
    with pytest.raises(ValueError) as err:
        kp.Plan.from_json(str(file))
    assert str(err.value) == f"file {str(file)!r}: {said.format(free=free)}"


def test_apply_plan_and_the_command_line_name_the_file_and_the_field(model, plan_data, tmp_path,
                                                                     capsys):
    free = _free(plan_data)
    file = _write(tmp_path, _edit(plan_data, ("variables", free, "new"), "abc"))
    field = f"variables[{free}].new must be a positive integer, got 'abc'"
    with pytest.raises(kp.ArgumentError) as err:
        kp.apply_plan(model, file)
    assert str(err.value).startswith(f"plan={str(file)!r}: {field}; ")
    assert err.value.arguments == {"plan": str(file)}
    saved = tmp_path / "cnn.keras"
    model.save(saved)
    assert main(["precrop", str(saved), "--apply", str(file)]) == 1
    line = capsys.readouterr().err
    assert line.startswith(f"keras-precrop: error: --apply {file} does not hold a plan (file "
                           f"{str(file)!r}: {field}); ")


def test_an_older_plan_s_field_is_named_as_its_file_spells_it(tmp_path):
    data = json.loads(OLD_PLAN.read_text())
    data["groups"][3]["new"] = "abc"
    file = _write(tmp_path, data)
    with pytest.raises(ValueError, match=r": groups\[3\]\.new must be a positive integer, got 'abc'$"):
        kp.Plan.from_json(str(file))


def test_a_valid_plan_file_round_trips_exactly(model, tmp_path):
    plan = kp.plan(model, params=0.5, flops=0.6)
    file = tmp_path / "plan.json"
    plan.to_json(file)
    again = kp.Plan.from_json(str(file))
    assert again == plan and again.to_json() == file.read_text()
    assert kp.apply_plan(model, file).count_params() == plan.params


@pytest.mark.parametrize("file", [OLD_PLAN, *PLAN_FILES], ids=lambda p: p.name)
def test_the_plan_files_in_the_repository_pass_the_check(file):
    plan = kp.Plan.from_json(str(file))
    assert plan.widths and plan.params == json.loads(file.read_text())["predicted"]["params"]


def test_old_import_paths_and_pickles_of_plans_keep_working(model):
    from keras_precrop.planning import (  # noqa: F401  (each must import)
        Plan,
        Subject,
        apply_plan,
        build_checked,
        named_for,
        planned_widths,
    )

    assert kp.Plan is Plan is plans.Plan and planning.named_for is plans.named_for
    plan = kp.plan(model, params=0.5)
    assert pickle.loads(pickle.dumps(plan)) == plan
    # A pickle written before the record moved names keras_precrop.planning.Plan.
    old = pickle.dumps(plan, protocol=2).replace(b"keras_precrop.plans\n", b"keras_precrop.planning\n")
    assert b"keras_precrop.planning\nPlan" in old and pickle.loads(old) == plan


# -- the budget kinds: one table (keras_precrop/budget/kinds.py) ------------------------------------


def test_plan_takes_every_budget_keyword_of_the_table_and_profiles_hold_its_totals(model):
    assert set(kinds.arguments()) <= set(inspect.signature(kp.plan).parameters)
    prof = kp.profile(model)
    assert [getattr(prof, kind.total) for kind in kinds.KINDS if not kind.timed] == [
        model.count_params(), prof.total_macs]


def _flags(parser, command):
    """The long options of ``command``'s subparser."""
    sub = next(a for a in parser._actions if a.dest == "command").choices[command]
    return {opt: action for action in sub._actions for opt in action.option_strings}


def test_the_command_line_s_budget_flags_are_the_table_s(monkeypatch):
    memory = kinds.BudgetKind("bytes", "memory", "bytes", "max_bytes", "bytes", "total_bytes",
                              help="memory budget, ratio of the original",
                              absolute_help="absolute memory budget")
    monkeypatch.setattr(kinds, "KINDS", (*kinds.KINDS, memory))
    parser = _cli_flags.parser()
    for command in ("precrop", "reconfigure", "compare"):
        flags = _flags(parser, command)
        for kind in kinds.KINDS:
            assert flags[f"--{kind.ratio}"].help == kind.help
            if kind.absolute:
                assert flags[f"--{kind.absolute}"].help == kind.absolute_help
    trained = _flags(parser, "prune-trained")
    assert {f"--{kind.ratio}" for kind in kinds.KINDS} <= set(trained)
    assert "--max_bytes" not in trained and "--max_params" not in trained
    assert trained["--latency"].help.startswith(kinds.of_row("latency").help + " (measured here")
    args = parser.parse_args(["precrop", "m.keras", "--memory", "0.5", "--max_bytes", "9"])
    assert cli._budgets(args) == {"params": None, "flops": None, "latency": None, "memory": 0.5,
                                  "max_params": None, "max_macs": None, "max_bytes": 9.0}


def test_compare_records_the_budgets_the_table_names(model, monkeypatch):
    comparison = kp.compare(model, flops=0.7, max_params=300, modes="uniform", round_to=2)
    assert comparison.budgets == {"flops": 0.7, "max_params": 300}
    # A keyword the table does not name is no budget: neither plan nor compare reads it.
    monkeypatch.setattr(kinds, "arguments", lambda: ["params", "flops", "latency", "max_macs"])
    narrowed = kp.compare(model, flops=0.7, max_params=300, modes="uniform", round_to=2)
    assert narrowed.budgets == {"flops": 0.7}
    assert narrowed.rows[0]["params"] > 300 >= comparison.rows[0]["params"]


def test_the_missing_budget_messages_name_the_table_s_keywords(model, tmp_path, capsys):
    with pytest.raises(kp.ArgumentError) as err:
        kp.plan(model)
    names = kinds.arguments()
    assert str(err.value) == ("Give at least one budget: "
                              + ", ".join(f"{n}=" for n in names[:-1]) + f" or {names[-1]}=.")
    trained = tmp_path / "trained.keras"
    trained.write_bytes(b"")  # prune-trained refuses the flags before it loads the model
    assert main(["prune-trained", str(trained), "--data", "cifar10", "--epochs", "1",
                 "--out", str(tmp_path / "small.keras")]) == 1
    flags = [f"--{kind.ratio}" for kind in kinds.KINDS]
    assert capsys.readouterr().err.strip() == (
        f"keras-precrop: error: Give the widths to prune to: a budget ({', '.join(flags[:-1])} or "
        f"{flags[-1]}) or --apply PLAN.json.")
