"""``ignore="auto"``: what the walk refuses stays whole (said in the plan), the rest is pruned.

Issue 61's goal: no model refused as a whole. ``ignore="auto"`` walks, keeps
whole every layer a refusal offers to keep whole (``ignore=[names]``) and walks
again until none is refused; the plan records the names (``plan.ignore``, so
``apply_plan`` walks the same) and why (``plan.solver["kept_whole"]``, the
refusal's own sentence). References: ``count_params()``, TensorFlow's own MAC
count, the explicit ``ignore=`` the refusals offer, forward passes.
"""

import json
import re

import keras
import numpy as np
import pytest

import keras_precrop as kp
from keras_precrop import cli
from keras_precrop.errors import ArgumentError, ArgumentTypeError, UnsupportedLayerError
from keras_precrop.graph import walker
from tests.conftest import model_fingerprint, tf_macs
from tests.test_keep_weights import assert_same_function, randomize
from tests.test_split import csp

L = keras.layers


class _Scale(keras.layers.Layer):
    """A custom layer the walker does not know: one learned scale per channel."""

    def build(self, input_shape):
        self.scale = self.add_weight(shape=(input_shape[-1],), initializer="ones")

    def call(self, x):
        return x * self.scale


def _refused_model(odd=None):
    """Convolutions and a dense head around ``odd`` (default: a :class:`_Scale` named "odd")."""
    keras.utils.set_random_seed(0)
    x = keras.Input((8, 8, 3), name="img")
    h = L.Conv2D(16, 3, padding="same", name="c0")(x)
    h = (odd or _Scale(name="odd"))(h)
    h = L.Conv2D(16, 3, padding="same", activation="relu", name="c1")(h)
    h = L.Conv2D(16, 3, padding="same", name="c2")(h)
    h = L.Dense(12, name="d0")(L.GlobalAveragePooling2D(name="gap")(h))
    return randomize(keras.Model(x, L.Dense(3, name="head")(h)))


def _lines(plan_or_profile):
    lines = []
    plan_or_profile.summary(print_fn=lines.append)
    return lines


def test_auto_keeps_the_refused_layer_whole_and_prunes_the_rest():
    model = _refused_model()
    model.get_layer("odd").scale.assign(np.linspace(0.5, 2.0, 16).astype("float32"))
    before = model_fingerprint(model)
    with pytest.raises(UnsupportedLayerError):  # without it: refused as a whole
        kp.precrop(model, params=0.5)
    new = kp.precrop(model, params=0.5, ignore="auto", weights="keep")
    plan = new.precrop_plan
    assert new.count_params() == plan.params <= 0.5 * model.count_params()
    assert tf_macs(new) == plan.macs < tf_macs(model)
    assert plan.ignore == ["odd"]
    why = "Layer 'odd' of class _Scale is not supported: the walker does not know how its channels flow."
    assert plan.solver["kept_whole"] == {"odd": why}
    assert f"Kept whole (auto): odd - {why}" in _lines(plan)
    np.testing.assert_array_equal(new.get_layer("odd").get_weights()[0],
                                  model.get_layer("odd").get_weights()[0])  # whole, as it was
    assert model_fingerprint(model) == before  # the user's model is untouched


def test_auto_plans_as_the_explicit_ignore_and_its_plan_file_applies(tmp_path):
    model = _refused_model()
    auto = kp.plan(model, params=0.6, ignore="auto")
    explicit = kp.plan(model, params=0.6, ignore=["odd"])
    assert auto.widths == explicit.widths and auto.ignore == explicit.ignore == ["odd"]
    assert "kept_whole" not in explicit.solver  # named by the user: nothing to explain
    auto.to_json(str(tmp_path / "plan.json"))
    read = kp.Plan.from_json(str(tmp_path / "plan.json"))
    assert read.solver["kept_whole"] == auto.solver["kept_whole"]
    new = kp.apply_plan(_refused_model(), str(tmp_path / "plan.json"))  # another instance
    assert new.count_params() == auto.params
    # The user's names stay, "auto" adds to them.
    both = kp.plan(model, params=0.6, ignore=["c1", "auto"])
    assert both.ignore == ["c1", "odd"] and list(both.solver["kept_whole"]) == ["odd"]


def test_a_latency_budget_fits_its_latency_model_on_the_resolved_walk():
    """The latency model is fitted on the walk "auto" resolved (a stand-in timer: parameters)."""
    model = _refused_model()
    timer = lambda models: {k: 1e-6 * m.count_params() + 1e-4 for k, m in models.items()}  # noqa: E731
    plan = kp.plan(model, latency=0.6, ignore="auto", calibrate=0, latency_model=dict(
        timer=timer, variants=6, rounds=1, refine=(), verbose=0))
    assert plan.ignore == ["odd"] and list(plan.solver["kept_whole"]) == ["odd"]
    assert plan.latency <= plan.budgets["latency"]
    # fitted alone, and under compare: "auto" resolved the same (before: refused; compare
    # read the string as the names "a", "u", "t", "o")
    options = dict(timer=timer, variants=6, rounds=1, refine=(), verbose=0)
    assert kp.latency_model(model, ignore="auto", **options).ignore == ["odd"]
    table = kp.compare(model, latency=0.6, ignore="auto", modes=["uniform"],
                       latency_model=options)  # measured by compare, on the resolved walk
    assert table.rows[0]["mode"] == "uniform"


def test_profile_with_auto_says_what_it_kept_whole():
    model = _refused_model(L.Permute((2, 1, 3), name="odd"))
    prof = kp.profile(model, ignore="auto")
    assert prof.total_params == model.count_params() and prof.total_macs == tf_macs(model)
    assert prof.ignore == ["odd"] and "class Permute is not supported" in prof.kept_whole["odd"]
    assert any(line.startswith("Kept whole (auto): odd - Layer 'odd'") for line in _lines(prof))
    data = json.loads(prof.to_json())
    assert data["ignore"] == ["odd"] and data["kept_whole"] == prof.kept_whole


def _two_rounds():
    """A residual add onto a piece of an unequal split (refused once every layer has walked, see
    tests/test_split.py) before a custom layer the walk refuses first; a convolution after it
    stays prunable."""
    model = csp([8])
    h = _Scale(name="scale")(model.get_layer("transition").output)
    h = L.Conv2D(16, 1, activation="relu", name="after")(h)
    out = model.get_layer("head")(L.GlobalAveragePooling2D(name="pool")(h))
    return keras.Model(model.input, out)


def test_a_refusal_revealed_by_the_first_round_is_kept_whole_in_the_second():
    model = _two_rounds()
    with pytest.raises(UnsupportedLayerError) as first:
        kp.profile(model)
    assert first.value.arguments["ignore"] == ["scale"]
    with pytest.raises(UnsupportedLayerError) as second:  # only once "scale" is kept whole
        kp.profile(model, ignore=["scale"])
    assert second.value.arguments["ignore"] == ["add"]
    new = kp.precrop(model, params=0.95, ignore="auto")
    plan = new.precrop_plan
    assert plan.ignore == ["scale", "add"]
    assert re.match(r"add: bounds .* split \(keras\.ops\.split\) of stem", plan.solver["kept_whole"]["add"])
    assert new.count_params() == plan.params == kp.plan(model, params=0.95, ignore=["scale", "add"]).params
    assert tf_macs(new) == plan.macs


def test_a_refusal_that_keeping_whole_does_not_remedy_is_raised_as_is():
    """A kept-whole layer whose channel axis has no size: the second round's refusal offers no
    ``ignore=``, and "auto" raises it as the walk does."""
    from tests.test_vit_family import _open_model, _OpenChannels

    with pytest.raises(UnsupportedLayerError, match="whose channel \\(last\\) axis has no size") as err:
        kp.profile(_open_model(_OpenChannels(name="open")), ignore="auto")
    assert not err.value.arguments


@pytest.mark.parametrize("ignore,error,shown", [
    ("autox", ArgumentError, "ignore=['autox'] names no layer of model"),
    (3, ArgumentTypeError, "ignore must be a layer name, a list of layer names, or 'auto'"),
    (["odd", 3], ArgumentTypeError, "got ['odd', 3]"),
])
def test_bad_ignore_values_are_refused_naming_ignore(ignore, error, shown):
    model = _refused_model()
    for call in (lambda: kp.plan(model, params=0.5, ignore=ignore),
                 lambda: kp.profile(model, ignore=ignore)):
        with pytest.raises(error) as info:
            call()
        assert info.value.argument == "ignore" and shown in str(info.value)


def test_a_walk_given_auto_says_where_auto_is_resolved():
    with pytest.raises(ArgumentError, match="'auto' is resolved by kp.profile"):
        walker.walk(_refused_model(), ignore="auto")


def test_cli_ignore_auto(tmp_path, capsys, monkeypatch):
    path, plan_path = str(tmp_path / "m.keras"), str(tmp_path / "plan.json")
    _refused_model(L.Permute((2, 1, 3), name="odd")).save(path)
    assert cli.main(["profile", path, "--ignore", "auto"]) == 0
    assert "Kept whole (auto): odd - Layer 'odd' of class Permute" in capsys.readouterr().out
    assert cli.main(["precrop", path, "--params", "0.5", "--ignore", "auto", "--quiet",
                     "--plan", plan_path, "--out", str(tmp_path / "s.keras")]) == 0
    assert "Kept whole (auto): odd" in capsys.readouterr().out
    assert kp.Plan.from_json(plan_path).ignore == ["odd"]
    # With --apply, --ignore auto stands for the names the plan resolved it to.
    assert cli.main(["precrop", path, "--apply", plan_path, "--ignore", "auto",
                     "--out", str(tmp_path / "again.keras")]) == 0
    fitted = {}

    def latency_model(model, ignore, graph, **options):  # records what the command hands down
        fitted.update(ignore=ignore, graph=graph)
        raise SystemExit(0)

    monkeypatch.setattr(kp, "latency_model", latency_model)
    with pytest.raises(SystemExit):
        cli.main(["latency", path, "--ignore", "auto"])
    assert fitted["ignore"] == ["odd"] and [r.path for r in fitted["graph"].layers if r.ignored] == ["odd"]
    assert cli._AUTO == walker.AUTO


# -- keras_hub's vision transformers (tests/test_vit_family.py's tiny configs) ----------------


def test_vitdet_with_auto_profiles_exactly_rebuilds_and_keeps_weights():
    from tests.test_vit_family import _vitdet

    model = randomize(_vitdet())
    prof = kp.profile(model, ignore="auto")
    assert prof.total_params == model.count_params() and prof.total_macs == tf_macs(model)
    assert set(prof.kept_whole) == {
        "windowed_transformer_encoder", "add_positional_embedding",
        "windowed_transformer_encoder_1_multi_head_attention_with_relative_pe"}
    new = kp.precrop(model, params=0.8, ignore="auto")  # what is left prunable: 0.77 at least
    assert new.count_params() == new.precrop_plan.params <= 0.8 * model.count_params()
    assert tf_macs(new) == new.precrop_plan.macs
    x = np.random.default_rng(0).normal(size=(2, 64, 64, 3)).astype("float32")
    same = kp.apply_plan(model, kp.plan(model, params=1.0, ignore="auto"), weights="keep")
    assert_same_function(model, same, x, tol=1e-5)
    pruned = kp.hub.precrop(model, params=0.8, ignore="auto")
    assert pruned.count_params() == pruned.precrop_plan.params == new.precrop_plan.params


def _swin_classifier():
    """Swin under a pooled MLP head: everything of the backbone is kept whole, the head is not."""
    from tests.test_vit_family import _swin

    backbone = _swin()
    x = keras.Input((32, 32, 3), name="images")
    h = L.GlobalAveragePooling1D(name="pool")(backbone(x))  # its output: (tokens, channels)
    h = L.Dense(64, activation="relu", name="mlp")(h)
    return keras.Model(x, L.Dense(10, name="head")(h))


@pytest.mark.slow  # 20 s: Swin's trace
def test_swin_with_auto_counts_params_and_macs_and_prunes_to_a_mac_budget():
    """Swin kept whole but its head: params equal count_params() and MACs TensorFlow's, the
    blocks behind the merging (whose reshape leaves the token count open in the graph) counted
    at the sizes the merging gave when measured (before: unknown, and MAC budgets refused)."""
    model = _swin_classifier()
    prof = kp.profile(model, ignore="auto")
    assert prof.total_params == model.count_params()
    assert len(prof.kept_whole) == 6 and not prof.unknown_macs
    assert prof.total_macs == tf_macs(model)
    plan = kp.plan(model, flops=0.9995, ignore="auto")  # the head is what prunes
    assert plan.macs <= 0.9995 * prof.total_macs and plan.widths["mlp"] < 64
    plan = kp.plan(model, params=0.97, ignore="auto")  # a parameter budget prunes the head
    assert plan.params <= 0.97 * model.count_params() and plan.widths["mlp"] < 64
    # keras_hub 0.32's Swin PatchEmbedding cannot write its config: a checked repair writes it
    # (graph/_hub_repairs.py; tests/test_hub_rebuild.py)
    small = kp.apply_plan(model, plan)
    assert small.count_params() == plan.params and tf_macs(small) == plan.macs


def test_a_vit_task_that_walks_whole_plans_the_same_with_auto():
    """Nothing refused: "auto" keeps nothing whole, and kp.hub's homogeneous plan is the one
    without it (the walk resolved once serves the tie and the plan)."""
    from tests.test_hub_vit import _vit

    task = _vit()
    auto = kp.hub.precrop(task, params=0.5, ignore="auto").precrop_plan
    assert auto.ignore == [] and "kept_whole" not in auto.solver
    assert auto.widths == kp.hub.precrop(task, params=0.5).precrop_plan.widths
