"""Issue 45: does ``kp.recalibrate_bn`` rescue a trained model pruned with kept weights?

The committed CIFAR-10 ResNet-20 teachers (``resnet20-baseline-ep10-s3`` and
``-s4``, 10 epochs) are pruned with kept weights (``importance="l1"``), as
``examples/train_cifar.py --keep_weights`` prunes them, at two points: the
latency plan ``experiments/plans/resnet20_tf_b64_latency0.5_streamfloor.json``
(``apply_plan``) and ``flops=0.2734`` (``precrop``, default mode). Each
pruned model's CIFAR-10 test accuracy is taken before and after
``recalibrate_bn`` on the first 10, 30 and 100 batches of 128 training
images, preprocessed as for evaluation (normalized, not augmented, not
shuffled). Each recalibration replaces the statistics outright (they do not
depend on the ones before), so the same pruned model is recalibrated with
10, then 30, then 100 batches. The teachers themselves are evaluated first
(they must give their recorded ``final_accuracy``, which checks the
preprocessing) and after 100 batches (recalibrating an unpruned model
should cost little).

Writes ``experiments/results/recalibrate_bn.json`` and ``.md``.

Usage (from the repository root; CIFAR-10 prepared in ``../shared/tfds``)::

    python experiments/recalibrate_bn.py [--data_dir ../shared/tfds]
"""

import argparse
import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
from _teachers import PLAN, ROOT, TEACHERS, accuracy, cut_at_once, teacher_path, write_results  # noqa: E402

import keras_precrop as kp  # noqa: E402

OUT = ROOT / "results" / "recalibrate_bn"
POINTS = ("latency0.5_streamfloor", "flops0.2734")
BATCHES = (10, 30, 100)
BATCH_SIZE = 128


def _prune(teacher, point):
    """``teacher`` pruned at ``point`` with its L1-most-important channels' weights."""
    if point == "flops0.2734":
        return kp.precrop(teacher, flops=0.2734, weights="keep", importance="l1")
    return cut_at_once(teacher, kp.Plan.from_json(PLAN))


def _run_teacher(name, train, test):
    """The rows of one teacher: itself, then each pruning point before and after recalibration."""
    path = teacher_path(name)
    recorded = json.loads((path.parent / "results.json").read_text())["final_accuracy"]
    teacher = keras.models.load_model(path)
    rows = [{"teacher": name, "point": "dense (unpruned)", "recorded": 100 * recorded,
             "before": accuracy(teacher, test)}]
    for point in POINTS:
        start = time.time()
        pruned = _prune(teacher, point)
        row = {"teacher": name, "point": point, "params": pruned.count_params(),
               "before": accuracy(pruned, test)}
        for batches in BATCHES:
            kp.recalibrate_bn(pruned, train, batches=batches)
            row[f"after_{batches}"] = accuracy(pruned, test)
        row["seconds"] = round(time.time() - start, 1)
        rows.append(row)
        print(json.dumps(row), flush=True)
    dense = keras.models.load_model(path)  # the teacher itself, recalibrated
    rows[0][f"after_{BATCHES[-1]}"] = accuracy(kp.recalibrate_bn(dense, train, batches=BATCHES[-1]),
                                                test)
    print(json.dumps(rows[0]), flush=True)
    return rows


def _markdown(rows):
    """The table of ``rows``."""
    head = ("| teacher | pruned to | before | " + " | ".join(f"after {b} batches" for b in BATCHES)
            + " |\n|---|---|---|" + "---|" * len(BATCHES) + "\n")
    lines = []
    for row in rows:
        after = [f"{row[f'after_{b}']:.2f}" if f"after_{b}" in row else "" for b in BATCHES]
        lines.append(f"| {row['teacher']} | {row['point']} | {row['before']:.2f} | "
                     + " | ".join(after) + " |")
    return ("# recalibrate_bn on pruned CIFAR-10 ResNet-20s (issue 45)\n\n"
            "CIFAR-10 test accuracy (%) of trained ResNet-20s pruned with kept weights (L1), "
            f"before and after `kp.recalibrate_bn` on the first N batches of {BATCH_SIZE} "
            "training images (normalized, not augmented); no training. "
            "Written by `experiments/recalibrate_bn.py`.\n\n" + head + "\n".join(lines) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data_dir", default=str(ROOT.parent.parent / "shared" / "tfds"))
    args = parser.parse_args()
    train = kp.data.load("cifar10", "train", BATCH_SIZE, data_dir=args.data_dir, training=False,
                         cache=False)
    test = kp.data.load("cifar10", "test", 500, data_dir=args.data_dir)
    rows = [row for name in TEACHERS for row in _run_teacher(name, train, test)]
    write_results(OUT, {"batch_size": BATCH_SIZE, "batches": list(BATCHES), "rows": rows},
                  _markdown(rows))


if __name__ == "__main__":
    main()
