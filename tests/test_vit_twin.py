"""The PyTorch twin of the keras_hub ViT teacher and Torch-Pruning on it (issue 61, evidence).

References: the Keras model's own logits on the same images, its
``count_params()`` and TensorFlow's MAC count; for pruning, the unpruned twin
with the removed heads, head dimensions and MLP units zeroed (the pruned
twin must compute exactly that), and a ``torch.save`` round trip (the
comparison script's checkpoints).
"""

import copy
import json
import sys

import keras
import numpy as np
import pytest

from tests.conftest import REPO, run_python, tf_macs

torch = pytest.importorskip("torch")
keras_hub = pytest.importorskip("keras_hub")
pytest.importorskip("torch_pruning")
sys.path.insert(0, str(REPO / "experiments"))
import tp_vit  # noqa: E402  (experiments/tp_vit.py)
import vit_twin  # noqa: E402  (experiments/vit_twin.py)

SMALL = {"patch_size": 8, "num_layers": 2, "num_heads": 4, "hidden_dim": 32, "mlp_dim": 64}
TEACHER = {"patch_size": 4, "num_layers": 6, "num_heads": 4, "hidden_dim": 128, "mlp_dim": 256}


def _vit(config, seed=0, spread=0.1):
    """A keras_hub ViT classifier (logits) with every weight moved off its initializer.

    keras_hub starts biases near 0 and norms at 1; noise makes each of them count.
    """
    keras.utils.set_random_seed(seed)
    backbone = keras_hub.models.ViTBackbone(image_shape=(32, 32, 3), **config)
    model = keras_hub.models.ViTImageClassifier(backbone=backbone, num_classes=10,
                                                preprocessor=None, activation=None)
    rng = np.random.default_rng(seed)
    for variable in model.weights:
        variable.assign(variable.numpy() + rng.normal(0, spread, variable.shape).astype("float32"))
    return model


def _images(n=4, seed=1):
    return np.random.default_rng(seed).normal(size=(n, 32, 32, 3)).astype("float32")


def _twin_logits(twin, images):
    with torch.no_grad():
        return twin(torch.from_numpy(images).permute(0, 3, 1, 2)).numpy()


@pytest.mark.parametrize("config", [SMALL, TEACHER], ids=["small", "teacher"])
def test_the_twin_computes_the_keras_models_logits(config):
    model = _vit(config)
    twin = vit_twin.from_keras(model)
    images = _images()
    expected = np.asarray(model(images))
    np.testing.assert_allclose(_twin_logits(twin, images), expected, atol=1e-4, rtol=0)
    assert np.abs(expected).max() > 0.5  # logits of some size: not a vacuous match
    assert sum(p.numel() for p in twin.parameters()) == model.count_params()
    assert vit_twin.macs(twin) == tf_macs(model)


def test_gap_pooling_and_head_dropout_are_mirrored():
    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.ViTBackbone(image_shape=(32, 32, 3), **SMALL)
    model = keras_hub.models.ViTImageClassifier(backbone=backbone, num_classes=10,
                                                preprocessor=None, pooling="gap", dropout=0.3)
    twin = vit_twin.from_keras(model)
    assert twin.head_drop.p == 0.3
    np.testing.assert_allclose(_twin_logits(twin, _images()), np.asarray(model(_images())),
                               atol=1e-4, rtol=0)


def test_a_softmax_head_is_refused():
    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.ViTBackbone(image_shape=(32, 32, 3), **SMALL)
    model = keras_hub.models.ViTImageClassifier(backbone=backbone, num_classes=10,
                                                preprocessor=None, activation="softmax")
    with pytest.raises(ValueError, match="activation"):
        vit_twin.from_keras(model)


def _rows_kept(new, old):
    """Indices of the rows of ``old`` that ``new``'s rows are (in order)."""
    distances = torch.cdist(new, old, compute_mode="donot_use_mm_for_euclid_dist")
    assert float(distances.min(dim=1).values.max()) < 1e-6
    return distances.argmin(dim=1)


def _masked_original(twin, small):
    """``twin`` with the query/key/value rows and MLP units that ``small`` lost zeroed."""
    masked = copy.deepcopy(twin)
    with torch.no_grad():
        for block, pruned in zip(masked.blocks, small.blocks):
            for linear, kept in ((block.attn.qkv, pruned.attn.qkv), (block.mlp.fc1, pruned.mlp.fc1)):
                drop = torch.ones(linear.out_features, dtype=torch.bool)
                drop[_rows_kept(kept.weight, linear.weight)] = False
                linear.weight[drop] = 0
                linear.bias[drop] = 0
    return masked


@pytest.mark.parametrize("heads", [True, False], ids=["whole_heads", "head_dims"])
def test_tp_cuts_heads_consistently_and_the_heads_are_synced(heads):
    """With the residual stream kept (TP's --bottleneck), the pruned twin equals the original
    with what TP removed zeroed: queries, keys and values were cut head by head alike."""
    twin = vit_twin.from_keras(_vit(SMALL))
    small = tp_vit.pruned(twin, 0.3, bottleneck=True, prune_num_heads=heads,
                          head_pruning_ratio=0.5)
    blocks = vit_twin.widths(small)["blocks"]
    assert vit_twin.widths(small)["hidden_dim"] == 32
    if heads:
        assert all(b["num_heads"] == 2 and b["head_dim"] == 8 for b in blocks)
    else:
        assert all(b["num_heads"] == 4 and b["head_dim"] < 8 for b in blocks)
    assert all(b["mlp_dim"] < 64 for b in blocks)
    images = _images()
    expected = _twin_logits(_masked_original(twin, small), images)
    np.testing.assert_allclose(_twin_logits(small, images), expected, atol=1e-5, rtol=0)
    if heads:  # TP leaves num_heads as it was (its issues #101, #198, #287): then it is wrong
        for attention in vit_twin.attention_layers(small):
            attention.num_heads = 4
        assert np.abs(_twin_logits(small, images) - expected).max() > 1e-3


def test_bisection_finds_the_smallest_ratio_under_the_macs_target():
    twin = vit_twin.from_keras(_vit(SMALL))
    small, ratio = tp_vit.prune_to_macs(twin, 0.5, steps=8)
    full = vit_twin.macs(twin)
    assert vit_twin.macs(small) <= 0.5 * full < vit_twin.macs(tp_vit.pruned(twin, ratio - 0.01))
    assert vit_twin.widths(small) == vit_twin.widths(tp_vit.pruned(twin, ratio))


def test_the_teacher_twin_pruned_to_half_its_macs_still_runs(tmp_path):
    twin = vit_twin.from_keras(_vit(TEACHER))
    small = tp_vit.pruned(twin, 0.3)  # TP's uniform ratio for half the MACs (prune_to_macs: 0.29)
    assert 0.45 < vit_twin.macs(small) / vit_twin.macs(twin) < 0.55
    widths = vit_twin.widths(small)
    assert widths["hidden_dim"] < 128  # TP cuts the stream (and norms, class token, positions)
    assert small.cls_token.shape[-1] == small.pos_embed.shape[-1] == widths["hidden_dim"]
    for attention, block in zip(vit_twin.attention_layers(small), widths["blocks"]):
        assert attention.qkv.out_features == 3 * block["num_heads"] * block["head_dim"]
        assert block["num_heads"] == 4 and block["head_dim"] < 32 and block["mlp_dim"] < 256
    logits = _twin_logits(small, _images())
    assert logits.shape == (4, 10) and np.isfinite(logits).all()
    counts = tp_vit.counts(small)
    assert counts["macs"] == vit_twin.macs(small) and counts["tp_macs"] < counts["macs"]
    torch.save(small, tmp_path / "small.pt")
    again = torch.load(tmp_path / "small.pt", weights_only=False)
    np.testing.assert_array_equal(_twin_logits(again, _images()), logits)


@pytest.mark.slow
def test_the_comparison_script_runs_and_resumes(tmp_path):
    """Two epochs of two steps on a random tiny teacher, then the same command again (resumed:
    nothing more is trained); needs the local CIFAR-10 copy."""
    data_dir = REPO.parent / "shared" / "tfds"
    if not (data_dir / "cifar10").exists():
        pytest.skip("no local CIFAR-10 copy")
    teacher = tmp_path / "teacher" / "final_model.keras"
    teacher.parent.mkdir()
    _vit(SMALL, spread=0.0).save(teacher)
    command = ["experiments/tp_vit.py", "--teacher", str(teacher), "--epochs", "2", "--distill",
               "--steps_per_epoch", "2", "--eval_batches", "1", "--model_dir",
               str(tmp_path / "run"), "--data_dir", str(data_dir), "--device", "cpu"]
    for _ in range(2):
        result = run_python(command)
        assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads((tmp_path / "run" / "results.json").read_text())
    assert [row["epoch"] for row in record["history"]] == [1, 2]
    assert record["check"]["keras_accuracy"] == record["check"]["twin_accuracy"]
    assert record["macs_ratio"] <= 0.5
