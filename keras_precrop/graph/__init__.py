"""The graph wing: what a model's channels are, and how to rebuild it with other widths.

* ``channels``: the vocabulary (segments, groups, width variables, views)
  and the :class:`~keras_precrop.graph.channels.WalkContext` handlers write to.
* ``handlers``: the one table of layer classes: how channels flow through
  each, what it costs, how its config changes with widths (``handler_base``:
  the contract every rule implements; ``shape_handlers``: reshapes, splits, pads).
* ``replay``: the one node-by-node replay of a functional graph, which the
  walker, the rebuild and the trace call with their own per-node callable.
* ``walker``: walks a functional model into a :class:`ModelGraph`.
* ``rebuild``: builds a model of the same graph at new widths.
* ``layers``: the layers a rebuild inserts (``ChannelSlice``, ``PrefixAdd``).

Nothing here knows budgets, solvers or timing: those wings read the graph.
"""

from keras_precrop.graph.channels import channels_width, input_shape, output_shape
from keras_precrop.graph.handlers import Handler, WeightSpec, register_handler
from keras_precrop.graph.layers import ChannelSlice, PrefixAdd
from keras_precrop.graph.rebuild import rebuild
from keras_precrop.graph.walker import ModelGraph, walk

__all__ = ["ChannelSlice", "Handler", "ModelGraph", "PrefixAdd", "WeightSpec", "channels_width",
           "input_shape", "output_shape", "rebuild", "register_handler", "walk"]
