"""MultiHeadAttention pruned by each head's dimension (``attention="head_dims"``, issue 61).

Every head stays; ``key_dim`` and ``value_dim`` shrink together, the same
indices in every head. References: Keras' ``count_params()``, TensorFlow's
MAC count, the rebuilt layer's config and a ``.keras`` round trip, the
original's outputs (identity plan), and the original with the dropped
dimensions' query, key and value columns zeroed (kept weights: the rebuilt
layer rescales its queries so its ``1/sqrt(key_dim)`` scores equal the
original's), and a masked ``GradualPruning`` model against its rebuild.
"""

import keras
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import keras_precrop as kp
from tests.conftest import assert_equals_zeroed_head_dims, assert_matches_plan, tf_macs
from tests.test_attention import VARIANTS, _attention_model, _batch, _np

_SETTINGS = dict(deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
_SAME_DIMS = [v for v in VARIANTS if v != "value_dim"]


def _dims(plan):
    """``{attention layer: new per-head dimension}`` of a plan."""
    return {v["name"]: v["new"] for v in plan.variables if v["kind"] == "head_dims"}


@pytest.mark.parametrize("variant", _SAME_DIMS)
def test_precrop_keeps_the_heads_and_narrows_them(variant, tmp_path):
    model = _attention_model(**VARIANTS[variant])
    prof = kp.profile(model, attention="head_dims")
    assert prof.total_params == model.count_params()
    plan = kp.plan(model, params=0.5, attention="head_dims")
    assert plan.attention == "head_dims"
    small = kp.apply_plan(model, plan)
    assert_matches_plan(model, plan, small)
    if keras.backend.backend() == "tensorflow":
        assert tf_macs(small) == plan.macs
    dims = _dims(plan)
    assert dims and all(1 <= d <= 6 for d in dims.values()) and min(dims.values()) < 6
    for name, d in dims.items():
        layer = small.get_layer(name)
        assert layer.num_heads == 4 and layer.key_dim == d == layer.get_config()["value_dim"]
    path = tmp_path / "small.keras"
    small.save(path)
    x = _batch(model)
    np.testing.assert_allclose(_np(keras.models.load_model(path)(x)), _np(small(x)), atol=1e-6)


@pytest.mark.parametrize("variant", ["self", "cross_key", "gate", "mask"])
def test_identity_plan_keeps_outputs(variant):
    model = _attention_model(**VARIANTS[variant])
    same = kp.apply_plan(model, kp.plan(model, params=1.0, attention="head_dims"), weights="keep")
    x = _batch(model)
    np.testing.assert_allclose(_np(same(x)), _np(model(x)), atol=1e-5)


def _dims_only_plan(model, params):
    """A plan under ``params`` where only the attention layers' head dimensions may change."""
    others = [layer.name for layer in model.layers if "mha" not in layer.name
              and not isinstance(layer, keras.layers.InputLayer)]
    return kp.plan(model, params=params, ignore=others, attention="head_dims")


@pytest.mark.parametrize("variant", ["self", "cross_key", "gate", "no_bias"])
def test_dropping_dimensions_equals_zeroing_them(variant):
    """The rebuilt model equals the original whose dropped dimensions read and write zeros."""
    model = _attention_model(**VARIANTS[variant])
    plan = _dims_only_plan(model, 0.8)
    small = kp.apply_plan(model, plan, weights="keep")
    mha, pruned = model.get_layer("b0_mha"), small.get_layer("b0_mha")
    assert pruned.num_heads == 4 and 1 <= pruned.key_dim < 6
    value = _np(mha._value_dense.kernel)
    kept = [i for i in range(6) if any(np.allclose(value[:, :, i], _np(pruned._value_dense.kernel)[:, :, j])
                                       for j in range(pruned.key_dim))]
    assert len(kept) == pruned.key_dim
    assert_equals_zeroed_head_dims(model, small, "b0_mha", [i for i in range(6) if i not in kept],
                                   _batch(model))


def test_a_layer_whose_value_dim_differs_is_refused_by_name():
    model = _attention_model(value_dim=4)
    with pytest.raises(kp.UnsupportedLayerError, match="b0_mha.*key_dim=6 and value_dim=4") as err:
        kp.plan(model, params=0.5, attention="head_dims")
    assert err.value.arguments["ignore"] == ["b0_mha"]
    plan = kp.plan(model, params=0.8, attention="head_dims", ignore="auto")  # kept whole instead
    assert plan.ignore == ["b0_mha"] and "b0_mha" in plan.solver["kept_whole"]


def test_a_bad_attention_value_is_refused_naming_it():
    with pytest.raises(kp.ArgumentError, match="attention='dims' must be one of 'heads', 'head_dims'"):
        kp.plan(_attention_model(), params=0.5, attention="dims")


def test_a_plan_remembers_its_attention_in_json(tmp_path):
    model = _attention_model()
    plan = kp.plan(model, params=0.5, attention="head_dims")
    plan.to_json(tmp_path / "plan.json")
    again = kp.Plan.from_json(tmp_path / "plan.json")
    assert again.attention == "head_dims"
    small = kp.apply_plan(model, again)
    assert small.get_layer("b0_mha").key_dim == _dims(plan)["b0_mha"]
    assert "attention=head_dims" in _summary(again)


def _summary(plan):
    lines = []
    plan.summary(print_fn=lines.append)
    return "\n".join(lines)


def test_gradual_pruning_of_head_dimensions_rebuilds_what_it_masked():
    """The masked model (dimensions zeroed, the original's 1/sqrt(key_dim)) computes what the
    rebuilt one (narrower heads, rescaled queries) does."""
    if keras.backend.backend() == "jax":
        pytest.skip("a cut norm under JAX's jit is refused (tests/test_gradual_norms.py)")
    model = _attention_model(blocks=2)
    plan = kp.plan(model, params=0.6, attention="head_dims")
    x, y = _batch(model, n=16), np.random.default_rng(0).integers(0, 5, 16)
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    pruning = kp.GradualPruning(plan, end_step=2, frequency=1)
    model.fit(x, y, epochs=3, batch_size=8, callbacks=[pruning], verbose=0)
    masked = _np(model(x))
    small = pruning.finalize()
    assert_matches_plan(model, plan, small)
    np.testing.assert_allclose(_np(small(x)), masked, atol=1e-4)


def test_gradual_pruning_masks_a_querys_dimensions_as_its_keys():
    """Queries and keys lose the same dimensions, over every input row. (The rescaled query once
    rescaled the flat indices that find the masks too, and masked other elements than the
    rebuild keeps: a share of the kept dimensions' rows, while pruned ones stayed.)"""
    if keras.backend.backend() == "jax":
        pytest.skip("a cut norm under JAX's jit is refused (tests/test_gradual_norms.py)")
    model = _attention_model(heads=2, key_dim=8)
    plan = kp.plan(model, params=0.5, mode="uniform", attention="head_dims")
    x, y = _batch(model, n=8), np.random.default_rng(0).integers(0, 5, 8)
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, epochs=2, batch_size=8, verbose=0,
              callbacks=[kp.GradualPruning(plan, end_step=1, frequency=1)])
    mha = next(layer for layer in model.layers if isinstance(layer, keras.layers.MultiHeadAttention))
    query, key = (_np(dense.kernel) == 0 for dense in (mha._query_dense, mha._key_dense))
    rows = ~(query.all(axis=(1, 2)) & key.all(axis=(1, 2)))  # the stream's kept channels
    query, key = query[rows], key[rows]
    assert 0 < query.all(axis=0).sum() < query.shape[1] * query.shape[2]  # some dimensions cut
    np.testing.assert_array_equal(query.any(axis=0), query.all(axis=0))  # whole columns only
    np.testing.assert_array_equal(query.all(axis=0), key.all(axis=0))


def test_hub_homogeneous_refuses_narrower_heads_naming_attention():
    with pytest.raises(kp.ArgumentError, match="attention='head_dims'.*homogeneous=False"):
        kp.hub.precrop(_tiny_vit(), params=0.5, attention="head_dims")


def _tiny_vit():
    import keras_hub

    backbone = keras_hub.models.ViTBackbone(image_shape=(16, 16, 3), patch_size=4, num_layers=1,
                                            num_heads=2, hidden_dim=8, mlp_dim=16)
    return keras_hub.models.ViTImageClassifier(backbone=backbone, num_classes=3)


@settings(max_examples=8, **_SETTINGS)
@given(heads=st.integers(1, 4), key_dim=st.integers(1, 6), cross=st.booleans(),
       gate=st.booleans(), budget=st.floats(0.2, 1.0))
def test_random_attention_models_prune_head_dims_exactly(heads, key_dim, cross, gate, budget):
    """Random attention layers x budgets: the rebuilt model is the plan, or a library error names it."""
    model = _attention_model(heads=heads, key_dim=key_dim, cross=cross, use_gate=gate,
                             width=12, tokens=5)
    try:
        plan = kp.plan(model, params=budget, attention="head_dims")
    except kp.InfeasibleBudgetError as err:
        assert "params" in str(err)
        return
    small = kp.apply_plan(model, plan, weights="keep")
    assert_matches_plan(model, plan, small)
