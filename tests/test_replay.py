"""The shared replay of a functional graph (keras_precrop/graph/replay.py), against Keras.

Replaying a model with a callable that runs each node's own operation on
the values replay hands it must give what ``model(x)`` gives, on a graph
with the cases a pass meets: a shared layer, a nested model called twice,
``keras.ops`` nodes with non-tensor arguments, a node with several outputs,
two inputs and structured (dict) outputs.
"""

import keras
import numpy as np

from keras_precrop.graph import replay as _replay

L = keras.layers


def _model():
    a, b = keras.Input((8,), name="a"), keras.Input((8,), name="b")
    shared = L.Dense(6, name="shared")
    inner_in = keras.Input((6,))
    inner = keras.Model(inner_in, L.Dense(4, activation="relu")(inner_in), name="inner")
    x, y = shared(a), shared(b)  # one layer, two calls
    both = keras.ops.concatenate([inner(x), inner(y)], axis=-1)  # nested model twice, an axis
    left, right = keras.ops.split(both, 2, axis=-1)  # one node, two outputs
    mixed = keras.ops.transpose(keras.ops.stack([left, right * 2.0], axis=1), (0, 2, 1))
    head = L.Dense(3, name="head")(L.Flatten()(mixed))
    return keras.Model([a, b], {"z": head, "sum": L.Add()([left, right]), "a": a})


def _run(node, inputs):
    """The identity pass: a node's own operation on the values replay resolved."""
    args, kwargs = _replay.arguments(node, inputs)
    return keras.tree.flatten(node.operation(*args, **kwargs))


def test_replay_with_the_nodes_own_operations_is_the_model():
    model = _model()
    xs = [np.random.default_rng(i).standard_normal((5, 8)).astype("float32") for i in (0, 1)]
    values = {id(t): x for t, x in zip(model.inputs, xs)}
    outputs = _replay.replay(model, values, _run)
    expected = model(xs)
    assert len(outputs) == len(model.outputs) == 3
    got = keras.tree.pack_sequence_as(model._outputs_struct, outputs)
    assert set(got) == set(expected)
    for key in expected:
        np.testing.assert_allclose(keras.ops.convert_to_numpy(got[key]),
                                   keras.ops.convert_to_numpy(expected[key]), rtol=1e-5, atol=1e-6)
    assert all(id(t) in values for t in model.outputs)


def test_each_node_is_replayed_once_after_the_nodes_it_reads():
    model = _model()
    seen, order = set(), []

    def call(node, inputs):
        assert all(v in seen for v in inputs)  # every input was produced before
        order.append(node.operation.name)
        names = [f"{node.operation.name}:{i}" for i in range(len(node.outputs))]
        seen.update(names)
        return names

    seen.update(t.name for t in model.inputs)
    values = {id(t): t.name for t in model.inputs}
    outputs = _replay.replay(model, values, call)
    # The input layers are no calls; the shared layer and the nested model are called twice.
    assert sorted(order) == sorted(op.name for op in model.operations if not isinstance(op, L.InputLayer)
                                   for _ in op._inbound_nodes)
    assert order.count("shared") == order.count("inner") == 2
    assert outputs == [values[id(t)] for t in model.outputs]
