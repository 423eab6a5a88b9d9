"""The one replay of a functional graph's nodes, which every pass over them shares.

A pass over a Keras functional model (a rebuild at new widths, the walk
into channel groups, the fingerprint of a trace's wiring) visits each call
node once, inputs first, hands it what earlier nodes made of its input
tensors, and keeps what it makes of the node's outputs. :func:`replay`
owns that order and bookkeeping, as the one traversal of Keras'
``clone_model`` does for a clone and its injected ``clone_function``; each
pass injects only what it does with one node, and what a tensor's value
is to it: a new tensor, a channel descriptor, a hash.
"""

from __future__ import annotations

import keras


def topological_nodes(fn):
    """Nodes of functional ``fn``, inputs first (Keras' depths, the deepest first)."""
    for depth in sorted(fn._nodes_by_depth, reverse=True):
        yield from fn._nodes_by_depth[depth]


def replay(fn, values, call):
    """Replay functional ``fn`` node by node, each one after the nodes it reads from.

    Args:
        fn: a functional model (or any ``keras.Function``), whose nested
            models are single nodes; a pass that enters one replays its
            graph from within ``call``, with the same ``values`` if it likes.
        values: ``{id(KerasTensor): value}``; holds the value of each of
            ``fn.inputs`` and receives one for every tensor a node outputs.
        call: ``call(node, inputs) -> outputs``, run for each node but the
            ``InputLayer``'s: ``inputs`` are the values of the node's tensor
            arguments (``node.arguments.keras_tensors``, in order; see
            :func:`arguments` for the whole call), ``outputs`` one value per
            tensor of ``node.outputs``.

    Returns:
        The values of ``fn.outputs``, in order (``keras.tree.pack_sequence_as``
        with ``fn._outputs_struct`` gives them the model's output structure).
    """
    for node in topological_nodes(fn):
        if isinstance(node.operation, keras.layers.InputLayer):
            continue
        inputs = [values[id(t)] for t in node.arguments.keras_tensors]
        for t, value in zip(node.outputs, call(node, inputs)):
            values[id(t)] = value
    return [values[id(t)] for t in fn.outputs]


def arguments(node, inputs):
    """``(args, kwargs)`` of ``node``'s call, its tensor arguments replaced by ``inputs``.

    Non-tensor arguments (an ``axis``, a ``training`` flag) stay as recorded.
    """
    tensors = node.arguments.keras_tensors
    return node.arguments.fill_in({id(t): x for t, x in zip(tensors, inputs)})
