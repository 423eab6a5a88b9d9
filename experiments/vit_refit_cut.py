"""What ``refit=True`` gives a one-shot cut of the ViT teachers before any fine-tuning.

Each committed teacher (``train_vit_teacher.py``, seeds 0 and 2) is cut to
the plans the trained rows of ``experiments/README.md`` prune to (the
calibrated ``latency=0.5`` plan, and half the MACs with every head kept,
narrower), its kept channels ranked by activation magnitude on 4 training
batches of 128 (those ``vit_trained.py`` ranks on), and evaluated on
CIFAR-10's test set: kept weights as carried, and refit by least squares on
the same 4 batches (``refit=True``); and at 80% of the MACs, a cut mild
enough to use without training. Writes
``experiments/results/vit_refit_cut.{json,md}``; a rerun measures only the
rows the JSON lacks.

  python experiments/vit_refit_cut.py
"""

import json
import pathlib
import sys
import time

import keras

import keras_precrop as kp

ROOT = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from vit_cut_at_once import accuracy  # noqa: E402  (the cut's evaluation)

DATA = str(ROOT.parent.parent / "shared" / "tfds")
TEACHERS = {seed: ROOT / "runs" / f"vit_cifar-teacher-ep15-s{seed}" / "final_model.keras"
            for seed in (0, 2)}
PLANS = {"latency 0.5": lambda t: kp.Plan.from_json(
             ROOT / "plans" / "vit_cifar_tf_b64_headdims_latency0.5_uniform.json"),
         "flops 0.5": lambda t: kp.plan(t, flops=0.5, mode="uniform", attention="head_dims"),
         "flops 0.8": lambda t: kp.plan(t, flops=0.8, mode="uniform", attention="head_dims")}
OUT = ROOT / "results" / "vit_refit_cut"


def main():
    """Cut each teacher to each plan, with and without a refit; write the JSON and the table."""
    import keras_hub  # noqa: F401  (registers the teacher's classes for loading)

    test = kp.data.load("cifar10", "test", 500, data_dir=DATA)
    calibration = kp.data.load("cifar10", "train", 128, data_dir=DATA, seed=0).take(4)
    json_file = OUT.with_suffix(".json")
    rows = json.loads(json_file.read_text()) if json_file.exists() else []
    for seed, path in TEACHERS.items():
        teacher = keras.models.load_model(path, compile=False)
        for budget, plan_of in PLANS.items():
            if any(r["teacher"] == f"s{seed}" and r["budget"] == budget for r in rows):
                continue
            plan = plan_of(teacher)
            row = {"teacher": f"s{seed}", "budget": budget, "teacher_accuracy": accuracy(teacher, test)}
            for refit in (False, True):
                start = time.time()
                small = kp.apply_plan(teacher, plan, weights="keep", importance="activation",
                                      data=calibration, refit=refit)
                row["refit_seconds" if refit else "cut_seconds"] = time.time() - start
                row["refit" if refit else "cut"] = accuracy(small, test)
            row["params"] = small.count_params()
            rows.append(row)
            print(json.dumps(row), flush=True)
            json_file.write_text(json.dumps(rows, indent=2) + "\n")
    lines = ["| teacher | budget | teacher % | cut, kept weights % | cut + refit % | params |",
             "|---|---|---:|---:|---:|---:|"]
    lines += [f"| {r['teacher']} | {r['budget']} | {r['teacher_accuracy']:.2f} | {r['cut']:.2f} | "
              f"{r['refit']:.2f} | {r['params']:,} |"
              for r in sorted(rows, key=lambda r: (r["teacher"], list(PLANS).index(r["budget"])))]
    OUT.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
