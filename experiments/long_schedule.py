"""Longer schedules on a borrowed accelerator that has JAX but no TensorFlow.

The CPU grids train 10 epochs; the paper trains 160. When a session is lent
a GPU machine for a few minutes (JAX and PyTorch, no TensorFlow, no network,
64 MiB of files per call), this script trains a grid's runs there for as many
epochs of the same recipe as fit the time, on the JAX backend:

1. ``export`` (here, with TensorFlow): builds the compressed, untrained
   model of every pending run (the first ``--max_runs``) with
   ``examples/train_cifar.py --export_init`` of the grid's pinned ``code``
   (the code path of the CPU runs: same planning, masks and initialization)
   into ``<work>/init/<run id>/``, and writes CIFAR-10 from TFDS as lossless WebP
   tiles of 1,000 images in three parts of about 29 MiB (``<work>/data_a``,
   ``data_b``, ``data_c``), so that each part travels in one call beside a
   repository that grows with every committed run. It also removes every
   other exported model (finished runs', later runs'), which would only take
   room, and prints what each call of the recipe below carries with the tree,
   against the 64 MiB a call takes.
2. ``calibrate`` (there): trains the grid's pending runs (no ``results.json``
   in ``experiments/runs/``; the first ``--max_runs``, both seeds of an entry
   together) at once, one process each, for two short epochs on random
   images, and writes the time of a full epoch and of the startup to
   ``--calib``.
3. ``train`` (there): trains the same runs at once for the grid's epochs
   (refused when the calibration says they would not end before
   ``--deadline_s``), ``--epochs N`` or ``--epochs fit`` (the most that end
   before it), with the recipe of ``keras_precrop.train`` and a NumPy copy of
   ``keras_precrop.data``'s CIFAR-10 preprocessing (pad 4, random crop,
   random flip, mean/std), stops at ``--deadline_s``, and packs each run's
   ``results.json``, ``history.csv``, ``train.log`` and, where the grid asks,
   ``final_model.keras`` into ``<out>/runs.tgz``; a run the deadline stopped
   packs its ``backup/`` too, and goes on from its last finished epoch (same
   batches as uninterrupted) when a later call finds it in ``<work>/resume/``.
4. ``unpack`` (here): puts finished runs into ``experiments/runs/`` (a
   saved model slimmed as ``run.py`` commits it) and the stopped ones into
   ``<work>/resume/``. A run's ``results.json`` says which
   code built its model (``git_commit``, the grid's pinned ``code``) and which
   trained it: the device's copy of the tree has no git history, so a run
   records the git blob ids of its training code (``train_code``), and
   ``unpack`` adds the commit here that has exactly those files
   (``train_commit``; null, with a warning, if none has: commit what the
   device ran and unpack again).

``python experiments/report.py`` reports a grid trained this way like any
other once its runs are unpacked into ``experiments/runs/`` and the grid's
``epochs`` say how long they trained.

How the grid ``long`` trains with this workplace's device tool (one H100,
15 minutes a session; ``.gpu`` and ``.whl``, the keras, namex and optree
wheels, are listed in ``.git/info/exclude``). A call keeps only the ignored
paths it carries, so each call copies what it brings to ``/tmp/gpu``, which
outlives calls on the same warm machine; each call must follow the last
within 30 s::

    # here; init gets the next 16 runs' models (two calls of 8), which leaves room in call 2:
    python experiments/long_schedule.py export --grid experiments/grids/long.json --max_runs 16
    # call 1, carry .whl .gpu/data_a (the working tree travels too: at most 64 MiB in all):
    mkdir -p /tmp/gpu && cp -r .gpu/data_a /tmp/gpu/
    pip install --no-index --no-deps --target /tmp/site .whl/*.whl
    # call 2, carry .gpu/init .gpu/data_b (and .gpu/resume, if unpack made one):
    cp -r .gpu/init .gpu/data_b /tmp/gpu/ && { [ ! -d .gpu/resume ] || cp -r .gpu/resume /tmp/gpu/; }
    # call 3, carry .gpu/data_c:
    cp -r .gpu/data_c /tmp/gpu/ && export PYTHONPATH=/tmp/site KERAS_BACKEND=jax
    python3 experiments/long_schedule.py train --grid experiments/grids/long.json --work /tmp/gpu \\
        --max_runs 8 --epochs 40 --out "$OUT" --deadline_s 565
    # call 4, in what is left of the 15 minutes, the next runs (export the two variables again):
    python3 experiments/long_schedule.py train ... --max_runs 2 --epochs 40 --out "$OUT" --deadline_s 360
    # here, after each train call: python experiments/long_schedule.py unpack <files_at>/runs.tgz

``--epochs 40`` needs no calibration; without it, a ``calibrate`` call
with the same ``--max_runs`` (about two minutes) must come before ``train``.

History: the first 8 runs went in two data parts (27,000 and 23,000 training
images) and trained with ``--epochs fit`` (the grid then said 160): 40 epochs
fit, 449 s for 8 runs at once on the H100, and the grid now says 40, so later
runs share their SynFlow and dense runs. The 4.5 minutes left of that session
trained PreCrop-FLOPs (exact, both seeds) for 35 and 36 of the 40 epochs
before the deadline; nothing resumed stopped runs then, so they were lost, and
stopped runs now pack their backup. The next lent H100 trained the other 10 (this
script and ``keras_precrop.train`` of e785dff; the models of 779e83c) with
the recipe above: in call 3, ``train --max_runs 8 --epochs 40
--deadline_s 565`` (8 runs at once, 432 s), then, on the same warm machine,
``train --max_runs 2 --epochs 40`` (the last 2, 167 s; that call first
copied the 8 finished ``results.json`` into ``experiments/runs/`` by hand,
which ``train`` now does not need: it counts the runs an earlier call on the
same machine finished as done). After the first
(compiling) epoch, an epoch took 2.9 s with 2 runs at once and 7.3-8.5 s with
8: the 8 trained 1.4x as many epochs a second, so filling a call with runs
pays, but not 4x. The third lent H100 (this script of 0f2c8bf) trained the
next 12 with the recipe: 8 runs at once in 452 s, then 4 at once in 243 s;
the 152 s left could not train 2 more (167 s), and the machine went back.
"""

import argparse
import csv
import hashlib
import io
import json
import math
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np
import run as _run  # experiments/run.py: grid loading and run ids

REPO = Path(__file__).resolve().parents[1]
_TILE = 1000  # images per WebP tile: 25 rows of 40
_TILE_SHAPE = (25, 40)
_PARTS = {
    "data_a": ("train", 0, 20_000),
    "data_b": ("train", 20_000, 40_000),
    "data_c": ("train", 40_000, 50_000),
}
_TEST_PART = "data_c"  # with the test split and the labels
_CALLS = ((".whl", "data_a"), ("init", "data_b", "resume"), ("data_c",))  # each device call's carry
_CALL_LIMIT = 64 * 2**20  # bytes a device call takes: the working tree and what it carries
_BATCH = 128
_PACKED = ("results.json", "history.csv", "train.log", "final_model.keras")
_TRAIN_CODE = ("experiments/long_schedule.py", "experiments/run.py", "keras_precrop")  # what trains there


def _init_name(flags):
    """The run id without its epochs: the exported model does not depend on them."""
    return _run.run_id({**flags, "epochs": "X"}).replace("-epX-", "-")


# --- export (TensorFlow side) -------------------------------------------------


def _tiles(images):
    """Yields lossless WebP bytes of consecutive ``_TILE``-image tiles."""
    from PIL import Image

    rows, cols = _TILE_SHAPE
    for start in range(0, len(images), _TILE):
        tile = images[start : start + _TILE]
        if len(tile) != _TILE:
            raise ValueError(f"{len(images)} images do not split into tiles of {_TILE}")
        grid = tile.reshape(rows, cols, 32, 32, 3).transpose(0, 2, 1, 3, 4).reshape(rows * 32, cols * 32, 3)
        buffer = io.BytesIO()
        Image.fromarray(grid).save(buffer, "WEBP", lossless=True, quality=100, method=4)
        yield buffer.getvalue()


def _export_data(data_dir, work):
    """Writes CIFAR-10 as WebP tiles in the parts of ``_PARTS`` plus labels and statistics."""
    import tensorflow_datasets as tfds

    from keras_precrop import data

    info = data.get_info("cifar10")
    splits = {
        split: tfds.as_numpy(
            tfds.load("cifar10", split=split, data_dir=data_dir, batch_size=-1, download=False)
        )
        for split in ("train", "test")
    }
    pieces = [(part, *spec) for part, spec in _PARTS.items()]
    pieces.append((_TEST_PART, "test", 0, len(splits["test"]["image"])))
    for part, split, start, stop in pieces:
        folder = work / part
        folder.mkdir(parents=True, exist_ok=True)
        for index, blob in enumerate(_tiles(splits[split]["image"][start:stop])):
            (folder / f"{split}-{(start // _TILE) + index:03d}.webp").write_bytes(blob)
    np.savez(
        work / _TEST_PART / "labels.npz",
        train=splits["train"]["label"].astype(np.int32),
        test=splits["test"]["label"].astype(np.int32),
        mean=np.array(info.mean, np.float32),
        std=np.array(info.std, np.float32),
    )


def export(args):
    """Exports the untrained models of the next pending runs, and the data; skips what exists.

    ``<work>/init`` ends up holding exactly the models of the first
    ``--max_runs`` pending runs (all of them by default): the call that
    carries it has room for a limited number, and a finished run's model
    would only take room.
    """
    work = args.work.resolve()
    pending = _pending(args.grid, args.max_runs)
    for flags in pending:
        out = work / "init" / _init_name(flags)
        if (out / "init.json").exists():
            continue
        code_dir = _run.code_dir_of(flags["code"], REPO)  # the grid's pinned commit, as run.py does
        command = [*_run.train_command(flags, out, args.data_dir, code_dir), "--export_init"]
        print(f"[long_schedule] exporting {out.name}", flush=True)
        subprocess.run(command, check=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(code_dir)})
    keep = {_init_name(flags) for flags in pending}
    for folder in (work / "init").glob("*"):
        if folder.name not in keep:  # trained already, or not among the next runs
            shutil.rmtree(folder)
    if not (work / _TEST_PART / "labels.npz").exists():
        print("[long_schedule] writing CIFAR-10 as WebP tiles", flush=True)
        _export_data(args.data_dir, work)
    _check_call_sizes(work)


def _git(repo, *argv):
    """The standard output of ``git argv`` in ``repo`` (raises on failure)."""
    return subprocess.run(["git", "-C", str(repo), *argv], capture_output=True, text=True, check=True).stdout


def _size(path):
    """Bytes of the files under ``path`` (0 if it does not exist)."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def _check_call_sizes(work):
    """Prints what each device call of the recipe carries, with the working tree that every call
    copies (git's tracked files and the untracked ones it does not ignore), and says which exceed
    the 64 MiB a call takes."""
    listed = _git(REPO, "ls-files", "-z", "--cached", "--others", "--exclude-standard").split("\0")
    tree = sum((REPO / path).stat().st_size for path in listed if path and (REPO / path).is_file())
    for number, carried in enumerate(_CALLS, 1):
        total = tree + sum(_size(REPO / name if name == ".whl" else work / name) for name in carried)
        over = " -- OVER the 64 MiB a call takes: move a part to another call" if total > _CALL_LIMIT else ""
        print(
            f"[long_schedule] call {number} carries {' '.join(carried)} and the tree "
            f"({tree / 2**20:.1f} MiB): {total / 2**20:.1f} MiB{over}"
        )


# --- training (JAX side) --------------------------------------------------------


def _read_split(work, split, count):
    """Decodes the ``split`` tiles of every part, in tile order, into uint8 ``(count, 32, 32, 3)``."""
    from PIL import Image

    found = [path for part in _PARTS for path in (work / part).glob(f"{split}-*.webp")]
    paths = sorted(found, key=lambda path: path.name)
    if len(paths) * _TILE != count:
        raise FileNotFoundError(
            f"{work}: found {len(paths)} {split} tiles of {_TILE} images, need {count // _TILE}; "
            f"copy every data part ({', '.join(_PARTS)}) there"
        )
    rows, cols = _TILE_SHAPE
    tiles = [np.asarray(Image.open(p).convert("RGB")) for p in paths]
    return np.concatenate(
        [t.reshape(rows, 32, cols, 32, 3).transpose(0, 2, 1, 3, 4).reshape(_TILE, 32, 32, 3) for t in tiles]
    )


def _load_data(work):
    """``(train images, train labels, test images, test labels, mean, std)`` from the tiles."""
    labels = np.load(work / _TEST_PART / "labels.npz")
    train = _read_split(work, "train", len(labels["train"]))
    test = _read_split(work, "test", len(labels["test"]))
    return train, labels["train"], test, labels["test"], labels["mean"], labels["std"]


def _augment(images, rng):
    """CIFAR-10 training augmentation: zero-pad 4, random 32x32 crop, random horizontal flip."""
    n = len(images)
    padded = np.pad(images, ((0, 0), (4, 4), (4, 4), (0, 0)))
    top, left = rng.integers(0, 9, size=(2, n))
    rows = (top[:, None] + np.arange(32))[:, :, None]
    cols = (left[:, None] + np.arange(32))[:, None, :]
    flip = rng.random(n) < 0.5
    cols = np.where(flip[:, None, None], cols[:, :, ::-1], cols)
    return padded[np.arange(n)[:, None, None], rows, cols]


def _batches(images, labels, *, training, seed, mean, std, normalize=True, first_epoch=0):
    """A ``keras.utils.PyDataset`` of preprocessed ``(images, labels)`` batches.

    Epoch ``e``'s order and augmentation depend on ``(seed, e)`` alone, so a run
    resumed at ``first_epoch`` sees the batches an uninterrupted run would.
    """
    import keras

    class Batches(keras.utils.PyDataset):
        """Shuffled, augmented (training) or plain (evaluation) batches; drops the last partial
        training batch, as ``keras_precrop.data`` does."""

        def __init__(self):
            super().__init__(workers=4 if training else 1, use_multiprocessing=False)
            self._epoch = first_epoch
            self._order = self._permutation()

        def _permutation(self):
            if not training:
                return np.arange(len(images))
            return np.random.default_rng((seed, self._epoch)).permutation(len(images))

        def __len__(self):
            return len(images) // _BATCH if training else math.ceil(len(images) / _BATCH)

        def __getitem__(self, index):
            chosen = self._order[index * _BATCH : (index + 1) * _BATCH]
            x = images[chosen]
            if training:
                x = _augment(x, np.random.default_rng((seed, self._epoch, index)))
            x = x.astype(np.float32)
            if normalize:
                x = (x / 255.0 - mean) / std
            return x, labels[chosen]

        def on_epoch_end(self):
            self._epoch += 1
            self._order = self._permutation()

    return Batches()


def _device():
    import jax

    device = jax.devices()[0]
    return f"{device.platform}: {getattr(device, 'device_kind', device)}"


def _blob_id(data):
    """Git's object id of a file's raw bytes (``git hash-object --no-filters``), computed without git.

    It equals the id in the tree for the repository's plain text files (no
    ``.gitattributes`` filters, no CRLF conversion, no symlinks); a file that
    is not stored byte for byte matches no commit.
    """
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _train_code(repo=REPO):
    """``{path: git blob id}`` of the Python files under ``_TRAIN_CODE`` in ``repo``.

    The device gets a copy of the working tree without its git history, so a
    run records the blob ids of the code that trains it, and ``unpack`` finds
    the commit here that has exactly those files (``_train_commit``).
    """
    tops = [repo / name for name in _TRAIN_CODE]
    files = sorted(path for top in tops for path in ([top] if top.is_file() else top.rglob("*.py")))
    return {path.relative_to(repo).as_posix(): _blob_id(path.read_bytes()) for path in files}


def _train_commit(code, repo=REPO):
    """The newest commit of ``repo``'s HEAD whose ``_TRAIN_CODE`` files are exactly ``code``, else None."""
    for commit in _git(repo, "rev-list", "HEAD").split():
        listing = _git(repo, "ls-tree", "-r", "-z", commit, "--", *_TRAIN_CODE).split("\0")
        tree = {path: meta.split()[2] for meta, path in (line.split("\t", 1) for line in listing if line)}
        if {path: blob for path, blob in tree.items() if path.endswith(".py")} == code:
            return commit
    return None


def train_one(args):
    """Trains one exported model (one process of ``train``/``calibrate``)."""
    import keras

    import keras_precrop  # noqa: F401  (registers MaskConstraint for loading)
    from keras_precrop import train

    start = time.time()
    code = _train_code()  # before training: a file that cannot be read fails the run at once
    init = Path(args.init)
    record = json.loads((init / "init.json").read_text())
    keras.utils.set_random_seed(record["seed"])
    if args.synthetic:
        rng = np.random.default_rng(0)
        train_x = rng.integers(0, 256, (50_000, 32, 32, 3), dtype=np.uint8)
        train_y = rng.integers(0, 10, 50_000).astype(np.int32)
        test_x, test_y = train_x[:10_000], train_y[:10_000]
        mean, std = np.zeros(3, np.float32), np.ones(3, np.float32)
    else:
        train_x, train_y, test_x, test_y, mean, std = _load_data(Path(args.work))
    recipe = train.get_recipe(record["dataset"], record["model"])
    steps = args.steps_per_epoch or len(train_x) // _BATCH
    loaded = keras.saving.load_model(init / "init_model.keras", compile=False)
    model = train.compile_model(
        lambda: loaded, recipe, steps_per_epoch=steps, global_batch_size=_BATCH, epochs=args.epochs
    )
    pipeline = dict(seed=record["seed"], mean=mean, std=std, normalize=record.get("normalize", True))
    # Epochs an earlier call trained, which BackupAndRestore skips. (A kill between an epoch's log
    # row and its backup repeats that epoch with the next epoch's batches: still a fresh shuffle.)
    done = len(train.read_history(args.model_dir))
    result = train.fit(
        model,
        _batches(train_x, train_y, training=True, first_epoch=done, **pipeline),
        _batches(test_x, test_y, training=False, **pipeline),
        model_dir=args.model_dir,
        epochs=args.epochs,
        steps_per_epoch=args.steps_per_epoch,
        eval_steps=args.eval_steps,
        tensorboard=False,
        verbose=2,
    )
    if args.save_model:
        os.replace(Path(result.model_dir) / "last.keras", Path(result.model_dir) / "final_model.keras")
    results = {
        **record,
        "export_command": record["command"],
        "command": _recorded(sys.argv[1:], Path(args.work)),
        "epochs": args.epochs,
        "steps_per_epoch": steps,
        "backend": keras.backend.backend(),
        "device": _device(),
        "train_code": code,  # of this call: a run resumed by a later call records the later code
        "final_accuracy": result.final_accuracy,
        "best_accuracy": result.best_accuracy,
        "train_time_s": result.train_time,
        "wall_time_s": time.time() - start,
        "history": result.history,
    }
    (Path(result.model_dir) / "results.json").write_text(json.dumps(results, indent=1))
    print(f"Final accuracy {result.final_accuracy:.4f}, best {result.best_accuracy:.4f}")


def _launch(runs, work, root, epochs, extra=()):
    """Starts one ``_one`` process per run; returns ``{run id: (process, run dir)}``."""
    procs = {}
    share = max(0.05, round(0.9 / len(runs), 3))
    env = {
        **os.environ,
        "KERAS_BACKEND": "jax",
        "PYTHONUNBUFFERED": "1",
        "XLA_PYTHON_CLIENT_MEM_FRACTION": str(share),
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    for flags in runs:
        name = _run.run_id({**flags, "epochs": epochs})
        run_dir = root / name
        run_dir.mkdir(parents=True, exist_ok=True)
        if (work / "resume" / name).is_dir():  # stopped by an earlier call's deadline: go on from there
            shutil.copytree(work / "resume" / name, run_dir, dirs_exist_ok=True)
        command = [
            sys.executable,
            __file__,
            "_one",
            f"--init={work / 'init' / _init_name(flags)}",
            f"--work={work}",
            f"--model_dir={run_dir}",
            f"--epochs={epochs}",
            *(["--save_model"] if flags.get("save_model") else []),
            *extra,
        ]
        log = open(run_dir / "train.log", "a")
        log.write(f"$ {_recorded(command[2:], work)}\n")
        log.flush()
        procs[name] = (subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT), run_dir)
    return procs


def _recorded(args, work):
    """A ``_one`` call's arguments as its run records them, in a clone's terms: the device's
    ``work`` folder is a copy of ``.gpu`` (what ``export`` writes) and the run's folder is unpacked
    into ``experiments/runs``, so the command reruns from any clone after ``export``; no path of
    the device."""
    words = ["python", "experiments/long_schedule.py"]
    for arg in args:
        key, sep, value = arg.partition("=")
        if key == "--model_dir":
            value = f"experiments/runs/{Path(value).name}"
        elif sep and Path(value).is_relative_to(work):
            value = (Path(".gpu") / Path(value).relative_to(work)).as_posix()
        words.append(f"{key}{sep}{value}")
    return " ".join(words)


def _wait(procs, deadline):
    """Waits for every process until ``deadline`` (time.time()), then kills the rest."""
    for name, (proc, _) in procs.items():
        try:
            proc.wait(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            print(f"[long_schedule] {name}: stopped at the deadline", flush=True)
    return {name: proc.returncode for name, (proc, _) in procs.items()}


def _pending(grid, max_runs=None, trained=None):
    """The grid's runs that have no ``results.json`` in ``experiments/runs/`` yet.

    Ordered entry by entry, an entry's first two seeds together (a claim needs
    two seeds, and one call may not fit every run), then the entries' further
    seeds, entry by entry; cut to ``max_runs``. Runs with a ``results.json``
    under ``trained`` (``train``'s folder on the device, where an earlier call
    on the same warm machine finished them and packed them for ``unpack``) are
    done too, so a second call trains the next.
    """
    done = [_run.RUNS, *([trained] if trained else [])]
    runs = _run.load_grid(grid)
    seeds = {}  # each entry's seeds, in order: its first two come before any entry's third
    for flags in runs:
        seeds.setdefault(flags["entry"], []).append(flags["seed"])
    pending = [
        (seeds[flags["entry"]].index(flags["seed"]) >= 2, flags["entry"], flags["seed"], flags)
        for flags in runs
        if not any((root / _run.run_id(flags) / "results.json").exists() for root in done)
    ]
    return [flags for *_, flags in sorted(pending, key=lambda run: run[:3])][:max_runs]


def _epoch_times(run_dir):
    """The ``epoch_time`` column of a run's ``history.csv`` (empty if it wrote none)."""
    path = run_dir / "history.csv"
    if not path.exists():
        return []
    with open(path) as f:
        return [float(row["epoch_time"]) for row in csv.DictReader(f)]


def calibrate(args):
    """Times two short epochs of every run at once; writes the full epoch's time and the startup.

    The second epoch (``--steps`` training steps and 20 evaluation batches,
    compiled already) is scaled to a full one: 390 training steps and 79
    evaluation batches, an evaluation batch taken as a third of a step.
    """
    runs = _pending(args.grid, args.max_runs)
    start = time.time()
    short = ["--synthetic", f"--steps_per_epoch={args.steps}", "--eval_steps=20"]
    procs = _launch(runs, args.work.resolve(), Path("/tmp/long_schedule_calibration"), 2, short)
    codes = _wait(procs, start + args.budget_s)
    times = []
    for name, (_, run_dir) in procs.items():
        epoch_times = _epoch_times(run_dir)
        if codes[name] != 0 or len(epoch_times) < 2:
            raise SystemExit(f"calibrating {name} failed (exit {codes[name]}); see {run_dir / 'train.log'}")
        times.append(epoch_times[1])
    per_step = max(times) / (args.steps + 20 / 3)
    epoch_s = per_step * (50_000 // _BATCH + 79 / 3)
    calib = {"runs": len(runs), "epoch_s": epoch_s, "startup_s": time.time() - start}
    Path(args.calib).write_text(json.dumps(calib, indent=1))
    print(f"[long_schedule] calibration: {json.dumps(calib)}", flush=True)


def _fitting_epochs(calib, deadline_s, max_epochs):
    """The most epochs (a multiple of 10 from 20 on) that end before ``deadline_s``.

    The startup measured by ``calibrate`` (imports, compilation, two short
    epochs) stands in for this call's startup and data decoding.
    """
    epochs = max(0, int(min(max_epochs, (deadline_s - calib["startup_s"]) / calib["epoch_s"])))
    return epochs - epochs % 10 if epochs >= 20 else epochs


def _epochs_flag(text):
    """``--epochs``: ``fit`` or a positive number of epochs."""
    if text == "fit" or (text.isdigit() and int(text) > 0):
        return text
    raise argparse.ArgumentTypeError(f"expected a positive number of epochs or 'fit', got {text!r}")


def _epochs(args, runs):
    """``--epochs``: a number, ``fit`` (the most that fit ``--deadline_s``) or, by default, the grid's.

    Raises:
        SystemExit: when the calibration was for another number of runs, or
            says the grid's epochs would not end before ``--deadline_s``.
    """
    if args.epochs not in (None, "fit"):
        return int(args.epochs)
    calib = json.loads(Path(args.calib).read_text())
    if calib["runs"] != len(runs):
        raise SystemExit(
            f"{args.calib} timed {calib['runs']} runs at once, this call trains {len(runs)}: "
            "calibrate with the same --max_runs"
        )
    if args.epochs == "fit":
        return _fitting_epochs(calib, args.deadline_s, max_epochs=160)
    epochs = runs[0]["epochs"]
    need = calib["startup_s"] + epochs * calib["epoch_s"]
    if need > args.deadline_s:
        raise SystemExit(
            f"{len(runs)} runs x {epochs} epochs (the grid's) take about {need:.0f} s by {args.calib}, "
            f"more than --deadline_s={args.deadline_s:.0f}: train fewer at once (--max_runs) or pass "
            f"--epochs fit ({_fitting_epochs(calib, args.deadline_s, max_epochs=160)} epochs)"
        )
    return epochs


def train(args):
    """Trains the pending runs at once until done or ``--deadline_s``; packs the results into ``--out``."""
    start = time.time()
    root = Path("/tmp/long_schedule_runs")
    runs = _pending(args.grid, args.max_runs, trained=root)
    if not runs:
        raise SystemExit(f"every run of {args.grid} has its results.json in {_run.RUNS} or {root}")
    epochs = _epochs(args, runs)
    if epochs < 1:
        raise SystemExit(f"the calibration in {args.calib} fits no epoch in --deadline_s={args.deadline_s}")
    print(f"[long_schedule] training {len(runs)} runs for {epochs} epochs", flush=True)
    procs = _launch(runs, args.work.resolve(), root, epochs)
    codes = _wait(procs, start + args.deadline_s)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    _pack({name: run_dir for name, (_, run_dir) in procs.items()}, out / "runs.tgz")
    print(f"[long_schedule] exit codes {codes}; packed {out / 'runs.tgz'} after {time.time() - start:.0f} s")


def _pack(run_dirs, path):
    """Packs each run's files; an unfinished run's ``backup/`` too, so that a later call resumes it."""
    with tarfile.open(path, "w:gz") as tar:
        for name, run_dir in run_dirs.items():
            finished = (run_dir / "results.json").exists()
            for file in _PACKED if finished else (*_PACKED, "backup"):
                if (run_dir / file).exists():
                    tar.add(run_dir / file, arcname=f"{name}/{file}")


def _stamp_train_commit(path):
    """Adds ``train_commit`` to a device run's results: the commit here whose code trained it.

    None (and a warning) when no commit of ``HEAD`` has the recorded files:
    the run trained uncommitted code.
    """
    results = json.loads(path.read_text())
    if "train_code" not in results:  # trained before runs recorded their code
        return
    results["train_commit"] = _train_commit(results["train_code"], REPO)
    if results["train_commit"] is None:
        print(
            f"[long_schedule] warning: no commit of HEAD has the code that trained {path.parent.name}; "
            "commit that code and unpack again"
        )
    path.write_text(json.dumps(results, indent=1))


def unpack(args):
    """Puts ``train``'s ``runs.tgz`` in place: finished runs into ``experiments/runs/``, the others
    (stopped at the deadline) into ``<work>/resume/``, which the next call carries to go on."""
    work = args.work.resolve()
    with tarfile.open(args.tgz) as tar, tempfile.TemporaryDirectory() as tmp:
        tar.extractall(tmp, filter="data")
        for run_dir in sorted(Path(tmp).iterdir()):
            finished = (run_dir / "results.json").exists()
            target = (_run.RUNS if finished else work / "resume") / run_dir.name
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(run_dir, target)
            if finished:
                shutil.rmtree(work / "resume" / run_dir.name, ignore_errors=True)
                _stamp_train_commit(target / "results.json")
                if (target / "final_model.keras").exists():
                    _run.slim_model(target / "final_model.keras")
            state = "finished" if finished else f"{len(_epoch_times(target))} epochs done, to resume"
            print(f"[long_schedule] {run_dir.name}: {state} -> {target}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("export", help="build the untrained models and the data parts (TensorFlow)")
    p.add_argument("--grid", type=Path, required=True)
    p.add_argument("--work", type=Path, default=REPO / ".gpu")
    p.add_argument("--data_dir", default=str(REPO.parent / "shared" / "tfds"))
    p.add_argument("--max_runs", type=int, default=None,
                   help="export only the first N pending runs (what one session trains)")
    p.set_defaults(fn=export)
    p = sub.add_parser("calibrate", help="time every run at once; write the epochs that fit")
    p.add_argument("--grid", type=Path, required=True)
    p.add_argument("--work", type=Path, default=REPO / ".gpu")
    p.add_argument("--calib", default="/tmp/long_schedule_calib.json")
    p.add_argument("--budget_s", type=float, default=120, help="calibration time limit")
    p.add_argument("--steps", type=int, default=100, help="training steps of each timed epoch")
    p.add_argument("--max_runs", type=int, default=None, help="time only the first N pending runs")
    p.set_defaults(fn=calibrate)
    p = sub.add_parser("train", help="train every run at once and pack the results")
    p.add_argument("--grid", type=Path, required=True)
    p.add_argument("--work", type=Path, default=REPO / ".gpu")
    p.add_argument(
        "--epochs",
        type=_epochs_flag,
        default=None,
        help="a number, or 'fit': the most that end before --deadline_s by the calibration; "
        "default: the grid's (refused if the calibration says they do not fit)",
    )
    p.add_argument("--max_runs", type=int, default=None, help="train only the first N pending runs")
    p.add_argument("--calib", default="/tmp/long_schedule_calib.json")
    p.add_argument("--deadline_s", type=float, default=560, help="stop training this long after the start")
    p.add_argument("--out", required=True)
    p.set_defaults(fn=train)
    p = sub.add_parser("unpack", help="put train's runs.tgz in place (here)")
    p.add_argument("tgz", type=Path)
    p.add_argument("--work", type=Path, default=REPO / ".gpu")
    p.set_defaults(fn=unpack)
    p = sub.add_parser("_one", help=argparse.SUPPRESS)
    p.add_argument("--init", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--model_dir", required=True)
    p.add_argument("--epochs", type=int, required=True)
    p.add_argument("--steps_per_epoch", type=int, default=None)
    p.add_argument("--eval_steps", type=int, default=None)
    p.add_argument("--synthetic", action="store_true")
    p.add_argument("--save_model", action="store_true")
    p.set_defaults(fn=train_one)
    args = parser.parse_args(argv)
    args.fn(args)


if __name__ == "__main__":
    main()
