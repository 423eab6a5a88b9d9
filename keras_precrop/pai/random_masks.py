"""Random pruning to given per-layer densities at weight, filter or channel granularity.

This is the PreCrop paper's test of its theorem: accuracy depends on the
layer-wise densities, not on the granularity of pruning. For each weight the
number of kept units is ``round(density * units)``, so every granularity hits
the requested density within one unit:

* ``"weight"``: single weights; exactly ``round(p * n)`` kept.
* ``"filter"``: whole ``k x k`` kernel slices (one input-output channel pair;
  for a depthwise kernel one channel-multiplier pair, for a Dense kernel a
  single weight).
* ``"channel"``: whole input and output channels, about ``sqrt(p)`` of each
  (the masked equivalent of PreCrop's channel pruning). The kept channels are
  the highest of a random priority shared by every tensor of a channel group
  (see :func:`connectivity.channel_priorities`), so the output channels a
  layer keeps are the input channels its successor keeps.

Biases and BatchNorm vectors are pruned entry by entry (an entry is a
channel); at channel granularity a bias follows its layer's output channels.
"""

import math

import numpy as np

from keras_precrop.pai import common, connectivity

GRANULARITIES = ("weight", "filter", "channel")


def _resolve_densities(model, layer_densities):
    """``{path: density}`` for every weight to mask (prunable ones default to 1)."""
    weights = common.named_weights(model)
    out = {p: 1.0 for p in common.prunable_weights(model)}
    if isinstance(layer_densities, dict):
        unknown = [p for p in layer_densities if p not in weights]
        if unknown:
            raise ValueError(
                f"layer_densities names weights that model {model.name!r} has no "
                f"maskable weight for: {unknown[:5]}; valid names look like {list(out)[:3]}."
            )
        out.update(layer_densities)
    else:
        out = {p: layer_densities for p in out}
    return {p: common.check_density(d, f"density of {p!r}") for p, d in out.items()}, weights


def _weight_level(shape, density, rng, path):
    size = math.prod(shape)
    mask = np.zeros(size, bool)
    mask[rng.choice(size, common.num_kept(density, size, repr(path)), replace=False)] = True
    return mask.reshape(shape)


def _filter_level(shape, spec, density, rng, path):
    units = np.zeros((shape[spec.in_axis], shape[spec.out_axis]), bool)
    keep = common.num_kept(density, units.size, repr(path))
    units.ravel()[rng.choice(units.size, keep, replace=False)] = True
    return np.broadcast_to(common.spread(spec, units, len(shape)), shape)


def _channel_counts(density, n_in, n_out, path):
    """Kept (input, output) channel counts with ``a * b`` closest to ``density * n_in * n_out``.

    ``b`` is ``sqrt(density)`` of the outputs, ``a`` then matches the target
    and ``b`` is refitted to ``a``, so ``|a * b - target| <= max(a, b) / 2``
    unless a count hits its bounds.
    """
    target = density * n_in * n_out
    if target < 0.5:
        raise ValueError(
            f"density {density!r} keeps no channel pair of the {n_in} x {n_out} in {path!r}."
        )
    b = min(max(round(math.sqrt(density) * n_out), 1), n_out)
    a = min(max(round(target / b), 1), n_in)
    b = min(max(round(target / a), 1), n_out)
    return a, b


def _grouped_channels(a, n_out, groups, density, priorities, path):
    """Kept (input within group, output) pairs of a grouped kernel.

    Every group keeps the same number of its own highest-priority inputs and
    outputs (a narrower grouped conv, as PreCrop builds it); with one input
    per group (depthwise-style) whole groups are kept or dropped.
    """
    p_in, p_out = priorities
    b = n_out // groups
    if a == 1:
        rows = common.top_k(p_in, common.num_kept(density, groups, repr(path)))
        return np.repeat(rows, b)[None, :]
    keep_a, keep_b = _channel_counts(density, a, b, path)
    units = np.zeros((a, n_out), bool)
    for j in range(groups):
        ins = common.top_k(p_in[j * a:(j + 1) * a], keep_a)
        outs = common.top_k(p_out[j * b:(j + 1) * b], keep_b)
        units[:, j * b:(j + 1) * b] = ins[:, None] & outs[None, :]
    return units


def _channel_level(shape, spec, density, priorities, path):
    """A mask of whole channels of one weight: the top input and output channels by ``priorities``."""
    p_in, p_out = priorities
    if spec.kind in ("bias", "scale"):
        return common.top_k(p_out, common.num_kept(density, shape[0], repr(path)))
    if spec.kind == "depthwise":
        rows = common.top_k(p_in, common.num_kept(density, shape[spec.in_axis], repr(path)))
        units = np.repeat(rows[:, None], shape[spec.out_axis], axis=1)
    elif spec.groups > 1:
        units = _grouped_channels(shape[spec.in_axis], shape[spec.out_axis], spec.groups,
                                  density, priorities, path)
    else:
        a, b = _channel_counts(density, shape[spec.in_axis], shape[spec.out_axis], path)
        units = common.top_k(p_in, a)[:, None] & common.top_k(p_out, b)[None, :]
    return np.broadcast_to(common.spread(spec, units, len(shape)), shape)


def random_masks(model, layer_densities, granularity="weight", remove_detached=False, seed=None):
    """Random masks with the given per-layer densities at a given granularity.

    Args:
        model: a built Keras model (not modified).
        layer_densities: ``{weight path: density}`` (e.g. from
            :func:`layer_densities` of SynFlow's masks); prunable weights not
            listed stay dense, and biases/BN weights may be listed too. A
            single number applies to every prunable weight.
        granularity: ``"weight"``, ``"filter"`` or ``"channel"``.
        remove_detached: then drop the weights no longer joining input to
            output (:func:`remove_detached`), as the paper does for weight and
            filter pruning; densities then fall below the requested ones.
        seed: seed of the numpy generator; the same seed gives the same masks.

    Returns:
        ``{weight path: float32 0/1 array}`` for every prunable or listed weight.

    Raises:
        ValueError: for an unknown granularity or weight name, a density
            outside (0, 1], a density that keeps no unit, or (channel
            granularity, ``remove_detached``) a model the connectivity
            analysis does not support.
    """
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity must be one of {GRANULARITIES}, got {granularity!r}.")
    densities, weights = _resolve_densities(model, layer_densities)
    rng = np.random.default_rng(seed)
    priorities = connectivity.channel_priorities(model, rng) if granularity == "channel" else {}
    masks = {}
    for path, density in densities.items():
        _, var, spec = weights[path]
        shape = tuple(var.shape)
        vector = spec.kind in ("bias", "scale")
        if granularity == "channel" and path in priorities:
            mask = _channel_level(shape, spec, density, priorities[path], path)
        elif granularity == "weight" or vector:
            mask = _weight_level(shape, density, rng, path)
        else:
            mask = _filter_level(shape, spec, density, rng, path)
        masks[path] = np.asarray(mask, np.float32)
    if remove_detached:
        masks = connectivity.remove_detached(model, masks)
    return masks
