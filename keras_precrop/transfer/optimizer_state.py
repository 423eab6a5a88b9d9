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
schedule goes on where it was) and the other global variables are copied in
order; the learning rate is the new optimizer's, as compiled.

That is exact only where an optimizer updates each weight element from its
own gradient and slots: :data:`ELEMENTWISE` lists those Keras has. Lamb's
trust ratio and Muon's orthogonalized step read whole tensors, so the
smaller model's step would differ from the masked model's; they are refused.
"""

from __future__ import annotations

import keras
import numpy as np

from keras_precrop.errors import ArgumentError
from keras_precrop.transfer.carry import carried

# The Keras optimizers whose update of a weight element reads that element's gradient and slots
# alone (and global scalars): their state sliced to the kept channels trains on exactly.
ELEMENTWISE = tuple(getattr(keras.optimizers, name) for name in (
    "SGD", "Adam", "AdamW", "Adamax", "Nadam", "RMSprop", "Adagrad", "Adadelta", "Ftrl", "Lion",
    "ScheduleFreeAdamW") if hasattr(keras.optimizers, name))


def carry_optimizer_state(old, new, graph, new_graph, widths, selection):
    """Copy optimizer ``old``'s state (for ``graph.model``) into ``new`` (for ``new_graph.model``).

    Args:
        old: the built optimizer that trained ``graph.model``.
        new: an optimizer of the same class, built on variables that
            include ``new_graph.model``'s trainable weights.
        graph, new_graph: the walks of the original and the rebuilt model.
        widths, selection: the widths and kept channels of the rebuild.

    Raises:
        ArgumentError: the optimizers' classes or slot kinds differ (e.g.
            ``use_ema`` on one side only), the class is not
            :data:`ELEMENTWISE`, two weights share a path (their slots share
            a name), or a variable of ``old`` is neither a slot of a weight
            nor a global one ``new`` has (e.g. Adafactor's factored moments).
    """
    if type(old) is not type(new):
        raise ArgumentError(f"{{optimizer}} cannot take the state of the {type(old).__name__} that "
                            "fitted the masked model: only an optimizer of the same class can. "
                            f"Compile the model with {type(old).__name__}.",
                            optimizer=type(new).__name__)
    if not isinstance(old, ELEMENTWISE):
        raise ArgumentError(
            f"{{optimizer}}: its state is carried exactly only for optimizers that update each "
            f"weight element alone ({', '.join(c.__name__ for c in ELEMENTWISE)}); a "
            f"{type(old).__name__} reads whole tensors (or wraps another optimizer), so the smaller "
            "model would not train as the masked one. Train it on with a fresh optimizer.",
            optimizer=type(old).__name__)
    old_slots, old_global = _slots(old, graph.model.trainable_weights)
    new_slots, new_global = _slots(new, new_graph.model.trainable_weights)
    kinds, new_kinds = ({kind for kind, _ in slots} for slots in (old_slots, new_slots))
    if kinds != new_kinds:
        raise ArgumentError(
            f"{{optimizer}} keeps state of kinds {sorted(new_kinds)}, the fitted one "
            f"{sorted(kinds)}: compile it with the fitted optimizer's options (use_ema, "
            "gradient_accumulation_steps, amsgrad, ...).", optimizer=type(new).__name__)
    _copy_globals(old_global, new_global, type(old).__name__)
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


def _copy_globals(old, new, name):
    """Copy the optimizer's variables that are no slot (the step count, Nadam's product), in order.

    In order, not by name: a variable Keras names itself (``variable_3``) is
    named anew in each optimizer. The learning rate is left as compiled.
    """
    old = [(n, v) for n, v in old if n != "learning_rate"]
    new = [(n, v) for n, v in new if n != "learning_rate"]
    for i, (n, variable) in enumerate(old):
        if i >= len(new) or tuple(new[i][1].shape) != tuple(variable.shape):
            raise ArgumentError(f"{{optimizer}}'s variable {n!r} of shape {tuple(variable.shape)} "
                                "is not a slot of one weight, so it cannot be carried to the "
                                "smaller model's.", optimizer=name)
        new[i][1].assign(variable)


def _slots(optimizer, weights):
    """``optimizer``'s variables: ``{(kind, id(weight)): slot}`` and ``[(name, global variable)]``.

    A slot is named ``<weight path, '/' as '_'>_<kind>`` and has its weight's
    shape (Keras' ``add_variable_from_reference``); the longest matching path
    wins, so ``conv_1`` is not taken for ``conv``. Two weights of one path
    (layers of one name in a model and a model nested in it) would share
    their slots' names: refused, as nothing tells their slots apart.
    """
    paths = [w.path for w in weights]
    shared = sorted({p for p in paths if paths.count(p) > 1})
    if shared:
        raise ArgumentError(f"{{optimizer}}: weights {shared} share their paths, so their slots "
                            "share names and cannot be told apart; give the layers unique names.",
                            optimizer=type(optimizer).__name__)
    prefixes = sorted(((w.path.replace("/", "_") + "_", w) for w in weights),
                      key=lambda pair: -len(pair[0]))
    slots, other = {}, []
    for variable in optimizer.variables:
        owner = next((pair for pair in prefixes if variable.name.startswith(pair[0])
                      and tuple(variable.shape) == tuple(pair[1].shape)), None)
        if owner is None:
            other.append((variable.name, variable))
        else:
            slots[(variable.name[len(owner[0]):], id(owner[1]))] = variable
    return slots, other


__all__ = ["carry_optimizer_state"]
