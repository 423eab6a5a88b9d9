"""MultiHeadAttention pruned by whole heads (issue 61): exact costs, rebuilds, kept weights.

References: Keras' ``count_params()``, TensorFlow's own MAC count of the traced
graph (its ``Einsum`` ops included), the rebuilt layer's config, a
``.keras`` round trip, and for kept weights the original model's outputs
(an identity plan) and the original with the dropped heads' output rows
zeroed (a head contributes to the output only through those rows).
"""

import keras
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import keras_precrop as kp
from tests.conftest import assert_matches_plan, tf_macs

_SETTINGS = dict(deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))


def _attention_model(heads=4, key_dim=6, value_dim=None, width=24, tokens=9, cross=False,
                     separate_key=False, output_shape=None, use_gate=False, use_bias=True,
                     mask=False, blocks=1, seed=0):
    """A pre-norm transformer: ``blocks`` x (LN -> MHA -> add, LN -> MLP -> add), then a head."""
    keras.utils.set_random_seed(seed)
    inputs = [keras.Input((tokens, width), name="tokens")]
    x = keras.layers.Dense(width, name="embed")(inputs[0])
    context = key = None
    if cross:
        inputs.append(keras.Input((tokens + 3, width + 4), name="context"))
        context = keras.layers.Dense(width + 2, name="context_proj")(inputs[-1])
        if separate_key:
            key = keras.layers.Dense(width - 2, name="key_proj")(inputs[-1])
    kwargs = {}
    if mask:
        inputs.append(keras.Input((tokens, tokens + 3 if cross else tokens), name="mask"))
        kwargs["attention_mask"] = inputs[-1]
    for b in range(blocks):
        h = keras.layers.LayerNormalization(name=f"b{b}_ln1")(x)
        mha = keras.layers.MultiHeadAttention(
            heads, key_dim, value_dim=value_dim, output_shape=output_shape, use_gate=use_gate,
            use_bias=use_bias, name=f"b{b}_mha")
        h = mha(h, context if cross else h, key=key, **kwargs)
        if output_shape is not None:
            h = keras.layers.Dense(width, name=f"b{b}_back")(h)
        x = keras.layers.Add(name=f"b{b}_add1")([x, h])
        h = keras.layers.LayerNormalization(name=f"b{b}_ln2")(x)
        h = keras.layers.Dense(2 * width, activation="gelu", name=f"b{b}_fc1")(h)
        x = keras.layers.Add(name=f"b{b}_add2")([x, keras.layers.Dense(width, name=f"b{b}_fc2")(h)])
    pooled = keras.layers.GlobalAveragePooling1D()(x)
    return keras.Model(inputs, keras.layers.Dense(5, name="head")(pooled))


def _np(outputs):
    """A model's outputs as numpy (torch's carry gradients)."""
    return keras.ops.convert_to_numpy(outputs)


def _batch(model, n=3, seed=1):
    rng = np.random.default_rng(seed)
    out = []
    for t in model.inputs:
        shape = (n, *t.shape[1:])
        out.append((rng.random(shape) > 0.3).astype("float32") if t.name.startswith("mask")
                   else rng.normal(size=shape).astype("float32"))
    return out if len(out) > 1 else out[0]


VARIANTS = {
    "self": {},
    "value_dim": {"value_dim": 4},
    "cross": {"cross": True},
    "cross_key": {"cross": True, "separate_key": True},
    "output_shape": {"output_shape": 20},
    "gate": {"use_gate": True},
    "no_bias": {"use_bias": False},
    "mask": {"mask": True},
    "two_blocks": {"blocks": 2},
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_profile_is_exact(variant):
    _runs_here(variant)
    _assert_exact(_attention_model(**VARIANTS[variant]))


def _assert_exact(model):
    """Profile == Keras' parameter count, and TensorFlow's MAC count on TensorFlow."""
    prof = kp.profile(model)
    assert prof.total_params == model.count_params()
    if keras.backend.backend() == "tensorflow":
        assert prof.total_macs == tf_macs(model)


def _runs_here(variant):
    """Keras 3.15's own MultiHeadAttention cannot run value_dim != key_dim on JAX (its dot-product
    attention reshapes the values by key_dim): such a model fails before any pruning."""
    if variant == "value_dim" and keras.backend.backend() == "jax":
        pytest.skip("Keras' MultiHeadAttention with value_dim != key_dim fails on JAX")


@pytest.mark.parametrize("variant", VARIANTS)
def test_precrop_rebuilds_with_fewer_heads(variant, tmp_path):
    _runs_here(variant)
    model = _attention_model(**VARIANTS[variant])
    plan = kp.plan(model, params=0.5)
    small = kp.apply_plan(model, plan)
    assert_matches_plan(model, plan, small)
    heads = {v["name"]: v["new"] for v in plan.variables if v["kind"] == "heads"}
    assert heads and all(1 <= n <= 4 for n in heads.values())
    for name, n in heads.items():
        assert small.get_layer(name).num_heads == n == small.get_layer(name).get_config()["num_heads"]
    path = tmp_path / "small.keras"
    small.save(path)
    again = keras.models.load_model(path)
    x = _batch(model)
    np.testing.assert_allclose(_np(again(x)), _np(small(x)), atol=1e-6)


@pytest.mark.parametrize("variant", VARIANTS)
def test_identity_plan_keeps_outputs(variant):
    _runs_here(variant)
    model = _attention_model(**VARIANTS[variant])
    same = kp.apply_plan(model, kp.plan(model, params=1.0), weights="keep")
    x = _batch(model)
    np.testing.assert_allclose(_np(same(x)), _np(model(x)), atol=1e-5)


def _heads_only_plan(model, params):
    """A plan under ``params`` where only attention heads may change (every other layer ignored)."""
    others = [layer.name for layer in model.layers if "mha" not in layer.name
              and not isinstance(layer, keras.layers.InputLayer)]
    return kp.plan(model, params=params, ignore=others)


@pytest.mark.parametrize("variant", ["self", "cross_key", "gate", "output_shape"])
def test_dropping_heads_equals_zeroing_their_output_rows(variant):
    """Against an independent reference: the original with the dropped heads' rows zeroed."""
    model = _attention_model(**VARIANTS[variant])
    small = kp.apply_plan(model, _heads_only_plan(model, 0.8), weights="keep")
    mha, pruned = model.get_layer("b0_mha"), small.get_layer("b0_mha")
    assert 1 <= pruned.num_heads < 4
    kept = [h for h in range(4) if any(np.allclose(_np(mha._query_dense.kernel)[:, h],
                                                   _np(pruned._query_dense.kernel)[:, j])
                                       for j in range(pruned.num_heads))]
    assert len(kept) == pruned.num_heads
    reference = keras.models.clone_model(model)
    reference.set_weights(model.get_weights())
    out_kernel = reference.get_layer("b0_mha")._output_dense.kernel
    rows = _np(out_kernel)
    rows[[h for h in range(4) if h not in kept]] = 0
    out_kernel.assign(rows)
    x = _batch(model)
    np.testing.assert_allclose(_np(small(x)), _np(reference(x)), atol=1e-5)


def test_heads_are_not_rounded_to_channel_multiples():
    model = _attention_model(heads=3, key_dim=8, width=32)
    plan = kp.plan(model, params=0.6, round_to=8, min_channels=8)
    heads = [v for v in plan.variables if v["kind"] == "heads"]
    assert heads and all(1 <= v["new"] <= 3 for v in heads)
    assert all(v["new"] % 8 == 0 for v in plan.variables if v["kind"] == "channels" and not v["fixed"])
    assert_matches_plan(model, plan, kp.apply_plan(model, plan))


def test_attention_over_two_axes_is_exact():
    keras.utils.set_random_seed(0)
    x = keras.Input((4, 5, 16))
    h = keras.layers.Conv2D(16, 1, name="proj")(x)
    for axes, name in (((1, 2), "both"), ((2,), "rows")):
        h = keras.layers.Add()([h, keras.layers.MultiHeadAttention(
            2, 4, attention_axes=axes, name=name)(h, h)])
    model = keras.Model(x, keras.layers.Dense(3)(keras.layers.GlobalAveragePooling2D()(h)))
    _assert_exact(model)
    plan = kp.plan(model, params=0.5)
    assert_matches_plan(model, plan, kp.apply_plan(model, plan))


class _Block(keras.layers.Layer):
    """A user's transformer block, traced through (its attention and dense layers walked)."""

    def __init__(self, width, **kwargs):
        super().__init__(**kwargs)
        self.norm = keras.layers.LayerNormalization()
        self.attention = keras.layers.MultiHeadAttention(4, width // 4)
        self.fc = keras.layers.Dense(width)

    def call(self, x):
        h = self.norm(x)
        x = x + self.attention(h, h)
        return x + self.fc(x)


def test_attention_inside_a_composite_layer():
    keras.utils.set_random_seed(0)
    x = keras.Input((6, 16))
    h = _Block(16, name="block")(keras.layers.Dense(16)(x))
    model = keras.Model(x, keras.layers.Dense(3)(keras.layers.GlobalAveragePooling1D()(h)))
    _assert_exact(model)
    same = kp.apply_plan(model, kp.plan(model, params=1.0), weights="keep")
    batch = _batch(model)
    np.testing.assert_allclose(_np(same(batch)), _np(model(batch)), atol=1e-5)


@settings(max_examples=10, **_SETTINGS)
@given(heads=st.integers(1, 5), key_dim=st.integers(1, 6), value_dim=st.sampled_from([None, 3]),
       cross=st.booleans(), gate=st.booleans(), budget=st.floats(0.2, 1.0))
def test_random_attention_models_prune_exactly(heads, key_dim, value_dim, cross, gate, budget):
    """Random attention layers x budgets: the rebuilt model is the plan, or a library error names it."""
    model = _attention_model(heads=heads, key_dim=key_dim, value_dim=value_dim, cross=cross,
                             use_gate=gate, width=12, tokens=5)
    try:
        plan = kp.plan(model, params=budget)
    except kp.InfeasibleBudgetError as err:
        assert "params" in str(err)
        return
    small = kp.apply_plan(model, plan, weights="keep")
    assert_matches_plan(model, plan, small)


def test_the_plan_says_which_norms_lose_channels():
    model = _attention_model(blocks=2)
    plan = kp.plan(model, params=0.5)
    cut = {row["name"] for row in plan.layers if row["class_name"] == "LayerNormalization"
           and row["channels_in"] != row["channels_in_new"]}
    assert cut and set(plan.solver["renormalized"]) == cut
    lines = []
    plan.summary(print_fn=lines.append)
    assert any(line.startswith(f"Note: {len(cut)} layers that normalize across channels")
               for line in lines)
    heads_only = kp.plan(model, params=0.9, ignore=[layer.name for layer in model.layers
                                                   if "mha" not in layer.name])
    assert "renormalized" not in heads_only.solver


def test_a_latency_rows_blocks_round_channels_not_heads():
    """A latency model rounds channel widths up to its block (kernels compute in blocks of
    channels); a head count is whole heads: rounding 3 heads up to 16 would price 16."""
    from keras_precrop.budget.costs import CostRow

    model = _attention_model(width=32, key_dim=8)  # every channel width a multiple of 16
    cm = kp.profile(model).cost
    timed = cm.with_rows([CostRow("latency", cm.coef[:, 1], cm.a, cm.b, cm.layer, block=16)])
    widths = cm.widths.copy()
    heads = [i for i, v in enumerate(cm.variables) if v.kind == "heads"]
    widths[heads] = 3
    params, macs, latency = timed.totals(widths)
    assert latency == pytest.approx(macs) and macs < timed.totals(cm.widths)[1]


def test_a_latency_models_prediction_of_a_model_does_not_round_its_heads():
    """``LatencyModel.predict(model)`` prices the model as the fit did: its heads whole, not
    rounded up to the block (before: 4 heads priced as 16, the original predicted 2.3x its own
    time on the CIFAR ViT; here 1.23x). Reference: the fit's prediction of the original
    (``seconds``)."""
    model = _attention_model(heads=2, width=32, key_dim=16, tokens=17)
    timer = lambda models: {k: 1e-8 * kp.profile(m).total_macs + 1e-4  # noqa: E731
                            for k, m in models.items()}
    lm = kp.latency_model(model, timer=timer, blocks=(16,), variants=6, rounds=1, refine=(),
                          verbose=0)
    assert lm.block == 16
    assert lm.predict(model) == pytest.approx(lm.seconds, rel=1e-9)


@pytest.mark.parametrize("variant", ["self", "gate"])
def test_a_layers_density_is_the_share_of_its_kernel_weights_kept(variant):
    """The plan's density of an attention layer reads like a dense layer's: kept kernel weights
    over the original's, counted on the rebuilt model (not the product of its kernels' densities,
    which shrinks with their number)."""
    model = _attention_model(**VARIANTS[variant])
    small = kp.precrop(model, params=0.4, mode="uniform", attention="head_dims")

    def kernel_weights(m, name):
        return sum(int(np.prod(w.shape)) for w in m.get_layer(name).weights
                   if w.path.endswith("kernel"))

    densities = {layer["name"]: layer["density"] for layer in small.precrop_plan.layers}
    for name in ("b0_mha", "b0_fc1", "embed"):
        kept = kernel_weights(small, name) / kernel_weights(model, name)
        assert densities[name] == pytest.approx(kept, rel=1e-9), name


@pytest.mark.parametrize("attention", ["heads", "head_dims"])
def test_an_ignored_attention_layer_keeps_every_head_and_its_weights(attention):
    """``ignore=`` keeps an attention layer whole: its heads and head size, not only the channels
    it reads and writes (they once shrank while the plan listed the layer as ignored)."""
    model = _attention_model(blocks=2)
    small = kp.precrop(model, params=0.6, weights="keep", ignore=["b0_mha"], attention=attention)
    kept, other = small.get_layer("b0_mha"), small.get_layer("b1_mha")
    assert (kept.num_heads, kept.key_dim) == (4, 6)
    assert (other.num_heads, other.key_dim) != (4, 6)  # the budget still cuts the other one
    for ours, theirs in zip(kept.weights, model.get_layer("b0_mha").weights, strict=True):
        np.testing.assert_array_equal(_np(ours), _np(theirs))
    assert_matches_plan(model, small.precrop_plan, small)


@pytest.mark.parametrize(("attention", "key"), [("heads", "num_heads"), ("head_dims", "key_dim")])
def test_the_plan_summary_says_each_attention_layers_new_head_count_or_size(attention, key):
    """The summary's row of an attention layer says the config value its rebuild gets."""
    model = _attention_model(blocks=2)
    small = kp.precrop(model, params=0.5, attention=attention)
    lines = []
    small.precrop_plan.summary(print_fn=lines.append)
    for name in ("b0_mha", "b1_mha"):
        before, after = (getattr(m.get_layer(name), key) for m in (model, small))
        said = f"({key} {before})" if before == after else f"({key} {before} -> {after})"
        assert any(line.startswith(f"| {name} (MultiHeadAttention)") and said in line
                   for line in lines), (said, lines)
    assert any(f"{key} " in line and "->" in line for line in lines)  # the budget cut some
