"""keras_hub's BERT through ``kp.hub``: a ``BertTextClassifier`` comes back as a
``BertTextClassifier`` whose ``BertBackbone`` is built from a new config (``hidden_dim``,
``num_heads``, ``intermediate_dim``; the head size kept), which saves and loads with
keras_hub alone. Its inputs are a dict of token ids of open length; the plan is walked
at a defined length and the task keeps its own.

References: ``count_params()``, the original's logits (an identity plan with kept weights),
a saved and reloaded task, the kept channels' own weights.
"""

import keras
import numpy as np
import pytest

import keras_precrop as kp
from tests.conftest import model_fingerprint

keras_hub = pytest.importorskip("keras_hub")

_RNG = np.random.default_rng(0)
_X = {"token_ids": _RNG.integers(1, 100, (2, 16)).astype("int32"),
      "segment_ids": np.repeat([[0] * 8 + [1] * 8], 2, axis=0).astype("int32"),
      "padding_mask": np.ones((2, 16), "int32")}


def _classifier():
    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=100, num_layers=2, num_heads=4, hidden_dim=32, intermediate_dim=64,
        max_sequence_length=16)
    return keras_hub.models.BertTextClassifier(backbone=backbone, num_classes=3, preprocessor=None)


def test_a_bert_classifier_comes_back_as_itself_from_a_smaller_config(tmp_path):
    task = _classifier()
    before = model_fingerprint(task)
    small = kp.hub.precrop(task, params=0.5)  # homogeneous: the default for a backbone of the table
    backbone = small.backbone
    assert type(small) is type(task) and type(backbone) is type(task.backbone)
    assert backbone.hidden_dim < 32 and backbone.hidden_dim // backbone.num_heads == 32 // 4
    assert backbone.intermediate_dim < 64 and backbone.num_layers == 2
    assert small.count_params() == small.precrop_plan.params <= 0.5 * task.count_params()
    assert small(_X).shape == (2, 3)
    assert model_fingerprint(task) == before
    small.save(tmp_path / "small.keras")
    back = keras.models.load_model(tmp_path / "small.keras")  # keras_hub's classes alone
    assert type(back) is type(task) and back.backbone.get_config() == backbone.get_config()
    np.testing.assert_allclose(back(_X), small(_X), atol=1e-6)


def test_an_identity_plan_with_kept_weights_computes_the_original_logits():
    task = _classifier()
    same = kp.hub.precrop(task, params=1.0, weights="keep")
    assert same.backbone.get_config() == task.backbone.get_config()
    np.testing.assert_allclose(same(_X), task(_X), atol=1e-5)


def test_kept_weights_are_the_tables_kept_columns():
    task = _classifier()
    small = kp.hub.precrop(task, params=0.5, weights="keep")
    old = task.backbone.token_embedding.embeddings.numpy()
    new = small.backbone.token_embedding.embeddings.numpy()
    columns = [np.flatnonzero((old == new[:, [j]]).all(axis=0)) for j in range(new.shape[1])]
    assert all(len(c) == 1 for c in columns) and len({int(c[0]) for c in columns}) == new.shape[1]


def test_per_block_widths_give_a_functional_backbone_and_prefix_views_are_refused_homogeneous():
    task = _classifier()
    per_block = kp.hub.precrop(task, params=0.5, homogeneous=False)
    assert type(per_block) is type(task) and isinstance(per_block.backbone, kp.hub.PrunedBackbone)
    pruned = per_block.backbone.count_params()
    assert pruned == per_block.precrop_plan.params <= 0.5 * task.backbone.count_params()  # of the backbone
    assert per_block(_X).shape == (2, 3)
    with pytest.raises(kp.ArgumentError, match=r"homogeneous=True \(the same widths in every "
                       r"block.*cannot say these widths in the backbone's config: no config key "
                       r"for \[.*:in'\]\. Use homogeneous=False"):
        kp.hub.precrop(task, params=0.5, homogeneous=True, residual="prefix")
