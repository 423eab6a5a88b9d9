"""``keras.layers.Embedding`` creates a text transformer's hidden stream, keras_hub's
``PositionEmbedding`` adds learned positions along it, and ``keras.layers.ReversibleEmbedding``
(keras_hub's language models' token embedding) also projects the stream back onto the
vocabulary: all prune with the stream.

References: ``model.count_params()``, TensorFlow's traced MACs, the original's outputs
(identity plans with kept weights, masks from ``mask_zero`` included), a saved and
reloaded model, and the original table's columns.
"""

import keras
import numpy as np
import pytest

import keras_precrop as kp
from tests.conftest import model_fingerprint, tf_macs

L = keras.layers
_IDS = np.random.default_rng(0).integers(0, 50, size=(3, 12)).astype("int32")
_IDS[:, -3:] = 0  # padding: mask_zero masks it in attention


def _text_model(positions=None, embedding=None):
    """Token ids -> an embedding (with ``mask_zero``) -> one pre-norm transformer block ->
    pooled logits; ``positions``: a layer adding learned positions to the embeddings."""
    ids = keras.Input((12,), dtype="int32", name="ids")
    x = (embedding or L.Embedding(50, 16, mask_zero=True, name="embed"))(ids)
    if positions is not None:
        x = L.Add(name="add_positions")([x, positions(x)])
    h = L.LayerNormalization(name="ln1")(x)
    x = L.Add(name="res1")([x, L.MultiHeadAttention(4, 4, name="mha")(h, h)])
    h = L.Dense(32, activation="gelu", name="mlp_up")(L.LayerNormalization(name="ln2")(x))
    x = L.Add(name="res2")([x, L.Dense(16, name="mlp_down")(h)])
    return keras.Model(ids, L.Dense(3, name="head")(L.GlobalAveragePooling1D(name="pool")(x)))


def _stream_is_pruned(model, small):
    """The embedding's and the block's widths of ``small``, a cut of ``model``, follow one stream."""
    width = small.get_layer("embed").output_dim
    assert width < model.get_layer("embed").output_dim
    assert small.get_layer("head").kernel.shape[0] == width  # the pooled stream
    assert small.get_layer("mlp_down").units <= width  # a writer of a prefix (residual="prefix")
    assert small.count_params() == small.precrop_plan.params <= 0.5 * model.count_params()
    assert tf_macs(small) == small.precrop_plan.macs


def test_an_embedding_is_profiled_exactly_and_prunes_with_the_stream(tmp_path):
    model = _text_model()
    before = model_fingerprint(model)
    profile = kp.profile(model)
    assert profile.total_params == model.count_params()
    assert profile.total_macs == tf_macs(model)
    small = kp.precrop(model, params=0.5, mode="uniform")
    _stream_is_pruned(model, small)
    assert small.get_layer("embed").mask_zero
    path = tmp_path / "small.keras"
    small.save(path)
    np.testing.assert_allclose(keras.models.load_model(path)(_IDS), small(_IDS), atol=1e-6)
    assert model_fingerprint(model) == before


def test_kept_weights_slice_the_table_and_an_identity_plan_computes_the_original():
    model = _text_model()
    same = kp.apply_plan(model, kp.plan(model, params=1.0), weights="keep")
    np.testing.assert_allclose(same(_IDS), model(_IDS), atol=1e-5)
    small = kp.precrop(model, params=0.5, mode="uniform", weights="keep")
    table, kept = model.get_layer("embed").embeddings.numpy(), small.get_layer("embed").embeddings.numpy()
    columns = [int(np.flatnonzero((table == kept[:, [j]]).all(axis=0))[0]) for j in range(kept.shape[1])]
    assert len(set(columns)) == len(columns) < table.shape[1]  # distinct columns of the original
    # (in the order the stream's channels rank: residual="prefix" puts the best first)


def test_keras_hub_position_embedding_prunes_with_the_stream():
    keras_hub = pytest.importorskip("keras_hub")
    model = _text_model(keras_hub.layers.PositionEmbedding(12, name="positions"),
                        L.Embedding(50, 16, name="embed"))  # no mask: the positions would drop it
    assert kp.profile(model).total_params == model.count_params()
    same = kp.apply_plan(model, kp.plan(model, params=1.0), weights="keep")
    np.testing.assert_allclose(same(_IDS), model(_IDS), atol=1e-5)
    small = kp.precrop(model, params=0.5, mode="uniform")
    _stream_is_pruned(model, small)
    assert small.get_layer("positions").position_embeddings.shape == (12, small.get_layer("embed").output_dim)


def _language_model(tie_weights):
    """A tiny language model: one ``ReversibleEmbedding`` looks the tokens up and, called with
    ``reverse=True`` after a block and a final norm, projects the stream back onto the vocabulary."""
    embed = L.ReversibleEmbedding(50, 16, tie_weights=tie_weights, name="embed")
    ids = keras.Input((12,), dtype="int32", name="ids")
    x = embed(ids)
    h = L.LayerNormalization(name="ln1")(x)
    x = L.Add(name="res1")([x, L.MultiHeadAttention(4, 4, name="mha")(h, h)])
    h = L.Dense(32, activation="gelu", name="mlp_up")(L.LayerNormalization(name="ln2")(x))
    x = L.Add(name="res2")([x, L.Dense(16, name="mlp_down")(h)])
    return keras.Model(ids, embed(L.LayerNormalization(name="final_norm")(x), reverse=True))


@pytest.mark.parametrize("tie_weights", [True, False])
def test_a_reversible_embedding_ties_the_input_and_output_embeddings_to_one_width(tie_weights, tmp_path):
    model = _language_model(tie_weights)
    before = model_fingerprint(model)
    profile = kp.profile(model)
    assert profile.total_params == model.count_params()
    assert profile.total_macs == tf_macs(model)  # the projection onto the vocabulary included
    same = kp.apply_plan(model, kp.plan(model, params=1.0), weights="keep")
    np.testing.assert_allclose(same(_IDS), model(_IDS), atol=1e-5)
    small = kp.precrop(model, params=0.5, mode="uniform", weights="keep")
    embed = small.get_layer("embed")
    assert embed.output_dim < 16 and embed.tie_weights == tie_weights
    assert small.get_layer("final_norm").gamma.shape == (embed.output_dim,)
    assert small(_IDS).shape == (3, 12, 50)  # the vocabulary stays whole
    assert small.count_params() == small.precrop_plan.params <= 0.5 * model.count_params()
    assert tf_macs(small) == small.precrop_plan.macs
    if not tie_weights:  # the projection's rows are the kept channels, as the table's columns
        original = model.get_layer("embed")
        table, reverse = original.embeddings.numpy(), original.reverse_embeddings
        kept = [int(np.flatnonzero((table == embed.embeddings.numpy()[:, [j]]).all(axis=0))[0])
                for j in range(embed.output_dim)]
        np.testing.assert_array_equal(embed.reverse_embeddings.numpy(), reverse.numpy()[kept])
    small.save(tmp_path / "lm.keras")
    np.testing.assert_allclose(keras.models.load_model(tmp_path / "lm.keras")(_IDS), small(_IDS), atol=1e-6)
    assert model_fingerprint(model) == before


class _Scaled(L.ReversibleEmbedding):
    """A subclass that computes otherwise (a scaled lookup): not the rule's call."""

    def call(self, inputs, reverse=False):
        return super().call(inputs, reverse) * 2.0


def test_an_embedding_subclass_that_overrides_call_is_refused_by_name_and_kept_whole_with_ignore():
    model = _text_model(embedding=_Scaled(50, 16, name="embed"))
    with pytest.raises(kp.UnsupportedLayerError, match=r"embed: _Scaled overrides "
                       r"ReversibleEmbedding.call; .*ignore=\['embed'\]"):
        kp.plan(model, params=0.5)
    small = kp.precrop(model, params=0.5, ignore=["embed"])
    assert small.get_layer("embed").output_dim == 16 and small.get_layer("mlp_up").units < 32


def test_an_embedding_with_lora_is_refused_by_name():
    model = _text_model()
    model.get_layer("embed").enable_lora(2)
    with pytest.raises(kp.UnsupportedLayerError, match=r"'embed' \(Embedding\) has LoRA "
                       r"enabled.*ignore=\['embed'\]"):
        kp.plan(model, params=0.5)
