"""keras_hub backbones whose config says their widths: pruned into a config of the same class.

A keras_hub transformer backbone saves its constructor's arguments, one
width per kind of layer (``ViTBackbone``: ``hidden_dim``, ``num_heads``,
``mlp_dim``, the same in every block). A plan with the same widths in every
block (*homogeneous*) is such a config, so the pruned task comes back as the
same keras_hub class built from a new config: it saves, loads and fine-tunes
with keras_hub alone, and the task's head is re-created on the new hidden
width. :data:`CONFIG_WIDTHS` is the table of such backbones: which config key
each width variable of the task's walk stands for (by the variable's name),
and which keys keep one ratio (a ViT's heads and hidden width: its head size
``hidden_dim // num_heads`` stays). Nothing here imports keras_hub.
"""

from __future__ import annotations

import dataclasses
import re

from keras_precrop.errors import ArgumentError


@dataclasses.dataclass(frozen=True)
class ConfigWidths:
    """How a backbone class's config says the widths of its task's width variables.

    Attributes:
        keys: ``{config key: pattern}``: the free width variables whose name
            ends in the pattern (a regular expression) are that key's.
        ratios: tuples of keys whose widths keep one ratio (new / original).
        residual: the ``residual`` mode a homogeneous plan walks under by
            default: ``"tie"`` where the config gives every reader of the
            stream all of it (no reader's view can be narrower).
        task_keys: the keys of ``keys`` that the task's config holds, not the
            backbone's (``ViTImageClassifier``'s ``intermediate_dim``, the
            width of its ``pre_logits`` layer); a task may lack their layers.
    """

    keys: dict
    ratios: tuple = ()
    residual: str = "prefix"
    task_keys: tuple = ()

    def classes(self, variables):
        """``{config key: [variable names]}``, every free variable in exactly one key.

        A key's variables may be fixed (a bare backbone's output keeps its
        hidden width); tied to it by a ratio, the others stay as they are.

        Raises:
            ArgumentError: naming ``homogeneous``: a free variable no key claims
                (the config cannot say its width), or a key that claims none.
        """
        found = self._claimed([v.name for v in variables])
        claimed = {name for names in found.values() for name in names}
        loose = [v.name for v in variables if not v.fixed and v.name not in claimed]
        empty = [key for key, names in found.items() if not names and key not in self.task_keys]
        if loose or empty:
            raise ArgumentError(
                "{homogeneous:True} (the same widths in every block, a new config: the default "
                "for a task of this backbone) cannot say these widths in the backbone's config: "
                + (f"no config key for {loose[:4]}" if loose else f"no width for {empty}")
                + ". Use {homogeneous:False} (per-block widths).")
        return found

    def tie(self, variables):
        """``plan(tie=...)``: each key's variables, the keys of a ratio together."""
        found = self.classes(variables)
        joined = {key for keys in self.ratios for key in keys}
        groups = [[name for key in keys for name in found[key]] for keys in self.ratios]
        return [g for g in groups + [found[k] for k in found if k not in joined] if len(g) > 1]

    def held(self, variables):
        """``{config key: fixed variable}`` for each key one of whose variables is fixed (ignored,
        or the model's output) while others are free: a homogeneous plan keeps that key (and
        those in a ratio with it) whole in every block."""
        fixed = {v.name for v in variables if v.fixed}
        found = self._claimed([v.name for v in variables])
        held = {key: next(n for n in names if n in fixed) for key, names in found.items()
                if any(n in fixed for n in names) and not all(n in fixed for n in names)}
        for keys in self.ratios:
            for key in keys:
                if key not in held and any(k in held for k in keys):
                    held[key] = held[next(k for k in keys if k in held)]
        return held

    def config(self, variables, widths):
        """``{config key: new width}`` from the planned ``widths`` (``{variable name: width}``)."""
        out = {}
        for key, names in self.classes(variables).items():
            if not names:  # a task key of a task without its layer
                continue
            values = {widths[name] for name in names}
            if len(values) != 1:
                raise ArgumentError(
                    f"{{plan}} gives {key} several widths ({sorted(values)}); a homogeneous plan "
                    "gives one (plan with tie=...), or pass kp.hub a plan of the backbone "
                    "(kp.hub.precrop(task, homogeneous=False).precrop_plan).", plan=key)
            out[key] = int(values.pop())
        return out

    def planned(self, variables):
        """``{config key: {new widths}}`` of a plan's ``variables`` (its rows), per key.

        Rows of kind ``"head_dims"`` are left out: they narrow each head and
        keep the number of heads, and no key of the table says a head's size.
        A key no row matches maps to an empty set.
        """
        new = {row["name"]: row["new"] for row in variables if row["kind"] != "head_dims"}
        return {key: {new[name] for name in names} for key, names in self._claimed(new).items()}

    def _claimed(self, names):
        """``{config key: [the names its pattern ends]}``, for every key of the table."""
        return {key: [name for name in names if re.search(pattern + "$", name)]
                for key, pattern in self.keys.items()}


# keras_hub backbones, by qualified class name. ViT and DeiT blocks give each head
# hidden_dim // num_heads channels, so heads and hidden width keep their ratio.
_VIT_LIKE = {"hidden_dim": r"_patching_and_embedding", "num_heads": r"_mha"}
CONFIG_WIDTHS = {
    # ViTImageClassifier(intermediate_dim=...) puts a Dense layer of that width before its logits.
    "keras_hub.src.models.vit.vit_backbone.ViTBackbone": ConfigWidths(
        keys={**_VIT_LIKE, "mlp_dim": r"_mlp_dense", "intermediate_dim": r"(^|_)pre_logits"},
        ratios=(("hidden_dim", "num_heads"),), task_keys=("intermediate_dim",)),
    "keras_hub.src.models.deit.deit_backbone.DeiTBackbone": ConfigWidths(
        keys={**_VIT_LIKE, "intermediate_dim": r"_mlp_dense"},
        ratios=(("hidden_dim", "num_heads"),)),
    # BERT: the token, segment and position embeddings and the pooler are hidden_dim wide, heads
    # hidden_dim // num_heads, as in a ViT; its post-norm blocks read the stream itself, and the
    # config gives every reader all of it (residual="tie": no narrower views).
    "keras_hub.src.models.bert.bert_backbone.BertBackbone": ConfigWidths(
        residual="tie",
        keys={"hidden_dim": r"(_token_embedding|_segment_embedding|_pooled_dense)",
              "num_heads": r"_self_attention_layer",
              "intermediate_dim": r"_feedforward_intermediate_dense"},
        ratios=(("hidden_dim", "num_heads"),)),
}


def config_widths(backbone):
    """The :class:`ConfigWidths` of ``backbone``'s class (or a base class), or ``None``."""
    return CONFIG_WIDTHS.get(table_key(backbone))


def table_key(backbone):
    """The key of :data:`CONFIG_WIDTHS` for ``backbone``'s class (or a base class), or ``None``."""
    for cls in type(backbone).__mro__:
        name = f"{cls.__module__}.{cls.__qualname__}"
        if name in CONFIG_WIDTHS:
            return name
    return None
