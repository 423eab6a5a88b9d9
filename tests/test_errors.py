"""Errors a new user met, each naming the argument they passed (issue: one-way house).

Each error is an ``ArgumentError`` whose fields keep the user's arguments, so
Python shows ``min_channels=1000`` and the command line ``--min_channels 1000``
without parsing message text.
"""

import json

import keras
import numpy as np
import pytest

import keras_precrop as kp
from keras_precrop.cli import main as cli_main

L = keras.layers


def _cnn(shape=(16, 16, 3)):
    x = keras.Input(shape)
    h = L.Conv2D(8, 3, padding="same", name="conv1")(x)
    h = L.ReLU()(h)
    h = L.Conv2D(12, 3, padding="same", name="conv2")(h)
    h = L.GlobalAveragePooling2D()(h)
    return keras.Model(x, L.Dense(4, name="head")(h), name="cnn")


def test_min_channels_that_exceed_the_budget_are_named():
    model = _cnn()
    with pytest.raises(kp.InfeasibleBudgetError) as err:
        kp.plan(model, params=0.5, min_channels=1000)
    assert err.value.arguments == {"params": 0.5, "min_channels": 1000, "round_to": 1}
    assert "params=0.5 cannot be met" in str(err.value)
    assert "min_channels=1000" in str(err.value)
    # The narrowest model is the original (every width is below 1000): its parameters.
    assert err.value.limit == {"params": float(model.count_params())}


def test_a_tiny_ratio_names_the_ratio_not_a_zero_budget():
    model = _cnn()
    with pytest.raises(kp.InfeasibleBudgetError) as err:
        kp.plan(model, params=1e-6)
    message = str(err.value)
    assert message.startswith("params=1e-06 cannot be met with integer widths")
    assert "0.0 must be" not in message and "params_budget" not in message
    assert err.value.argument == "params"


def test_the_command_line_shows_the_same_error_as_flags(capsys):
    assert cli_main(["precrop", "resnet20", "--params", "0.5", "--min_channels", "1000"]) == 1
    line = capsys.readouterr().err
    assert line.startswith("keras-precrop: error: --params 0.5 cannot be met")
    assert "--min_channels 1000" in line and "min_channels=" not in line


def test_a_plan_file_that_is_not_json_is_named(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text("widths: [1, 2]\n")
    with pytest.raises(ValueError, match=f"file {str(path)!r} is not a Plan JSON"):
        kp.Plan.from_json(str(path))
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match="it holds a list, not an object"):
        kp.Plan.from_json(str(path))


def test_a_hand_edited_negative_width_is_refused_before_keras_sees_it(tmp_path):
    model = _cnn()
    data = kp.plan(model, params=0.5).to_dict()
    edited = next(v for v in data["variables"] if not v["fixed"])
    edited["new"] = -3
    with pytest.raises(kp.PlanMismatchError, match=f"{edited['name']!r} -3 channels"):
        kp.apply_plan(model, kp.Plan.from_dict(json.loads(json.dumps(data))))


@pytest.mark.filterwarnings("ignore::UserWarning")  # Keras: layers without an int8 form
def test_a_quantized_model_is_refused_with_the_remedy():
    model = _cnn()
    model.quantize("int8")
    with pytest.raises(kp.UnsupportedLayerError, match="quantized layers are not supported.*"
                                                       "Prune before quantizing"):
        kp.precrop(model, params=0.5)


def test_layers_with_lora_are_refused_together_by_name_or_kept_whole_where_ignored():
    x = keras.Input((16, 16, 3))
    h = L.Conv2D(12, 3, padding="same", activation="relu", name="conv2")(_cnn().layers[1](x))
    h = L.GlobalAveragePooling2D()(L.Conv2D(8, 3, padding="same", name="conv3")(h))
    model = keras.Model(x, L.Dense(4, name="head")(h))
    lora = ["conv1", "head"]  # a Conv2D and a Dense
    for name in lora:
        model.get_layer(name).enable_lora(2)
    with pytest.raises(kp.UnsupportedLayerError) as err:
        kp.precrop(model, params=0.5)
    for name in lora:  # every one at once, with the remedies
        assert f"{name!r} ({type(model.get_layer(name)).__name__}) has LoRA enabled" in str(err.value)
    assert "prune before enabling LoRA" in str(err.value) and f"ignore={lora}" in str(err.value)
    assert kp.profile(model, ignore=lora).total_params == model.count_params()
    small = kp.precrop(model, params=0.8, ignore=lora)
    assert small.count_params() == small.precrop_plan.params  # its LoRA weights counted


def test_an_unknown_layer_offers_ignore_as_an_argument():
    class Opaque(L.Layer):
        def call(self, x):
            return x * 2.0

    x = keras.Input((8, 8, 3))
    h = Opaque(name="opaque")(L.Conv2D(4, 3, name="c")(x))
    model = keras.Model(x, L.Dense(2)(L.Flatten()(h)))
    with pytest.raises(kp.UnsupportedLayerError) as err:
        kp.profile(model)
    assert err.value.arguments == {"ignore": ["opaque"]}
    assert "ignore=['opaque']" in str(err.value)
    assert err.value.format(lambda k, v: f"--{k} {','.join(v)}").count("--ignore opaque") == 1


def test_argument_errors_keep_their_fields_through_pickling():
    import pickle

    err = kp.ArgumentError("{flops} must be positive.", limit=0.0, flops=-1.0)
    back = pickle.loads(pickle.dumps(err))
    assert (str(back), back.arguments, back.limit) == ("flops=-1.0 must be positive.",
                                                       {"flops": -1.0}, 0.0)


def test_uniform_mode_refuses_balance_naming_both():
    with pytest.raises(kp.ArgumentError) as err:
        kp.plan(_cnn(), params=0.5, mode="uniform", balance=2)
    assert err.value.arguments == {"balance": 2, "mode": "uniform"}
    np.testing.assert_equal(err.value.argument, "balance")


def _flexible_cnn():
    """A residual CNN whose input leaves the spatial size open (``keras.Input((None, None, 3))``)."""
    x = keras.Input((None, None, 3), name="img")
    h = L.ReLU()(L.BatchNormalization(name="bn")(L.Conv2D(16, 3, padding="same", name="c1")(x)))
    h = L.Add()([h, L.Conv2D(16, 3, padding="same", name="c2")(h)])
    h = L.GlobalAveragePooling2D()(L.Conv2D(32, 3, strides=2, padding="same", name="c3")(h))
    return keras.Model(x, L.Dense(5, name="head")(h), name="flex")


def test_a_parameter_budget_plans_a_model_of_undefined_spatial_size(tmp_path):
    model = _flexible_cnn()
    small = kp.precrop(model, params=0.5)
    plan = small.precrop_plan
    assert tuple(small.input.shape) == (None, None, None, 3)  # the model's own, open size
    assert small.count_params() == plan.params <= 0.5 * model.count_params()
    assert plan.original["params"] == model.count_params()
    assert plan.solver["spatial_probe"] == [224, 224, 3]  # the MACs are those at this size
    for shape in ((2, 16, 16, 3), (1, 40, 24, 3)):
        assert small(np.ones(shape, np.float32)).shape == (shape[0], 5)
    small.save(tmp_path / "small.keras")
    assert keras.models.load_model(tmp_path / "small.keras").count_params() == plan.params


def test_budgets_that_count_macs_need_the_spatial_size():
    with pytest.raises(kp.ArgumentError) as err:
        kp.plan(_flexible_cnn(), params=0.5, flops=0.5)
    assert err.value.arguments == {"flops": 0.5}
    assert str(err.value) == (
        "flops=0.5 needs MACs or time, which depend on the sizes of the inputs (an image's height "
        "and width, a sequence's length), but model 'flex' has input 'img' of undefined shape "
        "(None, None, None, 3); build it on inputs of full shape, e.g. keras.Input((224, 224, 3), "
        "name='img'), or give a parameter budget alone.")


def test_a_text_models_open_length_is_said_in_its_own_terms():
    ids = keras.Input((None,), dtype="int32", name="token_ids")
    model = keras.Model(ids, L.Dense(2, name="head")(L.Embedding(50, 8, name="embed")(ids)))
    with pytest.raises(kp.ArgumentError, match=r"input 'token_ids' of undefined shape \(None, None\); "
                       r"build it on inputs of full shape, e\.g\. keras\.Input\(\(128,\), "
                       r"name='token_ids', dtype='int32'\)"):
        kp.plan(model, flops=0.5)
    assert kp.plan(model, params=0.5).params <= 0.5 * model.count_params()  # parameters need no length


@pytest.mark.parametrize("options, message, arguments", [
    (dict(weights="trained"), "weights='trained' must be None (fresh weights", {"weights": "trained"}),
    (dict(weights="keep", importance="l3"), "importance='l3' is unknown; use one of ['l1', 'l2', "
     "'taylor', 'activation', 'bn_scale', 'random']", {"importance": "l3"}),
    (dict(weights="keep", importance="taylor"), "importance='taylor' needs data=: it ranks the "
     "channels by the loss gradients of a few (x, y) batches.", {"importance": "taylor"}),
    (dict(weights="keep", data=(np.zeros((1, 16, 16, 3)), np.zeros(1))), "data= is for "
     "a ranking that needs data (['taylor', 'activation']) or refit=True; importance='l1' takes "
     "none: leave data= out, rank with one of ['taylor', 'activation'], or refit.",
     {"importance": "l1", "refit": False}),
    (dict(importance="l2"), "importance='l2' and data= choose the channels that keep their trained "
     "weights; they need weights='keep'.", {"importance": "l2"}),
])
def test_weight_options_name_the_argument(options, message, arguments):
    with pytest.raises(kp.ArgumentError) as err:
        kp.precrop(_cnn(), params=0.5, **options)
    assert str(err.value).startswith(message)
    assert err.value.arguments == arguments
