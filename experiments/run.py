"""Trains every run of one or more experiment grids, one process at a time, resumably.

A grid (``experiments/grids/<name>.json``) lists runs of
``examples/train_cifar.py``::

    {"name": "cifar-a", "description": "...", "code": "b78e90a",
     "defaults": {"model": "resnet20", "epochs": 10},
     "seeds": [0, 1],
     "runs": [{"method": "synflow", "params": 0.3, "seeds": [0, 1, 2]},
              {"method": "precrop_params", "params": 0.308, "mode": "exact"}]}

An entry's own ``seeds`` (optional) replace the grid's for it: above, a
third seed for SynFlow at 0.3 where a claim is close. ``{seed}`` in a text
value is the run's seed: ``"init_model":
"experiments/runs/resnet20-baseline-ep10-s{seed}/final_model.keras"`` prunes,
at each seed, the model that the baseline of that seed saved. A run whose
``init_model`` does not exist yet waits (``--dry_run`` says so; training skips
it until the run that saves it has finished).

``code`` (optional) pins the commit whose ``examples/`` and ``keras_precrop/``
train the grid's runs: the driver checks it out once as a detached git
worktree beside this repository, so editing this checkout never changes a run
midway and the grids of one reproduction can need different commits (a
feature added later). Without it, ``--code_dir`` trains.

Each (run, seed) gets a directory ``experiments/runs/<run id>/`` whose name is
made of its flags alone, so grids that share a run (figure 3 reuses figure
2's SynFlow runs) train it once. The driver

* skips a run whose ``results.json`` exists,
* restarts an interrupted run with the same flags, which resumes after its
  last finished epoch (``BackupAndRestore`` in ``keras_precrop.train.fit``;
  its ``backup*/`` folders are not ignored by git, so that an unfinished run
  travels to the next session with the untracked files, and are deleted once
  the run has finished),
* trains seed-major: every run's first seed before any run's second, so a
  partial grid already answers every question once,
* with ``--commit``, commits each finished run's small files (results,
  history and log) to git, and its final model (slimmed by
  :func:`slim_model`) only where the grid says ``"keep_model": true``: the
  models that other runs start from (``init_model``). Every other run is
  reproducible from its ``results.json`` (command, seed, ``git_commit``), so
  its ``final_model.keras`` stays on this disk, ignored by git.

Paths in what a run records are relative to this repository: training runs
from its root, with ``--model_dir=experiments/runs/<run id>`` and a data
folder beside it written as ``../shared/tfds``, so a run's command reruns
from any clone.

Stop it at any time (Ctrl-C, ``kill``); run the same command to go on. To
take a timing on a quiet machine, pause the training instead:
``kill -STOP -<pgid>`` and ``kill -CONT -<pgid>``, with the process group id
that the driver writes to ``experiments/runs/driver.pid``.

Example:
  python experiments/run.py --grid experiments/grids/core.json \
      --data_dir ../shared/tfds --commit

``--match`` repeated is a queue in order of need, e.g. a teacher, the gradual
run that starts from it, the next teacher and its gradual run, then the rest
(a run id holds its ``init_model``'s id, so anchor a teacher's pattern):
  python experiments/run.py --grid experiments/grids/trained_teachers.json \
      --grid experiments/grids/gradual_mobilenet.json --commit \
      --match '^mobilenet_v2_cifar-baseline-ep10-s0$' --match 'gradual1.*s0$' \
      --match '^mobilenet_v2_cifar-baseline-ep10-s1$' --match 'gradual1.*s1$' --match .
"""

import argparse
import io
import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RUNS = REPO / "experiments" / "runs"
# The methods of examples/train_cifar.py (its _common.STRUCTURED and UNSTRUCTURED): those that
# rebuild the model narrower, and those that train the original model under a mask.
STRUCTURED = ("precrop_params", "precrop_flops", "preconfig", "precrop_plan")
MASKED = ("synflow", "snip", "grasp", "magnitude", "random")

# Flags a grid entry may set, in the order they appear in a run id.
_ID_FLAGS = (
    "method",
    "params",
    "flops",
    "mode",
    "balance",
    "round_to",
    "residual",
    "granularity",
    "densities",
    "batch_size",
    "steps_per_epoch",
    "plan_file",
    "init_model",
    "keep_weights",
    "importance",
    "gradual_epochs",
    "gradual_frequency",
    "gradual_schedule",
    "gradual_shrink",
    "regrow",
    "gradual_rebuild",
    "distill",
    "distill_alpha",
    "learning_rate",
)
_OTHER_FLAGS = ("model", "epochs", "save_model", "eval_steps")
# Short names of flags in a run id; switches (True) appear as their name alone.
_SHORT = {"learning_rate": "lr", "gradual_epochs": "gradual", "gradual_frequency": "gfreq",
          "gradual_schedule": "gsched", "gradual_shrink": "shrink", "distill_alpha": "alpha"}
_COMMITTED = ("results.json", "history.csv", "train.log")


def _fmt(value):
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def _id_part(key, value):
    """A run id's part for one flag: ``params0.3``, ``lr0.01``, ``distill`` (a switch that is on); a
    plan file by its name (``planresnet20_lat0.5``), an init model by its run's directory
    (``initresnet20-baseline-ep10-s3`` for ``.../resnet20-baseline-ep10-s3/final_model.keras``) or
    else its name."""
    if key == "plan_file":
        return f"plan{Path(value).stem}"
    if key == "init_model":
        path = Path(value)
        return f"init{path.parent.name if path.name == 'final_model.keras' else path.stem}"
    if value is True:
        return key
    return f"{_SHORT.get(key, key)}{_fmt(value)}"


def run_id(flags):
    """A directory name made of the run's flags: ``resnet20-synflow-params0.3-ep10-s0``.

    Unset flags and switches that are off (False, their default) are left out.
    """
    parts = [flags["model"], flags["method"]]
    parts += [_id_part(key, flags[key]) for key in _ID_FLAGS[1:] if flags.get(key) not in (None, False)]
    parts += [f"ep{flags['epochs']}", f"s{flags['seed']}"]
    return "-".join(parts)


def _seeds(value, where):
    """A grid's or an entry's ``seeds``: a non-empty list of distinct non-negative ints."""
    if (
        not isinstance(value, list)
        or not value
        or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in value)
        or len(set(value)) != len(value)
    ):
        raise ValueError(f"{where} has seeds {value!r}; expected a non-empty list of distinct ints >= 0.")
    return value


def load_grid(path):
    """The grid's runs as flag dicts, one per (entry, seed), seed-major.

    Besides ``examples/train_cifar.py``'s flags, each run has its ``seed``,
    the ``grid``'s name, the ``entry``'s index in the grid and the grid's
    pinned ``code``. An entry's own ``seeds`` replace the grid's for it, e.g. a
    third seed where a claim is close; a seed that no entry had before comes
    after all of theirs.

    Raises:
        ValueError: naming the grid file and entry for an unknown key, a
            missing ``method``/``model``/``epochs`` or bad ``seeds``.
    """
    with open(path) as f:
        grid = json.load(f)
    allowed = set(_ID_FLAGS) | set(_OTHER_FLAGS)
    defaults = grid.get("defaults", {})
    if "seeds" in defaults:
        raise ValueError(f"{path}: 'seeds' belongs at the grid's top level or in a run, not in the defaults.")
    default_seeds = _seeds(grid.get("seeds"), f"{path}")
    runs = []
    for index, entry in enumerate(grid["runs"]):
        flags = {**defaults, **entry}
        seeds = _seeds(flags.pop("seeds"), f"{path}: run {index}") if "seeds" in flags else default_seeds
        unknown = sorted(set(flags) - allowed)
        if unknown:
            raise ValueError(f"{path}: run {index} has unknown keys {unknown}; allowed: {sorted(allowed)}.")
        for key in ("model", "method", "epochs"):
            if key not in flags:
                raise ValueError(f"{path}: run {index} ({entry}) sets no {key!r}, nor do the defaults.")
        runs.append((flags, seeds))
    return [
        {**_with_seed(flags, seed), "seed": seed, "grid": grid["name"], "entry": index,
         "code": grid.get("code")}
        for seed in sorted({s for _, seeds in runs for s in seeds})
        for index, (flags, seeds) in enumerate(runs)
        if seed in seeds
    ]


def _with_seed(flags, seed):
    """``flags`` with ``{seed}`` in a text value replaced by the run's seed (an init model per seed)."""
    return {k: v.replace("{seed}", str(seed)) if isinstance(v, str) else v for k, v in flags.items()}


def code_dir_of(commit, default):
    """The checkout that trains a grid: a worktree of ``commit`` (made once), or ``default``."""
    if commit is None:
        return default.resolve()
    found = subprocess.run(
        ["git", "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    if found.returncode != 0:
        raise ValueError(f"a grid pins code {commit!r}, which is not a commit of {REPO}")
    sha = found.stdout.strip()
    path = REPO.parent / f"{REPO.name}-code-{sha[:10]}"
    if not (path / "examples").is_dir():
        command = ["git", "worktree", "add", "--detach", str(path), sha]
        subprocess.run(command, cwd=REPO, check=True, capture_output=True)
    return path


def _missing_input(flags):
    """The run's ``init_model`` while no such file exists yet (another run saves it), else None."""
    path = flags.get("init_model")
    return path if path is not None and not (REPO / path).exists() else None


def _relative(path):
    """``path`` relative to this repository (``../shared/tfds`` for a folder beside it), the way runs
    record paths: a recorded command reruns from any clone. A URL (``gs://...``) stays as it is."""
    return os.path.relpath(path, REPO) if os.path.isabs(path) else str(path)


def train_command(flags, model_dir, data_dir, code_dir):
    """The ``examples/train_cifar.py`` command line of ``code_dir`` that trains one run's flags.

    Paths are relative to this repository, the command's working directory
    (a grid's ``plan_file`` and ``init_model`` are already).
    """
    script = str(code_dir / "examples" / "train_cifar.py")
    command = [sys.executable, script, f"--model_dir={_relative(model_dir)}"]
    if data_dir:
        command.append(f"--data_dir={_relative(data_dir)}")
    for key, value in flags.items():
        if key in ("grid", "entry", "code") or value is None:
            continue
        if isinstance(value, bool):
            command.append(f"--{key}" if value else f"--no{key}")
        else:
            command.append(f"--{key}={_fmt(value)}")
    return command


def shown(command, checkout):
    """``command`` (interpreter, script, arguments) as a run records it: ``python``, the script
    relative to ``checkout``, the code checkout it belongs to (its commit is the run's
    ``git_commit``), and the arguments as given; no path of this machine."""
    return " ".join(["python", os.path.relpath(command[1], checkout), *command[2:]])


def relativize(run_dir, code_dir):
    """Rewrites the absolute paths left in a finished run's ``results.json`` and ``train.log``
    relative to this repository: code older than issue 44 records its script as the pinned
    worktree's absolute path, and a traceback names the files of ``code_dir``, this repository, the
    folders beside it and the interpreter's (``<python>``)."""
    prefixes = ((code_dir, ""), (REPO, ""), (REPO.parent, "../"), (Path(sys.prefix), "<python>/"))
    for name in ("results.json", "train.log"):
        path = run_dir / name
        if path.exists():
            text = path.read_text(encoding="utf-8", errors="replace")
            for prefix, relative in prefixes:
                text = text.replace(f"{Path(prefix).resolve()}{os.sep}", relative)
            path.write_text(text, encoding="utf-8")


def drop_backups(run_dir):
    """Deletes a finished run's ``backup*/`` folders (``BackupAndRestore``'s, kept by ``fit``).

    They only resume an unfinished run, and git does not ignore them (a workplace
    carries untracked files from one session to the next, not ignored ones, and a
    run of MobileNetV2 outlives a session): once the run has its ``results.json``,
    they would only weigh on every copy of the working tree.
    """
    for backup in run_dir.glob("backup*"):
        if backup.is_dir():
            shutil.rmtree(backup)


def kept_runs(grids):
    """The ids of the runs whose ``final_model.keras`` is committed: those of the ``grids`` (paths)
    that say ``"keep_model": true``, the trained models that other runs start from (``init_model``).

    Raises:
        ValueError: naming the grid whose ``keep_model`` is not true or false.
    """
    kept = set()
    for path in grids:
        keep = json.loads(Path(path).read_text()).get("keep_model", False)
        if not isinstance(keep, bool):
            raise ValueError(f"{path}: 'keep_model' is {keep!r}; expected true or false.")
        if keep:
            kept.update(run_id(flags) for flags in load_grid(path))
    return kept


def slim_model(path):
    """Rewrites the saved ``.keras`` model at ``path`` as small as an accuracy check allows.

    Drops the optimizer's state and the compile config (the model loads
    uncompiled, with the same layers, masks and weights) and deflates the
    archive: a masked ResNet-20 goes from 2.5 MB to 0.2 MB. Committed models
    stay in the working tree, which every call to a lent accelerator copies
    within a 64 MiB limit. Slimming a slim model changes nothing.
    """
    import h5py  # only here: the report imports this module without it

    with zipfile.ZipFile(path) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    config = json.loads(members["config.json"])
    config.pop("compile_config", None)
    members["config.json"] = json.dumps(config).encode()
    weights = io.BytesIO()
    with h5py.File(io.BytesIO(members["model.weights.h5"]), "r") as old, h5py.File(weights, "w") as new:
        for key, value in old.attrs.items():
            new.attrs[key] = value
        for key in old:
            if key != "optimizer":
                old.copy(old[key], new, name=key)
    members["model.weights.h5"] = weights.getvalue()
    slim = path.with_name(path.name + ".slim")
    with zipfile.ZipFile(slim, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    os.replace(slim, path)


def _commit(run_dir, keep_model=False):
    """Commits the run's small files alone (other staged work is left as it is), and with
    ``keep_model`` its saved model, slimmed first (:func:`slim_model`); a model no run starts from
    stays out of git (it is reproducible from ``results.json``), on this disk."""
    names = [*_COMMITTED, "final_model.keras"] if keep_model else _COMMITTED
    if keep_model and (run_dir / "final_model.keras").exists():
        slim_model(run_dir / "final_model.keras")
    paths = [str(run_dir / name) for name in names if (run_dir / name).exists()]
    for attempt in range(5):  # another git command may hold the index lock for a moment
        added = subprocess.run(["git", "add", "-f", *paths], cwd=REPO, capture_output=True, text=True)
        done = (
            added.returncode == 0
            and subprocess.run(
                ["git", "commit", "-q", "--only", "-m", f"experiments: {run_dir.name}", "--", *paths],
                cwd=REPO,
                capture_output=True,
                text=True,
            ).returncode
            == 0
        )
        if done:
            return True
        time.sleep(2 + 3 * attempt)
    print(f"[run.py] could not commit {run_dir.name}; commit it by hand", flush=True)
    return False


def _in_match_order(todo, patterns):
    """The runs of ``todo`` whose id matches one of ``patterns`` (regexes), those of the first
    pattern first (in ``todo``'s order), then the second's, each run once."""
    ordered = {}
    for pattern in patterns:
        ordered.update({name: flags for name, flags in todo
                        if name not in ordered and re.search(pattern, name)})
    return list(ordered.items())


def _parser():
    """The driver's command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--grid", action="append", required=True, help="grid JSON file (repeatable)")
    parser.add_argument("--data_dir", default=str(REPO.parent / "shared" / "tfds"), help="TFDS data_dir")
    parser.add_argument("--commit", action="store_true", help="git-commit each finished run")
    parser.add_argument("--dry_run", action="store_true", help="list the runs and their state, train none")
    parser.add_argument(
        "--code_dir",
        type=Path,
        default=REPO,
        help="checkout whose examples/ and keras_precrop/ train the grids that pin no 'code' "
        "(e.g. a git worktree pinned to a commit); default: this one",
    )
    parser.add_argument("--match", action="append", default=None,
                        help="train only runs whose id matches this regex; repeated, the runs of "
                        "the first pattern train first, then the second's (a queue in order of need)")
    parser.add_argument("--max_runs", type=int, default=None, help="stop after training this many runs")
    return parser


def _queue(grids, match):
    """``[(run id, flags)]`` of ``grids``, each run once, in the order they train.

    Every grid's first seed comes first; with ``match``, only the runs it
    matches, in the order of its patterns.
    """
    todo, seen = [], set()
    for path in grids:
        for flags in load_grid(path):
            name = run_id(flags)
            if name not in seen:
                seen.add(name)
                todo.append((name, flags))
    todo.sort(key=lambda item: item[1]["seed"])  # stable: every grid's first seed first
    return _in_match_order(todo, match) if match else todo


def _print_states(todo, done):
    """``--dry_run``: one line per run: done, started, waiting (for its --init_model) or todo."""
    for name, flags in todo:
        state = "done" if name in done else ("started" if (RUNS / name).exists() else "todo")
        state = "waiting" if state != "done" and _missing_input(flags) else state
        print(f"{state:8s} {flags['grid']:12s} {name}")


def _train_one(name, flags, args):
    """Trains run ``name`` in a subprocess, logging to its ``train.log``; returns the exit code."""
    run_dir = RUNS / name
    run_dir.mkdir(exist_ok=True)
    code_dir = code_dir_of(flags["code"], args.code_dir)
    command = train_command(flags, run_dir, args.data_dir, code_dir)
    print(f"[run.py] {time.strftime('%H:%M:%S')} training {name}", flush=True)
    with open(run_dir / "train.log", "a") as log:
        log.write(f"$ {shown(command, code_dir)}\n")
        log.flush()
        env = {**os.environ, "PYTHONPATH": str(code_dir)}  # the code of code_dir, the paths of REPO
        code = subprocess.call(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    if code != 0:
        print(f"[run.py] {name} failed with exit code {code}; see {run_dir / 'train.log'}", flush=True)
    else:
        relativize(run_dir, code_dir)
        drop_backups(run_dir)
    return code


def main(argv=None):
    """Trains the runs of ``--grid`` not done yet, in queue order; a finished run keeps its results."""
    args = _parser().parse_args(argv)
    todo = _queue(args.grid, args.match)
    kept = kept_runs(args.grid)
    RUNS.mkdir(parents=True, exist_ok=True)
    done = [name for name, _ in todo if (RUNS / name / "results.json").exists()]
    print(f"[run.py] {len(todo)} runs, {len(done)} done, {len(todo) - len(done)} to train", flush=True)
    if args.dry_run:
        _print_states(todo, done)
        return 0
    (RUNS / "driver.pid").write_text(f"{os.getpgrp()}\n")
    trained = 0
    for name, flags in todo:
        if (RUNS / name / "results.json").exists():
            continue
        if args.max_runs is not None and trained >= args.max_runs:
            break
        missing = _missing_input(flags)
        if missing:
            print(f"[run.py] {name} waits for --init_model {missing}; train the run that saves it first",
                  flush=True)
            continue
        code = _train_one(name, flags, args)
        trained += 1
        if code == 0 and args.commit:
            _commit(RUNS / name, keep_model=name in kept)
    return 0


if __name__ == "__main__":
    sys.exit(main())
