"""The refusals of ``kp.GradualPruning``: arguments that cannot mean what they say, and what no mask
can stand in for, checked before any step trains.

Kept apart from ``gradual.py`` (which imports this module, never the reverse) so the callback's
module holds its schedule and masks.
"""

from __future__ import annotations

import collections.abc
import itertools

import keras
import numpy as np

from keras_precrop.errors import NAME_ONLY, ArgumentError, DataError, is_integer, is_number
from keras_precrop.graph.channels import channels_width
from keras_precrop.plans import Plan
from keras_precrop.training.constraints import factors_in_step
from keras_precrop.transfer.carry import check_options

SCHEDULES = ("cubic", "linear", "final")


def refuse_another_model(bound, model):
    """Refuse to prune ``model`` with a callback bound to ``bound`` by its first fit: its masks
    would zero ``bound``'s weights while ``model`` trains unpruned, and ``finalize`` would cut
    ``bound``."""
    same = " (another model of the same name)" if model.name == bound.name else ""
    raise ArgumentError(
        f"GradualPruning: this callback prunes model {bound.name!r}, which its first fit trained, "
        f"and cannot prune model {model.name!r}{same}: its masks, schedule and finalize() "
        f"belong to {bound.name!r}. Make a new callback for {model.name!r}: kp.GradualPruning(plan, "
        f"end_step=...), with a plan made for {model.name!r}.")


def refuse_widening(graph, widths):
    """Refuse widths above the model's: masks only take channels away, none can be added."""
    grown = [f"{v.name!r} ({v.width} -> {w} channels)" for v, w in zip(graph.variables, widths)
             if w > v.width]
    if grown:
        raise ArgumentError(
            "GradualPruning only removes channels (it masks them during fit and cuts them in "
            f"finalize), but the {{plan:=}} widens {', '.join(grown[:5])}"
            f"{f' and {len(grown) - 5} more' if len(grown) > 5 else ''}. Apply a plan that widens "
            "with kp.apply_plan(model, plan, weights='keep') (the added channels start silent, "
            "so it computes what the model does) and train that, or prune gradually to a plan "
            "that only narrows (kp.plan).", plan=NAME_ONLY)


MAX_KEPT_BATCHES = 32  # the most batches of a one-shot iterator GradualPruning keeps for its updates


def reusable(data):
    """``data`` (checked ``data=``) ready to be read at every update: as given, or the batches of
    a one-shot iterator, kept.

    A list, a ``tf.data.Dataset`` or a ``DataLoader`` is read anew at each update. A generator or
    other iterator can be read only once: its batches are read now, at the start of the fit, and
    ranked on at every update; an endless one would never stop, so one that yields more than
    :data:`MAX_KEPT_BATCHES` is refused.

    Raises:
        DataError: naming ``data=``.
    """
    if not isinstance(data, collections.abc.Iterator):
        return data
    kept = list(itertools.islice(data, MAX_KEPT_BATCHES + 1))
    if len(kept) > MAX_KEPT_BATCHES:
        raise DataError(
            "{data:=} is a generator or iterator, which can be read only once, so GradualPruning "
            "reads its batches when fit begins and ranks on them at every update; it yields more "
            f"than {MAX_KEPT_BATCHES} (an endless one never stops). Pass a few, e.g. "
            "itertools.islice(batches, 4), or data it can read anew at each update: a list of "
            "batches, or a tf.data.Dataset's take(4).", data=NAME_ONLY)
    return kept


def refuse_untrained_target(target, pruned, fitted):
    """Refuse a ``model=`` (``target``, whose model to prune is ``pruned``) whose weights the fit
    does not train: its masks would change nothing."""
    trained = {id(v) for v in fitted.trainable_variables}
    if not isinstance(pruned, keras.Model) or not all(id(w) in trained for w in pruned.trainable_weights):
        raise ArgumentError(
            "GradualPruning({model}): the model fitted does not train it; give the model that "
            f"{fitted.name!r} trains (itself, a part of it, or the Distiller whose student it is), "
            "or leave model= out to prune the fitted model.", model=target)


def normalized_cuts(graph, widths):
    """The layers that mix the channels they normalize over without a kernel, and that ``widths`` cut.

    A LayerNormalization, GroupNormalization, RMSNormalization or softmax
    over the channel axis computes each output channel from all of its
    input channels (its handler has no channel map, and no kernel reads
    them). Returns their records, once each, in the order they are called.
    """
    cut = {}
    for call in graph.calls:
        rec = call.record
        channels = graph.tensor_channels[call.inputs[0]]
        if (rec.read_segments or rec.handler.channel_map(rec, call.node) is not None
                or graph.tensor_channels[call.outputs[0]] != channels):
            continue
        if channels_width(channels, lambda s: graph.new_width(s, widths)) < graph.width(channels):
            cut.setdefault(rec.path, rec)
    return list(cut.values())


def masked_norm_call(rec):
    """``call(inputs, keep)``: the norm of ``rec`` with its statistics over the channels ``keep``
    keeps (its handler's ``masked_call``), or ``None`` where the handler has none, or the layer
    has no per-channel weight (its kept channels are read from that weight's masks)."""
    return rec.handler.masked_call(rec) if rec.layer.weights else None


def refuse_normalized_cuts(graph, widths, fitted=None):
    """Refuse widths that cut the channels a layer normalizes over, where nothing leaves the masked
    channels out of its statistics.

    A masked channel is zero but still counts in a norm's statistics (a mean
    over 16 channels, not the 6 kept), so the masked model would not compute
    what the rebuilt one does, and fine-tuning would train the wrong network.
    Masks alone (``fitted`` is ``None``: :func:`~keras_precrop.gradual.channel_masks`)
    cannot stand in for the rebuild of any such layer. During the fit of
    ``fitted``, ``GradualPruning`` lends each cut LayerNormalization and
    RMSNormalization a call over the kept channels (:func:`masked_norm_call`),
    which a train step reads where it reads the lent factors
    (``training.constraints.factors_in_step``: TensorFlow, PyTorch without
    ``jit_compile``); every other such layer, or backend, is refused by name.
    """
    for rec in normalized_cuts(graph, widths):
        if fitted is None:
            _refuse_norm(rec, "masks alone leave a masked channel (zero) in its statistics, so "
                         "the masked model would not compute the pruned one (GradualPruning "
                         "computes a LayerNormalization's or RMSNormalization's statistics over "
                         "the kept channels while it fits)")
        if masked_norm_call(rec) is None:
            _refuse_norm(rec, "a masked channel is zero but still counts in its statistics, so the "
                         "masked model would not compute the pruned one (GradualPruning computes "
                         "the statistics of keras.layers.LayerNormalization and RMSNormalization "
                         "with a scale or offset over the kept channels, no other)")
        if not factors_in_step(fitted):
            backend = keras.backend.backend()
            backend = {"jax": "JAX", "torch": "PyTorch with jit_compile=True"}.get(backend, backend)
            _refuse_norm(rec, f"it would compute its statistics over the kept channels, but under "
                         f"{backend} the compiled train step keeps what it was traced with", (
                             "prune in one shot with kp.apply_plan(model, plan, weights='keep'), "
                             "or fit with TensorFlow, or PyTorch without jit_compile"))


def _refuse_norm(rec, why, remedy="prune in one shot with kp.apply_plan"):
    """Raise the refusal of a cut to the channels ``rec``'s layer normalizes over, saying ``why``."""
    raise ArgumentError(
        f"GradualPruning cannot mask the channels that {rec.path!r} ({rec.class_name}) normalizes "
        f"over: {why}. Make the {{plan:=}} with {{ignore}} to keep those channels (or {remedy}).",
        plan=NAME_ONLY, ignore=[rec.path])


def check_arguments(plan, end_step, start_step, frequency, schedule, ranking, regrow, shrink):
    """Refuse arguments of :class:`GradualPruning` that cannot mean what they say; return the
    importance table's ranking of ``importance``.

    Numbers are taken as Keras takes them (``errors.is_integer``/``is_number``:
    ``int``, ``float`` and NumPy's scalars, but not a ``bool``).
    """
    if not isinstance(plan, Plan):
        raise ArgumentError("{plan} must be a keras_precrop.Plan, e.g. kp.plan(model, latency=0.5).",
                            plan=plan)
    for name, value, low in (("end_step", end_step, 0), ("start_step", start_step, 0),
                             ("frequency", frequency, 1)):
        if not is_integer(value) or value < low:
            raise ArgumentError(f"{{{name}}} must be an integer >= {low}.", **{name: value})
    if end_step < start_step:
        raise ArgumentError("{end_step} must not come before start_step=" + str(start_step) + ".",
                            end_step=end_step)
    if schedule not in SCHEDULES:
        raise ArgumentError(f"{{schedule}} must be one of {list(SCHEDULES)}.", schedule=schedule)
    importance, data = ranking
    ranking = check_options("keep", importance, data, "kp.GradualPruning")  # data=, no chance
    if not isinstance(regrow, (bool, np.bool_)):
        raise ArgumentError("{regrow} must be True or False.", regrow=regrow)
    if not is_number(shrink) or not 0 <= shrink < 1:
        raise ArgumentError("{shrink} must be a number in [0, 1): the fraction of a doomed "
                            "channel's weights taken away at each step.", shrink=shrink)
    return ranking
