"""Figure 4's proxy: the SynFlow score of each way to realize SynExp's layer densities, no training.

The paper's theorem says the expected SynFlow score of a randomly pruned
network depends only on its layer densities, not on the granularity of
pruning, and reads this as "the accuracy does not either". Figure 4 trains
four ways to realize the SynExp densities at ``--params`` (random masks of
single weights, of k x k filters and of whole channels, and PreCrop's
``paper`` rule); this script measures the score itself for the same four ways
(and the dense model), over ``--seeds`` fresh initializations (seeds 0, 1,
...; the masks' seed is the model's):

* **score**: ``S = sum |w * dR/dw|`` over every prunable weight, from
  ``pai.synflow_scores`` in float64 (the linearized network on an all-ones
  input; masked weights are zero).
* **expected for weight and filter masks**: with the initial weights fixed,
  every path of the linearized network holds at most one weight per layer,
  and a random mask keeps a weight of layer l with probability p_l (its
  realized density), independently across layers; so the masks' mean score is
  exactly the score of the dense network with layer l's kernel scaled by
  p_l. The ratio of each sample to it tests that premise of the theorem.

Writes ``experiments/results/thm_score.json`` (``report.py`` renders it).

Usage::

    python experiments/thm_score.py [--seeds 8] [--params 0.1] [--model resnet20]
"""

import argparse
import json
import os
import pathlib

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_precrop as kp  # noqa: E402
from keras_precrop import pai  # noqa: E402

OUT = pathlib.Path(__file__).resolve().parent / "results" / "thm_score.json"
GRANULARITIES = ("weight", "filter", "channel")


def score(model, masks=None):
    """SynFlow's total score ``sum |w * dR/dw|`` of ``model`` under ``masks`` (float64)."""
    return float(sum(s.sum() for s in pai.synflow_scores(model, masks, dtype="float64").values()))


def expected_score(model, densities):
    """The mean score of ``model`` under random masks of these per-kernel ``densities`` (fixed weights).

    Every path of the linearized network holds at most one weight per layer
    and masks of different layers are independent, so each path's expected
    flow is its dense flow times the densities of its layers: the score of a
    copy whose kernels are scaled by their densities.
    """
    scaled = keras.models.clone_model(model)
    scaled.set_weights(model.get_weights())
    for path, variable in pai.prunable_weights(scaled).items():
        variable.assign(variable.numpy() * densities.get(path, 1.0))
    return score(scaled)


def ways(model, params, seed):
    """Figure 4's ways at ``params`` on ``model``'s initial weights: ``{way: score}`` of the dense
    model, of random masks (seeded by ``seed``) at each granularity and of PreCrop's paper rule, and
    ``{granularity: expected score}`` of the weight and filter masks at their realized densities."""
    solved = kp.plan(model, params=params, mode="paper").solver["layer_densities_solved"]
    targets = {f"{name}/kernel": density for name, density in solved.items()}
    scores, expected = {"dense": score(model)}, {}
    for granularity in GRANULARITIES:
        masks = pai.random_masks(model, targets, granularity, seed=seed)
        scores[granularity] = score(model, masks)
        if granularity != "channel":  # channel masks couple the layers a path crosses
            expected[granularity] = expected_score(model, pai.layer_densities(masks))
    scores["precrop (paper)"] = score(kp.precrop(model, params=params, mode="paper"))
    return scores, expected


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=8, help="initializations (seeds 0 .. N-1)")
    parser.add_argument("--params", type=float, default=0.1, help="the budget whose SynExp densities to use")
    parser.add_argument("--model", default="resnet20")
    parser.add_argument("--out", type=pathlib.Path, default=OUT)
    args = parser.parse_args()
    results = {"model": args.model, "params": args.params, "seeds": args.seeds, "scores": {}, "expected": {}}
    for seed in range(args.seeds):
        keras.utils.set_random_seed(seed)
        scores, expected = ways(kp.models.get(args.model), args.params, seed)
        for key, values in (("scores", scores), ("expected", expected)):
            for way, value in values.items():
                results[key].setdefault(way, []).append(value)
        print(f"seed {seed}: " + ", ".join(f"{way} {np.log10(v):.2f}" for way, v in scores.items())
              + " (log10 score)", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
