"""``kp.GradualPruning`` across the channels a LayerNormalization normalizes over (issue 61, item 2).

A vision transformer's residual stream runs through a LayerNormalization in
every block; a masked channel is zero but would still count in its mean and
variance. During the fit the callback lends each cut LayerNormalization and
RMSNormalization a call with its statistics over the kept channels. Checked
against independent references:

* the lent computation against Keras' own layer built on the kept channels
  (``Normalize.masked_call``), for every flag of LayerNormalization and for
  RMSNormalization;
* the masked model at the end of the fit against the model ``finalize()``
  rebuilds (a forward pass of each), on a small transformer (a multi-head
  attention block and an MLP block around a residual stream, LayerNorm and
  RMSNorm), through ``keras.distillation.Distiller`` too, and on a
  keras_hub ``ViTImageClassifier``; without the lent calls it is not;
* after the fit the layers' ``call`` is their class's, the model's config is
  unchanged and it computes what a clone with its weights computes;
* under JAX (and PyTorch with ``jit_compile``), whose compiled step would keep
  the values it was traced with, the plan is refused before any step, in a
  subprocess with TensorFlow hidden (``tests/test_backends.py``'s helper);
  PyTorch's eager step computes the masked statistics (slow).

Run as a script (``python tests/test_gradual_norms.py [--jit-compile]``) it fits
the small transformer under the current backend and prints one JSON line.
"""

import json
import sys
import types

import keras
import numpy as np
import pytest

import keras_precrop as kp
from keras_precrop.graph.handlers import handler_of
from keras_precrop.training import finetune
from keras_precrop.training.constraints import LentFactors
from tests.conftest import tf_macs
from tests.test_backends import _check, _run

L = keras.layers
NORMS = ("ln0", "ln1", "rms", "ln_f")


def _transformer(seed=0):
    """Tokens embedded by a Dense into a 16-channel stream through a LayerNormalization, a
    multi-head attention block and an MLP block (RMSNormalization, Dense, Dense) each added to
    it, a final LayerNormalization, pooled to five logits."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((6, 8))
    x = L.LayerNormalization(name="ln0")(L.Dense(16, name="embed")(inputs))
    h = L.LayerNormalization(name="ln1")(x)
    x = L.Add()([x, L.MultiHeadAttention(num_heads=2, key_dim=4, name="mha")(h, h)])
    h = L.Dense(32, activation="gelu", name="up")(L.RMSNormalization(name="rms")(x))
    x = L.Add()([x, L.Dense(16, name="down")(h)])
    x = L.LayerNormalization(name="ln_f")(x)
    return keras.Model(inputs, L.Dense(5, name="head")(L.GlobalAveragePooling1D()(x)))


def _data(shape, n=32, seed=1):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, *shape)).astype("float32"), rng.integers(0, 5, n)


class _Outputs(keras.callbacks.Callback):
    """Records ``model(x)`` when the fit ends, listed before the pruning callback: the masked
    model with the lent norms, as the last step trained it."""

    def __init__(self, model, x):
        super().__init__()
        self.pruned, self.x, self.outputs = model, x, None

    def on_train_end(self, logs=None):
        self.outputs = keras.ops.convert_to_numpy(self.pruned(self.x))


def _fit(model, plan, fitted=None, x=None, y=None, epochs=2, jit_compile="auto"):
    """Fit ``fitted`` (default ``model``) two epochs of four steps, pruning ``model`` to ``plan``
    by step 4; returns the callback and the masked model's outputs on 8 inputs at the end."""
    fitted = model if fitted is None else fitted
    if x is None:
        x, y = _data(model.inputs[0].shape[1:])
    fitted.compile(keras.optimizers.Adam(1e-2),
                   keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                   jit_compile=jit_compile)
    record = _Outputs(model, x[:8])
    pruning = kp.GradualPruning(plan, end_step=4, frequency=2, verbose=0)
    fitted.fit(x, y, batch_size=8, epochs=epochs, callbacks=[record, pruning], verbose=0)
    return pruning, record.outputs


def _stream_plan(model):
    the_plan = kp.plan(model, params=0.5)
    stream = next(v for v in the_plan.variables if v["name"] == "embed")
    assert stream["new"] < stream["width"] == 16  # the stream every norm normalizes over is cut
    return the_plan


def _assert_own_calls(model, config):
    """After the fit: each norm's ``call`` is its class's, the config is the one before, and the
    model computes what a clone with its weights computes."""
    for name in NORMS:
        layer = model.get_layer(name)
        assert "call" not in layer.__dict__ and layer.call.__func__ is type(layer).call
    assert model.get_config() == config
    clone = keras.models.clone_model(model)
    clone.set_weights(model.get_weights())
    x, _ = _data(model.inputs[0].shape[1:], n=4, seed=7)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(model(x)),
                                  keras.ops.convert_to_numpy(clone(x)))


# -- the lent computation against Keras' own layer on the kept channels ------------------------

@pytest.mark.parametrize("make", [
    lambda: L.LayerNormalization(epsilon=1e-5),
    lambda: L.LayerNormalization(center=False),
    lambda: L.LayerNormalization(scale=False),
    lambda: L.LayerNormalization(axis=[-2, -1]),
    lambda: L.LayerNormalization(rms_scaling=True),
    lambda: L.RMSNormalization(),
], ids=["ln", "no-center", "no-scale", "two-axes", "rms-scaling", "rms-norm"])
@pytest.mark.filterwarnings("ignore:You passed `rms_scaling=True`")
def test_masked_call_is_the_layer_built_on_the_kept_channels(make):
    rng = np.random.default_rng(0)
    keep = (rng.random(12) < 0.6).astype("float32")
    kept = np.flatnonzero(keep)
    x = rng.normal(2.0, 3.0, size=(3, 5, 12)).astype("float32")  # masked channels not zero
    layer, small = make(), make()
    layer.build(x.shape)
    layer.set_weights([rng.normal(size=w.shape).astype("float32") for w in layer.weights])
    small.build(x[..., kept].shape)
    small.set_weights([keras.ops.convert_to_numpy(w)[..., kept] for w in layer.weights])
    masked = handler_of(layer).masked_call(types.SimpleNamespace(layer=layer))
    out = keras.ops.convert_to_numpy(masked(x, keras.ops.convert_to_tensor(keep)))
    np.testing.assert_allclose(out[..., kept], keras.ops.convert_to_numpy(small(x[..., kept])),
                               rtol=1e-5, atol=1e-5)
    assert not out[..., keep == 0].any()


class _OwnCall(L.LayerNormalization):
    def call(self, inputs):
        return super().call(inputs) * 2.0


@pytest.mark.parametrize("layer", [L.GroupNormalization(2), L.Softmax(), L.UnitNormalization(),
                                   _OwnCall()], ids=lambda layer: type(layer).__name__)
def test_masked_call_is_none_where_the_handler_does_not_know_the_call(layer):
    assert handler_of(layer).masked_call(types.SimpleNamespace(layer=layer)) is None


# -- fit: the masked model computes what finalize() rebuilds ----------------------------------

def test_a_cut_stream_trains_masked_as_finalize_rebuilds_it():
    model = _transformer()
    config, the_plan = model.get_config(), _stream_plan(model)
    pruning, masked = _fit(model, the_plan)
    _assert_own_calls(model, config)
    small = pruning.finalize()
    assert small.count_params() == the_plan.predicted["params"] < model.count_params()
    np.testing.assert_allclose(keras.ops.convert_to_numpy(small(_data((6, 8))[0][:8])), masked,
                               atol=1e-5)
    for name in NORMS:  # every norm's cut channels masked: its scale (and offset) zero there
        for w in model.get_layer(name).weights:
            assert (keras.ops.convert_to_numpy(w) == 0).sum() == 16 - small.get_layer(name).weights[
                0].shape[-1]
    _assert_own_calls(model, config)  # finalize gave nothing back wrong


def test_validation_within_the_fit_evaluates_the_masked_model():
    """A test function traced before the fit (an ``evaluate``) is traced anew with the lent norms:
    the last epoch's ``val_loss`` is the rebuilt model's loss; after the fit ``evaluate`` is the
    model's own again (a clone with its weights)."""
    model = _transformer()
    x, y = _data((6, 8))
    the_plan = _stream_plan(model)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(keras.optimizers.Adam(1e-2), loss)
    model.evaluate(x[:8], y[:8], verbose=0)  # traced on the validation batch's shape
    pruning = kp.GradualPruning(the_plan, end_step=4, frequency=2, verbose=0)
    history = model.fit(x, y, batch_size=8, epochs=2, validation_data=(x[:8], y[:8]),
                        callbacks=[pruning], verbose=0)
    small = pruning.finalize()
    expected = float(loss(y[:8], small(x[:8])))
    assert history.history["val_loss"][-1] == pytest.approx(expected, rel=1e-5)
    clone = keras.models.clone_model(model)
    clone.set_weights(model.get_weights())
    clone.compile(loss=loss)
    assert model.evaluate(x, y, verbose=0) == pytest.approx(clone.evaluate(x, y, verbose=0),
                                                             rel=1e-6)


def test_without_the_lent_norms_the_masked_model_is_not_the_rebuilt_one(monkeypatch):
    """The same fit with the lent calls left out: the masked zeros count in the norms' statistics
    and the masked model computes something else than the rebuilt one."""
    hold = LentFactors.hold
    monkeypatch.setattr(LentFactors, "hold", lambda self, model, weights, step, calls=():
                        hold(self, model, weights, step))
    model = _transformer()
    pruning, masked = _fit(model, _stream_plan(model))
    small = pruning.finalize()
    assert np.abs(keras.ops.convert_to_numpy(small(_data((6, 8))[0][:8])) - masked).max() > 1e-2


def test_a_distillers_student_with_a_cut_stream():
    model, teacher = _transformer(), _transformer(seed=1)
    config, the_plan = model.get_config(), _stream_plan(model)
    pruning, masked = _fit(model, the_plan, finetune.distiller(model, teacher))
    _assert_own_calls(model, config)
    small = pruning.finalize()
    np.testing.assert_allclose(keras.ops.convert_to_numpy(small(_data((6, 8))[0][:8])), masked,
                               atol=1e-5)


def test_a_group_normalization_cut_is_still_refused_by_name():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((6, 8))
    x = L.GroupNormalization(4, name="gn")(L.Dense(16, name="embed")(inputs))
    model = keras.Model(inputs, L.Dense(5, name="head")(L.GlobalAveragePooling1D()(x)))
    with pytest.raises(kp.ArgumentError, match=r"'gn' \(GroupNormalization\).*ignore=\['gn'\]"):
        _fit(model, kp.plan(model, params=0.5))


def test_a_vit_classifier_at_half_the_macs_trains_masked_as_finalize_rebuilds_it():
    keras_hub = pytest.importorskip("keras_hub")
    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.ViTBackbone(image_shape=(16, 16, 3), patch_size=4, num_layers=2,
                                            num_heads=2, hidden_dim=16, mlp_dim=32)
    model = keras_hub.models.ViTImageClassifier(backbone=backbone, num_classes=5,
                                                preprocessor=None, activation=None)
    x, y = _data((16, 16, 3), n=24)
    pruning, masked = _fit(model, kp.plan(model, flops=0.5), x=x, y=y)
    small = pruning.finalize()
    assert tf_macs(small) <= 0.5 * tf_macs(model)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(small(x[:8])), masked, atol=1e-5)
    norms, rebuilt = ([layer for layer in m._flatten_layers() if isinstance(layer, L.LayerNormalization)]
                      for m in (model, small))
    assert len(norms) == 5 and all("call" not in layer.__dict__ for layer in norms)
    (hidden,) = {layer.gamma.shape[-1] for layer in rebuilt}  # the stream, cut
    for layer in norms:  # each norm's scale masked where the stream was cut
        assert (keras.ops.convert_to_numpy(layer.gamma) == 0).sum() == 16 - hidden > 0


# -- other backends, in subprocesses ------------------------------------------------------------

def _script(backend, tmp_path, *args):
    process = _run(backend, [__file__, *args], tmp_path / "jax_cache")
    return json.loads(_check(process).strip().splitlines()[-1])


def _assert_refused(result, backend, named):
    assert result["backend"] == backend
    assert "'ln0' (LayerNormalization)" in result["error"] and named in result["error"]
    assert "ignore=['ln0']" in result["error"] and "apply_plan" in result["error"]
    assert result["trained"] is False  # refused before any step


def test_jax_refuses_a_cut_norm_before_any_step(tmp_path):
    _assert_refused(_script("jax", tmp_path), "jax", "under JAX")


@pytest.mark.slow
def test_pytorch_computes_the_masked_statistics_and_refuses_them_compiled(tmp_path):
    result = _script("torch", tmp_path)
    assert result["backend"] == "torch" and result["max_diff"] <= 1e-5 and result["restored"]
    _assert_refused(_script("torch", tmp_path, "--jit-compile"), "torch",
                    "under PyTorch with jit_compile=True")


def _main(jit_compile):
    """Fit the small transformer under this process's backend and print what the tests check."""
    model = _transformer()
    before = [keras.ops.convert_to_numpy(w) for w in model.weights]
    report = {"backend": keras.backend.backend()}
    try:
        pruning, masked = _fit(model, _stream_plan(model), jit_compile=jit_compile)
    except kp.ArgumentError as e:
        report["error"] = str(e)
        report["trained"] = any((b != keras.ops.convert_to_numpy(w)).any()
                                for b, w in zip(before, model.weights))
    else:
        small = keras.ops.convert_to_numpy(pruning.finalize()(_data((6, 8))[0][:8]))
        report["max_diff"] = float(np.abs(small - masked).max())
        report["restored"] = all("call" not in model.get_layer(n).__dict__ for n in NORMS)
    print(json.dumps(report))


if __name__ == "__main__":
    _main(jit_compile=True if "--jit-compile" in sys.argv else "auto")
