"""Every keras.applications constructor: profile, precrop and reconfigure.

Each of the 40 constructors is built at a small input (``weights=None``).
Its profile must equal ``count_params()`` and the MACs of TensorFlow's traced
graph; ``precrop(params=0.5)``, ``precrop(flops=0.5)`` and
``reconfigure(params=0.8, flops=1.0)`` must meet their budgets and give a
model whose Keras/TensorFlow counts and layer widths are the plan's. The
matrix is slow (``pytest -m slow tests/test_applications.py``); the default
suite runs one PreCrop of the smallest constructor.
"""

import keras
import pytest

import keras_precrop as kp
from tests.conftest import assert_budget_use, assert_matches_plan, tf_macs

# Smallest square input each constructor accepts with weights=None (the
# Inception family and Xception need 75 and 71 pixels; the rest 32).
MIN_SIZE = {"InceptionResNetV2": 75, "InceptionV3": 75, "Xception": 71}
CONSTRUCTORS = sorted(n for n in dir(keras.applications) if n[:1].isupper())
TASKS = [("precrop", dict(params=0.5)), ("precrop", dict(flops=0.5)),
         ("reconfigure", dict(params=0.8, flops=1.0))]


def _build(name):
    size = MIN_SIZE.get(name, 32)
    keras.utils.set_random_seed(0)
    return getattr(keras.applications, name)(input_shape=(size, size, 3), weights=None)


def test_all_forty_constructors_are_listed():
    assert len(CONSTRUCTORS) == 40


def _check(name, tasks):
    model = _build(name)
    prof = kp.profile(model)
    assert prof.total_params == model.count_params()
    assert prof.total_macs == tf_macs(model)
    for task, budgets in tasks:
        options = dict(upper=1.0, mode="exact") if task == "precrop" else dict(
            upper=None, mode="layerwise")
        plan = kp.plan(model, **budgets, **options)
        new = kp.apply_plan(model, plan)  # raises if the model disagrees with the plan
        assert_matches_plan(model, plan, new)
        assert_budget_use(plan, model, options["upper"])
        del new
    keras.backend.clear_session()


def test_application_sample():
    """The default suite's sample: the smallest constructor, one PreCrop."""
    _check("MobileNetV3Small", TASKS[:1])


@pytest.mark.slow
@pytest.mark.parametrize("name", CONSTRUCTORS)
def test_application(name):
    _check(name, TASKS)
