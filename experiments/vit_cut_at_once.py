"""What a one-shot cut leaves of the ViT teacher before any fine-tuning (issue 61's evidence).

The committed teacher (``train_vit_teacher.py``, seed 0) is cut to half its
MACs with its weights kept (L1), per block (``kp.precrop`` of the whole task)
and with one config for every block (``kp.hub.precrop``, homogeneous), and
evaluated on CIFAR-10's test set: the starting point fine-tuning and
distillation work from, beside Torch-Pruning's on the PyTorch twin
(``experiments/results/tp_vit_prepare_teacher_s0.json``, ``pruned_accuracy``).

  python experiments/vit_cut_at_once.py
"""

import json
import pathlib

import keras

import keras_precrop as kp

ROOT = pathlib.Path(__file__).resolve().parent
TEACHER = ROOT / "runs" / "vit_cifar-teacher-ep15-s0" / "final_model.keras"
OUT = ROOT / "results" / "vit_cut_at_once_teacher_s0.json"


def accuracy(model, test):
    """Test accuracy (%) of a logits model."""
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return 100 * model.evaluate(test, verbose=0, return_dict=True)["accuracy"]


def main():
    """Cut the teacher both ways, evaluate, write the JSON and print it."""
    import keras_hub  # noqa: F401  (registers the teacher's classes for loading)

    teacher = keras.models.load_model(TEACHER, compile=False)
    test = kp.data.load("cifar10", "test", 500, data_dir=str(ROOT.parent.parent / "shared" / "tfds"))
    ways = {"precrop_per_block": lambda: kp.precrop(teacher, flops=0.5, weights="keep"),
            "hub_homogeneous": lambda: kp.hub.precrop(teacher, flops=0.5, weights="keep")}
    out = {"teacher_accuracy": accuracy(teacher, test)}
    for name, cut in ways.items():
        model = cut()
        plan = model.precrop_plan
        out[name] = {"accuracy_before_fine_tuning": accuracy(model, test),
                     "macs_ratio": plan.macs / plan.original["macs"], "params": model.count_params()}
    OUT.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
