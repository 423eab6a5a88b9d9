"""A width kept whole stays whole, and a refused budget's stated minimum is the smallest plan.

The integer grid clips each residual writer and view to its stream. A bound between two fixed
widths (a kept-whole add onto a piece of an unequal split, where the walk lets it stand between
different units of channels) once narrowed the add's writer: ``_two_rounds`` at ``params=0.95``
planned 2,701 params with the conv "block" at 8 of its 16 channels although "add", kept whole,
adds it to a 16-channel piece, while ``params=0.9`` was refused by the width program ("params_budget
= 3474 is infeasible ...", naming no argument of the user's) at its true minimum, 3,531. Likewise
a stream the grid narrowed below a kept-whole writer clipped the writer. References:
``count_params()`` of ``kp.apply_plan``'s model, the layers' own ``filters``, the profile's fixed
widths, and a plan at the stated minimum.
"""

import keras
import numpy as np
import pytest

import keras_precrop as kp
from keras_precrop.errors import InfeasibleBudgetError
from tests.conftest import mixed_cnn
from tests.test_auto_ignore import _two_rounds

L = keras.layers


def _kept_whole_writer():
    """A residual add whose writer "w" is kept whole (``ignore=["w"]``) onto a prunable stream."""
    keras.utils.set_random_seed(0)
    x = keras.Input((8, 8, 3))
    h = L.Conv2D(16, 3, padding="same", name="stem")(x)
    y = L.Conv2D(16, 3, padding="same", name="w")(L.Conv2D(8, 3, padding="same", name="mid")(h))
    h = L.Conv2D(16, 3, padding="same", name="c2")(L.Add(name="add")([h, y]))
    return keras.Model(x, L.Dense(3, name="head")(L.GlobalAveragePooling2D()(h)))


def _fixed_widths(model, ignore):
    """``{variable name: width}`` of the widths the walk fixes: no plan may change them."""
    return {v.name: v.width for v in kp.profile(model, ignore=ignore).variables if v.fixed}


def _check_plan(model, ignore, plan, fixed):
    """The plan meets its budget, keeps every fixed width, and is the model it says it is."""
    assert plan.params <= plan.budgets["params"]
    assert {name: plan.widths[name] for name in fixed} == fixed
    assert kp.apply_plan(model, plan).count_params() == plan.params


def _smallest(model, ignore, ratio):
    """The refusal of ``params=ratio`` (names it), and its stated minimum checked as reachable."""
    with pytest.raises(InfeasibleBudgetError) as err:
        kp.plan(model, params=ratio, ignore=ignore)
    assert err.value.arguments["params"] == ratio and f"params={ratio}" in str(err.value)
    smallest = err.value.limit["params"]
    least = kp.plan(model, max_params=int(smallest), ignore=ignore)  # reachable: the minimum
    _check_plan(model, ignore, least, _fixed_widths(model, ignore))
    assert least.params == smallest
    with pytest.raises(InfeasibleBudgetError):  # and nothing below it
        kp.plan(model, max_params=int(smallest) - 1, ignore=ignore)
    return smallest


def test_a_kept_whole_add_keeps_its_writer_and_a_refusal_names_params():
    model = _two_rounds()
    plan = kp.plan(model, params=0.95, ignore="auto")
    assert plan.ignore == ["scale", "add"]
    assert plan.widths["block"] == 16  # before: 8, into a kept-whole add of a 16-channel piece
    new = kp.apply_plan(model, plan)
    assert new.count_params() == plan.params <= plan.budgets["params"]
    assert new.get_layer("block").filters == 16
    assert [t.shape[-1] for t in new.get_layer("add").input] == [16, 16]
    x = np.random.default_rng(0).normal(size=(2, 12, 12, 3)).astype("float32")
    assert new(x).shape == (2, 5)
    # "after" (and the head's input) is all that is prunable: the smallest plan has it at 1.
    assert _smallest(model, "auto", 0.9) == model.count_params() - 16 * 15 - 15 - 15 * 5


@pytest.mark.parametrize("build,ignore", [
    (_two_rounds, "auto"),
    (mixed_cnn, ()),
    (_kept_whole_writer, ["w"]),
])
def test_every_budget_is_met_or_refused_at_the_true_minimum(build, ignore):
    model = build()
    fixed = _fixed_widths(model, ignore)
    smallest = _smallest(model, ignore, 0.01)
    total = model.count_params()
    for budget in np.linspace(smallest, total, 6)[:-1] + 3:
        _check_plan(model, ignore, kp.plan(model, max_params=int(budget), ignore=ignore), fixed)


def test_gradual_pruning_never_narrows_a_width_kept_whole():
    """``GradualPruning``'s intermediate widths clip writers to their stream, but not a fixed one
    (a layer kept whole, here "block", whose walk bound names the fixed 2-unit piece of the split
    it is added to) and not below it."""
    from keras_precrop.gradual import widths_at

    model = _two_rounds()
    prof = kp.profile(model, ignore="auto")
    graph = prof.graph
    plan = kp.plan(model, params=0.95, ignore="auto")
    targets = [plan.widths[v.name] for v in graph.variables]
    for fraction in (0.0, 0.3, 0.7, 1.0):
        widths = widths_at(graph.variables, targets, fraction)
        for v, w in zip(graph.variables, widths):
            if v.fixed:
                assert w == v.width, (fraction, v.name)
            if v.bound is not None and not graph.variables[v.bound].fixed:
                assert w <= widths[v.bound], (fraction, v.name)
