"""``kp.GradualPruning``, trust round 2 (issue 60): what it used to do silently wrong, or late.

Each test checks behaviour against an independent reference: the masked model's own outputs,
Keras' ``count_params()``, the plan's numbers, ``kp.apply_plan``'s message or result on the same
model, or a twin run that differs only in the form of its arguments.

* a callback is bound to the model its first fit trains: a second model is refused, naming both
  (it used to go on masking the first and finalize the first), while the same model fits twice;
* ``importance="taylor"`` with a one-shot generator ranks at every update on its batches (it
  used to be used up at the first update);
* ``finalize()`` after a fit that trained no batch says so (it used to fail on formatting None),
  and with ``end_step=0`` it prunes in one shot as ``apply_plan`` would;
* a plan for another input size, a plan that widens, and grouped widths that no group count
  divides are refused when the fit begins, in the words ``apply_plan`` uses, naming what is wrong;
* a model built for any input size takes a plan under a parameter budget;
* NumPy scalars are numbers.
"""

import itertools

import keras
import numpy as np
import pytest

import keras_precrop as kp
from keras_precrop import errors

L = keras.layers


def _net(size=16, name="net", groups=1, seed=0):
    """A small compiled CNN: conv, batch norm, a (grouped) conv, pooled dense head."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((size, size, 3) if size else (None, None, 3))
    x = L.ReLU()(L.BatchNormalization(name="bn1")(L.Conv2D(8, 3, padding="same", name="c1")(inputs)))
    x = L.ReLU()(L.BatchNormalization(name="bn2")(
        L.Conv2D(8, 3, padding="same", groups=groups, name="c2")(x)))
    model = keras.Model(inputs, L.Dense(4, name="fc")(L.GlobalAveragePooling2D()(x)), name=name)
    model.compile(keras.optimizers.SGD(0.01, momentum=0.9),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _data(n=16, size=16, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, size, size, 3)).astype("float32"), rng.integers(0, 4, n)


def _outputs(model, x):
    return keras.ops.convert_to_numpy(model(x, training=False))


def _assert_finalized(pruning, model, plan, x):
    """``finalize()`` gives the plan's model (Keras' count) computing what the masked model does."""
    small = pruning.finalize()
    assert small.count_params() == plan.predicted["params"]
    np.testing.assert_allclose(_outputs(small, x), _outputs(model, x), rtol=1e-5, atol=1e-5)
    return small


# -- 1: one callback, one model ---------------------------------------------------------------


def test_a_callback_is_bound_to_the_model_of_its_first_fit():
    first, second = _net(name="first"), _net(name="second", seed=1)
    x, y = _data()
    plan = kp.plan(first, params=0.5)
    pruning = kp.GradualPruning(plan, end_step=2, frequency=1, verbose=0)
    first.fit(x, y, batch_size=8, epochs=1, callbacks=[pruning], verbose=0)
    masked = _outputs(first, x[:4])
    untouched = [keras.ops.convert_to_numpy(w) for w in second.weights]
    with pytest.raises(kp.ArgumentError, match=r"prunes model 'first'.*cannot prune model 'second'"
                                               r".*new callback"):
        second.fit(x, y, batch_size=8, epochs=1, callbacks=[pruning], verbose=0)
    for w, before in zip(second.weights, untouched):  # refused before any step
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(w), before)
    np.testing.assert_array_equal(_outputs(first, x[:4]), masked)  # nor was the first touched
    _assert_finalized(pruning, first, plan, x[:4])


def test_the_same_model_fits_twice_with_one_callback():
    model = _net()
    x, y = _data()
    plan = kp.plan(model, params=0.5)
    pruning = kp.GradualPruning(plan, end_step=3, frequency=1, verbose=0)
    model.fit(x[:8], y[:8], batch_size=4, epochs=1, callbacks=[pruning], verbose=0)  # steps 1-2
    model.fit(x[:8], y[:8], batch_size=4, epochs=1, callbacks=[pruning], verbose=0)  # steps 3-4
    _assert_finalized(pruning, model, plan, x[:4])


# -- 2: a one-shot generator of Taylor data -----------------------------------------------------


def _taylor_run(data_of):
    """A fit ranked by Taylor at every step on ``data_of(batches)``; the model and its result."""
    model = _net(seed=3)
    x, y = _data(seed=3)
    batches = [(x[i:i + 4], y[i:i + 4]) for i in range(0, 8, 4)]
    plan = kp.plan(model, params=0.5)
    pruning = kp.GradualPruning(plan, end_step=4, frequency=1, importance="taylor",
                                data=data_of(batches), verbose=0)
    model.fit(x, y, batch_size=4, epochs=1, shuffle=False, callbacks=[pruning], verbose=0)
    return _assert_finalized(pruning, model, plan, x[:4]), x[:4]


def test_taylor_ranks_on_a_generators_batches_at_every_update():
    """Four updates on the batches a generator yields once: the same model as the same batches
    given as a list, which is read anew at each update."""
    from_generator, x = _taylor_run(lambda batches: (b for b in batches))
    from_list, _ = _taylor_run(list)
    np.testing.assert_allclose(_outputs(from_generator, x), _outputs(from_list, x), atol=1e-6)


def test_a_generator_of_more_taylor_batches_than_are_kept_is_refused():
    """A generator's batches are kept for every update, at most 32 (an endless one never stops)."""
    model = _net()
    x, y = _data()
    many = itertools.islice(itertools.repeat((x[:4], y[:4])), 33)
    pruning = kp.GradualPruning(kp.plan(model, params=0.5), end_step=2, frequency=1,
                                importance="taylor", data=many, verbose=0)
    with pytest.raises(errors.DataError, match=r"data= is a generator.*more than 32.*islice"):
        model.fit(x, y, batch_size=8, epochs=1, callbacks=[pruning], verbose=0)


# -- 3: finalize after a fit that trained no batch ---------------------------------------------


def test_finalize_after_a_fit_of_no_batch_says_no_batch_trained():
    model = _net()
    x, y = _data()
    pruning = kp.GradualPruning(kp.plan(model, params=0.5), end_step=3, frequency=1, verbose=0)
    model.fit(x, y, batch_size=4, epochs=0, callbacks=[pruning], verbose=0)
    with pytest.raises(kp.ArgumentError, match=r"not started: no batch has trained \(the optimizer "
                                               r"is at step 0\); fit the model past end_step=3"):
        pruning.finalize()
    fresh = kp.GradualPruning(kp.plan(model, params=0.5), end_step=3, verbose=0)
    with pytest.raises(kp.ArgumentError, match="no fit has begun"):
        fresh.finalize()


def test_finalize_at_end_step_0_without_a_batch_prunes_as_apply_plan_does():
    """``end_step=0``: the plan is reached at step 0, before any batch; a fit of no batch then
    finalizes the one-shot pruned model, channels ranked as ``apply_plan(weights="keep")`` ranks."""
    model, twin = _net(), _net()
    x, y = _data()
    plan = kp.plan(model, params=0.5)
    reference = kp.apply_plan(twin, plan, weights="keep", importance="l1")
    pruning = kp.GradualPruning(plan, end_step=0, verbose=0)
    model.fit(x, y, batch_size=4, epochs=0, callbacks=[pruning], verbose=0)
    small = _assert_finalized(pruning, model, plan, x[:4])
    np.testing.assert_allclose(_outputs(small, x[:4]), _outputs(reference, x[:4]), atol=1e-5)


# -- 4, 5, 6: plans refused when the fit begins -------------------------------------------------


def _refused_at_fit_begin(model, plan, error, x, y):
    """The error a fit with ``plan`` raises; no step trained (the weights are as they were)."""
    before = [keras.ops.convert_to_numpy(w) for w in model.weights]
    pruning = kp.GradualPruning(plan, end_step=2, frequency=1, verbose=0)
    with pytest.raises(error) as refused:
        model.fit(x, y, batch_size=4, epochs=1, callbacks=[pruning], verbose=0)
    for w, value in zip(model.weights, before):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(w), value)
    assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == 0
    return str(refused.value)


def test_a_plan_for_another_input_size_is_refused_when_the_fit_begins():
    plan = kp.plan(_net(16), params=0.5)
    model = _net(32, name="net32")
    x, y = _data(8, size=32)
    message = _refused_at_fit_begin(model, plan, kp.PlanMismatchError, x, y)
    with pytest.raises(kp.PlanMismatchError) as by_apply_plan:
        kp.apply_plan(model, plan)
    assert message == str(by_apply_plan.value)
    assert "(16, 16, 3)" in message and "(32, 32, 3)" in message


def test_a_widening_plan_is_refused_naming_what_grows_and_where_to_widen():
    model = _net()
    x, y = _data(8)
    plan = kp.reconfigure(model, params=1.5).precrop_plan
    grown = {v["name"]: (v["width"], v["new"]) for v in plan.variables if v["new"] > v["width"]}
    assert grown  # the reference: the plan's own widths
    message = _refused_at_fit_begin(model, plan, kp.ArgumentError, x, y)
    assert "only removes channels" in message and "kp.apply_plan" in message
    assert "ignore" not in message
    for name, (width, new) in grown.items():
        assert f"{name!r} ({width} -> {new} channels)" in message


def _plan_with(plan, name, width):
    """``plan`` with variable ``name`` planned at ``width`` (a hand-edited plan)."""
    variables = [{**v, "new": width} if v["name"] == name else v for v in plan.variables]
    return kp.Plan.from_dict({**plan.to_dict(), "variables": variables})


def test_grouped_widths_no_group_count_divides_are_refused_naming_the_layer():
    model = _net(groups=2)
    x, y = _data(8)
    plan = kp.plan(model, params=0.5)
    assert all(v["new"] % 2 == 0 for v in plan.variables if v["name"] == "c1")
    odd = _plan_with(plan, "c1", 3)  # c2 (groups=2) reads c1's channels
    expected = r"'c1' 3 channels, but layer 'c2' \(Conv2D, groups=2\).*multiple of 2"
    with pytest.raises(kp.PlanMismatchError, match=expected):
        kp.apply_plan(model, odd)
    message = _refused_at_fit_begin(model, odd, kp.PlanMismatchError, x, y)
    assert "groups=2" in message and "'c2'" in message


# -- 7: an open input size under a parameter budget ---------------------------------------------


def test_a_model_of_any_input_size_prunes_to_a_parameter_plan():
    model = _net(size=None, name="open")
    x, y = _data(16)
    nodes = {layer.name: len(layer._inbound_nodes) for layer in model.layers}
    plan = kp.plan(model, params=0.5)
    pruning = kp.GradualPruning(plan, end_step=2, frequency=1, verbose=0)
    model.fit(x, y, batch_size=4, epochs=1, callbacks=[pruning], verbose=0)
    small = _assert_finalized(pruning, model, plan, x[:4])
    assert tuple(small.inputs[0].shape) == (None, None, None, 3)
    wider = _data(2, size=24, seed=5)[0]  # another size: the same function
    np.testing.assert_allclose(_outputs(small, wider), _outputs(model, wider), rtol=1e-5, atol=1e-5)
    assert {layer.name: len(layer._inbound_nodes) for layer in model.layers} == nodes
    small.compile(keras.optimizers.SGD(0.01, momentum=0.9), "mse")
    pruning.carry_optimizer(small)  # its walk is the returned model's
    assert int(keras.ops.convert_to_numpy(small.optimizer.iterations)) == 4


# -- 8: NumPy scalars ---------------------------------------------------------------------------


def test_numpy_scalars_are_numbers_as_in_keras():
    model = _net()
    plan = kp.plan(model, params=0.5)
    pruning = kp.GradualPruning(plan, end_step=np.int64(4), start_step=np.int32(0),
                                frequency=np.int64(2), shrink=np.float32(0.01), regrow=np.bool_(False))
    assert (pruning.end_step, pruning.frequency, pruning.regrow) == (4, 2, False)
    assert pruning.shrink == pytest.approx(0.01)
    for bad in ({"shrink": True}, {"end_step": np.float64(4.0)}):
        with pytest.raises(errors.ArgumentError, match=f"{next(iter(bad))}="):
            kp.GradualPruning(plan, **{"end_step": 4, **bad})
