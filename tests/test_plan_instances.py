"""A plan applies to every model of the architecture it was made for, and only to those (issue 42)."""

import keras
import numpy as np
import pytest

import keras_precrop as kp


def _resnetish(width=16):
    """A small residual CNN as users write it: unnamed keras.Input, named layers."""
    inputs = keras.Input((16, 16, 3))
    x = keras.layers.Conv2D(width, 3, padding="same", name="stem")(inputs)
    y = keras.layers.Conv2D(width, 3, padding="same", activation="relu", name="b0_conv1")(x)
    y = keras.layers.Conv2D(width, 3, padding="same", name="b0_conv2")(y)
    x = keras.layers.Add(name="b0_add")([x, y])
    x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    return keras.Model(inputs, keras.layers.Dense(10, name="head")(x), name="resnetish")


def _sequential():
    """A Sequential CNN with an unnamed input."""
    return keras.Sequential([
        keras.Input((16, 16, 1)),
        keras.layers.Conv2D(8, 3, activation="relu", name="c1"),
        keras.layers.Conv2D(16, 3, activation="relu", name="c2"),
        keras.layers.GlobalAveragePooling2D(name="pool"),
        keras.layers.Dense(10, name="head"),
    ], name="seq")


def _reloaded(tmp_path):
    model = _resnetish()
    model.save(tmp_path / "m.keras")
    return keras.models.load_model(tmp_path / "m.keras")


@pytest.mark.parametrize("second", ["functional", "sequential", "reloaded"])
def test_a_plan_applies_to_a_second_instance_with_an_unnamed_input(second, tmp_path):
    build = _sequential if second == "sequential" else _resnetish
    plan = kp.plan(build(), params=0.5)
    other = _reloaded(tmp_path) if second == "reloaded" else build()
    new = kp.apply_plan(other, plan)
    assert new.count_params() == plan.params < other.count_params()


def test_ignore_given_as_one_string_is_one_layer_name():
    model = _resnetish()
    plan = kp.plan(model, params=0.9, ignore="b0_conv1")
    assert plan.ignore == ["b0_conv1"]
    assert plan.ignore == kp.plan(model, params=0.9, ignore=["b0_conv1"]).ignore
    new = kp.apply_plan(_resnetish(), plan)
    assert new.get_layer("b0_conv1").filters == model.get_layer("b0_conv1").filters
    assert new.count_params() == plan.params < model.count_params()
    with pytest.raises(kp.errors.ArgumentError, match=r"ignore=\['nope'\]"):
        kp.plan(model, params=0.9, ignore="nope")


def test_a_plan_is_refused_by_a_model_of_the_same_names_but_other_widths():
    # (The battery's case cloned only the stem at 24 filters: that model cannot be built,
    # Keras' Add refuses it before apply_plan is called.)
    plan = kp.plan(_resnetish(), params=0.5)
    with pytest.raises(kp.errors.PlanMismatchError,
                       match=r"'stem' has 24 channels in model 'resnetish' but 16 in the plan"):
        kp.apply_plan(_resnetish(width=24), plan)


def test_ignore_may_name_the_input_layer_of_a_nested_model():
    inner_in = keras.Input((8, 8, 4))
    inner = keras.Model(inner_in, keras.layers.Conv2D(8, 3, padding="same", name="ic")(inner_in),
                        name="inner")
    x = keras.Input((8, 8, 3))
    h = inner(keras.layers.Conv2D(4, 3, padding="same", name="c0")(x))
    h = keras.layers.GlobalAveragePooling2D(name="gap")(h)
    model = keras.Model(x, keras.layers.Dense(5, name="head")(h))
    name = inner_in._keras_history.operation.name
    for ignore in ([name], [f"inner/{name}"]):
        plan = kp.plan(model, params=0.7, ignore=ignore)
        new = kp.apply_plan(model, plan)
        assert new.count_params() == plan.params < model.count_params()
        assert new.get_layer("inner").inputs[0]._keras_history.operation.name == name


def _unnamed_sequential(first=8, order=("conv", "dw")):
    """The tutorial Sequential CNN: no layer named, so Keras numbers them per process."""
    make = {"conv": lambda: keras.layers.Conv2D(first, 3, activation="relu"),
            "dw": lambda: keras.layers.DepthwiseConv2D(3)}
    return keras.Sequential([
        keras.Input((16, 16, 1)),
        *(make[kind]() for kind in order),
        keras.layers.Conv2D(16, 3, activation="relu"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(10),
    ], name="tutorial")


def test_a_plan_of_unnamed_layers_applies_to_another_instance_by_place():
    first, second = _unnamed_sequential(), _unnamed_sequential()
    assert [w.path for w in first.weights] != [w.path for w in second.weights]  # Keras' counter
    plan = kp.plan(first, params=0.5)
    new = kp.apply_plan(second, plan, weights="keep")
    reference = kp.apply_plan(first, plan)
    assert [w.shape for w in new.weights] == [w.shape for w in reference.weights]
    assert new.count_params() == plan.params < second.count_params()
    names = [layer.name for layer in new.layers if not isinstance(layer, keras.layers.InputLayer)]
    assert names == [layer.name for layer in second.layers]
    kept = keras.ops.convert_to_numpy(new.get_layer(names[0]).kernel)  # slices of the second's own
    own = keras.ops.convert_to_numpy(second.layers[0].kernel)
    for c in range(kept.shape[-1]):
        assert any(np.array_equal(kept[..., c], own[..., k]) for k in range(own.shape[-1]))


def test_a_plan_of_unnamed_layers_on_another_architecture_is_refused_by_place():
    plan = kp.plan(_unnamed_sequential(), params=0.5)
    with pytest.raises(kp.PlanMismatchError, match=r"Width variable 'conv2d_\d+' has 12 channels .* "
                                                   r"but 8 in the plan"):
        kp.apply_plan(_unnamed_sequential(first=12), plan)
    with pytest.raises(kp.PlanMismatchError, match=r"not in the same places: name the layers"):
        kp.apply_plan(_unnamed_sequential(order=("dw", "conv")), plan)


def test_a_json_file_of_another_record_is_named_with_what_it_holds(tmp_path):
    path = tmp_path / "lm.json"
    path.write_text('{"model_name": "x", "coefficients": [1.0]}')
    with pytest.raises(ValueError, match=r"file '.*lm\.json' is not a Plan JSON: .*lacks fields .*"
                                         r"it holds the fields \['coefficients', 'model_name'\]"):
        kp.Plan.from_json(str(path))
