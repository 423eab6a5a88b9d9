"""What the scripts measuring the committed ResNet-20 teachers share (issues 43 and 45).

The dense CIFAR-10 ResNet-20s of grid keep_weights_teacher (seeds 3 and 4, 10
epochs), the stream-floor ``latency=0.5`` plan they are pruned to, today's
one-shot cut (kept weights, L1 channels) and their test accuracy.
"""

import json
import pathlib

import keras

import keras_precrop as kp

ROOT = pathlib.Path(__file__).resolve().parent
TEACHERS = ("resnet20-baseline-ep10-s3", "resnet20-baseline-ep10-s4")
PLAN = ROOT / "plans" / "resnet20_tf_b64_latency0.5_streamfloor.json"


def teacher_path(name):
    """The saved model of the committed run ``name``."""
    return ROOT / "runs" / name / "final_model.keras"


def cut_at_once(model, plan):
    """``model`` cut at once to ``plan``, keeping its L1-most-important channels' weights."""
    return kp.apply_plan(model, plan, weights="keep", importance="l1")


def accuracy(model, test):
    """Test accuracy (%) of a logits model."""
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return 100 * model.evaluate(test, verbose=0, return_dict=True)["accuracy"]


def write_results(out, record, markdown):
    """Write ``record`` (with the backend and Keras version) to ``out``.json, ``markdown`` to
    ``out``.md, and print the table."""
    record = {**record, "backend": keras.backend.backend(), "keras": keras.__version__}
    out.with_suffix(".json").write_text(json.dumps(record, indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown)
    print(markdown)
