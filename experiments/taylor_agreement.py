"""How much two Taylor rankings of the same trained model agree, beside L1 (issue 43, grid gradual_rank).

Ranks the channels of a committed ResNet-20 teacher for the stream-floor
``latency=0.5`` plan three ways: by L1, and by Taylor on two disjoint draws of
512 training examples (what ``--importance taylor`` takes at each update), and
prints the share of the kept channels (in the width variables the plan cuts)
that each pair has in common, and the share that chance would give, for
``--draws`` pairs of draws (the training pipeline shuffles: each run draws anew). A ranking
whose choice moves with the batch moves the fading channels from update to
update during ``fit``.

Usage: ``python experiments/taylor_agreement.py [--seed 3] [--data_dir ../shared/tfds] [--draws 3]``.
"""

import argparse
import json

import keras

import keras_precrop as kp
from keras_precrop import data as kp_data
from keras_precrop import gradual
from keras_precrop.graph.walker import walk
from keras_precrop.planning import data_batches, planned_widths

PLAN = "experiments/plans/resnet20_tf_b64_latency0.5_streamfloor.json"
TEACHER = "experiments/runs/resnet20-baseline-ep10-s{seed}/final_model.keras"


def _common(graph, widths, a, b):
    """The share of ``a``'s kept channels that ``b`` keeps too, over the variables cut."""
    cut = [i for i in a if graph.variables[i].width > widths[i]]
    same = sum(len(set(a[i].tolist()) & set(b[i].tolist())) for i in cut)
    return same / sum(len(a[i]) for i in cut), sum(widths[i] for i in cut) / sum(
        graph.variables[i].width for i in cut)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=3, help="the teacher's seed (3 or 4)")
    parser.add_argument("--data_dir", default="../shared/tfds", help="TFDS data directory")
    parser.add_argument("--draws", type=int, default=3, help="pairs of Taylor rankings to compare")
    parser.add_argument("--out", default="experiments/results/taylor_agreement.json",
                        help="write the shares here as JSON")
    args = parser.parse_args()
    model = keras.models.load_model(TEACHER.format(seed=args.seed), compile=False)
    plan = kp.Plan.from_json(PLAN)
    graph = walk(model, ignore=plan.ignore, residual=plan.residual)
    widths = planned_widths(graph, plan, model)
    train = kp_data.load("cifar10", "train", 128, data_dir=args.data_dir, download=False,
                         normalize=not kp_data.model_rescales_inputs(model))
    by_l1 = gradual.channel_masks(graph, widths, "l1")[1]
    batches, rows = iter(train.repeat()), []
    for draw in range(args.draws):
        kept = [gradual.channel_masks(graph, widths, ("taylor", data_batches(
            model, [next(batches) for _ in range(4)])))[1] for _ in range(2)]
        shares = [_common(graph, widths, *pair) for pair in ((kept[0], kept[1]), (kept[0], by_l1),
                                                             (kept[1], by_l1))]
        print(f"draw {draw + 1}: two Taylor rankings keep {shares[0][0]:.1%} of the same channels, "
              f"each with L1 {shares[1][0]:.1%} and {shares[2][0]:.1%} (chance: {shares[0][1]:.1%})")
        rows.append({"taylor_taylor": shares[0][0], "taylor_l1": [shares[1][0], shares[2][0]],
                     "chance": shares[0][1]})
    with open(args.out, "w") as f:
        json.dump({"teacher": TEACHER.format(seed=args.seed), "plan": PLAN, "examples": 512,
                   "draws": rows}, f, indent=1)


if __name__ == "__main__":
    main()
