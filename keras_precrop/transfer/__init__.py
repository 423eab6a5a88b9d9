"""The transfer wing: carrying a trained model's weights into its pruned (or widened) rebuild.

* ``criteria``: the one table of channel rankings (``"l1"``, ``"l2"``,
  ``"taylor"``, ``"bn_scale"``, ``"random"`` and the user's,
  ``kp.register_importance``), with what each needs; ``taylor``: the loss
  gradients the rankings that need data take.
* ``importance``: how much each channel matters by a ranking, summed over
  every layer of its coupled group.
* ``selection``: which channels each width variable keeps; residual streams
  (and other prefix families) are permuted, best channels first.
* ``refit``: ``refit=True``'s least-squares refit of every linear projection
  of the pruned model to the original's outputs on calibration data.
* ``carry``: follows the kept channels through the rebuilt graph and copies
  the slices of every weight (``Handler.channel_axes`` names the axes).
* ``flow``: per-tensor channel labels, propagated call by call.

It reads the graph wing, and the training wing for Taylor's gradients;
``planning`` calls it for ``weights="keep"``. Importing it loads only the
table (the command line reads it for ``--help``, without Keras or NumPy);
``carry_weights`` and ``check_options`` load on first use.
"""

from keras_precrop.transfer.criteria import IMPORTANCE

__all__ = ["IMPORTANCE", "RefitWarning", "carry_weights", "check_options", "refit_projections"]


def __getattr__(name):
    """``carry_weights``, ``check_options``, ``refit_projections`` and ``RefitWarning``, imported
    on first use (they load Keras)."""
    if name in ("carry_weights", "check_options"):
        from keras_precrop.transfer import carry  # noqa: PLC0415  (Keras: not for --help)

        return getattr(carry, name)
    if name in ("refit_projections", "RefitWarning"):
        from keras_precrop.transfer import refit  # noqa: PLC0415  (Keras: not for --help)

        return getattr(refit, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
