"""Tests for keras_precrop.train: recipes, schedules, L2, strategies and resuming.

Distributed and kill/resume runs happen in subprocesses that execute this file
as a script (see ``_worker_main``): logical CPU devices must be configured
before TensorFlow initializes, each multi-worker replica is its own process,
and a killed run must really die. All runs train the same tiny model from the
same initial weights on the same fixed batches, so their losses must agree
with an uninterrupted default-strategy run in this process.
"""

import argparse
import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from keras_precrop import train  # noqa: E402

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_EPOCHS = 3
_STEPS = 4
_BATCH = 16
_CLASSES = 4
_KILLED_RC = 17


# ----------------------------------------------------------------- recipes


# The seed paper's Table "Hyperparameters used in training", written out
# independently of RECIPES: epoch -> learning rate at the reference batch.
_TABLE_LR = {
    "cifar10": (128, lambda e: 0.1 * (1 - e / 160)),
    "imagenet_mobilenet": (256, lambda e: 0.025 * 0.98**e),
    "imagenet_resnet": (512, lambda e: 0.2 * (1.0 if e < 30 else 0.1 if e < 60 else 0.01)),
    "imagenet_efficientnet": (256, lambda e: 0.035 * 0.99**e),
}
_TABLE_REST = {  # epochs, weight decay
    "cifar10": (160, 1e-4),
    "imagenet_mobilenet": (180, 4e-5),
    "imagenet_resnet": (90, 1e-4),
    "imagenet_efficientnet": (150, 4e-5),
}


@pytest.mark.parametrize("name", sorted(_TABLE_LR))
def test_schedule_matches_table(name):
    recipe = train.RECIPES[name]
    batch, lr_at = _TABLE_LR[name]
    assert (recipe.batch_size, recipe.momentum) == (batch, 0.9)
    assert (recipe.epochs, recipe.weight_decay) == _TABLE_REST[name]
    spe = 7
    schedule = train.learning_rate_schedule(recipe, spe, batch)
    for epoch in (0, 1, 2, 29, 30, 31, 59, 60, 61, 89, recipe.epochs - 1):
        # First step of the epoch; for the per-epoch schedules also its last.
        steps = [epoch * spe] + ([] if recipe.schedule == "linear" else [epoch * spe + spe - 1])
        for step in steps:
            assert float(schedule(step)) == pytest.approx(lr_at(epoch), rel=1e-5), (epoch, step)


@pytest.mark.parametrize("global_batch", [32, 128, 1024])
def test_linear_scaling_with_global_batch(global_batch):
    recipe = train.RECIPES["imagenet_resnet"]
    schedule = train.learning_rate_schedule(recipe, 10, global_batch)
    assert float(schedule(0)) == pytest.approx(0.2 * global_batch / 512)
    assert float(schedule(30 * 10)) == pytest.approx(0.02 * global_batch / 512)


def test_linear_schedule_spans_the_run_actually_trained():
    schedule = train.learning_rate_schedule(train.RECIPES["cifar10"], 10, 128, epochs=4)
    assert [float(schedule(e * 10)) for e in range(4)] == pytest.approx([0.1, 0.075, 0.05, 0.025])


@pytest.mark.parametrize(
    "dataset, model, expected",
    [
        ("cifar10", "vgg16", "cifar10"),
        ("imagenet2012", "resnet18", "imagenet_resnet"),
        ("imagenet2012", "mobilenet_v2", "imagenet_mobilenet"),
        ("imagenet2012", "efficientnet_b0", "imagenet_efficientnet"),
    ],
)
def test_get_recipe(dataset, model, expected):
    assert train.get_recipe(dataset, model).name == expected


@pytest.mark.parametrize(
    "dataset, model, match",
    [("mnist", "resnet20", "mnist"), ("imagenet2012", "vgg16", "vgg16")],
)
def test_get_recipe_rejects_unknown(dataset, model, match):
    with pytest.raises(ValueError, match=match):
        train.get_recipe(dataset, model)


@pytest.mark.parametrize("bad", [0, -3, 2.5, None])
def test_schedule_rejects_bad_sizes(bad):
    recipe = train.RECIPES["cifar10"]
    with pytest.raises(ValueError, match=str(bad)):
        train.learning_rate_schedule(recipe, bad, 128)
    with pytest.raises(ValueError, match=str(bad)):
        train.learning_rate_schedule(recipe, 10, bad)


# ---------------------------------------------------------- weight decay


def _conv_bn_dense():
    inputs = keras.Input((6, 6, 2))
    x = keras.layers.Conv2D(3, 3, use_bias=True, name="conv")(inputs)
    x = keras.layers.BatchNormalization(name="bn")(x)
    x = keras.layers.DepthwiseConv2D(3, name="dw")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(2, name="fc")(x))


def test_l2_is_coupled_and_skips_bn_and_bias():
    """Two steps against PyTorch's SGD(momentum, weight_decay) update, by hand."""
    lr, momentum, wd = 0.1, 0.9, 0.05
    model = _conv_bn_dense()
    variables = model.trainable_variables
    optimizer = train.SGDWithL2(l2=wd, learning_rate=lr, momentum=momentum)
    rng = np.random.default_rng(0)
    w0 = [v.numpy() for v in variables]
    grads = [[np.zeros_like(w) for w in w0], [rng.normal(size=w.shape).astype("float32") for w in w0]]

    # PyTorch: b = momentum * b + (g + wd * w [kernels only]); w -= lr * b.
    expected, buffers = [w.copy() for w in w0], [np.zeros_like(w) for w in w0]
    for step_grads in grads:
        optimizer.apply(step_grads, variables)
        for i, (w, g) in enumerate(zip(expected, step_grads)):
            decayed = g + (wd * w if w.ndim >= 2 else 0.0)
            buffers[i] = momentum * buffers[i] + decayed
            expected[i] = w - lr * buffers[i]
    for v, want, start in zip(variables, expected, w0):
        np.testing.assert_allclose(v.numpy(), want, rtol=1e-5, atol=1e-7, err_msg=v.path)
        if v.ndim >= 2:
            assert not np.allclose(v.numpy(), start), v.path

    decayed = sorted(v.path for v in variables if train.SGDWithL2.decays(v))
    assert decayed == ["conv/kernel", "dw/kernel", "fc/kernel"]
    assert {v.path for v in variables} - set(decayed) == {
        "bn/beta",
        "bn/gamma",
        "conv/bias",
        "dw/bias",
        "fc/bias",
    }


def test_l2_leaves_bn_and_bias_alone_under_zero_gradients():
    model = _conv_bn_dense()
    optimizer = train.SGDWithL2(l2=0.5, learning_rate=0.1, momentum=0.9)
    for v in model.trainable_variables:  # nonzero BN/bias values that decay would shrink
        v.assign(tf.fill(v.shape, 2.0))
    for _ in range(3):
        optimizer.apply([tf.zeros(v.shape) for v in model.trainable_variables], model.trainable_variables)
    for v in model.trainable_variables:
        if v.ndim == 1:
            np.testing.assert_array_equal(v.numpy(), 2.0, err_msg=v.path)
        else:
            assert np.all(v.numpy() < 2.0), v.path


def test_sgd_with_l2_round_trips_through_keras_file(tmp_path):
    """Its arguments, schedule and momentum buffers, after a step (an unbuilt optimizer has none)."""
    model = train.compile_model(
        _conv_bn_dense, train.RECIPES["imagenet_mobilenet"], steps_per_epoch=5, global_batch_size=64
    )
    rng = np.random.default_rng(0)
    model.fit(rng.normal(size=(8, 6, 6, 2)), rng.integers(0, 2, size=8), epochs=1, verbose=0)
    path = str(tmp_path / "m.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded.optimizer, train.SGDWithL2)
    assert loaded.optimizer.l2 == pytest.approx(4e-5)
    schedule = keras.optimizers.schedules.deserialize(loaded.optimizer.get_config()["learning_rate"])
    assert float(schedule(0)) == pytest.approx(0.025 * 64 / 256)
    assert float(loaded.optimizer.learning_rate) == pytest.approx(float(model.optimizer.learning_rate))
    saved = {v.path: v.numpy() for v in model.optimizer.variables}
    assert int(loaded.optimizer.iterations) == 1 and len(saved) == len(loaded.optimizer.variables) > 1
    for v in loaded.optimizer.variables:
        np.testing.assert_array_equal(v.numpy(), saved[v.path], err_msg=v.path)


@pytest.mark.parametrize("bad", [{"l2": -1.0}, {"l2": float("nan")}, {"l2": 1e-4, "weight_decay": 1e-4}])
def test_sgd_with_l2_rejects_bad_arguments(bad):
    with pytest.raises(ValueError, match="l2|weight_decay"):
        train.SGDWithL2(**bad)


def test_compile_model_refuses_softmax_outputs():
    def build():
        inputs = keras.Input((4,))
        return keras.Model(inputs, keras.layers.Dense(3, activation="softmax", name="probs")(inputs))

    with pytest.raises(ValueError, match="probs"):
        train.compile_model(build, train.RECIPES["cifar10"], steps_per_epoch=1, global_batch_size=8)


# -------------------------------------------------------------- strategies


def test_get_strategy_names():
    with pytest.raises(ValueError, match="'gpu'"):
        train.get_strategy("gpu")
    assert train.get_strategy("default") is tf.distribute.get_strategy()
    if not tf.config.list_physical_devices("GPU") and not tf.config.list_physical_devices("TPU"):
        assert train.get_strategy("auto").num_replicas_in_sync == 1


def test_steps_per_epoch_from_cardinality():
    ds = tf.data.Dataset.range(50).batch(8, drop_remainder=True)
    assert train.steps_per_epoch(ds) == 6
    with pytest.raises(ValueError, match="steps_per_epoch"):
        train.steps_per_epoch(ds.repeat())


# --------------------------------------------- training runs (shared setup)


def _tiny_model():
    """Conv -> synchronized BN -> dense: synchronized BN makes replicas see global batch stats."""
    inputs = keras.Input((8, 8, 3))
    x = keras.layers.Conv2D(8, 3, name="conv")(inputs)
    x = keras.layers.BatchNormalization(synchronized=True, name="bn")(x)
    x = keras.layers.ReLU()(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(_CLASSES, name="fc")(x), name="tiny")


def _batches(shuffled=False):
    """Fixed batches, identical in every process; ``shuffled``: reshuffled every epoch from a seed,
    as ``make_pipeline`` does (epoch k's order is the k-th draw of the seed)."""
    rng = np.random.default_rng(1)
    images = rng.normal(size=(_STEPS * _BATCH, 8, 8, 3)).astype("float32")
    labels = rng.integers(0, _CLASSES, size=_STEPS * _BATCH).astype("int32")
    ds = tf.data.Dataset.from_tensor_slices((images, labels))
    if shuffled:
        tf.random.set_seed(0)  # with the op's seed, the same draws in every process
        ds = ds.shuffle(len(labels), seed=1, reshuffle_each_iteration=True)
    return ds.batch(_BATCH, drop_remainder=True)


def _run(strategy, model_dir, init_weights, callbacks=(), shuffled=False, steps_per_epoch=None):
    """Trains the tiny model for _EPOCHS epochs and returns the TrainResult."""

    def build():
        model = _tiny_model()
        model.load_weights(init_weights)
        return model

    model = train.compile_model(
        build,
        train.RECIPES["cifar10"],
        steps_per_epoch=_STEPS,
        global_batch_size=_BATCH,
        epochs=_EPOCHS,
        strategy=strategy,
    )
    return train.fit(
        model, _batches(shuffled), _batches(), model_dir=model_dir, epochs=_EPOCHS, callbacks=callbacks,
        steps_per_epoch=steps_per_epoch, verbose=0,
    )


class _Recorder(keras.callbacks.Callback):
    """Records the epochs this process trains; optionally hard-exits after one."""

    def __init__(self, kill_after):
        super().__init__()
        self.kill_after = kill_after
        self.epochs = []

    def on_epoch_begin(self, epoch, logs=None):
        self.epochs.append(epoch)

    def on_epoch_end(self, epoch, logs=None):
        if epoch == self.kill_after:
            os._exit(_KILLED_RC)  # no cleanup, no on_train_end: like a kill


def _worker_main(argv):
    parser = argparse.ArgumentParser()
    parser.add_argument("strategy")
    parser.add_argument("model_dir")
    parser.add_argument("init_weights")
    parser.add_argument("out")
    parser.add_argument("--kill_after", type=int, default=-1)
    parser.add_argument("--logical_cpus", type=int, default=0)
    parser.add_argument("--shuffled", action="store_true")
    parser.add_argument("--steps_per_epoch", type=int, default=None)
    args = parser.parse_args(argv)
    if args.logical_cpus:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * args.logical_cpus
        )
    strategy = train.get_strategy(args.strategy)
    recorder = _Recorder(args.kill_after)
    result = _run(strategy, args.model_dir, args.init_weights, [recorder], args.shuffled,
                  args.steps_per_epoch)
    with open(args.out, "w") as f:
        json.dump(
            {
                "history": result.history,
                "epochs_run": recorder.epochs,
                "replicas": strategy.num_replicas_in_sync,
            },
            f,
        )


def _spawn(args, env=None):
    return subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), *map(str, args)],
        cwd=_REPO,
        env={**os.environ, "PYTHONPATH": _REPO, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _wait(proc, expected_rc=0, timeout=240):
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == expected_rc, out[-4000:]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted default-strategy run in this process, and its initial weights."""
    root = tmp_path_factory.mktemp("reference")
    keras.utils.set_random_seed(0)
    init_weights = str(root / "init.weights.h5")
    _tiny_model().save_weights(init_weights)
    result = _run(tf.distribute.get_strategy(), str(root / "run"), init_weights)
    return init_weights, result.history


def _assert_same_losses(history, reference_history, rtol=1e-4):
    assert [row["epoch"] for row in history] == list(range(_EPOCHS))
    for key in ("loss", "val_loss", "accuracy", "val_accuracy"):
        np.testing.assert_allclose(
            [row[key] for row in history],
            [row[key] for row in reference_history],
            rtol=rtol,
            atol=1e-6,
            err_msg=key,
        )


def test_reference_run_learns_and_logs_schedule(reference, tmp_path):
    _, history = reference
    assert [row["epoch"] for row in history] == [0, 1, 2]
    assert history[-1]["loss"] < history[0]["loss"]
    lr0 = 0.1 * _BATCH / 128  # linear scaling, then linear decay over _EPOCHS
    np.testing.assert_allclose(
        [row["learning_rate"] for row in history],
        [lr0 * (1 - e / _EPOCHS) for e in range(_EPOCHS)],
        rtol=1e-5,
    )
    assert all(row["epoch_time"] > 0 for row in history)


def test_checkpoints_load_and_evaluate_like_the_history(reference, tmp_path):
    init_weights, _ = reference
    result = _run(tf.distribute.get_strategy(), str(tmp_path), init_weights)
    best_epoch = max(result.history, key=lambda row: row["val_accuracy"])
    for name, row in (("last.keras", result.history[-1]), ("best.keras", best_epoch)):
        loaded = keras.saving.load_model(str(tmp_path / name))
        loss, accuracy = loaded.evaluate(_batches(), verbose=0)
        assert accuracy == pytest.approx(row["val_accuracy"]), name
        assert loss == pytest.approx(row["val_loss"], rel=1e-4), name
    assert result.best_accuracy == best_epoch["val_accuracy"]
    assert result.final_accuracy == result.history[-1]["val_accuracy"]
    assert (tmp_path / "tensorboard").is_dir()

    # Rerunning the finished run trains nothing and returns the same history.
    recorder = _Recorder(kill_after=-1)
    again = _run(tf.distribute.get_strategy(), str(tmp_path), init_weights, [recorder])
    assert recorder.epochs == []
    assert again.history == result.history


def test_refuses_to_retrain_over_a_history_whose_backup_is_lost(reference, tmp_path):
    """One epoch ahead of the backup is a kill between logging and backing up (that epoch trains
    again); more means the backup is gone, and training again would mix two runs' epochs."""
    init_weights, _ = reference
    _run(tf.distribute.get_strategy(), str(tmp_path), init_weights)
    metadata = tmp_path / "backup" / "training_metadata.json"
    with open(metadata) as f:
        state = json.load(f)
    with open(metadata, "w") as f:
        json.dump({**state, "epoch": _EPOCHS - 1}, f)
    recorder = _Recorder(kill_after=-1)
    _run(tf.distribute.get_strategy(), str(tmp_path), init_weights, [recorder])
    assert recorder.epochs == [_EPOCHS - 1]

    history = (tmp_path / "history.csv").read_text()
    for name in os.listdir(tmp_path / "backup"):
        os.remove(tmp_path / "backup" / name)
    with pytest.raises(ValueError, match=rf"model_dir='{tmp_path}'.*epochs 0-2.*backup/.* 0 trained"):
        _run(tf.distribute.get_strategy(), str(tmp_path), init_weights)
    assert (tmp_path / "history.csv").read_text() == history


def test_fit_without_tensorboard(reference, tmp_path):
    init_weights, _ = reference

    def build():
        model = _tiny_model()
        model.load_weights(init_weights)
        return model

    model = train.compile_model(
        build, train.RECIPES["cifar10"], steps_per_epoch=_STEPS, global_batch_size=_BATCH
    )
    result = train.fit(model, _batches(), model_dir=str(tmp_path), epochs=1, tensorboard=False, verbose=0)
    assert not (tmp_path / "tensorboard").exists()
    assert [row["epoch"] for row in result.history] == [0]
    assert "val_accuracy" not in result.history[0]
    with pytest.raises(ValueError, match="val_accuracy"):
        result.final_accuracy  # noqa: B018 - reading the property raises


@pytest.mark.parametrize("data", ["shuffled", *(pytest.param(data, marks=pytest.mark.slow) for data in
                                              ["fixed", "shuffled, steps_per_epoch", "shuffled, mirrored"])])
def test_resumes_after_kill(reference, tmp_path, data):
    """Killed after epoch 0 and rerun, the run trains epochs 1-2 as the uninterrupted one did: the
    weights, optimizer and schedule restored, and (shuffled) the data of epochs 1-2, not epoch 0's
    order again (the restarted process builds its pipeline afresh; train.skip_epochs), with
    steps_per_epoch None or the dataset's batches (Keras makes its iterators differently), and
    under a MirroredStrategy over two logical CPUs (Keras distributes the dataset given, whose
    distributed copy draws from the same seeds)."""
    init_weights, reference_history = reference
    flags = {"fixed": [], "shuffled": ["--shuffled"],
             "shuffled, steps_per_epoch": ["--shuffled", "--steps_per_epoch", _STEPS],
             "shuffled, mirrored": ["--shuffled", "--logical_cpus", 2]}[data]
    strategy = "mirrored" if "mirrored" in data else "default"
    if strategy == "mirrored":  # the uninterrupted run of the same data and strategy, in its process
        _wait(_spawn([strategy, tmp_path / "reference", init_weights, tmp_path / "reference.json", *flags]))
        with open(tmp_path / "reference.json") as f:
            reference_history = json.load(f)["history"]
    elif data != "fixed":  # the uninterrupted run of the same data, here
        reference_history = _run(tf.distribute.get_strategy(), str(tmp_path / "reference"), init_weights,
                                 shuffled=True, steps_per_epoch=_STEPS if "steps" in data else None).history
    model_dir = tmp_path / "run"
    args = [strategy, model_dir, init_weights, tmp_path / "out.json", *flags]
    _wait(_spawn([*args, "--kill_after", 0]), expected_rc=_KILLED_RC)
    with open(model_dir / "history.csv") as f:
        assert [line.split(",")[0] for line in f.read().splitlines()[1:]] == ["0"]

    _wait(_spawn(args))
    with open(tmp_path / "out.json") as f:
        out = json.load(f)
    assert out["epochs_run"] == [1, 2]  # the rerun started at the second epoch
    with open(model_dir / "history.csv") as f:  # and did not log any epoch twice
        assert [line.split(",")[0] for line in f.read().splitlines()[1:]] == ["0", "1", "2"]
    # Weights, optimizer state and schedule position were restored: same run as uninterrupted.
    _assert_same_losses(out["history"], reference_history)
    np.testing.assert_allclose(
        [row["learning_rate"] for row in out["history"]], [row["learning_rate"] for row in reference_history]
    )


@pytest.mark.slow
def test_mirrored_two_logical_cpus_matches_default(reference, tmp_path):
    init_weights, reference_history = reference
    _wait(_spawn(["mirrored", tmp_path / "run", init_weights, tmp_path / "out.json", "--logical_cpus", 2]))
    with open(tmp_path / "out.json") as f:
        out = json.load(f)
    assert out["replicas"] == 2
    _assert_same_losses(out["history"], reference_history)


def _free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("localhost", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def _multiworker(model_dir, init_weights, out_prefix, flags=(), expected_rc=0):
    """Runs two multi-worker processes on localhost to their end; returns their outputs' paths."""
    workers = [f"localhost:{port}" for port in _free_ports(2)]
    procs, outs = [], [f"{out_prefix}{index}.json" for index in range(2)]
    for index in range(2):
        tf_config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
        procs.append(_spawn(["multiworker", model_dir, init_weights, outs[index], *flags],
                            env={"TF_CONFIG": json.dumps(tf_config)}))
    for proc in procs:
        _wait(proc, expected_rc)
    return outs


@pytest.mark.slow
def test_multiworker_two_processes_matches_default(reference, tmp_path):
    init_weights, reference_history = reference
    for path in _multiworker(tmp_path / "run", init_weights, tmp_path / "out"):
        with open(path) as f:
            out = json.load(f)
        assert out["replicas"] == 2
        _assert_same_losses(out["history"], reference_history)
    # Only the chief wrote the shared directory; the other worker kept to its own.
    assert (tmp_path / "run" / "best.keras").exists()
    assert (tmp_path / "run" / "worker_1" / "history.csv").exists()


@pytest.mark.slow
def test_multiworker_resumes_after_kill_on_reshuffled_data(reference, tmp_path):
    """Both workers killed after epoch 0 and rerun train epochs 1-2 on those epochs' shuffles:
    each worker's history equals the uninterrupted multi-worker run's (train.skip_epochs)."""
    init_weights, _ = reference
    references = _multiworker(tmp_path / "reference", init_weights, tmp_path / "reference", ["--shuffled"])
    _multiworker(tmp_path / "run", init_weights, tmp_path / "killed", ["--shuffled", "--kill_after", 0],
                 expected_rc=_KILLED_RC)
    for path, reference_path in zip(
        _multiworker(tmp_path / "run", init_weights, tmp_path / "out", ["--shuffled"]), references
    ):
        with open(path) as f, open(reference_path) as g:
            out, reference_out = json.load(f), json.load(g)
        assert out["epochs_run"] == [1, 2]
        _assert_same_losses(out["history"], reference_out["history"])


if __name__ == "__main__":
    _worker_main(sys.argv[1:])


def test_fit_builds_a_distiller_and_resumes_it(tmp_path):
    """A ``keras.distillation.Distiller`` is not built until it sees data, and BackupAndRestore
    refuses an unbuilt model: ``fit`` builds it from the data's spec, trains the student and a
    second call with more epochs goes on from the first's backup (the student's weights as the
    first call left them, not the starting ones)."""
    from keras_precrop.training.finetune import distiller

    keras.utils.set_random_seed(0)
    student, teacher = _tiny_model(), _tiny_model()
    model = distiller(student, teacher)
    model.compile(optimizer=keras.optimizers.SGD(0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    assert not model.built
    start = [w.numpy().copy() for w in student.weights]
    first = train.fit(model, _batches(), model_dir=str(tmp_path), epochs=1, tensorboard=False,
                      verbose=0)
    after_one = [w.numpy().copy() for w in student.weights]
    assert any(not np.array_equal(a, b) for a, b in zip(start, after_one))
    assert [row["epoch"] for row in first.history] == [0]
    for w, value in zip(student.weights, start):  # a new process would start from these
        w.assign(value)
    second = train.fit(model, _batches(), model_dir=str(tmp_path), epochs=2, tensorboard=False,
                       verbose=0)
    assert [row["epoch"] for row in second.history] == [0, 1]
    assert second.history[0] == first.history[0]
