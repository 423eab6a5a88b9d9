"""Checks that rule out a bug behind the CIFAR-10 results; writes ``experiments/results/sanity.json``.

Four checks, each as independent of the training code as it can be:

1. **init**: every PreCrop/PreConfig plan the grids train (seed 0) is built
   the way ``examples/train_cifar.py`` builds it, by the commit the grid pins
   (extracted with ``git archive`` and imported in a subprocess) with the
   same flags and seed. The root mean square of every Conv/Dense kernel is
   compared with the standard deviation its initializer's config gives at
   the kernel's *new* fan (variance scaling: ``sqrt(scale / fan)`` for the
   normal, truncated normal and uniform variants alike), and with what the
   *original* fan would give, for contrast. BatchNorm layers must start at
   gamma 1, beta 0, mean 0, variance 1; no rebuilt weight may be a variable
   of the original model or equal to a slice of its values, and no two
   rebuilt kernels may be equal.
2. **masks**: every finished masked run (SynFlow, SNIP, GraSP, magnitude,
   random) with a ``final_model.keras``: its kernels' exact zeros are counted
   and compared with the pruned weights ``results.json`` implies
   (``original_params - params``: ``params`` is ``count_params()`` less the
   masked weights) and with the masks stored in the model's config, decoded
   here from their documented format. Trained weights are never exactly
   zero, so equal counts show that the masks held to the end of training;
   the masks are attached once, before training, as weight constraints, and
   nothing re-applies them later.
3. **eval**: every finished run's ``final_model.keras`` is loaded with
   ``keras.saving.load_model`` (``keras_precrop`` is imported only to
   register its layers and ``MaskConstraint``) and evaluated on the CIFAR-10
   test split, read with ``tfds.load`` and normalized here with training's
   mean and standard deviation; the accuracy is compared with
   ``final_accuracy``, params (``count_params()`` less exact zeros) and MACs
   (``profile``, each layer's MACs scaled by its kernel's nonzero share) with
   ``params`` and ``macs``.

4. **layer densities** (figure 4's premise): every finished run that
   realizes SynExp's layer densities (random masks with ``--densities
   synexp``, PreCrop's ``paper`` rule) and has a ``final_model.keras``: the
   kept share of each Conv/Dense kernel (nonzero weights of a masked kernel,
   the whole of a narrower rebuilt one, out of the original kernel's size)
   is compared with the density program's solution (``plan(mode="paper")``
   at the run's ``--params`` and ``--flops``, solved by this checkout).

Unfinished runs (no ``results.json``) are skipped; rerunning the script
rewrites the JSON. It takes a few minutes on a CPU.

Usage::

    python experiments/sanity.py [--runs_dir experiments/runs] [--data_dir ../shared/tfds]
"""

import argparse
import base64
import io
import json
import math
import os
import pathlib
import re
import subprocess
import sys
import tarfile
import tempfile
import zipfile
import zlib

import numpy as np
import run as _run  # experiments/run.py: grids, run ids and the training command

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent
# CIFAR-10 normalization of training (keras_precrop.data, the Synaptic-Flow codebase's values).
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
# A kernel's root mean square passes within this many standard errors of its formula.
Z_LIMIT = 5.0
# Initializers that are VarianceScaling with fixed arguments: (scale, mode, distribution).
_VARIANCE_SCALING = {
    "HeNormal": (2.0, "fan_in", "truncated_normal"),
    "HeUniform": (2.0, "fan_in", "uniform"),
    "GlorotNormal": (1.0, "fan_avg", "truncated_normal"),
    "GlorotUniform": (1.0, "fan_avg", "uniform"),
    "LecunNormal": (1.0, "fan_in", "truncated_normal"),
    "LecunUniform": (1.0, "fan_in", "uniform"),
}


def formula_std(initializer, shape):
    """The standard deviation a variance-scaling initializer draws a kernel of ``shape`` with.

    Keras scales every variant to the same variance ``scale / fan``: the
    truncated normal divides its stddev by 0.8796 (the std of a standard
    normal truncated at 2), the uniform takes limits ``sqrt(3 scale / fan)``.

    Args:
        initializer: the serialized initializer (``layer.get_config()["kernel_initializer"]``).
        shape: the kernel's shape, ``(*receptive field, in, out)``.

    Returns:
        ``sqrt(scale / fan)``.

    Raises:
        ValueError: naming the initializer when it is not variance scaling or
            sets ``input_axes``/``output_axes``.
    """
    name, config = initializer["class_name"], initializer.get("config", {})
    if name == "VarianceScaling" and not (config.get("input_axes") or config.get("output_axes")):
        scale, mode = config["scale"], config["mode"]
    elif name in _VARIANCE_SCALING:
        scale, mode, _ = _VARIANCE_SCALING[name]
    else:
        raise ValueError(f"no variance-scaling formula for the initializer {name} ({config})")
    receptive = math.prod(shape[:-2])
    fans = {"fan_in": shape[-2] * receptive, "fan_out": shape[-1] * receptive}
    fans["fan_avg"] = (fans["fan_in"] + fans["fan_out"]) / 2
    return math.sqrt(scale / fans[mode])


def _kernel_layers(model):
    """``{name: layer}`` of the layers with a ``kernel`` and a ``kernel_initializer`` (Conv, Dense)."""
    import keras

    found = {}
    for layer in model.layers:
        if isinstance(layer, keras.Model):
            found.update(_kernel_layers(layer))
        elif getattr(layer, "kernel", None) is not None and "kernel_initializer" in layer.get_config():
            found[layer.name] = layer
    return found


def _overlap(a, b):
    """The leading corner of ``a`` and ``b`` (their common prefix slice in every dimension)."""
    corner = tuple(slice(0, min(x, y)) for x, y in zip(a.shape, b.shape))
    return a[corner], b[corner]


def _batchnorms_at_init(model):
    """Names of the BatchNormalization layers that do not start at gamma 1, beta 0, mean 0, variance 1."""
    import keras

    wrong = []
    for layer in model.layers:
        if isinstance(layer, keras.Model):
            wrong += _batchnorms_at_init(layer)
        elif isinstance(layer, keras.layers.BatchNormalization):
            start = {"gamma": 1.0, "beta": 0.0, "moving_mean": 0.0, "moving_variance": 1.0}
            if any(
                getattr(layer, attr, None) is not None and not np.all(getattr(layer, attr).numpy() == value)
                for attr, value in start.items()
            ):
                wrong.append(layer.name)
    return wrong


def check_init(model, reference):
    """Compares the initial weights of a rebuilt ``model`` with its initializers' formulas.

    Args:
        model: the freshly built compressed model.
        reference: the original model it was rebuilt from (same layer names).

    Returns:
        A dict: ``layers`` (per kernel: ``name``, ``shape``, ``rms``,
        ``formula`` at the new fan, ``ratio`` = rms / formula, ``z`` = its
        deviation from 1 in standard errors, ``ratio_if_kept`` = formula at
        the original fan / formula at the new fan, i.e. the ratio had the
        weights kept the original layer's scale, and ``z_if_kept``);
        ``worst`` (the layer of largest ``|z|``); ``telling`` (the layer where
        the original scale would show most, largest ``|z_if_kept|``);
        ``batchnorm_not_at_init``, ``shared`` (variables of ``reference``),
        ``copied`` (kernels equal to a slice of the original's),
        ``duplicates`` (pairs of equal kernels) and ``ok``.
    """
    originals = _kernel_layers(reference)
    rows, kernels = [], {}
    for name, layer in _kernel_layers(model).items():
        w = np.asarray(layer.kernel.numpy(), dtype=np.float64)
        kernels[name] = w
        original = originals[name]
        formula = formula_std(layer.get_config()["kernel_initializer"], w.shape)
        kept = formula_std(original.get_config()["kernel_initializer"], tuple(original.kernel.shape))
        rms = float(np.sqrt(np.mean(w**2)))
        # The RMS of n normal draws has a relative standard error of 1 / sqrt(2 n).
        error = 1 / math.sqrt(2 * w.size)
        rows.append(
            {
                "name": name,
                "shape": list(w.shape),
                "original_shape": list(original.kernel.shape),
                "rms": rms,
                "formula": formula,
                "ratio": rms / formula,
                "z": (rms / formula - 1) / error,
                "ratio_if_kept": kept / formula,
                "z_if_kept": (kept / formula - 1) / error,
            }
        )
    copied = [
        name
        for name, w in kernels.items()
        if np.array_equal(*_overlap(w, np.asarray(originals[name].kernel.numpy(), dtype=np.float64)))
    ]
    names = list(kernels)
    duplicates = [
        [a, b]
        for i, a in enumerate(names)
        for b in names[i + 1 :]
        if kernels[a].shape == kernels[b].shape and np.array_equal(kernels[a], kernels[b])
    ]
    reference_ids = {id(v) for v in reference.weights}
    shared = [v.path for v in model.weights if id(v) in reference_ids]
    batchnorm = _batchnorms_at_init(model)
    ok = all(abs(r["z"]) <= Z_LIMIT for r in rows) and not (batchnorm or shared or copied or duplicates)
    return {
        "layers": rows,
        "worst": max(rows, key=lambda r: abs(r["z"])),
        "telling": max(rows, key=lambda r: abs(r["z_if_kept"])),
        "detectable_if_kept": sum(abs(r["z_if_kept"]) > Z_LIMIT for r in rows),
        "batchnorm_not_at_init": batchnorm,
        "shared": shared,
        "copied": copied,
        "duplicates": duplicates,
        "ok": bool(ok),
    }


def decode_mask(data, shape):
    """A ``MaskConstraint`` config's mask: base64 of zlib-compressed ``np.packbits`` of the 0/1 array."""
    bits = np.frombuffer(zlib.decompress(base64.b64decode(data)), dtype=np.uint8)
    return np.unpackbits(bits, count=math.prod(shape)).reshape(shape)


def _config_masks(layers):
    """``{layer name: kernel mask}`` from the layer configs of a ``.keras`` file's ``config.json``."""
    masks = {}
    for layer in layers:
        config = layer.get("config", {})
        if "layers" in config:
            masks.update(_config_masks(config["layers"]))
        constraint = config.get("kernel_constraint")
        if isinstance(constraint, dict) and constraint.get("class_name") == "MaskConstraint":
            masks[config["name"]] = decode_mask(constraint["config"]["mask"], constraint["config"]["shape"])
    return masks


def check_masks(model, path, results):
    """Counts a trained masked model's exact zeros against its masks and ``results.json``.

    Args:
        model: the model loaded from ``path``.
        path: its ``.keras`` file (the masks are read from its ``config.json``).
        results: the run's ``results.json`` as a dict.

    Returns:
        A dict: ``kernel_weights``, ``kernel_zeros`` (exact zeros in all
        Conv/Dense kernels), ``pruned_per_results`` (``original_params -
        params``), ``masked`` (zeros of the stored masks), ``nonzero_under_mask``
        (weights a mask zeroes that are not zero: the mask did not hold),
        ``zeros_outside_mask`` and ``ok`` (all three counts equal, no nonzero
        weight under a mask).
    """
    with zipfile.ZipFile(path) as archive:
        masks = _config_masks(json.loads(archive.read("config.json"))["config"]["layers"])
    total = zeros = masked = under = outside = 0
    for name, layer in _kernel_layers(model).items():
        w = layer.kernel.numpy()
        total += w.size
        zeros += int(np.sum(w == 0))
        mask = masks.get(name, np.ones(w.shape, dtype=np.uint8))
        masked += int(np.sum(mask == 0))
        under += int(np.sum((w != 0) & (mask == 0)))
        outside += int(np.sum((w == 0) & (mask == 1)))
    pruned = results["original_params"] - results["params"]
    return {
        "kernel_weights": total,
        "masked_layers": len(masks),
        "kernel_zeros": zeros,
        "pruned_per_results": pruned,
        "masked": masked,
        "nonzero_under_mask": under,
        "zeros_outside_mask": outside,
        "kept_share": 1 - zeros / total,
        "ok": zeros == pruned == masked and under == 0,
    }


def load_test_set(data_dir):
    """CIFAR-10's test split as ``(float32 images normalized as in training, int labels)``."""
    import tensorflow_datasets as tfds

    images, labels = tfds.as_numpy(
        tfds.load(
            "cifar10", split="test", data_dir=data_dir, download=False, batch_size=-1, as_supervised=True
        )
    )
    images = (images.astype(np.float32) / 255.0 - np.float32(CIFAR10_MEAN)) / np.float32(CIFAR10_STD)
    return images, labels.astype(np.int64)


def accuracy(model, images, labels, batch_size=500):
    """Share of ``images`` whose largest logit is at their label (inference mode)."""
    logits = model.predict(images, batch_size=batch_size, verbose=0)
    return float(np.mean(np.argmax(logits, axis=-1) == labels))


def recount(model):
    """``(params, MACs)`` of a trained model with exactly-zero kernel weights taken as pruned.

    Params are ``count_params()`` less the zeros; MACs are ``profile``'s per
    layer, scaled by the nonzero share of the layer's kernel (as
    ``results.json`` counts masked models).
    """
    import keras_precrop as kp

    kernels = {name: layer.kernel.numpy() for name, layer in _kernel_layers(model).items()}
    zeros = sum(int(np.sum(w == 0)) for w in kernels.values())
    density = {name: np.count_nonzero(w) / w.size for name, w in kernels.items()}
    macs = sum(layer.macs * density.get(layer.name, 1.0) for layer in kp.profile(model).layers)
    return model.count_params() - zeros, int(round(macs))


def layer_densities(model, reference):
    """``{layer: kept share}`` of ``model``'s Conv/Dense kernels out of ``reference``'s (the original).

    A masked kernel keeps its nonzero weights (trained weights are never
    exactly zero); a rebuilt, narrower kernel keeps its whole size.
    """
    original = {name: math.prod(layer.kernel.shape) for name, layer in _kernel_layers(reference).items()}
    return {
        name: np.count_nonzero(layer.kernel.numpy()) / original[name]
        for name, layer in _kernel_layers(model).items()
    }


def check_densities(model, results):
    """A figure-4 run's realized layer densities against SynExp's (None for the other runs).

    Returns:
        A dict: ``layers`` compared, ``mean_abs_diff`` and the ``worst_layer``
        with its ``worst_target`` density and signed ``worst_diff``.
    """
    if results.get("densities") != "synexp" and results.get("plan_options", {}).get("mode") != "paper":
        return None
    import keras_precrop as kp

    reference = kp.models.get(results["model"])
    targets = kp.plan(reference, params=results["params_budget"], flops=results["flops_budget"],
                      mode="paper").solver[
        "layer_densities_solved"
    ]
    realized = layer_densities(model, reference)
    diffs = {name: realized[name] - target for name, target in targets.items()}
    worst = max(diffs, key=lambda name: abs(diffs[name]))
    return {
        "layers": len(diffs),
        "mean_abs_diff": float(np.mean(np.abs(list(diffs.values())))),
        "worst_layer": worst,
        "worst_target": targets[worst],
        "worst_diff": diffs[worst],
    }


def check_run(run_dir, images, labels):
    """The masks (masked runs), densities (figure 4's runs) and eval checks of one finished run
    with a ``final_model.keras``."""
    import keras

    import keras_precrop  # noqa: F401  (registers PrefixAdd, ChannelSlice and MaskConstraint)

    results = json.loads((run_dir / "results.json").read_text())
    path = run_dir / "final_model.keras"
    model = keras.saving.load_model(path, compile=False)
    params, macs = recount(model)
    measured = accuracy(model, images, labels)
    log = run_dir / "train.log"
    row = {
        "run": run_dir.name,
        "method": results["method"],
        "masks": check_masks(model, path, results) if results["method"] in _run.MASKED else None,
        "densities": check_densities(model, results),
        "starts": sum(line.startswith("$ ") for line in log.read_text().splitlines())
        if log.exists()
        else None,
        "eval": {
            "final_accuracy": results["final_accuracy"],
            "accuracy": measured,
            "difference_pp": 100 * (measured - results["final_accuracy"]),
            "params": results["params"],
            "params_recount": params,
            "macs": results["macs"],
            "macs_recount": macs,
        },
    }
    keras.backend.clear_session()
    return row


def _plans(grids, match):
    """``{code commit: [(run id, grid name, flags)]}`` of the structured runs of seed 0 in ``grids``."""
    plans, seen = {}, set()
    for path in grids:
        for flags in _run.load_grid(path):
            name = _run.run_id(flags)
            if flags["method"] not in _run.STRUCTURED or flags["seed"] != 0 or name in seen:
                continue
            if match and not re.search(match, name):
                continue
            seen.add(name)
            plans.setdefault(flags["code"], []).append((name, flags["grid"], flags))
    return plans


def _extract(commit, into):
    """Writes ``examples/`` and ``keras_precrop/`` of ``commit`` into ``into``."""
    archive = subprocess.run(
        ["git", "archive", "--format=tar", commit, "examples", "keras_precrop"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")


def init_checks(grids, match=None, code_dir=None):
    """Runs :func:`check_init` on every structured plan of ``grids``, each by its grid's code.

    Each commit's plans are built in one subprocess (``--init_worker``) that
    imports that commit's ``keras_precrop`` and ``examples/_common.py``
    (``code_dir`` instead, if given, for every grid).
    """
    rows = []
    for commit, plans in _plans(grids, match).items():
        with tempfile.TemporaryDirectory() as tmp:
            code = pathlib.Path(code_dir).resolve() if code_dir else pathlib.Path(tmp) / "code"
            if not code_dir:
                if commit is None:
                    raise ValueError(f"a grid of {[p[0] for p in plans]} pins no code; pass --code_dir")
                _extract(commit, code)
            jobs = [
                {
                    "run": name,
                    "grid": grid,
                    "args": _run.train_command(flags, pathlib.Path(tmp), None, code)[2:],
                }
                for name, grid, flags in plans
            ]
            (pathlib.Path(tmp) / "jobs.json").write_text(json.dumps(jobs))
            env = {**os.environ, "PYTHONPATH": str(code), "TF_CPP_MIN_LOG_LEVEL": "2"}
            print(f"[sanity] init: {len(jobs)} plans of code {commit or code}", flush=True)
            subprocess.run([sys.executable, __file__, "--init_worker", str(code), tmp], env=env, check=True)
            for row in json.loads((pathlib.Path(tmp) / "init.json").read_text()):
                rows.append({**row, "code": commit or str(code)})
    return rows


def _build(args, _common, kp, keras):
    """``(model, reference)`` as ``_common.run`` makes them: seed, reference, plan, rebuild."""
    _common.FLAGS.unparse_flags()
    _common.FLAGS(["train_cifar.py", *args])
    _common._check_flags()
    keras.utils.set_random_seed(_common.FLAGS.seed)
    info = _common.data.get_info("cifar10")
    reference = kp.models.get(_common.FLAGS.model, input_shape=info.input_shape, num_classes=info.num_classes)
    build_model, _ = _common._builder(reference, None, info.num_classes, 128)
    return build_model(), reference


def _init_worker(code, tmp):
    """Builds each job's model as ``examples/_common.py`` of ``code`` does and checks it."""
    sys.path.insert(0, str(pathlib.Path(code) / "examples"))
    import keras

    import _common
    import keras_precrop as kp

    if not pathlib.Path(kp.__file__).resolve().is_relative_to(pathlib.Path(code).resolve()):
        raise RuntimeError(f"imported {kp.__file__}, not the keras_precrop of {code}")
    _common.define_flags(default_model="resnet20")
    rows = []
    for job in json.loads((pathlib.Path(tmp) / "jobs.json").read_text()):
        row = {"run": job["run"], "grid": job["grid"]}
        try:
            model, reference = _build(job["args"], _common, kp, keras)
        except Exception as error:  # a plan that cannot be built is a finding, not the end of the check
            rows.append({**row, "error": f"{type(error).__name__}: {error}", "ok": False})
            print(f"[sanity] {job['run']}: cannot build it: {rows[-1]['error']}", flush=True)
            continue
        row.update(params=model.count_params(), **check_init(model, reference))
        print(
            f"[sanity] {job['run']}: worst ratio {row['worst']['ratio']:.3f} ({row['worst']['name']}), "
            f"ok {row['ok']}",
            flush=True,
        )
        rows.append(row)
        keras.backend.clear_session()
    (pathlib.Path(tmp) / "init.json").write_text(json.dumps(rows))


def _print_tables(report):
    print(f"\n{'plan':70s} {'params':>7s} {'worst ratio':>11s} {'z':>6s} {'if kept':>8s}  ok")
    for row in report["init"]:
        if "error" in row:
            print(f"{row['run']:70s} cannot build it: {row['error']}")
            continue
        print(
            f"{row['run']:70s} {row['params']:7d} {row['worst']['ratio']:11.3f} {row['worst']['z']:6.2f} "
            f"{row['telling']['ratio_if_kept']:8.3f}  {row['ok']}"
        )
    print(f"\n{'run':60s} {'zeros':>7s} {'pruned':>7s} {'acc json':>9s} {'acc here':>9s} {'diff pp':>8s}")
    for row in report["runs"]:
        masks, ev = row["masks"] or {}, row["eval"]
        print(
            f"{row['run']:60s} {masks.get('kernel_zeros', '-'):>7} {masks.get('pruned_per_results', '-'):>7} "
            f"{ev['final_accuracy']:9.4f} {ev['accuracy']:9.4f} {ev['difference_pp']:8.3f}"
        )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs_dir", type=pathlib.Path, default=HERE / "runs", help="the runs to check")
    parser.add_argument("--data_dir", default=str(REPO.parent / "shared" / "tfds"), help="TFDS data_dir")
    parser.add_argument(
        "--grids_dir", type=pathlib.Path, default=HERE / "grids", help="grids whose plans to build"
    )
    parser.add_argument("--out", type=pathlib.Path, default=HERE / "results" / "sanity.json")
    parser.add_argument("--match", default=None, help="check only runs/plans whose id matches this regex")
    parser.add_argument(
        "--code_dir",
        default=None,
        help="build every plan with this checkout instead of each grid's pinned commit",
    )
    parser.add_argument("--init_worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.init_worker:
        return _init_worker(*args.init_worker)

    grids = sorted(args.grids_dir.glob("*.json"))
    report = {"init": init_checks(grids, args.match, args.code_dir), "runs": [], "skipped": []}
    for row in report["init"]:  # the plan built here is the one trained?
        results = args.runs_dir / row["run"] / "results.json"
        row["trained_params"] = json.loads(results.read_text())["params"] if results.exists() else None
    images, labels = load_test_set(args.data_dir)
    for run_dir in sorted(p for p in args.runs_dir.iterdir() if p.is_dir()):
        if args.match and not re.search(args.match, run_dir.name):
            continue
        if not (run_dir / "results.json").exists():
            report["skipped"].append({"run": run_dir.name, "why": "not finished"})
        elif not (run_dir / "final_model.keras").exists():
            report["skipped"].append(
                {"run": run_dir.name,
                 "why": "no final_model.keras: its grid saves none, or keeps it out of git (no keep_model)"}
            )
        else:
            print(f"[sanity] checking {run_dir.name}", flush=True)
            report["runs"].append(check_run(run_dir, images, labels))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    _print_tables(report)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
