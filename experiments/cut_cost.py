"""Issue 43: what does the cut cost after the channels have faded? Measured, not assumed.

Group sparsity before pruning is meant to bring the channels that will go near
zero, so that cutting them costs little (Torch-Pruning's CIFAR-10 ResNet-56:
one shot from a trained model falls to 11-28%, after its group-lasso phase to
88.9%). Here the fading of ``kp.GradualPruning(shrink=0.01, schedule="final")``
plays that part. For each committed ResNet-20 teacher (``resnet20-baseline-ep10-s3``
and ``-s4``) this takes the CIFAR-10 test accuracy of:

* the teacher, and the teacher cut at once to the stream-floor ``latency=0.5``
  plan (``kp.apply_plan(..., weights="keep", importance="l1")``, today's one shot);
* a copy after one epoch of fading (the channels the plan leaves out, re-ranked
  by L1 every 20 steps, multiplied by 0.99 after every step), distilled from
  the teacher with the 3-epoch recipe's first epoch (SGD momentum 0.9, batch
  128, L2 1e-4, rate 0.2 decayed linearly towards 0 over 3 epochs: grid
  gradual_lr's best way), stopped one step before the mask comes;
* that faded model cut at once in the same way as the teacher (the faded
  channels have the smallest L1, so they are the ones cut);
* the L1 mass of the kernels the cut drops (all kernels' minus those of the
  cut model), as a fraction of the teacher's: 0.99 a step leaves 2% after the
  390 steps if training did not push the fading weights back.

Each teacher fades with ``shrink`` 0.01 (the committed runs') and 0.02.

Writes ``experiments/results/cut_cost.json`` and ``.md``.

Usage (from the repository root; CIFAR-10 prepared in ``../shared/tfds``)::

    python experiments/cut_cost.py [--data_dir ../shared/tfds]
"""

import argparse
import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
from _teachers import PLAN, ROOT, TEACHERS, accuracy, cut_at_once, teacher_path, write_results  # noqa: E402

import keras_precrop as kp  # noqa: E402

OUT = ROOT / "results" / "cut_cost"
BATCH_SIZE, RATE, EPOCHS, SHRINKS, FREQUENCY = 128, 0.2, 3, (0.01, 0.02), 20


def _kernel_mass(model):
    """The L1 norm of all of ``model``'s conv and dense kernels."""
    return sum(float(keras.ops.sum(keras.ops.abs(w))) for w in model.weights if "kernel" in w.path)


def _faded(path, teacher, plan, train, shrink):
    """A copy of the teacher after one epoch of fading, one step before the channels are masked."""
    steps = len(train)
    model = keras.models.load_model(path)
    pruning = kp.GradualPruning(plan, end_step=steps + 1, frequency=FREQUENCY, schedule="final",
                                shrink=shrink, verbose=0)
    rate = keras.optimizers.schedules.PolynomialDecay(RATE, EPOCHS * steps, 0.0)
    kp.fine_tune(model, train, teacher=teacher, epochs=1, learning_rate=rate, weight_decay=1e-4,
                 callbacks=[pruning], verbose=2)
    return model


def _run_teacher(name, plan, train, test):
    """One teacher's rows, one per shrink: its accuracy, cut at once, after fading, the faded
    model cut, and the kernel mass each cut drops."""
    path = teacher_path(name)
    teacher = keras.models.load_model(path)
    cut = cut_at_once(teacher, plan)
    dense, at_once = accuracy(teacher, test), accuracy(cut, test)
    dropped = _kernel_mass(teacher) - _kernel_mass(cut)
    rows = []
    for shrink in SHRINKS:
        start = time.time()
        faded = _faded(path, teacher, plan, train, shrink)
        faded_cut = cut_at_once(faded, plan)
        rows.append({"teacher": name, "shrink": shrink, "dense": dense, "cut_at_once": at_once,
                     "faded": accuracy(faded, test), "faded_then_cut": accuracy(faded_cut, test),
                     "dropped_mass": (_kernel_mass(faded) - _kernel_mass(faded_cut)) / dropped,
                     "seconds": round(time.time() - start, 1)})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def _markdown(rows):
    """The table of ``rows``."""
    lines = [f"| {r['teacher']} | {r['shrink']} | {r['dense']:.2f} | {r['cut_at_once']:.2f} | "
             f"{r['faded']:.2f} | {r['faded_then_cut']:.2f} | {100 * r['dropped_mass']:.1f} |"
             for r in rows]
    return ("# The cost of the cut after fading (issue 43)\n\n"
            "CIFAR-10 test accuracy (%) of the committed ResNet-20 teachers, cut at once to the "
            "stream-floor `latency=0.5` plan (L1, kept weights), and of a copy after one epoch of "
            "fading (`GradualPruning(shrink=shrink, schedule=\"final\")`, distilled, rate "
            f"{RATE} decayed linearly over {EPOCHS} epochs), before and after the same cut; and the "
            "L1 mass of the kernels that cut drops from the faded model, in % of what it drops from "
            "the teacher. Written by `experiments/cut_cost.py`.\n\n"
            "| teacher | shrink | dense | cut at once | after fading, before the cut | after fading, "
            "cut | mass dropped (% of the teacher's) |\n"
            "|---|---|---|---|---|---|---|\n" + "\n".join(lines) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data_dir", default=str(ROOT.parent.parent / "shared" / "tfds"))
    args = parser.parse_args()
    train = kp.data.load("cifar10", "train", BATCH_SIZE, data_dir=args.data_dir)
    test = kp.data.load("cifar10", "test", 500, data_dir=args.data_dir)
    plan = kp.Plan.from_json(PLAN)
    rows = [row for name in TEACHERS for row in _run_teacher(name, plan, train, test)]
    write_results(OUT, {"batch_size": BATCH_SIZE, "rate": RATE, "epochs_of_decay": EPOCHS,
                        "frequency": FREQUENCY, "rows": rows}, _markdown(rows))


if __name__ == "__main__":
    main()
