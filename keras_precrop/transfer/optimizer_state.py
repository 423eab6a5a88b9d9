"""Carrying an optimizer's state into a rebuilt model, slot by slot, as the weights were carried.

A model pruned while it trains (``GradualPruning``) can be rebuilt smaller
once its masks are final and go on training at the smaller model's speed.
Its optimizer must follow it: a fresh one would restart the schedule and drop
the momentum, a stale one holds the old variables. Keras optimizers keep one
slot per trainable weight and slot kind (SGD's momentum, Adam's moments, EMA's
average, gradient accumulators), each of the weight's shape and named after
its path (``add_variable_from_reference``); every such slot is carried
through the same traversal that carries the weights (``carry.carried``), so
a kept weight element keeps exactly its own momentum. The step count (so a
schedule goes on where it was) and the other global variables are copied by
name; the learning rate is the new optimizer's, as compiled.
"""

from __future__ import annotations

import keras
import numpy as np

from keras_precrop.errors import ArgumentError
from keras_precrop.transfer.carry import carried


def carry_optimizer_state(old, new, graph, new_graph, widths, selection):
    """Copy optimizer ``old``'s state (for ``graph.model``) into ``new`` (for ``new_graph.model``).

    Args:
        old: the built optimizer that trained ``graph.model``.
        new: an optimizer of the same class, built on variables that
            include ``new_graph.model``'s trainable weights.
        graph, new_graph: the walks of the original and the rebuilt model.
        widths, selection: the widths and kept channels of the rebuild.

    Raises:
        ArgumentError: the optimizers' classes differ, or a variable of
            ``old`` is neither a slot of a weight nor a global one
            ``new`` has (e.g. Adafactor's factored moments).
    """
    if type(old) is not type(new):
        raise ArgumentError(f"{{optimizer}} is a {type(new).__name__}; the state to carry is a "
                            f"{type(old).__name__}'s. Compile with the same class.",
                            optimizer=type(new).__name__)
    old_slots, old_global = _slots(old, graph.model.trainable_weights)
    new_slots, new_global = _slots(new, new_graph.model.trainable_weights)
    for name, variable in old_global.items():
        if name == "learning_rate":  # a hyperparameter: the new optimizer's, as compiled
            continue
        if name not in new_global or tuple(new_global[name].shape) != tuple(variable.shape):
            raise ArgumentError(f"{{optimizer}}'s variable {name!r} of shape {tuple(variable.shape)} "
                                "is not a slot of one weight, so it cannot be carried to the "
                                "smaller model's.", optimizer=type(old).__name__)
        new_global[name].assign(variable)
    kinds = {kind for kind, _ in old_slots} | {kind for kind, _ in new_slots}
    zeros = {id(w): np.zeros(tuple(w.shape), np.float32) for w in graph.model.weights}
    for kind in sorted(kinds):
        values = dict(zeros)
        values.update({key: keras.ops.convert_to_numpy(slot)
                       for (k, key), slot in old_slots.items() if k == kind})
        for _, new_w, value in carried(graph, new_graph, widths, selection, values):
            slot = new_slots.pop((kind, id(new_w)), None)
            if slot is not None:
                slot.assign(value.astype(slot.dtype))
    if new_slots:
        names = sorted(slot.name for slot in new_slots.values())
        raise ArgumentError(f"{{optimizer}}: no state was carried into {names}.",
                            optimizer=type(new).__name__)


def _slots(optimizer, weights):
    """``optimizer``'s variables: ``{(kind, id(weight)): slot}`` and ``{name: global variable}``.

    A slot is named ``<weight path, '/' as '_'>_<kind>`` and has its weight's
    shape (Keras' ``add_variable_from_reference``); the longest matching path
    wins, so ``conv_1`` is not taken for ``conv``.
    """
    prefixes = sorted(((w.path.replace("/", "_") + "_", w) for w in weights),
                      key=lambda pair: -len(pair[0]))
    slots, other = {}, {}
    for variable in optimizer.variables:
        owner = next((pair for pair in prefixes if variable.name.startswith(pair[0])
                      and tuple(variable.shape) == tuple(pair[1].shape)), None)
        if owner is None:
            if variable.name in other:
                raise ArgumentError(f"{{optimizer}} holds two variables named {variable.name!r} "
                                    "that are not slots of one weight; their state cannot be "
                                    "carried.", optimizer=type(optimizer).__name__)
            other[variable.name] = variable
        else:
            slots[(variable.name[len(owner[0]):], id(owner[1]))] = variable
    return slots, other


__all__ = ["carry_optimizer_state"]
