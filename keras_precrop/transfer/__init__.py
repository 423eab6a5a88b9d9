"""The transfer wing: carrying a trained model's weights into its pruned (or widened) rebuild.

* ``importance``: how much each channel matters (``"l1"``, ``"l2"``,
  ``"taylor"``, ``"random"``), summed over every layer of its coupled group.
* ``selection``: which channels each width variable keeps; residual streams
  (and other prefix families) are permuted, best channels first.
* ``carry``: follows the kept channels through the rebuilt graph and copies
  the slices of every weight (``Handler.channel_axes`` names the axes).
* ``flow``: per-tensor channel labels, propagated call by call.

It reads the graph wing only; ``planning`` calls it for ``weights="keep"``.
"""

from keras_precrop.transfer.carry import carry_weights, check_options
from keras_precrop.transfer.importance import IMPORTANCE

__all__ = ["IMPORTANCE", "carry_weights", "check_options"]
