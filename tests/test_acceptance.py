"""Zoo models through profile, PreCrop, PreConfig, fit and ``.keras`` on the current Keras backend.

Backend-neutral (no TensorFlow import): ``tests/test_backends.py`` runs this
file under JAX and PyTorch with TensorFlow hidden, and the default suite runs
it under TensorFlow. ResNet-20 is in the default suite; MobileNetV2 and
EfficientNetB0 (``keras.applications``, fresh weights, 96x96 inputs) are slow.
"""

import functools
import importlib
import importlib.util

import keras
import numpy as np
import pytest

import keras_precrop as kp
from keras_precrop.cli import main as cli_main

_CLASSES = 10
_MODELS = [
    pytest.param("resnet20", (32, 32, 3), id="resnet20"),
    pytest.param("mobilenet_v2", (96, 96, 3), id="mobilenet_v2", marks=pytest.mark.slow),
    pytest.param("efficientnet_b0", (96, 96, 3), id="efficientnet_b0", marks=pytest.mark.slow),
]
_METHODS = {
    "precrop": (functools.partial(kp.precrop, params=0.5), 0.5, 1.0),
    "reconfigure": (functools.partial(kp.reconfigure, params=0.8, flops=1.0), 0.8, 1.0),
}


@functools.cache
def _reference(name, input_shape):
    """The zoo model and its profile, built once per module."""
    keras.utils.set_random_seed(0)
    model = kp.models.get(name, input_shape=input_shape, num_classes=_CLASSES)
    return model, kp.profile(model)


def _numpy(x):
    return keras.ops.convert_to_numpy(x)


@pytest.mark.parametrize("method", ["precrop", pytest.param("reconfigure", marks=pytest.mark.slow)])
@pytest.mark.parametrize("name,input_shape", _MODELS)
def test_compressed_zoo_model_matches_plan_trains_and_round_trips(name, input_shape, method, tmp_path):
    model, profile = _reference(name, input_shape)
    assert profile.total_params == model.count_params()
    compress, params_ratio, flops_ratio = _METHODS[method]
    new = compress(model)
    plan = new.precrop_plan
    new_profile = kp.profile(new)
    assert new.count_params() == new_profile.total_params == plan.params
    assert new_profile.total_macs == plan.macs
    assert plan.params <= params_ratio * profile.total_params
    assert plan.macs <= flops_ratio * profile.total_macs
    assert {layer.name for layer in model.layers} <= {layer.name for layer in new.layers}

    rng = np.random.default_rng(0)
    x = rng.uniform(0, 255, size=(4, *input_shape)).astype("float32")
    y = np.arange(4) % _CLASSES
    assert tuple(new(x[:2]).shape) == (2, _CLASSES)
    new.compile(
        optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    before = [w.numpy().copy() for w in new.trainable_weights]
    history = new.fit(x, y, batch_size=2, epochs=1, verbose=0)  # two steps
    assert np.isfinite(history.history["loss"]).all()
    assert any(not np.array_equal(b, w.numpy()) for b, w in zip(before, new.trainable_weights))

    path = tmp_path / f"{name}_{method}.keras"
    new.save(path)
    loaded = keras.saving.load_model(path)
    assert loaded.count_params() == plan.params
    np.testing.assert_allclose(_numpy(loaded(x[:2])), _numpy(new(x[:2])), rtol=1e-5, atol=1e-5)


def test_cli_precrops_a_zoo_model_into_a_loadable_file(tmp_path, capsys):
    out, plan_file = tmp_path / "small.keras", tmp_path / "plan.json"
    args = ["precrop", "resnet20", "--params", "0.4", "--out", str(out), "--plan", str(plan_file)]
    assert cli_main(args) == 0
    assert "Params: 274,042 ->" in capsys.readouterr().out
    plan = kp.Plan.from_json(str(plan_file))
    small = keras.saving.load_model(out)
    assert small.count_params() == plan.params <= 0.4 * 274_042
    x = np.zeros((1, 32, 32, 3), "float32")
    assert tuple(small(x).shape) == (1, _CLASSES)


@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is not None, reason="TensorFlow is installed")
def test_tensorflow_features_say_what_to_install():
    needs = r"keras_precrop\.data .* needs TensorFlow.*keras-precrop\[cpu\]"
    with pytest.raises(ImportError, match=needs):
        kp.data  # noqa: B018 (the attribute imports the module, as `from keras_precrop import data`)
    with pytest.raises(ImportError, match=needs):
        importlib.import_module("keras_precrop.training.data")
    remote = r"the remote path 'gs://bucket/run/history.csv' needs TensorFlow.*keras-precrop\[cpu\]"
    with pytest.raises(ImportError, match=remote):
        kp.train.read_history("gs://bucket/run")
