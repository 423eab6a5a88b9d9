"""Handlers of the embeddings that create a transformer's hidden stream: a vision
transformer's patch embeddings and ``keras.layers.Embedding``'s token lookups.

keras_hub's vision transformers begin with one layer that cuts the image into
patches, projects each onto the hidden dimension with a strided ``Conv2D``
and adds tokens and position embeddings (``ViTPatchingAndEmbedding``,
``DeiTEmbeddings``, ``DINOV2Embedding``, ...). All of its weights but the
convolution's input axis run along the hidden dimension: the class,
distillation, register and mask tokens, the learned position embeddings (a
DINOv2 layer's stored and interpolated ones alike: the interpolation is
spatial, per channel), the projection's filters and bias. So the layer
creates the hidden (residual-stream) channels, as a convolution creates its
filters, and every later block reads and writes them.

A ``keras.layers.Embedding`` creates its ``output_dim`` channels from integer
ids the same way: its table's last axis runs along them, the ids' last axis is
a sequence, not channels (:class:`TokenEmbedding`).

The keras_hub handlers are registered by qualified name (``handlers.py``), so
nothing of keras_hub is imported here.
"""

from __future__ import annotations

import math

import keras
from keras.src import backend as _backend

from keras_precrop.errors import UnsupportedLayerError
from keras_precrop.graph.channels import Part, input_shape, output_shape
from keras_precrop.graph.handler_base import Handler, op_weights


class PatchEmbedding(Handler):
    """A layer whose strided ``Conv2D`` projects image patches onto ``hidden_dim`` channels.

    Parameters: the convolution's ``k_h * k_w * c_in`` weights per hidden
    channel (and its bias), plus every other float weight whose last axis is
    the hidden dimension (tokens, position embeddings), per hidden channel;
    other weights (CLIP's integer ``position_ids``) are constants. MACs: the
    convolution's, one kernel per patch (adding tokens and positions is no
    multiply-accumulate). A rebuild sets ``hidden_dim``; kept weights slice
    every hidden axis to the channels that survive.

    Args:
        dropped: config entries the layer's ``get_config`` writes but its
            ``__init__`` refuses (keras_hub 0.32's ViT and DeiT embeddings
            write ``num_patches`` and ``num_positions``), left out of the
            rebuilt layer's config so that it can be created at all.
        restored: constructor arguments its ``get_config`` forgets (ViT's
            ``use_patch_bias``, everyone's ``data_format``), taken from the
            layer's attributes of the same name so that the rebuilt layer
            is the original's kind.
    """

    def __init__(self, dropped=(), restored=("data_format",)):
        self.dropped = tuple(dropped)
        self.restored = tuple(restored)

    def walk(self, ctx, rec, node, ins):
        layer = rec.layer
        conv = _patch_conv(layer, rec.path)
        out = ctx.new_output(rec, layer.hidden_dim)
        patches = math.prod(conv.compute_output_shape(input_shape(node))[1:-1])
        kernel = math.prod(conv.kernel_size)
        ctx.add_kernel(rec, ins[0], out, params=kernel, macs=kernel * patches,
                       bias=conv.use_bias)
        own = {id(w) for w in conv.weights}
        for w in op_weights(layer):
            if id(w) in own:
                continue
            size = math.prod(w.shape)
            if _along_hidden(w, layer.hidden_dim):
                ctx.add_term(rec, size // layer.hidden_dim, 0, out[0])
            else:
                ctx.add_term(rec, size, 0)
        _check_declared_tokens(ctx, rec, node)
        return [out]

    def configure(self, rec, config, width):
        config = {k: v for k, v in config.items() if k not in self.dropped}
        for name in self.restored:
            config[name] = getattr(rec.layer, name)
        config["hidden_dim"] = width(rec.out_segment)
        return config

    def channel_axes(self, rec, node):
        """The projection's kernel reads the image's channels; every hidden axis is ``"out"``."""
        layer = rec.layer
        kernel = _patch_conv(layer, rec.path).kernel
        return [{-2: "in", -1: "out"} if w is kernel
                else {-1: "out"} if _along_hidden(w, layer.hidden_dim) else {}
                for w in op_weights(layer)]


class TokenEmbedding(Handler):
    """``keras.layers.Embedding``: a table lookup that creates ``output_dim`` channels.

    Parameters: ``input_dim`` per output channel; MACs: none (a gather). The
    ids it reads have no channels, so nothing before it is pruned by it. A
    rebuild sets ``output_dim``; kept weights slice the table's last axis.
    A subclass whose ``call`` is not its handled class's (``base``) and a
    table with LoRA weights are refused by name: this rule reads that call
    alone.
    """

    base = keras.layers.Embedding
    ties_shared_inputs = False  # ids have no channels (and a reverse call reads the stream)

    def walk(self, ctx, rec, node, ins):
        self._check(rec)
        out = ctx.new_output(rec, rec.layer.output_dim)
        ctx.add_term(rec, self._tables(rec.layer) * rec.layer.input_dim, 0, out[0])
        return [out]

    def _check(self, rec):
        """Refuse, by name, a layer whose ``call`` or weights this rule does not read."""
        layer, base = rec.layer, self.base
        if type(layer).call is not base.call:
            raise UnsupportedLayerError(
                f"{rec.path}: {type(layer).__name__} overrides {base.__name__}.call; the embedding "
                f"rule reads {base.__name__}'s own call only. Keep its channels fixed with "
                "{ignore}.", ignore=[rec.path])

    def _tables(self, layer):
        """How many ``(input_dim, output_dim)`` tables the layer holds."""
        return 1

    def configure(self, rec, config, width):
        config["output_dim"] = width(rec.out_segment)
        return config

    def channel_axes(self, rec, node):
        """The table's last axis holds the output channels."""
        return [{-1: "out"} if w is rec.layer.embeddings else {} for w in op_weights(rec.layer)]


class ReversibleEmbedding(TokenEmbedding):
    """``keras.layers.ReversibleEmbedding`` (keras_hub's language models' token embedding):
    a lookup, and called with ``reverse=True`` the projection of the hidden stream back onto
    the vocabulary, by the same table transposed (``tie_weights``) or by its own
    ``reverse_embeddings``.

    Both calls index one segment, the table's channels: the lookup creates the
    stream, the projection reads it whole (the stream it reads is tied to
    it), so input and output embeddings keep one width. The projection writes
    ``input_dim`` fixed channels (the vocabulary) at ``tokens x input_dim``
    MACs per stream channel; an untied table adds ``input_dim`` parameters
    per channel. Parameters count on the layer's first call, whichever it is.
    """

    base = keras.layers.ReversibleEmbedding

    def walk(self, ctx, rec, node, ins):
        if not _reverse(node):
            return super().walk(ctx, rec, node, ins)
        self._check(rec)
        layer = rec.layer
        out = ctx.new_output(rec, layer.output_dim)
        ctx.tie(ins[0], out, rec.path)
        tokens = math.prod(input_shape(node)[1:-1])
        ctx.add_term(rec, self._tables(layer) * layer.input_dim, tokens * layer.input_dim, out[0])
        return [(Part(ctx.new_segment(layer.input_dim, f"{rec.path}:logits", fixed=True)),)]

    def _tables(self, layer):
        return 1 if layer.tie_weights else 2

    def channel_axes(self, rec, node):
        """The lookup table's last axis and the untied projection's first hold the channels."""
        layer = rec.layer
        reverse = getattr(layer, "reverse_embeddings", None)
        return [{-1: "out"} if w is layer.embeddings else {0: "out"} if w is reverse else {}
                for w in op_weights(layer)]


def _reverse(node):
    """Whether a ``ReversibleEmbedding`` call projects onto the vocabulary (``reverse=True``)."""
    args, kwargs = node.arguments.args, node.arguments.kwargs
    return bool(kwargs.get("reverse", args[1] if len(args) > 1 else False))


def _along_hidden(weight, hidden_dim):
    """Whether a weight holds one float vector per hidden channel (its last axis)."""
    shape = tuple(weight.shape)
    return bool(shape) and shape[-1] == hidden_dim and "float" in str(weight.dtype)


def _check_declared_tokens(ctx, rec, node):
    """Note a layer whose declared output shape is not what its ``call`` computes.

    Later layers' MACs are counted from the declared shape: keras_hub 0.32's
    ``SigLIPVisionEmbedding`` declares a class token it does not add, so each
    later layer's MACs count one token too many, which the user should know.
    A size the ``call`` leaves open (``None``) is no contradiction.
    """
    declared = output_shape(node)
    computed = tuple(_backend.compute_output_spec(rec.layer.call, node.arguments.keras_tensors[0]).shape)
    if rec.calls == 0 and any(None not in (a, b) and a != b for a, b in zip(declared, computed)):
        ctx.note(f"{rec.path}: its class declares output shape {declared} but computes {computed}; "
                 "the MACs of the layers after it are counted on the declared shape.")


def _patch_conv(layer, path):
    """The one channels-last ``Conv2D`` inside ``layer`` that projects its patches.

    Raises:
        UnsupportedLayerError: a channels-first layer, or one with no or
            several convolutions (not a patch embedding this rule knows).
    """
    convs = [s for s in layer._flatten_layers(include_self=False)
             if isinstance(s, keras.layers.Conv2D)]
    if len(convs) != 1 or getattr(layer, "data_format", "channels_last") != "channels_last":
        raise UnsupportedLayerError(
            f"{path}: a patch embedding is read as one channels_last Conv2D that projects "
            f"patches onto hidden_dim, but {type(layer).__name__} "
            + ("is channels_first" if len(convs) == 1 else f"holds {len(convs)} Conv2D layers")
            + ". Keep its channels fixed with {ignore}.", ignore=[path])
    return convs[0]


# keras_hub 0.32's embedding layers, by qualified name (registered in ``handlers.py``).
VIT_EMBEDDINGS = (
    ("keras_hub.src.models.vit.vit_layers.ViTPatchingAndEmbedding",
     PatchEmbedding(dropped=("num_patches", "num_positions"),
                    restored=("data_format", "use_patch_bias"))),
    ("keras_hub.src.models.deit.deit_layers.DeiTEmbeddings",
     PatchEmbedding(dropped=("num_patches", "num_positions"))),
    ("keras_hub.src.models.dinov2.dinov2_layers.DINOV2Embedding", PatchEmbedding()),
    ("keras_hub.src.models.dinov3.dinov3_layers.DINOV3Embedding", PatchEmbedding()),
    ("keras_hub.src.models.clip.clip_layers.CLIPVisionEmbedding", PatchEmbedding()),
    ("keras_hub.src.models.siglip.siglip_layers.SigLIPVisionEmbedding", PatchEmbedding()),
)
