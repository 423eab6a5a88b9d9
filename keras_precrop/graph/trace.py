"""See through subclassed models and composite layers: trace them into one functional graph.

The walker reads functional graphs. A subclassed ``keras.Model``, or a layer
that holds sublayers and has no handler (a user's ``ResidualBlock``,
keras_hub's ``InvertedResidualBlock``), is one opaque node there. In Keras 3,
running a layer's ``call`` on symbolic ``KerasTensor`` inputs records every
sublayer call and every ``keras.ops`` call inside it as a node, and the nodes
reuse the sublayers themselves, so their variables are shared. This module
does that recursively: while a model is traced, ``__call__`` of each
composite layer's class is swapped for a function that runs the instance's
``call`` instead of adding a node for it, so composites inside composites
dissolve too. Layers with handlers stay atomic, as do ignored layers.

A composite's sublayers are named by their place: ``block1_conv1`` is the
sublayer ``conv1`` of the top-level layer ``block1``, and ``block1_add`` the
first ``keras.ops.add`` its ``call`` records. The layers' names live in
:attr:`Traced.names`, not on the layers: the user's model is left as it was
(its layers' names are changed while the traced graph is built, so that two
blocks' ``conv1`` do not clash, and restored afterwards). The walker reports
these names and the rebuild gives them to the new layers. The traced graph
calls the model's own layers once more, which in Keras records a call node on
each; those nodes are taken off the layers again when the trace ends (they
live on in the traced graph alone), so the model's nodes, config, outputs and
``get_layer(...).output`` stay as they were. Nothing is cached: each call of
the package traces once and hands the :class:`Traced` graph down.

A ``call`` that cannot run on symbolic tensors (a Python ``if`` on a tensor's
value, a ``tf.*`` or ``jax.numpy`` function on its inputs) is refused with the
layer's name and the ``ignore`` remedy; a trace never guesses.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import re
import warnings

import keras
from keras.src.backend.common import global_state
from keras.src.layers.layer import CallContext
from keras.src.ops.numpy import Reshape as _Reshape
from keras.src.utils.naming import to_snake_case

from keras_precrop.errors import UnsupportedLayerError, UnsupportedModelError
from keras_precrop.graph import handlers
from keras_precrop.graph import replay as _replay


@dataclasses.dataclass
class Traced:
    """A model as the walker reads it.

    One call of the package (``profile``, ``plan``, ``precrop``, ...) traces
    a model once and hands this down; nothing keeps it afterwards, and the
    model's own layers keep no reference to it (see :func:`calls_undone`).

    Attributes:
        functional: a Functional model whose nodes are layers the walker knows
            (or the model itself when nothing needed tracing).
        names: ``id(layer) -> name`` of every layer of a dissolved composite
            (``"block1_conv1"``); other layers keep their own names.
    """

    functional: keras.Model
    names: dict = dataclasses.field(default_factory=dict)
    _nested: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)

    def name(self, op):
        """The name the walker and the rebuild use for operation ``op``."""
        return self.names.get(id(op), op.name)

    def graph_of(self, model):
        """The functional graph of ``model``, a model nested in :attr:`functional`.

        Traced once per :class:`Traced` (a nested model kept whole by
        ``ignore`` may still hold composites), so the walk and the rebuild
        see the same tensors.
        """
        if id(model) not in self._nested:
            self._nested[id(model)] = traced(model).functional
        return self._nested[id(model)]


def traced(model, ignore=(), refused=None) -> Traced:
    """``model`` as a functional graph of layers the walker knows.

    A Functional or built Sequential model without composite layers is
    returned as it is; anything else is traced, afresh on each call: nothing
    is cached, since a cache would keep every model it saw alive. A caller
    traces once and hands the result down (the walk, the rebuild and the
    copy of weights must see the same tensors).

    Args:
        model: a Functional, Sequential or subclassed ``keras.Model``, built.
        ignore: names of layers to keep whole (an ignored composite is not
            dissolved; the walker then keeps its channels fixed).
        refused: a list that gains the refusal of every layer that cannot be
            traced (each then kept whole, as ``ignore`` would), so a caller
            names them all at once; without it they raise one error together.

    Raises:
        UnsupportedLayerError: layers that cannot be traced (all of them), when
            ``refused`` is not given.
    """
    ignore, collected = frozenset(ignore), []
    while True:
        try:
            result = _trace(model, ignore)
            break
        except UnsupportedLayerError as err:
            names = frozenset(err.arguments.get("ignore") or ())
            if not names or names <= ignore:  # keeping it whole is no remedy
                raise
            collected.append(err)
            ignore |= names
    collected = _outermost(collected, result)
    if refused is None and collected:
        raise UnsupportedLayerError.together(collected, model.name)
    if refused is not None:
        refused.extend(collected)
    return result


def _outermost(refusals, result):
    """The refusals whose layers are in the traced graph ``result``.

    A layer refused inside a composite that was refused later is no layer of
    the graph (the composite is kept whole), so ``ignore`` would not take its
    name: the composite's own refusal stands for it.
    """
    names = {result.name(op) for op in result.functional.operations}
    return [err for err in refusals if names & set(err.arguments["ignore"])]


def input_specs(model):
    """``(name, shape)`` of each input of ``model``, without tracing it.

    A subclassed model's one input has the shape it was built with.
    """
    fn = _graph_of(model)
    if fn is not None:
        return [(t.name, tuple(t.shape)) for t in fn.inputs]
    return [(_input_name(model), _built_shape(model))]


def _trace(model, ignore) -> Traced:
    """``model`` as one functional graph of its leaf layers, with each layer's name by place.

    A functional model without composite layers is its own graph; a subclassed
    model, or composites (nested layers that call others), are retraced with the
    composites dissolved into their sublayers, which keep the names their place
    gives them. A model whose ``call`` records another graph when training
    is refused (``_check_training_branches``).
    """
    fn = _graph_of(model)
    found = {}  # id -> (layer, name by place); dissolved composites in ``composites``
    composites = {}
    for op, name in _top_level(model, fn):
        if name != op.name:
            found[id(op)] = (op, name)
        _collect(op, name, ignore, found, composites)
    if fn is not None and not composites:
        return Traced(fn)
    if fn is None:
        composites[id(model)] = model
    names = {i: name for i, (_, name) in found.items()}
    base = dict(names)
    with calls_undone(model), _renamed(found, composites), _dissolving(composites, names):
        functional = _retrace(model, fn)
    _close_reshapes(functional, fn, names, (found, composites, model))
    _check_training_branches(model, fn, (found, composites, base), (functional, names))
    return Traced(functional, {i: name for i, name in names.items() if i not in composites})


def is_functional(model) -> bool:
    """Whether ``model`` is a Functional or Sequential model (a layer graph Keras can clone),
    not a subclassed one whose ``call`` is Python code."""
    return isinstance(model, keras.Sequential) or hasattr(model, "_nodes_by_depth")


def _graph_of(model):
    """The functional graph of a Functional or Sequential ``model``; ``None`` if subclassed."""
    if isinstance(model, keras.Sequential):
        fn = getattr(model, "_functional", None)
        if fn is None:
            raise UnsupportedModelError(
                f"Sequential model {model.name!r} is not built: give it an "
                "Input (keras.Input(shape)) as first layer or call it once.")
        return fn
    if is_functional(model):
        return model
    if not isinstance(model, keras.Model):
        raise UnsupportedModelError(
            f"{model!r} is not a keras.Model; profile, plan and precrop take a model.")
    return None


def _sublayers(layer):
    """The layers ``layer`` holds directly (attributes and lists of layers)."""
    return [s for s in layer._flatten_layers(include_self=False, recursive=False)
            if not isinstance(s, keras.layers.InputLayer)]


def _own_variables(layer):
    return list(layer._trainable_variables) + list(layer._non_trainable_variables)


def is_composite(op) -> bool:
    """Whether ``op`` is dissolved by a trace: a layer with no handler that
    holds sublayers and no variables of its own, or a nested model that
    contains such a layer or whose inputs leave a size undefined (a
    ``keras_hub`` image encoder built for any image size, inside a
    DeepLabV3 or RetinaNet backbone: dissolved, its layers see the sizes
    they are called on, which the MACs need). (A layer without sublayers and
    without a handler stays whole, and the walker refuses it by name.)

    Keras' own layers that hold sublayers (``Bidirectional``,
    ``TimeDistributed``, ``RNN``, ``MultiHeadAttention``) are not a user's
    composites: they stay whole, and their handler (or ``ignore``) says
    how their channels flow.

    (*) ``keras.layers.Identity`` dissolves too: keras_hub builds it with a
    ``DTypePolicy`` object, which its ``get_config`` cannot serialize (Keras
    3.15), so a rebuilt graph could not hold it.
    """
    if not isinstance(op, keras.layers.Layer) or isinstance(op, keras.layers.InputLayer):
        return False
    if type(op) is keras.layers.Identity:  # computes nothing; and may not serialize (*)
        return True
    if _is_keras_layer(op):  # Bidirectional, TimeDistributed, RNN, ...: not the user's code
        return False
    graph = _graph_of(op) if isinstance(op, keras.Model) else None
    if graph is not None:
        undefined = any(None in tuple(t.shape)[1:] for t in graph.inputs)
        return undefined or any(is_composite(s) for s in graph.operations)
    return handlers.handler_of(op) is None and not _own_variables(op) and bool(_sublayers(op))


def _is_keras_layer(op):
    """Whether ``op`` is one of Keras' own layers (not a model, not a user's subclass)."""
    return type(op).__module__.startswith("keras.") and not isinstance(op, keras.Model)


def _own_name(layer):
    """``layer``'s name, or its class's snake-case name where Keras generated it.

    Keras numbers automatic names across the process (the second instance of
    a model holds ``global_average_pooling2d_1``); naming such a layer by its
    class and its place in its owner (numbered by :func:`_unique`) makes
    every instance of an architecture name its layers alike, so a plan made
    on one applies to another.
    """
    auto = to_snake_case(type(layer).__name__)
    return auto if re.fullmatch(re.escape(auto) + r"(_\d+)?", layer.name) else layer.name


def _top_level(model, fn):
    """``(operation, name)`` of the top level of ``model``: a functional graph's
    operations by their own names, a subclassed model's sublayers by their place."""
    if fn is not None:
        return [(op, op.name) for op in fn.operations]
    layers = _sublayers(model)
    taken = {layer.name for layer in layers if _own_name(layer) == layer.name}
    return [(layer, layer.name if _own_name(layer) == layer.name else
             _unique(_own_name(layer), taken)) for layer in layers]


def _collect(op, name, ignore, found, composites):
    """Name ``op``'s sublayers by their place and gather the composites to dissolve."""
    if op.name in ignore or name in ignore or not is_composite(op):
        return
    composites[id(op)] = op
    found.setdefault(id(op), (op, name))
    taken = {n for _, n in found.values()}
    for sub in _sublayers(op):
        if id(sub) not in found:
            sub_name = _unique(_place_name(name, _own_name(sub)), taken)
            found[id(sub)] = (sub, sub_name)
            _collect(sub, sub_name, ignore, found, composites)


def _place_name(owner, name):
    """``block1_conv1`` for sublayer ``conv1`` of ``block1``; a name that already
    starts with its owner's (keras_hub's ``block_0_0_conv1``) is kept.

    (Not ``/``, which Keras forbids in names, nor ``.``, which PyTorch forbids
    in the variable paths made from them.)
    """
    return name if name.startswith(f"{owner}_") else f"{owner}_{name}"


def _unique(name, taken):
    base, i = name, 1
    while name in taken:
        name, i = f"{base}_{i}", i + 1
    taken.add(name)
    return name


@contextlib.contextmanager
def _renamed(found, composites):
    """Give the layers of dissolved composites their place names while the graph is built."""
    old = [(layer, layer.name) for i, (layer, _) in found.items() if i not in composites]
    for layer, _ in old:
        layer.name = found[id(layer)][1]
    try:
        yield
    finally:
        for layer, name in old:
            layer.name = name


@contextlib.contextmanager
def calls_undone(model):
    """Leave the operations of ``model`` with the call nodes they had before the trace.

    A trace calls the model's layers (and a functional model's ``keras.ops``
    operations) on new tensors, and Keras records each call as a node in the
    operation's ``_inbound_nodes`` and in the ``_outbound_nodes`` of the
    operations that fed it. The traced graph keeps its nodes in its own
    ``_nodes_by_depth`` and tensors' histories, which is all the walk, the
    rebuild and the copy of weights read; the model's lists get back what
    they held, after a trace that fails too, so the model keeps no reference
    to the trace (see ``keras/src/ops/node.py``).
    """
    saved = [(op, list(op._inbound_nodes), list(op._outbound_nodes))
             for op in _operations(model)]
    try:
        yield
    finally:
        for op, inbound, outbound in saved:
            op._inbound_nodes[:] = inbound
            op._outbound_nodes[:] = outbound


def _operations(model):
    """Every operation a trace of ``model`` may call: its layers, those of nested layers and
    models, and the ``keras.ops`` operations recorded in its functional graphs."""
    found = {}
    for layer in model._flatten_layers(include_self=True, recursive=True):
        found[id(layer)] = layer
        graph = getattr(layer, "_functional", None) if isinstance(layer, keras.Sequential) else layer
        for op in graph.operations if graph is not None and is_functional(graph) else ():
            found.setdefault(id(op), op)
    return list(found.values())


@contextlib.contextmanager
def _dissolving(composites, names):
    """Swap ``__call__`` of the composites' classes for one that runs ``call`` in place.

    ``names`` (``id -> name by place``) gains the ``keras.ops`` operations
    each composite's ``call`` records.
    """
    classes = {type(op) for op in composites.values()}
    original = {cls: cls.__call__ for cls in classes}

    def call_in_place(self, *args, **kwargs):
        if id(self) not in composites:
            return original[type(self)](self, *args, **kwargs)
        outputs = _run_call(self, names.get(id(self), self.name), args, kwargs)
        _name_ops(outputs, (args, kwargs), names.get(id(self)), names)
        return outputs

    with _class_attributes(classes, "__call__", lambda cls: call_in_place):
        yield


def _run_call(layer, name, args, kwargs):
    """``layer.call(*args, **kwargs)`` on symbolic tensors, or a clear refusal.

    A ``call`` that takes ``training`` and is not given it gets the mode of
    the trace (see :func:`_training`), as Keras passes an outer call's
    ``training`` down to the layers it calls.
    """
    call = type(layer).call
    signature = inspect.signature(call).parameters
    context = global_state.get_global_attribute("current_call_ctx")
    mode = None if context is None else context.get_value("training")
    if "training" in signature and kwargs.get("training") is None and mode is not None:
        kwargs = {**kwargs, "training": mode}
    parameters = signature.values()
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        accepted = {p.name for p in parameters}
        kwargs = {k: v for k, v in kwargs.items() if k in accepted}
    try:
        with warnings.catch_warnings():
            # A nested model built on a list of one input, called on a tensor:
            # Keras unpacks the tensor, but warns when it is symbolic.
            warnings.filterwarnings("ignore", "The structure of `inputs` doesn't match")
            return call(layer, *args, **kwargs)
    except UnsupportedLayerError:
        raise
    except Exception as e:  # any failure of a symbolic run: refuse, never guess
        if _python_branch(e):
            raise UnsupportedLayerError(
                f"Layer {name!r} of class {type(layer).__name__} branches in Python on a "
                f"tensor's value in its call() ({_first_line(e)}): an `if`, `while`, `and` or "
                "`or` on a tensor cannot be recorded in any graph, so the layer can be neither "
                "traced nor kept whole (Keras too runs call() on symbolic tensors to save, "
                "compile or build a model). Write the branch with keras.ops.where (both sides "
                "computed) or keras.ops.cond.") from e
        raise UnsupportedLayerError(
            f"Layer {name!r} of class {type(layer).__name__} cannot be traced into a "
            f"functional graph: its call() failed on symbolic tensors ({type(e).__name__}: "
            f"{_first_line(e)}). Layers are traced by running call() on keras.Input tensors, so call() "
            "may use Keras layers and keras.ops only, with no Python branch on a tensor's "
            "value (a `tf.*` or `jax.numpy` function on its inputs fails too). Keep the "
            "layer whole with {ignore} (its channels then stay fixed) or describe it with "
            f"keras_precrop.register_handler({type(layer).__name__}, ...).",
            ignore=[name]) from e


def _name_ops(outputs, inputs, name, names):
    """Name the ``keras.ops`` operations between a composite's inputs and outputs by place.

    An operation's recorded name carries a global counter (``transpose_7``),
    which differs from one trace to the next; ``block1_transpose`` (a
    numbered suffix for a later one of the same kind in the block) names the
    same operation in every trace, so ``ignore`` can name it. The operations
    are the trace's own (the user's model never holds them), so they take the
    name, and a rebuild that replays them keeps it. ``name`` is the
    composite's name by place, ``None`` for the traced model itself.
    """
    stop = {id(t) for t in keras.tree.flatten(inputs) if isinstance(t, keras.KerasTensor)}
    stack = [t for t in keras.tree.flatten(outputs) if isinstance(t, keras.KerasTensor)]
    seen, found = set(), {}
    while stack:
        t = stack.pop()
        if id(t) in stop or id(t) in seen:
            continue
        seen.add(id(t))
        op, node_index, _ = t._keras_history
        if id(op) not in names and not isinstance(op, keras.layers.Layer):
            found[id(op)] = op
        stack.extend(op._inbound_nodes[node_index].input_tensors)
    taken = set(names.values())
    for op in sorted(found.values(), key=_creation_order):
        kind = to_snake_case(type(op).__name__)
        op.name = names[id(op)] = _unique(_place_name(name, kind) if name else kind, taken)


def _creation_order(op):
    """The counter Keras appended to an operation's automatic name (``transpose_7``: 7)."""
    suffix = re.search(r"_(\d+)$", op.name)
    return int(suffix.group(1)) if suffix else 0


def _python_branch(error):
    """Whether ``error`` (or one it was raised from) is a tensor used as a Python ``bool``."""
    signs = ("cannot be used as a boolean", "as a Python `bool`", "TracerBoolConversion",
             "OperatorNotAllowedInGraph", "Boolean value of Tensor")
    while error is not None:
        if any(sign in f"{type(error).__name__}: {error}" for sign in signs):
            return True
        error = error.__cause__ or error.__context__
    return False


def _first_line(error):
    lines = [line for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else ""


def _retrace(model, fn):
    """Run the model on fresh inputs while composites dissolve; a new Functional."""
    if fn is not None:
        return keras.models.clone_model(fn, clone_function=lambda op: op)
    shape = _built_shape(model)
    x = keras.Input(shape[1:], name=_input_name(model))
    return keras.Model(x, model(x), name=model.name)


def _close_reshapes(functional, fn, names, owners):
    """Make the reshapes a dissolved ``call`` recorded replayable, or refuse their composite.

    A ``call`` that reshapes by sizes it reads from a symbolic tensor
    (``B = ops.shape(x)[0]``; ``ops.reshape(x, (B, H, W, C))``) records the
    open batch size as ``None``, which no backend reshapes by: the traced
    graph would fail on data. One open size is what ``-1`` means, and becomes
    ``-1``. Two or more (``(B, -1, C)``) leave the sizes undetermined (which
    tensor's batch ``B`` was is not recorded), so the composite whose
    ``call`` holds the reshape is refused by name and kept whole.

    Args:
        functional, fn: the traced graph and the model's own (``None``:
            subclassed); the model's own operations are left as they are.
        names: ``id -> name by place`` of the traced operations.
        owners: ``(found, composites, model)`` of the trace (see :func:`_owner`).
    """
    own = {id(op) for op in fn.operations} if fn is not None else set()
    for op in functional.operations:
        newshape = getattr(op, "newshape", None)
        if id(op) in own or not isinstance(op, _Reshape) or None not in newshape:
            continue
        if sum(d is None or d == -1 for d in newshape) == 1:
            op.newshape = tuple(-1 if d is None else d for d in newshape)
            continue
        name = names.get(id(op), op.name)
        owner = _owner(name, *owners)
        why = (f"reshapes sizes it leaves open ({name!r}: to {tuple(newshape)}, sizes "
               "read with ops.shape() on a symbolic tensor, whose batch size is None), so "
               "its trace cannot be replayed")
        if owner is None:
            raise UnsupportedModelError(f"Model {owners[2].name!r} {why}. Reshape with one "
                                        "open size (-1) or with sizes known in advance.")
        layer = next(layer for layer, n in owners[0].values() if n == owner)
        raise UnsupportedLayerError(
            f"Layer {owner!r} of class {type(layer).__name__} {why}. Keep the layer whole with "
            f"{{ignore}} (its channels then stay fixed) or describe it with "
            f"keras_precrop.register_handler({type(layer).__name__}, ...).", ignore=[owner])


@contextlib.contextmanager
def _training(mode):
    """Call layers as ``model(x, training=mode)`` does: Keras' call context holds ``mode``."""
    previous = global_state.get_global_attribute("current_call_ctx")
    context = CallContext(entry_layer=None)  # no layer ends it: restored below
    context.set_value("training", mode)
    global_state.set_global_attribute("current_call_ctx", context)
    try:
        yield
    finally:
        global_state.set_global_attribute("current_call_ctx", previous)


@contextlib.contextmanager
def _specs_without_training(model):
    """Let layers whose ``compute_output_spec`` takes no ``training`` be called when training.

    Keras passes a training call's ``training`` on to a layer's symbolic
    call, ``compute_output_spec(x, training=True)``; a layer that overrides
    it without that argument (keras_hub 0.32's ``DINOV2Embedding``) raises
    ``TypeError`` there, though it computes the same shapes in either mode.
    While the graph is traced for training, such classes get a
    ``compute_output_spec`` that drops ``training``; the classes get theirs
    back afterwards.
    """
    classes = {type(layer) for layer in model._flatten_layers(include_self=True, recursive=True)
               if "training" in inspect.signature(type(layer).call).parameters
               and not _takes(type(layer).compute_output_spec, "training")}

    def spec_without_training(cls):
        original = cls.compute_output_spec
        return lambda self, *args, training=None, **kwargs: original(self, *args, **kwargs)

    with _class_attributes(classes, "compute_output_spec", spec_without_training):
        yield


@contextlib.contextmanager
def _class_attributes(classes, name, make):
    """Set attribute ``name`` of each of ``classes`` to ``make(cls)`` for the block; each class
    gets its own back after it (or none, where it inherited the attribute)."""
    saved = {cls: cls.__dict__.get(name) for cls in classes}
    for cls in classes:
        setattr(cls, name, make(cls))
    try:
        yield
    finally:
        for cls, method in saved.items():
            if method is None:
                delattr(cls, name)
            else:
                setattr(cls, name, method)


def _takes(function, name):
    """Whether ``function`` takes the keyword argument ``name`` (by name or as ``**kwargs``)."""
    parameters = inspect.signature(function).parameters.values()
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


def _check_training_branches(model, fn, collected, inference):
    """Refuse a model whose ``call`` code records another graph when training.

    The graph is traced as Keras calls a model for inference (``training``
    left ``None``, which layers treat as ``False``); a Python branch on
    ``training`` (``if training: x = self.noise(x)``) is then not in it, and
    the pruned model would lack it. So the model is traced once more with
    ``training=True``, and the two graphs (their layers and operations and
    how they connect) must agree. Layers that behave differently in training
    by themselves (``Dropout``, ``GaussianNoise``, ``BatchNormalization``)
    are called in both and keep that behaviour in the rebuilt model.

    Args:
        model, fn: the model and its functional graph (``None``: subclassed).
        collected: ``(found, composites, names)`` of the trace before it ran.
        inference: ``(functional, names)``: the traced graph and its names.
    """
    found, composites, base = collected
    names = dict(base)
    with (calls_undone(model), _renamed(found, composites), _dissolving(composites, names),
          _training(True), _specs_without_training(model)):
        training = _retrace(model, fn)
    (ops, wiring), (t_ops, t_wiring) = _structure(*inference), _structure(training, names)
    if wiring == t_wiring:
        return
    differ = [(*(t_ops.get(k) or ops[k]), k in t_ops) for k in {*ops} ^ {*t_ops}]
    differ = [d for d in differ if d[1]] or differ  # (name, is a layer, only when training)
    where = "only when training" if all(d[2] for d in differ) else "differently when training"
    called = ", ".join(sorted(repr(d[0]) for d in differ)) or "its layers (wired otherwise)"
    owners = sorted({_owner(d[0], found, composites, model) or "" for d in differ or [("",)]})
    fix = ("Call such layers unconditionally (Dropout, GaussianNoise and the other noise "
           "layers already do nothing outside training, and keep that in the pruned model)")
    if "" in owners:
        raise UnsupportedModelError(
            f"Model {model.name!r} of class {type(model).__name__} calls {called} {where}: its "
            "call() branches on `training`, and a trace records one graph, so the pruned model "
            f"would lose that branch. {fix}.")
    raise UnsupportedLayerError(
        f"Layer(s) {', '.join(map(repr, owners))} call {called} {where}: their call() branches "
        "on `training`, and a trace records one graph, so the pruned model would lose that "
        f"branch. {fix}, or keep them whole with {{ignore}} (their channels then stay fixed).",
        ignore=owners)


def _structure(functional, names):
    """``({key: (name, is a layer)}, outputs)``: a traced graph's operations and wiring.

    An operation's key is its name by place (a layer of a dissolved composite,
    an operation one records), else its class and rank among the operations of
    its class (the model's own layers, and a layer a ``call`` creates anew on
    every call, as keras_hub's ASPP does its ``Resizing``), so two traces of
    one model give equal keys; ``outputs`` hashes how every
    output is computed from the inputs, so the two are equal when the graphs are.
    """
    ops, created = {}, {}

    def call(node, inputs):
        op = node.operation
        key = names.get(id(op))
        if key is None:  # by class and order: a layer a call creates anew differs by object
            kind = type(op).__name__
            created[kind] = created.get(kind, -1) + 1
            key = (kind, created[kind])
        ops[key] = (names.get(id(op), op.name), isinstance(op, keras.layers.Layer))
        return [hash(((key, tuple(inputs)), i)) for i in range(len(node.outputs))]

    keys = {id(t): ("input", i) for i, t in enumerate(functional.inputs)}
    return ops, tuple(_replay.replay(functional, keys, call))


def _owner(name, found, composites, model):
    """The innermost dissolved composite whose ``call`` holds the layer or op named ``name``
    (by place, ``block1_noise``), or ``None`` for the model's own ``call``."""
    owners = [n for i, (_, n) in found.items() if i in composites and i != id(model)
              and name.startswith(f"{n}_")]
    return max(owners, key=len, default=None)


def _input_name(model):
    """The name of a subclassed model's traced input (alike for every instance of its class)."""
    return f"{_own_name(model)}_input"


def _built_shape(model):
    """The input shape a subclassed model was built with (its one input)."""
    shapes = getattr(model, "_build_shapes_dict", None) or {}
    if model.built and not shapes:
        raise UnsupportedModelError(
            f"Subclassed model {model.name!r} of class {type(model).__name__} is built, but Keras "
            "recorded no input shape for it: when it was first called, its call() (or a layer's "
            "call() inside it) could not run on symbolic tensors, so Keras built it eagerly. "
            "It is traced by running call() on a keras.Input, which fails the same way: most "
            "often a Python `if` on a tensor's value (`if ops.mean(x) > 0:`), or a `tf.*` or "
            "`jax.numpy` function on its inputs. Write such a branch with keras.ops.where or "
            "keras.ops.cond, and give the model a build() method or call "
            "model.build((None, 32, 32, 3)); the trace then names the layer.")
    if not model.built or len(shapes) != 1:
        raise UnsupportedModelError(
            f"Subclassed model {model.name!r} of class {type(model).__name__} "
            + ("is not built" if not model.built or not shapes else
               f"takes {len(shapes)} inputs ({', '.join(shapes)})")
            + ": it is traced into a functional graph from the input shape it was built "
            "with, so build it on one input first, e.g. model(x) on a batch or "
            "model.build((None, 32, 32, 3)).")
    return tuple(next(iter(shapes.values())))
