"""Keras' GroupQueryAttention pruned by groups (a key-value head with its query heads) or by head
dimensions: exact costs, rebuilds, kept weights.

References: Keras' ``count_params()``, TensorFlow's own MAC count of the traced
graph, the rebuilt layer's config, a ``.keras`` round trip, and for kept
weights the original model's outputs (identity plans) and the original whose
dropped groups' output rows (or dropped dimensions) are zeroed: a query head
reaches the output only through its rows of the output projection.
"""

import keras
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import keras_precrop as kp
from tests.conftest import assert_equals_zeroed_head_dims, assert_matches_plan, tf_macs


def _gqa_model(query_heads=6, kv_heads=3, head_dim=4, width=16, tokens=5, use_gate=False,
               use_bias=True, cross=False, mask=False, causal=False, seed=0):
    """A pre-norm block (LN -> GQA -> add, LN -> MLP -> add), then a classifier head."""
    keras.utils.set_random_seed(seed)
    inputs = [keras.Input((tokens, width), name="tokens")]
    x = keras.layers.Dense(width, name="embed")(inputs[0])
    context = None
    if cross:
        inputs.append(keras.Input((tokens + 2, width + 3), name="context"))
        context = keras.layers.Dense(width, name="context_proj")(inputs[-1])  # the query's width
    kwargs = {"use_causal_mask": causal}
    if mask:
        inputs.append(keras.Input((tokens, tokens + 2 if cross else tokens), name="mask"))
        kwargs["attention_mask"] = inputs[-1]
    h = keras.layers.LayerNormalization(name="ln1")(x)
    h = keras.layers.GroupQueryAttention(
        head_dim, query_heads, kv_heads, use_gate=use_gate, use_bias=use_bias, name="gqa")(
        h, context if cross else h, **kwargs)
    x = keras.layers.Add(name="add1")([x, h])
    h = keras.layers.LayerNormalization(name="ln2")(x)
    h = keras.layers.Dense(2 * width, activation="gelu", name="fc1")(h)
    x = keras.layers.Add(name="add2")([x, keras.layers.Dense(width, name="fc2")(h)])
    return keras.Model(inputs, keras.layers.Dense(5, name="head")(keras.layers.GlobalAveragePooling1D()(x)))


def _np(x):
    return keras.ops.convert_to_numpy(x)


def _batch(model, n=3, seed=1):
    rng = np.random.default_rng(seed)
    out = [(rng.random((n, *t.shape[1:])) > 0.3).astype("float32") if t.name.startswith("mask")
           else rng.normal(size=(n, *t.shape[1:])).astype("float32") for t in model.inputs]
    return out if len(out) > 1 else out[0]


VARIANTS = {
    "self": {},
    "gate": {"use_gate": True},
    "no_bias": {"use_bias": False},
    "cross": {"cross": True},
    "mask": {"mask": True},
    "causal": {"causal": True},
    "one_group": {"query_heads": 4, "kv_heads": 1},
    "as_mha": {"query_heads": 3, "kv_heads": 3},
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_profile_is_exact(variant):
    model = _gqa_model(**VARIANTS[variant])
    profile = kp.profile(model)
    assert profile.total_params == model.count_params()
    if keras.backend.backend() == "tensorflow":
        assert profile.total_macs == tf_macs(model)


@pytest.mark.parametrize("variant", ["self", "gate", "cross", "causal"])
def test_precrop_keeps_the_group_size_and_rebuilds_its_config(variant, tmp_path):
    """Groups go whole: the rebuilt layer's config keeps num_query_heads / num_key_value_heads."""
    model = _gqa_model(**VARIANTS[variant])
    plan = kp.plan(model, params=0.5)
    small = kp.apply_plan(model, plan)
    assert_matches_plan(model, plan, small)
    config = small.get_layer("gqa").get_config()
    groups = next(v["new"] for v in plan.variables if v["kind"] == "heads")
    assert (config["num_key_value_heads"], config["num_query_heads"]) == (groups, 2 * groups)
    assert 1 <= groups < 3 and config["head_dim"] == 4
    small.save(tmp_path / "small.keras")
    x = _batch(model)
    np.testing.assert_allclose(_np(keras.models.load_model(tmp_path / "small.keras")(x)), _np(small(x)),
                               atol=1e-6)


def test_head_dims_keep_every_head_and_narrow_head_dim():
    model = _gqa_model()
    plan = kp.plan(model, params=0.5, attention="head_dims")
    small = kp.apply_plan(model, plan)
    assert_matches_plan(model, plan, small)
    config = small.get_layer("gqa").get_config()
    assert (config["num_query_heads"], config["num_key_value_heads"]) == (6, 3)
    assert 1 <= config["head_dim"] < 4


@pytest.mark.parametrize("attention", ["heads", "head_dims"])
@pytest.mark.parametrize("variant", ["self", "gate", "mask"])
def test_identity_plan_keeps_outputs(variant, attention):
    model = _gqa_model(**VARIANTS[variant])
    same = kp.apply_plan(model, kp.plan(model, params=1.0, attention=attention), weights="keep")
    x = _batch(model)
    np.testing.assert_allclose(_np(same(x)), _np(model(x)), atol=1e-5)


def _attention_only_plan(model, params, attention):
    """A plan under ``params`` where only the attention layer may change (every other layer ignored)."""
    others = [layer.name for layer in model.layers
              if layer.name != "gqa" and not isinstance(layer, keras.layers.InputLayer)]
    return kp.plan(model, params=params, ignore=others, attention=attention)


def _kept(original, pruned, count, axis):
    """The indices along ``axis`` of the original's key kernel that the pruned one kept, in order."""
    old, new = _np(original._key_dense.kernel), _np(pruned._key_dense.kernel)
    return [i for j in range(count) for i in range(old.shape[axis])
            if np.allclose(np.take(old, i, axis), np.take(new, j, axis))]


@pytest.mark.parametrize("importance", ["l1", "activation"])
@pytest.mark.parametrize("variant", ["self", "gate", "cross"])
def test_dropping_groups_equals_zeroing_their_query_heads_output_rows(variant, importance):
    """A dropped group's query heads read its dropped key-value head: the rebuilt model is the
    original with those query heads' rows of the output projection zeroed."""
    model = _gqa_model(**VARIANTS[variant])
    x = _batch(model)
    data = [(x, np.zeros(3, "int32"))] if importance == "activation" else None
    small = kp.apply_plan(model, _attention_only_plan(model, 0.85, "heads"), weights="keep",
                          importance=importance, data=data)
    gqa, pruned = model.get_layer("gqa"), small.get_layer("gqa")
    assert 1 <= pruned.num_key_value_heads < 3 and pruned.num_query_heads == 2 * pruned.num_key_value_heads
    kept = _kept(gqa, pruned, pruned.num_key_value_heads, axis=1)
    assert len(kept) == pruned.num_key_value_heads
    reference = keras.models.clone_model(model)
    reference.set_weights(model.get_weights())
    out_kernel = reference.get_layer("gqa")._output_dense.kernel  # (query heads, head_dim, width)
    rows = _np(out_kernel)
    rows[[q for q in range(6) if q // 2 not in kept]] = 0
    out_kernel.assign(rows)
    np.testing.assert_allclose(_np(small(x)), _np(reference(x)), atol=1e-5)


def test_dropping_dimensions_equals_zeroing_them():
    """The rebuilt model equals the original whose dropped head dimensions read and write zeros
    (its queries rescaled: the layer scales them by 1/sqrt(head_dim))."""
    model = _gqa_model()
    small = kp.apply_plan(model, _attention_only_plan(model, 0.8, "head_dims"), weights="keep")
    pruned = small.get_layer("gqa")
    assert 1 <= pruned.head_dim < 4 and pruned.num_query_heads == 6
    kept = _kept(model.get_layer("gqa"), pruned, pruned.head_dim, axis=2)
    assert len(kept) == pruned.head_dim
    assert_equals_zeroed_head_dims(model, small, "gqa", [i for i in range(4) if i not in kept], _batch(model))


@pytest.mark.parametrize("attention", ["heads", "head_dims"])
def test_gradual_pruning_rebuilds_what_it_masked(attention):
    """GradualPruning masks whole groups (or dimensions) while it trains; the model it finalizes
    computes what the masked one did at the end of the fit (with the norms of the cut stream it
    lends them during the fit: tests/test_gradual_norms.py)."""
    if keras.backend.backend() == "jax":
        pytest.skip("a cut norm under JAX's jit is refused (tests/test_gradual_norms.py)")
    model = _gqa_model()
    plan = kp.plan(model, params=0.6, attention=attention)
    assert next(v for v in plan.variables if v["name"] == "embed")["new"] < 16  # the stream is cut
    x, y = _batch(model, n=16), np.random.default_rng(0).integers(0, 5, 16)
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    outputs = []
    at_end = keras.callbacks.LambdaCallback(on_train_end=lambda logs: outputs.append(_np(model(x))))
    pruning = kp.GradualPruning(plan, end_step=2, frequency=1, verbose=0)
    model.fit(x, y, epochs=3, batch_size=8, callbacks=[at_end, pruning], verbose=0)
    masked = outputs[0]
    small = pruning.finalize()
    assert_matches_plan(model, plan, small)
    np.testing.assert_allclose(_np(small(x)), masked, atol=1e-4)


@settings(max_examples=10, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(kv_heads=st.integers(1, 3), group=st.integers(1, 3), head_dim=st.integers(1, 5),
       cross=st.booleans(), gate=st.booleans(), attention=st.sampled_from(["heads", "head_dims"]),
       budget=st.floats(0.2, 1.0))
def test_random_gqa_models_prune_exactly(kv_heads, group, head_dim, cross, gate, attention, budget):
    """Random grouped-query layers x budgets: the rebuilt model (kept weights) is the plan and keeps
    the group size, or a library error names the budget."""
    model = _gqa_model(kv_heads * group, kv_heads, head_dim, width=12, tokens=4, cross=cross,
                       use_gate=gate)
    try:
        plan = kp.plan(model, params=budget, attention=attention)
    except kp.InfeasibleBudgetError as err:
        assert "params" in str(err)
        return
    small = kp.apply_plan(model, plan, weights="keep")
    assert_matches_plan(model, plan, small)
    layer = small.get_layer("gqa")
    assert layer.num_query_heads == group * layer.num_key_value_heads


@pytest.mark.parametrize("attention", ["heads", "head_dims"])
def test_an_ignored_group_query_attention_keeps_its_groups_and_weights(attention):
    """``ignore=["gqa"]`` keeps its key-value groups and head size (they were once cut)."""
    model = _gqa_model()
    small = kp.precrop(model, params=0.7, weights="keep", ignore=["gqa"], attention=attention)
    kept = small.get_layer("gqa")
    assert (kept.num_query_heads, kept.num_key_value_heads, kept.head_dim) == (6, 3, 4)
    assert small.count_params() < model.count_params()
    for ours, theirs in zip(kept.weights, model.get_layer("gqa").weights, strict=True):
        np.testing.assert_array_equal(_np(ours), _np(theirs))
