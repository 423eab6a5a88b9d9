"""``experiments/long_schedule.py``: training exported models where there is JAX but no TensorFlow.

The NumPy augmentation is checked against a per-image loop written from the
documented transform (zero-pad 4, a 32x32 window, an optional mirror), the
WebP tiles round-trip exactly, the batches keep each image with its label and
reproduce ``keras_precrop.data``'s batch counts and normalization, and one
exported masked model trains on the JAX backend in a process where
TensorFlow cannot be imported, keeping its masks.
"""

import argparse
import json
import math
import os
import pathlib
import re
import subprocess
import sys

import keras
import numpy as np
import pytest

import keras_precrop as kp
from keras_precrop import pai
from tests.conftest import REPO, git, git_init, saved_trained_model

sys.path.insert(0, str(REPO / "experiments"))
import long_schedule  # noqa: E402
import run  # noqa: E402


def test_augment_is_a_padded_window_maybe_mirrored():
    rng = np.random.default_rng(0)
    images = rng.integers(1, 256, (64, 32, 32, 3), dtype=np.uint8)
    out = long_schedule._augment(images, np.random.default_rng(1))
    assert out.shape == images.shape and out.dtype == np.uint8
    offsets, flips = set(), []
    for image, result in zip(images, out):
        padded = np.zeros((40, 40, 3), np.uint8)
        padded[4:36, 4:36] = image
        found = [
            (top, left, flip)
            for top in range(9)
            for left in range(9)
            for flip in (False, True)
            if np.array_equal(result, padded[top : top + 32, left : left + 32][:, ::-1 if flip else 1])
        ]
        assert len(found) == 1
        offsets.add(found[0][:2])
        flips.append(found[0][2])
    assert len(offsets) > 20 and 10 < sum(flips) < 54  # random windows, about half mirrored


def test_tiles_round_trip_and_a_missing_part_is_named(tmp_path):
    images = np.random.default_rng(0).integers(0, 256, (3000, 32, 32, 3), dtype=np.uint8)
    for part, (start, stop) in zip(long_schedule._PARTS, ((0, 2000), (2000, 3000))):
        (tmp_path / part).mkdir()
        for index, blob in enumerate(long_schedule._tiles(images[start:stop])):
            (tmp_path / part / f"train-{start // 1000 + index:03d}.webp").write_bytes(blob)
    np.testing.assert_array_equal(long_schedule._read_split(tmp_path, "train", 3000), images)
    (tmp_path / "data_a" / "train-000.webp").rename(tmp_path / "data_b" / "train-000.webp")
    np.testing.assert_array_equal(long_schedule._read_split(tmp_path, "train", 3000), images)  # tile order
    (tmp_path / "data_b" / "train-002.webp").unlink()
    with pytest.raises(FileNotFoundError, match="2 train tiles.*need 3.*every data part.*data_a, data_b"):
        long_schedule._read_split(tmp_path, "train", 3000)
    with pytest.raises(ValueError, match="tiles of 1000"):
        list(long_schedule._tiles(images[:1500]))


def _indexed(n):
    """Images whose every pixel is ``index % 200 + 1`` and labels ``index % 10``."""
    values = np.arange(n) % 200 + 1
    images = np.broadcast_to(values[:, None, None, None], (n, 32, 32, 3)).astype(np.uint8)
    return images, (np.arange(n) % 10).astype(np.int32)


def test_training_batches_shuffle_augment_and_keep_labels():
    images, labels = _indexed(1000)
    mean, std = np.array([0.5, 0.4, 0.3], np.float32), np.array([0.2, 0.25, 0.3], np.float32)
    batches = long_schedule._batches(images, labels, training=True, seed=3, mean=mean, std=std)
    assert len(batches) == 1000 // 128  # the last partial batch is dropped, as in keras_precrop.data
    x, y = batches[0]
    assert x.shape == (128, 32, 32, 3) and x.dtype == np.float32 and y.dtype == np.int32
    pixels = np.rint((x * std + mean) * 255).astype(int)
    centre = pixels[:, 16, 16, 0]  # never padding: windows move at most 4 pixels
    np.testing.assert_array_equal((centre - 1) % 10, y)
    assert (pixels == 0).any()  # some windows reach into the zero padding
    first = [batches[i][1] for i in range(len(batches))]
    assert not np.array_equal(np.concatenate(first), labels[: len(np.concatenate(first))])
    batches.on_epoch_end()
    assert not np.array_equal(batches[0][1], first[0])  # a new order every epoch
    again = long_schedule._batches(images, labels, training=True, seed=3, mean=mean, std=std)
    np.testing.assert_array_equal(again[0][0], x)  # the seed fixes order and augmentation
    resumed = long_schedule._batches(images, labels, training=True, seed=3, mean=mean, std=std, first_epoch=1)
    np.testing.assert_array_equal(resumed[0][0], batches[0][0])  # a resumed run's second epoch


def test_evaluation_batches_are_every_image_in_order_normalized():
    images, labels = _indexed(300)
    mean, std = np.array([0.4914, 0.4822, 0.4465]), np.array([0.2470, 0.2435, 0.2616])
    batches = long_schedule._batches(images, labels, training=False, seed=0, mean=mean, std=std)
    assert len(batches) == math.ceil(300 / 128)
    x = np.concatenate([batches[i][0] for i in range(len(batches))])
    y = np.concatenate([batches[i][1] for i in range(len(batches))])
    np.testing.assert_array_equal(y, labels)
    np.testing.assert_allclose(x, (images / 255.0 - mean) / std, rtol=1e-5, atol=1e-5)
    raw = long_schedule._batches(images, labels, training=False, seed=0, mean=mean, std=std, normalize=False)
    np.testing.assert_array_equal(raw[0][0], images[:128].astype(np.float32))


@pytest.mark.parametrize(
    "calib, deadline, expected",
    [
        ({"epoch_s": 5.0, "startup_s": 60.0}, 560, 100),  # 100 fit exactly
        ({"epoch_s": 5.1, "startup_s": 60.0}, 560, 90),  # 98 fit: rounded down to tens
        ({"epoch_s": 1.0, "startup_s": 60.0}, 560, 160),  # the paper's schedule caps it
        ({"epoch_s": 30.0, "startup_s": 60.0}, 560, 16),  # under 20: every epoch counts
        ({"epoch_s": 30.0, "startup_s": 600.0}, 560, 0),
    ],
)
def test_fitting_epochs(calib, deadline, expected):
    assert long_schedule._fitting_epochs(calib, deadline, 160) == expected


def test_init_name_is_the_run_id_without_epochs():
    flags = {"model": "resnet20", "method": "precrop_params", "params": 0.1103, "mode": "exact",
             "epochs": 160, "seed": 1}
    assert long_schedule._init_name(flags) == "resnet20-precrop_params-params0.1103-modeexact-s1"
    assert run.run_id({**flags, "epochs": 40}) == "resnet20-precrop_params-params0.1103-modeexact-ep40-s1"


@pytest.mark.slow
def test_an_exported_masked_model_trains_on_jax_without_tensorflow(tmp_path):
    """The accelerator path end to end on the CPU: no TensorFlow, JAX backend, masks kept."""
    keras.utils.set_random_seed(0)
    model = kp.models.get("resnet20", input_shape=(32, 32, 3), num_classes=10)
    masks = pai.random(model, 0.2, seed=0)
    pai.apply_masks(model, masks)
    init = tmp_path / "init"
    init.mkdir()
    model.save(init / "init_model.keras")
    record = {"command": "train_cifar.py --export_init", "dataset": "cifar10", "model": "resnet20",
              "method": "random", "seed": 0, "normalize": True, "params": 1}
    (init / "init.json").write_text(json.dumps(record))
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text("import sys\nsys.modules['tensorflow'] = None\n")
    env = {**os.environ, "KERAS_BACKEND": "jax", "PYTHONPATH": os.pathsep.join([str(blocker), str(REPO)])}
    out = tmp_path / "run"
    command = [sys.executable, str(REPO / "experiments" / "long_schedule.py"), "_one", f"--init={init}",
               f"--work={tmp_path}", f"--model_dir={out}", "--epochs=2", "--steps_per_epoch=2",
               "--eval_steps=1", "--synthetic", "--save_model"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert results["backend"] == "jax" and results["epochs"] == 2 and results["steps_per_epoch"] == 2
    assert results["export_command"] == record["command"]
    assert results["command"] == ("python experiments/long_schedule.py _one --init=.gpu/init --work=.gpu "
                                  "--model_dir=experiments/runs/run --epochs=2 --steps_per_epoch=2 "
                                  "--eval_steps=1 --synthetic --save_model")  # a clone's paths
    assert [row["epoch"] for row in results["history"]] == [0, 1]
    assert 0 <= results["final_accuracy"] <= 1
    hashed = git(REPO, "hash-object", "keras_precrop/training/train.py")
    assert results["train_code"]["keras_precrop/training/train.py"] == hashed
    paths = ["keras_precrop/*.py", "experiments/long_schedule.py", "experiments/run.py"]
    listed = git(REPO, "ls-files", "--cached", "--others", "--exclude-standard", "--", *paths).splitlines()
    assert sorted(results["train_code"]) == sorted(set(listed))
    trained = keras.saving.load_model(out / "final_model.keras", compile=False)
    for path, mask in masks.items():
        layer = trained.get_layer(path.split("/")[0])
        weights = keras.ops.convert_to_numpy(layer.kernel)
        assert np.all(weights[mask == 0] == 0) and np.all(weights[mask == 1] != 0), path
    assert not np.allclose(keras.ops.convert_to_numpy(trained.get_layer("classifier").kernel),
                           keras.ops.convert_to_numpy(model.get_layer("classifier").kernel))
    # A later call with a longer run goes on from the backup: one more epoch, history kept.
    command[command.index("--epochs=2")] = "--epochs=3"
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Epoch 3/3" in done.stdout and "Epoch 1/3" not in done.stdout
    results = json.loads((out / "results.json").read_text())
    assert [row["epoch"] for row in results["history"]] == [0, 1, 2]


def _grid(tmp_path, monkeypatch, done=()):
    """A two-entry, two-seed grid in tmp_path, with ``done`` run ids finished in a fake runs dir."""
    runs = tmp_path / "runs"
    for name in done:
        (runs / name).mkdir(parents=True)
        (runs / name / "results.json").write_text("{}")
    monkeypatch.setattr(run, "RUNS", runs)
    grid = tmp_path / "grid.json"
    grid.write_text(json.dumps({
        "name": "g", "description": "", "defaults": {"model": "resnet20", "epochs": 40}, "seeds": [0, 1],
        "runs": [{"method": "synflow", "params": 0.1}, {"method": "precrop_params", "params": 0.11}]}))
    return grid


def test_pending_runs_go_entry_by_entry_and_skip_finished_ones(tmp_path, monkeypatch):
    grid = _grid(tmp_path, monkeypatch, done=["resnet20-synflow-params0.1-ep40-s0"])
    ids = [run.run_id(flags) for flags in long_schedule._pending(grid)]
    assert ids == ["resnet20-synflow-params0.1-ep40-s1", "resnet20-precrop_params-params0.11-ep40-s0",
                   "resnet20-precrop_params-params0.11-ep40-s1"]
    assert [run.run_id(f) for f in long_schedule._pending(grid, max_runs=2)] == ids[:2]
    trained = tmp_path / "trained"  # an earlier call on the same device machine finished this one
    (trained / ids[0]).mkdir(parents=True)
    (trained / ids[0] / "results.json").write_text("{}")
    assert [run.run_id(f) for f in long_schedule._pending(grid, trained=trained)] == ids[1:]


def test_pending_runs_put_every_entrys_first_two_seeds_before_a_third(tmp_path, monkeypatch):
    grid = _grid(tmp_path, monkeypatch, done=["resnet20-synflow-params0.1-ep40-s0"])
    text = json.loads(grid.read_text())
    text["runs"][0]["seeds"] = [0, 1, 2]
    text["runs"].insert(0, {"method": "snip", "params": 0.1, "seeds": [1, 2]})  # no seed 0, still first
    grid.write_text(json.dumps(text))
    assert [run.run_id(f) for f in long_schedule._pending(grid)] == [
        "resnet20-snip-params0.1-ep40-s1", "resnet20-snip-params0.1-ep40-s2",
        "resnet20-synflow-params0.1-ep40-s1",
        "resnet20-precrop_params-params0.11-ep40-s0", "resnet20-precrop_params-params0.11-ep40-s1",
        "resnet20-synflow-params0.1-ep40-s2"]


def test_export_keeps_exactly_the_models_of_the_next_runs(tmp_path, monkeypatch):
    """--max_runs N: the first N pending runs are exported (once), and every other model in init
    (a finished run's, a later run's) is removed, since the call that carries init has room for few."""
    grid = _grid(tmp_path, monkeypatch, done=["resnet20-synflow-params0.1-ep40-s0"])
    work = tmp_path / "work"
    (work / long_schedule._TEST_PART).mkdir(parents=True)
    (work / long_schedule._TEST_PART / "labels.npz").write_text("data exported already")
    exported = []

    def fake_export(command, **kwargs):  # stands in for train_cifar.py --export_init
        out = pathlib.Path(next(arg for arg in command if arg.startswith("--model_dir=")).split("=", 1)[1])
        out.mkdir(parents=True)
        (out / "init.json").write_text("{}")
        exported.append(out.name)

    monkeypatch.setattr(long_schedule.subprocess, "run", fake_export)
    monkeypatch.setattr(long_schedule._run, "code_dir_of", lambda code, repo: tmp_path)
    monkeypatch.setattr(long_schedule, "_check_call_sizes", lambda work: None)
    names = [long_schedule._init_name(flags) for flags in long_schedule._pending(grid)]
    for stale in ("resnet20-synflow-params0.1-s0", names[2]):  # finished; beyond --max_runs
        (work / "init" / stale).mkdir(parents=True)
    (work / "init" / names[0]).mkdir()
    (work / "init" / names[0] / "init.json").write_text("{}")  # exported by an earlier call

    def export(max_runs):
        args = argparse.Namespace(grid=grid, work=work, data_dir="unused", max_runs=max_runs)
        long_schedule.export(args)
        return sorted(folder.name for folder in (work / "init").iterdir())

    assert export(2) == sorted(names[:2]) and exported == [names[1]]
    assert export(None) == sorted(names) and exported == [names[1], names[2]]


def test_epochs_default_to_the_grids_and_are_refused_when_they_do_not_fit(tmp_path, monkeypatch):
    grid = _grid(tmp_path, monkeypatch)
    runs = long_schedule._pending(grid)
    calib = tmp_path / "calib.json"

    def epochs(epochs, deadline_s, timed_runs=4, epoch_s=10.0):
        calib.write_text(json.dumps({"runs": timed_runs, "epoch_s": epoch_s, "startup_s": 60.0}))
        args = argparse.Namespace(epochs=epochs, calib=str(calib), deadline_s=deadline_s)
        return long_schedule._epochs(args, runs)

    assert epochs(None, 460) == 40  # 60 + 40 x 10 s
    assert epochs("25", 100) == 25  # a number is taken as given
    assert epochs("fit", 360) == 30
    with pytest.raises(SystemExit, match=r"4 runs x 40 epochs \(the grid's\) take about 460 s .* "
                                         r"--deadline_s=459.*--max_runs.*--epochs fit \(30 epochs\)"):
        epochs(None, 459)
    with pytest.raises(SystemExit, match="timed 8 runs at once, this call trains 4: calibrate with the same"):
        epochs(None, 1000, timed_runs=8)
    with pytest.raises(argparse.ArgumentTypeError, match="positive number of epochs or 'fit', got '0'"):
        long_schedule._epochs_flag("0")


def test_pack_and_unpack_put_finished_runs_in_place_and_keep_the_others_resumable(tmp_path, monkeypatch):
    monkeypatch.setattr(run, "RUNS", tmp_path / "runs")
    device = tmp_path / "device"
    files = {"done": ["results.json", "history.csv", "train.log", "final_model.keras", "backup/w.h5"],
             "cut": ["history.csv", "train.log", "backup/w.h5", "backup/training_metadata.json"]}
    for name, paths in files.items():
        for path in paths:
            (device / name / path).parent.mkdir(parents=True, exist_ok=True)
            text = {"history.csv": "epoch,epoch_time\n0,1.0\n1,1.0\n", "results.json": "{}"}.get(path, name)
            (device / name / path).write_text(text)
    model = saved_trained_model(device / "done" / "final_model.keras")
    long_schedule._pack({name: device / name for name in files}, tmp_path / "runs.tgz")
    work = tmp_path / "work"
    (work / "resume" / "done" / "backup").mkdir(parents=True)  # from an earlier call that was cut short
    long_schedule.unpack(argparse.Namespace(tgz=tmp_path / "runs.tgz", work=work))
    assert sorted(p.name for p in (tmp_path / "runs" / "done").iterdir()) == sorted(
        ["results.json", "history.csv", "train.log", "final_model.keras"])  # no backup: it is finished
    unpacked = keras.saving.load_model(tmp_path / "runs" / "done" / "final_model.keras")  # slimmed
    assert not unpacked.compiled and unpacked.get_weights()[0].tolist() == model.get_weights()[0].tolist()
    assert not (work / "resume" / "done").exists()
    cut = work / "resume" / "cut"
    assert sorted(str(p.relative_to(cut)) for p in cut.rglob("*") if p.is_file()) == sorted(files["cut"])
    assert (cut / "backup" / "w.h5").read_text() == "cut"
    assert not (tmp_path / "runs" / "cut").exists()


def test_unpack_names_the_commit_whose_code_trained_a_run(tmp_path, monkeypatch):
    """The device has no git: a run records its code's blob ids, and unpack finds their commit here."""
    repo = git_init(tmp_path / "repo")

    def write(path, text):
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)

    for path in ("experiments/long_schedule.py", "experiments/run.py", "keras_precrop/train.py"):
        write(path, f"# {path}\n")
    write("keras_precrop/notes.txt", "tracked, but not Python: not recorded on either side\n")
    write("keras_precrop/sub dir/x.py", "# a path with a space\n")
    write("README.md", "not training code\n")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "first")
    first, code = git(repo, "rev-parse", "HEAD"), long_schedule._train_code(repo)
    for path, blob in code.items():
        assert blob == git(repo, "hash-object", "--no-filters", path), path
    write("keras_precrop/train.py", "# changed\n")
    git(repo, "commit", "-qam", "second")
    write("README.md", "changed, but not training code\n")
    git(repo, "commit", "-qam", "third")
    assert set(code) == {"experiments/long_schedule.py", "experiments/run.py", "keras_precrop/train.py",
                         "keras_precrop/sub dir/x.py"}
    assert long_schedule._train_commit(code, repo) == first
    head = git(repo, "rev-parse", "HEAD")
    assert long_schedule._train_commit(long_schedule._train_code(repo), repo) == head
    write("keras_precrop/new.py", "# not committed\n")
    assert long_schedule._train_commit(long_schedule._train_code(repo), repo) is None

    monkeypatch.setattr(long_schedule, "REPO", repo)
    monkeypatch.setattr(run, "RUNS", tmp_path / "runs")
    device = tmp_path / "device" / "r"
    device.mkdir(parents=True)
    (device / "results.json").write_text(json.dumps({"final_accuracy": 0.5, "train_code": code}))
    long_schedule._pack({"r": device}, tmp_path / "runs.tgz")
    long_schedule.unpack(argparse.Namespace(tgz=tmp_path / "runs.tgz", work=tmp_path / "work"))
    results = json.loads((tmp_path / "runs" / "r" / "results.json").read_text())
    assert results == {"final_accuracy": 0.5, "train_code": code, "train_commit": first}


def test_export_says_which_device_call_would_carry_too_much(tmp_path, monkeypatch, capsys):
    """Each call's carry plus the working tree (tracked and untracked-not-ignored files, not ignored
    ones) against the limit of a call, here scaled down to 11 MiB."""
    mib = 2**20
    repo = git_init(tmp_path / "repo")
    work = repo / ".gpu"
    (repo / ".gitignore").write_text(".gpu/\n.whl/\nbig.bin\n")
    sizes = {"tracked.py": mib, "untracked.txt": mib, "big.bin": 50 * mib, ".whl/k.whl": 2 * mib,
             ".gpu/data_a/t.webp": 3 * mib, ".gpu/init/m/init_model.keras": 9 * mib,
             ".gpu/data_b/t.webp": mib // 10, ".gpu/data_c/t.webp": mib // 10}
    for name, size in sizes.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_bytes(b"x" * size)
    git(repo, "add", "tracked.py", ".gitignore")
    monkeypatch.setattr(long_schedule, "REPO", repo)
    monkeypatch.setattr(long_schedule, "_CALL_LIMIT", 11 * mib)
    long_schedule._check_call_sizes(work)
    tree = 2 * mib + len(".gpu/\n.whl/\nbig.bin\n")  # big.bin is ignored: no call copies it
    lines = capsys.readouterr().out.splitlines()
    totals = [tree + 5 * mib, tree + 9 * mib + mib // 10, tree + mib // 10]
    said = [re.search(r"\): ([\d.]+) MiB", line).group(1) for line in lines]
    assert said == [f"{total / mib:.1f}" for total in totals]
    assert ["OVER" in line for line in lines] == [False, True, False]
    assert lines[1].startswith("[long_schedule] call 2 carries init data_b resume and the tree (2.0 MiB)")
