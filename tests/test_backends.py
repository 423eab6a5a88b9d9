"""keras-precrop on JAX and PyTorch, checked from the TensorFlow test run.

Every other backend runs in a subprocess (Keras picks its backend once per
process), with TensorFlow hidden by ``tests/without_tensorflow/sitecustomize.py``
so "works without TensorFlow installed" is what is tested:

* the backend-neutral core test files pass under JAX and PyTorch (by default
  ``test_layers.py`` under JAX; with ``-m slow`` under PyTorch too, with
  MobileNetV2, EfficientNetB0 and the fast tests of every other core file);
* by default each check below runs under JAX; ``-m slow`` repeats it under
  PyTorch and resumes a fit on both (the default suite's time: 15 minutes on
  two cores);
* ``profile``'s MACs equal a reference from each layer's kernel and
  activation shapes (checked against TensorFlow's graph here), where that
  graph, the suite's usual reference, is not available;
* the pruners give TensorFlow's masks and scores on the same weights,
  masked training keeps its zeros through ``fit`` and ``.keras``, and a
  masked model TensorFlow saved loads and computes alike;
* importing the core under JAX leaves TensorFlow unimported even where it
  is installed;
* training under Keras' JAX distribution (``DataParallel`` over two host
  devices) follows the single-device run (the CIFAR example under it:
  ``tests/test_examples.py``).

JAX subprocesses share one persistent compilation cache per test session, and
compile with XLA's cheapest optimization level: on 2 CPU cores compiling the
random initializer of every new weight shape dominates their run time.
"""

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest

import keras_precrop as kp
from tests.backend_scripts import macs, pruners
from tests.conftest import tf_macs

REPO = pathlib.Path(__file__).resolve().parents[1]
WITHOUT_TENSORFLOW = REPO / "tests" / "without_tensorflow"
OTHER_BACKENDS = ("jax", "torch")
# The default suite checks under JAX; `-m slow` repeats it under PyTorch.
JAX_BY_DEFAULT = ["jax", pytest.param("torch", marks=pytest.mark.slow)]

# Core test files that import no TensorFlow; test_profile.py and test_graph.py
# check MACs against TensorFlow's traced graph and run under TensorFlow only.
CORE_FAST = ["tests/test_layers.py"]
CORE_REST = [
    "tests/test_acceptance.py",
    "tests/test_rebuild.py",
    "tests/test_plan.py",
    "tests/test_models.py",
    "tests/test_cli.py",
    "tests/test_solver.py",
    "tests/test_solve_models.py",
    "tests/test_trace.py",
    "tests/test_attention.py",
    "tests/test_head_dims.py",
    "tests/test_gqa.py",
    "tests/test_activation_importance.py",
    "tests/test_refit.py",
]


@pytest.fixture(scope="session")
def jax_cache(tmp_path_factory):
    """A compilation cache shared by this session's JAX subprocesses."""
    return tmp_path_factory.mktemp("jax_cache")


def _run(backend, args, jax_cache, *, hide_tensorflow=True, extra_env=None, timeout=1800):
    """Runs ``python ARGS`` in the repository under ``backend``; returns the finished process."""
    path = [str(REPO)]
    if hide_tensorflow:
        path.insert(0, str(WITHOUT_TENSORFLOW))
    env = {
        **os.environ,
        "KERAS_BACKEND": backend,
        "PYTHONPATH": os.pathsep.join(path),
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "JAX_PLATFORMS": "cpu",
        "JAX_COMPILATION_CACHE_DIR": str(jax_cache),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "XLA_FLAGS": "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true "
                     "--xla_cpu_use_fusion_emitters=false",
        **(extra_env or {}),
    }
    return subprocess.run(
        [sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )


def _check(process):
    assert process.returncode == 0, process.stdout[-4000:] + process.stderr[-4000:]
    return process.stdout


def _pytest(backend, files, marker, jax_cache):
    args = ["-m", "pytest", "-q", "-m", marker, "-p", "no:cacheprovider", *files]
    out = _check(_run(backend, args, jax_cache))
    assert " passed" in out and " failed" not in out and " error" not in out, out[-2000:]
    return out


@pytest.mark.parametrize("backend", JAX_BY_DEFAULT)
def test_core_tests_pass_without_tensorflow(backend, jax_cache):
    _pytest(backend, CORE_FAST, "not slow", jax_cache)


@pytest.mark.slow
@pytest.mark.parametrize("backend", OTHER_BACKENDS)
def test_all_core_tests_pass_without_tensorflow(backend, jax_cache):
    _pytest(backend, CORE_FAST, "slow or not slow", jax_cache)  # MobileNetV2 and EfficientNetB0 too
    _pytest(backend, CORE_REST, "not slow", jax_cache)


_IMPORTS = textwrap.dedent(
    """
    import sys
    import keras_precrop as kp
    from keras_precrop import (budget, cli, errors, graph, latency, models, pai, planning, progress,
                               train, training, verify)
    from keras_precrop.budget import costs, densities, grid, modes, widths
    from keras_precrop.graph import channels, handlers, layers, rebuild, walker
    from keras_precrop.latency import calibrate, features, fit, model, timing
    from keras_precrop.training import constraints, optimizers
    tensorflow = ("tensorflow", "tensorflow_datasets")
    loaded = sorted(name for name in sys.modules if name.split(".")[0] in tensorflow)
    print("loaded:", loaded)
    """
)


def test_importing_the_core_under_jax_does_not_import_tensorflow(jax_cache):
    # Importing only: once running, Keras itself imports an installed TensorFlow
    # lazily (get_config checks for tf.TensorShape); the runs above hide it.
    out = _check(_run("jax", ["-c", _IMPORTS], jax_cache, hide_tensorflow=False))
    assert "loaded: []" in out


# -- MACs against a reference that is not the walker ---------------------------------


def _assert_macs_agree(models):
    """``profile``'s MACs, per layer and in total, equal the kernel-shape reference."""
    for name, got in models.items():
        assert got["profile"] == got["reference"], name
        assert got["total_macs"] == sum(got["reference"].values()), name


def test_kernel_shape_macs_are_tensorflows_graph_macs():
    """Under TensorFlow: the hand formulas of backend_scripts/macs.py equal the traced graph's
    MACs, so they can stand in for it where TensorFlow is hidden; profile agrees with both."""
    for build in macs.MODELS.values():
        model = build()
        assert sum(macs.reference_macs(model).values()) == tf_macs(model), model.name
    _assert_macs_agree(macs.run())


@pytest.mark.parametrize("backend", JAX_BY_DEFAULT)
def test_profile_macs_match_kernel_shapes_without_tensorflow(backend, jax_cache):
    script = REPO / "tests" / "backend_scripts" / "macs.py"
    result = json.loads(_check(_run(backend, [str(script)], jax_cache)).strip().splitlines()[-1])
    assert result["backend"] == backend
    assert set(result["models"]) == set(macs.MODELS)
    _assert_macs_agree(result["models"])


# -- latency budgets on the real clock ----------------------------------------------


@pytest.mark.parametrize("backend", JAX_BY_DEFAULT)
def test_a_latency_budget_is_planned_and_a_timed_step_trains(backend, jax_cache):
    """The runner times the model itself, not ``predict_on_batch``'s overhead: under JAX that
    overhead made ``latency=0.5`` infeasible. Torch's clock on a shared 2-core machine is too
    noisy to require a feasible plan from a six-variant fit; it must fit, and its training
    step must train."""
    script = REPO / "tests" / "backend_scripts" / "latency_budget.py"
    result = json.loads(_check(_run(backend, [str(script)], jax_cache)).strip().splitlines()[-1])
    assert result["backend"] == backend
    assert result["weights_moved"] == (backend == "torch")  # JAX's step is stateless
    if backend == "jax":
        assert result["feasible"], result
        assert result["predicted_ratio"] <= 0.5 * (1 + 1e-9)


# -- the pruners against TensorFlow's -----------------------------------------------

_SYNFLOW_ITERATIONS = 10


@pytest.fixture(scope="module")
def pruner_inputs(tmp_path_factory):
    """Weights of ResNet-20 and a small CNN, a batch, and TensorFlow's results on them."""
    keras.utils.set_random_seed(0)
    resnet, cnn = kp.models.get("resnet20"), pruners.small_cnn()
    rng = np.random.default_rng(0)
    inputs = {
        **{f"resnet{i}": w for i, w in enumerate(resnet.get_weights())},
        **{f"cnn{i}": w for i, w in enumerate(cnn.get_weights())},
        "x": rng.normal(size=(8, 8, 8, 3)).astype("float32"),
        "y": rng.integers(0, 3, 8),
        "synflow_iterations": np.array(_SYNFLOW_ITERATIONS),
    }
    folder = tmp_path_factory.mktemp("pruners")
    np.savez(folder / "inputs.npz", **inputs)
    pruners.run(inputs, str(folder / "tensorflow.npz"))
    with np.load(folder / "tensorflow.npz") as reference:
        return folder, dict(reference)


@pytest.mark.parametrize("backend", JAX_BY_DEFAULT)
def test_pruners_match_tensorflow_on_the_same_weights(backend, pruner_inputs, jax_cache):
    folder, reference = pruner_inputs
    output = folder / f"{backend}.npz"
    script = REPO / "tests" / "backend_scripts" / "pruners.py"
    saved = folder / "tensorflow.npz.keras"
    _check(_run(backend, [str(script), str(folder / "inputs.npz"), str(output), str(saved)], jax_cache))
    with np.load(output) as got:
        got = dict(got)
    # SynFlow: the same masks up to float32 rounding near the threshold, which
    # iterated rounds carry on (JAX: identical; PyTorch's convolutions: 99.7%).
    agreement = np.mean(got["synflow"] == reference["synflow"])
    assert agreement > 0.99, agreement
    np.testing.assert_allclose(got["synflow_densities"], reference["synflow_densities"], atol=0.01)
    assert got["synflow"].sum() == reference["synflow"].sum()
    for name in ("snip", "grasp"):
        scale = np.abs(reference[name]).max()
        np.testing.assert_allclose(got[name], reference[name], rtol=1e-3, atol=1e-4 * scale, err_msg=name)
    np.testing.assert_array_equal(got["magnitude"], reference["magnitude"])
    # Masked training with momentum and weight decay: the same steps, the same zeros.
    np.testing.assert_allclose(got["masked_fit_loss"], reference["masked_fit_loss"], rtol=1e-4)
    np.testing.assert_allclose(got["masked_kernel"], reference["masked_kernel"], rtol=1e-4, atol=1e-6)
    assert np.count_nonzero(got["masked_kernel"]) == np.count_nonzero(reference["masked_kernel"])
    # TensorFlow's masked .keras file loads, with its masks, and computes the same.
    np.testing.assert_allclose(got["reloaded_outputs"], reference["masked_outputs"], rtol=1e-5, atol=1e-6)


def test_tensorflow_reference_masks_are_what_the_pruners_promise(pruner_inputs):
    _, reference = pruner_inputs
    assert reference["synflow"].sum() == round(0.05 * reference["synflow"].size)
    assert np.isclose(reference["snip"].sum(), 1.0)
    assert reference["magnitude"].sum() == round(0.3 * reference["magnitude"].size)
    assert set(np.unique(reference["synflow"])) == {0.0, 1.0}


# -- JAX distribution ------------------------------------------------------------

_DATA_PARALLEL = textwrap.dedent(
    """
    import json, sys
    import jax, keras, numpy as np
    from keras_precrop import train

    class Batches(keras.utils.PyDataset):
        def __init__(self):
            super().__init__()
            rng = np.random.default_rng(0)
            self.x = rng.normal(size=(64, 8, 8, 3)).astype("float32")
            self.y = rng.integers(0, 4, 64)

        def __len__(self):
            return 4

        def __getitem__(self, i):
            return self.x[16 * i : 16 * (i + 1)], self.y[16 * i : 16 * (i + 1)]

    initial = []

    def run(name, model_dir):
        strategy = train.get_strategy(name)

        def build():
            keras.utils.set_random_seed(0)
            inputs = keras.Input((8, 8, 3))
            h = keras.layers.Conv2D(8, 3, padding="same", name="conv")(inputs)
            h = keras.layers.BatchNormalization(name="bn")(h)
            h = keras.layers.GlobalAveragePooling2D()(keras.layers.ReLU()(h))
            model = keras.Model(inputs, keras.layers.Dense(4, name="fc")(h))
            if initial:  # the distributed run starts from the single-device run's weights
                model.set_weights(initial)
            else:
                initial.extend(model.get_weights())
            return model

        model = train.compile_model(build, train.RECIPES["cifar10"], steps_per_epoch=4,
                                    global_batch_size=16, epochs=2, strategy=strategy)
        kernel = model.get_layer("conv").kernel.value
        result = train.fit(model, Batches(), model_dir=model_dir, epochs=2, verbose=0)
        return {"replicas": strategy.num_replicas_in_sync,
                "kernel_devices": len(kernel.sharding.device_set),
                "loss": [row["loss"] for row in result.history],
                "needs_static": train.needs_static_batches(strategy)}

    print(json.dumps({"devices": len(jax.devices()), "single": run("default", sys.argv[1] + "/single"),
                      "parallel": run("mirrored", sys.argv[1] + "/parallel")}))
    """
)


def test_jax_data_parallel_over_two_devices_matches_one_device(tmp_path, jax_cache):
    process = _run(
        "jax",
        ["-c", _DATA_PARALLEL, str(tmp_path)],
        jax_cache,
        extra_env={"XLA_FLAGS": "--xla_force_host_platform_device_count=2"},
    )
    result = json.loads(_check(process).strip().splitlines()[-1])
    assert result["devices"] == 2
    single, parallel = result["single"], result["parallel"]
    assert (single["replicas"], single["kernel_devices"], single["needs_static"]) == (1, 1, False)
    assert (parallel["replicas"], parallel["kernel_devices"], parallel["needs_static"]) == (2, 2, True)
    assert len(single["loss"]) == 2
    np.testing.assert_allclose(parallel["loss"], single["loss"], rtol=1e-3)
    assert single["loss"][1] < single["loss"][0]  # it did train


_RESUME = textwrap.dedent(
    """
    import json, os, sys
    import keras, numpy as np, tensorflow as tf
    from keras_precrop import train

    model_dir, kill = sys.argv[1], sys.argv[2] == "kill"
    steps = None if sys.argv[3] == "None" else int(sys.argv[3])
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(64, 8, 8, 3)).astype("float32"), rng.integers(0, 4, 64).astype("int32")
    tf.random.set_seed(0)
    data = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(64, seed=1, reshuffle_each_iteration=True)

    class Kill(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if kill:
                os._exit(3)  # a kill after epoch 0, backed up

    def build():
        keras.utils.set_random_seed(0)
        inputs = keras.Input((8, 8, 3))
        h = keras.layers.GlobalAveragePooling2D()(keras.layers.Conv2D(4, 3)(inputs))
        return keras.Model(inputs, keras.layers.Dense(4)(h))

    model = train.compile_model(build, train.RECIPES["cifar10"], steps_per_epoch=4, global_batch_size=16,
                                epochs=3)
    result = train.fit(model, data.batch(16), model_dir=model_dir, epochs=3, steps_per_epoch=steps,
                       callbacks=[Kill()], verbose=0, tensorboard=False)
    print(json.dumps([row["loss"] for row in result.history]))
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("steps_per_epoch", [None, 4])
@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_a_resumed_fit_reads_the_epochs_own_shuffles(backend, steps_per_epoch, tmp_path, jax_cache):
    """On JAX and PyTorch too (Keras reads tf.data through generators there), a fit killed after
    epoch 0 and resumed trains epochs 1-2 on their own reshuffled batches: its losses are the
    uninterrupted run's (train.skip_epochs; without it, epoch 1 repeats epoch 0's order)."""
    def losses(name, how):
        args = ["-c", _RESUME, str(tmp_path / name), how, str(steps_per_epoch)]
        process = _run(backend, args, jax_cache, hide_tensorflow=False)
        assert process.returncode == (3 if how == "kill" else 0), process.stderr[-4000:]
        return json.loads(process.stdout.strip().splitlines()[-1]) if how != "kill" else None

    uninterrupted = losses("whole", "go")
    losses("resumed", "kill")
    np.testing.assert_allclose(losses("resumed", "go"), uninterrupted, rtol=1e-6)
