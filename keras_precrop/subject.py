"""The user's model as one call of the package sees it: walked once, and copied to a defined size.

A :class:`Subject` carries the model through one call (``kp.precrop`` plans
and applies with one walk; ``kp.compare`` plans every mode with it). A model
built with an undefined spatial size (``keras.Input((None, None, 3))``) is
planned on a copy at :data:`_PROBE_SIZE` where only parameters count
(:func:`probe_specs`, :func:`with_inputs`); ``GradualPruning`` makes the
same copy.
"""

from __future__ import annotations

import keras

from keras_precrop.budget import costs as _costs
from keras_precrop.errors import ArgumentError, UnsupportedModelError
from keras_precrop.graph.rebuild import layer_copy
from keras_precrop.graph.trace import calls_undone, input_specs, is_functional
from keras_precrop.graph.walker import example_shape, ignore_names, input_example

# The spatial size that stands in for an input's undefined one where only parameters count.
_PROBE_SIZE = 224


class Subject:
    """The user's model as one call of the package sees it: walked once, the walk handed down.

    ``kp.precrop`` plans and applies with one walk of the model (the
    rebuild, its check and the copy of weights read that walk; only the
    rebuilt model is walked once more), and ``kp.compare`` plans every mode
    with it. A subject lives for one call: nothing in the package keeps a
    model, its trace or its walk afterwards, so dropping the results frees
    the model. ``kp.plan`` and ``kp.apply_plan`` take one in place of the
    model.

    Attributes:
        model: the user's model.
    """

    def __init__(self, model):
        self.model = model
        self._defined = None  # the copy at a defined spatial size, once made
        self._profile = None  # ({(ignore, residual, attention) it serves}, the profile of the walk)

    @classmethod
    def of(cls, model):
        """``model`` if it is a subject already, else a new subject of it."""
        return model if isinstance(model, cls) else cls(model)

    def defined(self, macs_arguments):
        """The model, or a copy whose undefined spatial sizes are :data:`_PROBE_SIZE` (made once).

        Parameters do not depend on the spatial size, so a model built as
        ``keras.Input((None, None, 3))`` can be planned under parameter budgets
        on a copy with a defined size (its MACs are then those at that size).
        Budgets that count MACs or time need the model's own size.

        Args:
            macs_arguments: ``{name: value}`` of the arguments that need MACs or
                timing (``flops``, ``latency``, ...); those given are refused.
        """
        specs = probe_specs(self.model, macs_arguments)
        if specs is None:
            return self.model
        if self._defined is None:
            self._defined = with_inputs(self.model, specs)
        return self._defined

    def profile(self, ignore, residual, macs_arguments, attention="heads"):
        """The profile of the walk of :meth:`defined` (``profile.graph``), walked once per
        ``ignore``, ``residual`` and ``attention``.

        ``ignore="auto"`` is resolved here (:func:`~keras_precrop.budget.costs.resolve_ignore`;
        ``profile.ignore`` holds the names, ``profile.kept_whole`` why), and the walk serves the
        names it resolved to as well: ``apply_plan`` of a plan made with "auto" walks with them.
        """
        rules = (residual, attention)
        defined, key = self.defined(macs_arguments), (frozenset(ignore_names(ignore)), *rules)
        if self._profile is None or key not in self._profile[0]:
            prof = _costs.profile(defined, ignore=ignore, residual=residual, attention=attention)
            self._profile = {key, (frozenset(prof.ignore), *rules)}, prof
        return self._profile[1]


def probe_specs(model, macs_arguments):
    """``None`` for a model whose spatial sizes are defined, else its inputs at :data:`_PROBE_SIZE`.

    Raises:
        ArgumentError: for an undefined size under arguments that need MACs or time
            (see :meth:`Subject.defined`).
    """
    specs = input_specs(model)  # an unsupported model gets the walker's error here
    shapes = [shape for _, shape in specs]
    if all(None not in shape[1:] for shape in shapes):
        return None
    given = {k: v for k, v in macs_arguments.items() if v is not None}
    name, shape = next((name, shape) for name, shape in specs if None in shape[1:])
    dtype = next((str(t.dtype) for t in getattr(model, "inputs", None) or () if t.name == name), "float32")
    if given:
        raise ArgumentError(
            f"{' and '.join('{' + k + '}' for k in given)} need{'s' * (len(given) == 1)} MACs or "
            f"time, which depend on the sizes of the inputs (an image's height and width, a "
            f"sequence's length), but model {model.name!r} has input {name!r} of undefined shape "
            f"{shape}; build it on inputs of full shape, e.g. {input_example(name, shape, dtype)}, "
            "or give a parameter budget alone.", **given)
    if not is_functional(model):  # a copy at the probe size needs a functional graph
        full = (None,) + example_shape(shape)[1:]
        raise UnsupportedModelError(
            f"Subclassed model {model.name!r} has the undefined input shape "
            f"{shape}; build it with a full input shape, e.g. {input_example(name, shape, dtype)} "
            f"or model.build({full}).")
    return [(name, shape[:1] + tuple(_PROBE_SIZE if d is None else d for d in shape[1:]))
            for name, shape in specs]


def at_sizes_of(model, reference, share_layers=False):
    """``model`` on inputs of ``reference``'s sizes: itself where they already are, else
    :func:`with_inputs` of ``reference``'s specs (``kp.hub`` builds a homogeneous task from its
    config at the original's open sizes; a plan walked it at defined ones)."""
    specs = input_specs(reference)
    if [tuple(shape[1:]) for _, shape in input_specs(model)] == [tuple(shape[1:]) for _, shape in specs]:
        return model
    return with_inputs(model, specs, share_layers=share_layers)


def with_inputs(model, specs, share_layers=False):
    """Functional ``model`` on inputs of other spatial sizes (``(name, shape)`` in ``specs``; the
    inputs keep their dtypes).

    Args:
        model: a functional model.
        specs: the new inputs, as :func:`probe_specs` gives them.
        share_layers: ``False``: a fresh copy, new layers with new weights
            (``apply_plan`` copies the weights it needs). ``True``: a model that
            calls ``model``'s own layers, so its weights are ``model``'s
            (``GradualPruning`` masks them through it); the layers' call records
            are left as they were (as a trace leaves them), so ``model`` keeps
            no reference to the new one.
    """
    inputs = [keras.Input(shape[1:], name=name, dtype=tensor.dtype)
              for (name, shape), tensor in zip(specs, model.inputs, strict=True)]
    inputs = keras.tree.pack_sequence_as(model._inputs_struct, inputs)  # a dict of inputs stays one
    if share_layers:
        with calls_undone(model):
            return keras.models.clone_model(model, input_tensors=inputs, clone_function=lambda op: op)
    return keras.models.clone_model(model, input_tensors=inputs, clone_function=layer_copy)
