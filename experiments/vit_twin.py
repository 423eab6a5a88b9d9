"""A plain PyTorch twin of keras_hub's ``ViTImageClassifier``, for Torch-Pruning (issue 61).

Issue 61 compares PreCrop on the CIFAR-10 ViT teacher with Torch-Pruning (TP)
on a PyTorch copy of the same teacher. The twin computes what keras_hub's
model computes, layer for layer (keras_hub 0.32's ``vit_layers.py``):

* ``ViTPatchingAndEmbedding``: a ``Conv2D`` patch embedding (kernel = stride
  = patch, bias), patches flattened row by row, a class token in front, a
  learned position embedding added;
* ``ViTEncoder``: dropout, pre-LN blocks, a final ``LayerNormalization``
  (keras_hub passes ``layer_norm_epsilon``, 1e-6 by default, not Keras'
  own 1e-3);
* ``ViTEncoderBlock``: ``x + dropout(MHA(LN(x)))`` then ``x + MLP(LN(x))``;
  Keras' ``MultiHeadAttention`` scales the queries by ``1/sqrt(key_dim)``
  before the product with the keys, softmax, attention dropout, an output
  projection; the MLP is ``Dense(gelu)``, dropout, ``Dense``, dropout, and
  Keras' ``gelu`` is the exact (erf) one by default, as ``nn.GELU()``;
* ``ViTImageClassifier``: the class token's output (``pooling="token"``)
  or the mean over tokens (``"gap"``), dropout, a ``Dense`` head (logits).

The twin takes channels-first images (N, C, H, W), PyTorch's layout.

The attention is laid out as timm's ``Attention``, the form TP's own ViT
examples prune: one fused ``qkv`` ``nn.Linear`` (rows: queries, keys,
values, each head after head), a ``num_heads`` attribute and ``proj``. Keras'
separate (hidden, heads, key_dim) query/key/value kernels are stacked into
it. The query scale is fixed at construction (as timm's ``self.scale``), so
a twin whose head dimensions TP cut computes, on the kept weights, what the
original computed with those dimensions' terms left out.

TP changes weights, not attributes: after ``pruner.step()`` the attention
layers still say their original ``num_heads`` (the most-filed problem of
TP's ViT users, its issues #101, #198 and #287). :func:`sync_heads` sets
them from the pruner and checks the layout.
"""

import torch
from torch import nn


class Attention(nn.Module):
    """Keras' ``MultiHeadAttention`` (self-attention) with a fused ``qkv`` projection.

    Args:
        dim: the width of the stream read and written.
        num_heads: attention heads.
        head_dim: each head's query/key/value width (Keras' ``key_dim``).
        bias: whether the projections have biases (``use_mha_bias``).
        attention_dropout: dropout on the attention probabilities.
    """

    def __init__(self, dim, num_heads, head_dim, bias=True, attention_dropout=0.0):
        super().__init__()
        self.num_heads = num_heads
        self.scale = head_dim ** -0.5  # fixed: pruned head dims do not rescale the rest
        self.qkv = nn.Linear(dim, 3 * num_heads * head_dim, bias=bias)
        self.attn_drop = nn.Dropout(attention_dropout)
        self.proj = nn.Linear(num_heads * head_dim, dim, bias=bias)

    def forward(self, x):
        """Self-attention of ``x`` (batch, tokens, dim)."""
        batch, tokens, _ = x.shape
        qkv = self.qkv(x).reshape(batch, tokens, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        query, key, value = qkv.unbind(0)
        scores = (query * self.scale) @ key.transpose(-2, -1)
        probabilities = self.attn_drop(scores.softmax(dim=-1))
        return self.proj((probabilities @ value).transpose(1, 2).reshape(batch, tokens, -1))


class Mlp(nn.Module):
    """keras_hub's ViT ``MLP``: ``Dense(gelu)``, dropout, ``Dense``, dropout."""

    def __init__(self, dim, mlp_dim, bias=True, dropout=0.0):
        super().__init__()
        self.fc1 = nn.Linear(dim, mlp_dim, bias=bias)
        self.act = nn.GELU()  # exact erf, as Keras' "gelu" (approximate=False)
        self.fc2 = nn.Linear(mlp_dim, dim, bias=bias)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        """The MLP of ``x``."""
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))


class Block(nn.Module):
    """keras_hub's ``ViTEncoderBlock``: pre-LN attention and MLP, each added to the stream."""

    def __init__(self, config):
        super().__init__()
        dim, eps = config["hidden_dim"], config["layer_norm_epsilon"]
        self.norm1 = nn.LayerNorm(dim, eps=eps)
        self.attn = Attention(dim, config["num_heads"], dim // config["num_heads"],
                              config["use_mha_bias"], config["attention_dropout"])
        self.drop = nn.Dropout(config["dropout_rate"])
        self.norm2 = nn.LayerNorm(dim, eps=eps)
        self.mlp = Mlp(dim, config["mlp_dim"], config["use_mlp_bias"], config["dropout_rate"])

    def forward(self, x):
        """One encoder block on ``x`` (batch, tokens, dim)."""
        x = x + self.drop(self.attn(self.norm1(x)))
        return x + self.mlp(self.norm2(x))


class ViTTwin(nn.Module):
    """keras_hub's ``ViTImageClassifier`` on a ``ViTBackbone``, in PyTorch.

    Args:
        config: the backbone's config keys (``image_shape`` channels last,
            ``patch_size``, ``num_layers``, ``num_heads``, ``hidden_dim``,
            ``mlp_dim``, ``dropout_rate``, ``attention_dropout``,
            ``layer_norm_epsilon``, ``use_mha_bias``, ``use_mlp_bias``,
            ``use_patch_bias``) plus the task's ``num_classes``, ``pooling``
            and ``dropout``; :func:`twin_config` reads them off a Keras model.
    """

    def __init__(self, config):
        super().__init__()
        self.config = dict(config)
        height, width, channels = config["image_shape"]
        patch, dim = config["patch_size"], config["hidden_dim"]
        tokens = (height // patch[0]) * (width // patch[1]) + 1
        self.patch_embed = nn.Conv2d(channels, dim, patch, stride=patch,
                                     bias=config["use_patch_bias"])
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, tokens, dim))
        self.pos_drop = nn.Dropout(config["dropout_rate"])
        self.blocks = nn.Sequential(*[Block(config) for _ in range(config["num_layers"])])
        self.norm = nn.LayerNorm(dim, eps=config["layer_norm_epsilon"])
        self.head_drop = nn.Dropout(config["dropout"])
        self.head = nn.Linear(dim, config["num_classes"])

    def forward(self, images):
        """Logits of ``images`` (batch, channels, height, width)."""
        x = self.patch_embed(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        x = self.norm(self.blocks(self.pos_drop(x)))
        pooled = x[:, 0] if self.config["pooling"] == "token" else x.mean(dim=1)
        return self.head(self.head_drop(pooled))


def twin_config(keras_model):
    """The :class:`ViTTwin` config of a keras_hub ``ViTImageClassifier`` (logits, no preprocessor).

    Raises:
        ValueError: for what the twin does not mirror: a softmax head, an
            ``intermediate_dim`` layer, no class token, channels-first data.
    """
    backbone, task = keras_model.backbone, keras_model.get_config()
    unsupported = {
        "activation": task.get("activation") not in (None, "linear"),
        "intermediate_dim": task.get("intermediate_dim") is not None,
        "use_class_token": not backbone.use_class_token,
        "data_format": backbone.data_format != "channels_last",
        "pooling": task.get("pooling", "token") not in ("token", "gap"),
    }
    if any(unsupported.values()):
        raise ValueError(f"The twin does not mirror these settings of the Keras model: "
                         f"{[k for k, v in unsupported.items() if v]}; use the defaults "
                         "(logits, no intermediate layer, a class token, channels last).")
    patch = backbone.patch_size
    keys = ("num_layers", "num_heads", "hidden_dim", "mlp_dim", "dropout_rate",
            "attention_dropout", "layer_norm_epsilon", "use_mha_bias", "use_mlp_bias",
            "use_patch_bias")
    return {
        **{key: getattr(backbone, key) for key in keys},
        "image_shape": tuple(backbone.image_shape),
        "patch_size": tuple(patch) if isinstance(patch, (tuple, list)) else (patch, patch),
        "num_classes": task["num_classes"], "pooling": task.get("pooling", "token"),
        "dropout": float(task.get("dropout") or 0.0),
    }


def from_keras(keras_model):
    """A :class:`ViTTwin` holding ``keras_model``'s weights, one for one, in eval mode.

    Args:
        keras_model: a keras_hub ``ViTImageClassifier`` (logits) on a ``ViTBackbone``.

    Returns:
        The twin; its logits of channels-first images equal the Keras
        model's of the same images channels last (float32 round-off).
    """
    twin = ViTTwin(twin_config(keras_model))
    backbone = keras_model.backbone
    embedding = backbone.get_layer("vit_patching_and_embedding")
    encoder = backbone.get_layer("vit_encoder")
    with torch.no_grad():
        _copy_dense(twin.patch_embed, embedding.patch_embedding, (3, 2, 0, 1))
        twin.cls_token.copy_(_tensor(embedding.class_token))
        twin.pos_embed.copy_(_tensor(embedding.position_embedding.embeddings)[None])
        for block, layer in zip(twin.blocks, encoder.encoder_layers):
            _copy_norm(block.norm1, layer.layer_norm_1)
            _copy_attention(block.attn, layer.mha)
            _copy_norm(block.norm2, layer.layer_norm_2)
            _copy_dense(block.mlp.fc1, layer.mlp.dense_1)
            _copy_dense(block.mlp.fc2, layer.mlp.dense_2)
        _copy_norm(twin.norm, encoder.layer_norm)
        _copy_dense(twin.head, keras_model.get_layer("predictions"))
    return twin.eval()


def _tensor(variable):
    """A Keras variable's value as a float32 torch tensor."""
    return torch.from_numpy(variable.numpy().astype("float32"))


def _copy_dense(module, layer, axes=(1, 0)):
    """A Keras ``Dense``/``Conv2D``'s kernel (permuted to PyTorch's layout) and bias into ``module``."""
    module.weight.copy_(_tensor(layer.kernel).permute(*axes))
    if module.bias is not None:
        module.bias.copy_(_tensor(layer.bias))


def _copy_norm(module, layer):
    """A Keras ``LayerNormalization``'s scale and offset into ``module``."""
    module.weight.copy_(_tensor(layer.gamma))
    module.bias.copy_(_tensor(layer.beta))


def _copy_attention(attention, mha):
    """Keras ``MultiHeadAttention``'s (dim, heads, key_dim) q/k/v kernels stacked into ``qkv``."""
    dense = (mha._query_dense, mha._key_dense, mha._value_dense)
    attention.qkv.weight.copy_(torch.cat([_tensor(d.kernel).flatten(1).T for d in dense]))
    if attention.qkv.bias is not None:
        attention.qkv.bias.copy_(torch.cat([_tensor(d.bias).flatten() for d in dense]))
    out = mha._output_dense
    attention.proj.weight.copy_(_tensor(out.kernel).flatten(0, 1).T)
    if attention.proj.bias is not None:
        attention.proj.bias.copy_(_tensor(out.bias))


def attention_layers(twin):
    """The twin's :class:`Attention` modules, block by block."""
    return [module for module in twin.modules() if isinstance(module, Attention)]


def sync_heads(twin, pruner):
    """Sets each attention's ``num_heads`` from a TP pruner after pruning, and checks the layout.

    Args:
        twin: a :class:`ViTTwin` pruned by ``pruner``.
        pruner: a ``torch_pruning`` pruner built with ``num_heads={attn.qkv: heads}``.

    Raises:
        ValueError: where ``qkv`` and ``proj`` no longer split into equal heads.
    """
    for index, attention in enumerate(attention_layers(twin)):
        heads = pruner.num_heads[attention.qkv]
        width = attention.qkv.out_features
        if width % (3 * heads) or attention.proj.in_features * 3 != width:
            raise ValueError(f"Block {index}: qkv has {width} outputs and proj "
                             f"{attention.proj.in_features} inputs, not 3 x {heads} equal heads.")
        attention.num_heads = heads


def widths(twin):
    """The twin's widths: the stream's and, per block, heads, head size and MLP width."""
    blocks = []
    for block in twin.blocks:
        attention = block.attn
        blocks.append({"num_heads": attention.num_heads,
                       "head_dim": attention.qkv.out_features // (3 * attention.num_heads),
                       "mlp_dim": block.mlp.fc1.out_features})
    return {"hidden_dim": twin.patch_embed.out_channels, "blocks": blocks}


def macs(twin):
    """MACs per image counted as TensorFlow counts the Keras model's.

    Convolution, dense layers and both attention products (queries x keys,
    probabilities x values); norms, softmax and activations are not MACs.
    TP's ``count_ops_and_params`` leaves the attention products out.
    """
    patch = twin.config["patch_size"]
    tokens = twin.pos_embed.shape[1]
    conv = twin.patch_embed
    total = (tokens - 1) * conv.in_channels * patch[0] * patch[1] * conv.out_channels
    for block in twin.blocks:
        attention = block.attn
        inner = attention.proj.in_features  # heads x head size (queries, keys, values alike)
        total += tokens * (_linear_macs(attention.qkv) + _linear_macs(attention.proj))
        total += 2 * tokens * tokens * inner
        total += tokens * (_linear_macs(block.mlp.fc1) + _linear_macs(block.mlp.fc2))
    return total + _linear_macs(twin.head)


def _linear_macs(linear):
    """MACs of one ``nn.Linear`` on one vector."""
    return linear.in_features * linear.out_features
