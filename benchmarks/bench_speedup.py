"""Benchmark: real CPU speedups of PreCrop models vs the dense baseline and SynFlow masks.

For each model: the baseline, PreCrop at ``flops`` in {0.75, 0.5, 0.25}
(exact mode, ``round_to`` 1, 8 and 16; 16 because oneDNN's AVX-512 fp32
kernels work on blocks of 16 channels), PreCrop at ``latency`` in {0.75,
0.5, 0.25} (a latency model fitted here first, TF runtime at the throughput
batch), and the baseline architecture with SynFlow masks at the parameter
count of the PreCrop ``flops=0.5`` model (its kernels stay dense, with zeros
inside). Measures inference latency (batch 1), inference throughput in
TensorFlow and in the TFLite interpreter, and SGD training step time;
variants run round-robin (interleaved) after warm-up and the speedup is the
median over rounds of the same-round time ratio to the baseline. The ideal
speedup is the MACs ratio; each plan's SynExp objective (the accuracy proxy)
and predicted time ratio are reported next to it. Then profiles (TF
profiler) the per-op-type times of the baseline, the 0.5 models and the
SynFlow model, to show where the time goes.

Usage::

    python benchmarks/bench_speedup.py            # all models, full repeats (~45 min)
    python benchmarks/bench_speedup.py --quick    # resnet20, few repeats (~4 min)
    python benchmarks/bench_speedup.py --models resnet20 mobilenet_v2
    python benchmarks/bench_speedup.py --render-only   # redraw .md/.png from .json

Writes ``benchmarks/results/speedup.json``, ``speedup.md`` and ``speedup.png``
(``--out`` picks another folder, e.g. for quick runs).
"""

import argparse
import json
import math
import os
import pathlib
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import _timing  # noqa: E402
import keras_precrop as kp  # noqa: E402

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
FLOPS = (0.75, 0.5, 0.25)
ROUNDINGS = (1, 8, 16)
LATENCY = (0.75, 0.5, 0.25)  # latency-budget plans (round_to=1: the latency model rounds)
SYNFLOW_AT = 0.5  # SynFlow keeps as many parameters as PreCrop at this FLOP ratio
OPS_AT = 0.5  # per-op profiles of the PreCrop models at this FLOP ratio
OPS_SHOWN = 0.97  # op tables list the op types making up this share of the baseline
# name -> (throughput batch, training batch)
MODELS = {
    "resnet20": (64, 128),
    "mobilenet_v2_cifar": (64, 128),
    "mobilenet_v2": (32, 16),
    "efficientnet_b0": (32, 16),
}
GOAL_MODELS = ("resnet20", "mobilenet_v2")
GOAL_FLOPS, GOAL_SPEEDUP = 0.5, 1.6  # CPU throughput at 50% MACs, 0.8 of the ideal 2x
GOAL_LATENCY, GOAL_LATENCY_SPEEDUP = 0.5, 1.8  # issue 11: latency=0.5, TF and TFLite
# measurement -> (rounds full, rounds quick, seconds per sample)
MEASUREMENTS = {
    "latency": (20, 5, 0.2),
    "throughput": (12, 3, 0.3),
    "tflite": (8, 2, 0.3),
    "train": (8, 3, 0.3),
}
# latency model fits: kp.latency_model options, full and quick
FIT = {False: dict(variants=20, rounds=5), True: dict(variants=8, rounds=2, refine_rounds=1)}


def _log(*args):
    print(*args, file=sys.stderr, flush=True)


def _activations(model):
    """Output elements per example summed over all layers (nested models flattened).

    A proxy for the memory traffic of the elementwise layers (batch norm,
    activations, padding, adds), whose cost is linear in width where a
    convolution's MACs are quadratic.
    """
    total = 0
    for layer in model.layers:
        if isinstance(layer, keras.Model):
            total += _activations(layer)
        elif not isinstance(layer, keras.layers.InputLayer):
            total += sum(math.prod(t.shape[1:]) for t in keras.tree.flatten(layer.output))
    return total


def _variant(label, kind, model, prof, base, **extra):
    return {"label": label, "kind": kind, "model": model, "params": prof.total_params,
            "macs": prof.total_macs, "activations": _activations(model),
            "params_ratio": prof.total_params / base.total_params,
            "macs_ratio": prof.total_macs / base.total_macs, **extra}


def _synflow_variant(name, base_prof, target_params, iterations):
    """Baseline architecture with SynFlow masks keeping ``target_params`` nonzeros."""
    model = kp.models.get(name)
    prunable = sum(int(v.numpy().size) for v in kp.pai.prunable_weights(model).values())
    fixed = model.count_params() - prunable
    density = (target_params - fixed) / prunable
    start = time.perf_counter()
    masks = kp.pai.synflow(model, density, iterations=iterations, verbose=0)
    seconds = time.perf_counter() - start
    kp.pai.apply_masks(model, masks)
    nonzero = fixed + sum(int(m.sum()) for m in masks.values())
    # MACs a perfect sparse kernel would execute: each masked layer's MACs
    # scale with its kernel's density.
    layer_macs = {layer.name: layer.macs for layer in base_prof.layers}
    saved = 0.0
    for path, mask in masks.items():
        layer = path.rsplit("/", 1)[0]
        if layer not in layer_macs:
            raise KeyError(f"Mask {path!r} names no layer of the profile of {name!r}.")
        saved += layer_macs[layer] * (1.0 - float(mask.mean()))
    return _variant(
        f"synflow@precrop{SYNFLOW_AT}", "synflow", model, base_prof, base_prof,
        flops=None, round_to=None, latency_budget=None, density=density,
        synflow_iterations=iterations,
        synflow_seconds=seconds, nonzero_params=nonzero,
        nonzero_macs_ratio=(base_prof.total_macs - saved) / base_prof.total_macs)


def _planned(label, kind, model, base_prof, lm, **extra):
    """A PreCrop variant with its plan's SynExp objective and predicted time ratio."""
    plan = model.precrop_plan
    return _variant(label, kind, model, kp.profile(model), base_prof,
                    objective=plan.solver["objective"],
                    predicted_time_ratio=lm.predict(model) / lm.seconds, **extra)


def _variants(name, synflow_iterations, quick):
    """The baseline, the PreCrop models (FLOPs and latency budgets) and the SynFlow model.

    Returns ``(variants, infeasible, latency model summary)``.
    """
    base = kp.models.get(name)
    base_prof = kp.profile(base)
    _log(f"  latency model (batch {MODELS[name][0]}, {FIT[quick]}) ...")
    lm = kp.latency_model(base, batch_size=MODELS[name][0], **FIT[quick])
    out = [_variant("baseline", "baseline", base, base_prof, base_prof, flops=1.0, round_to=1,
                    latency_budget=None, objective=0.0, predicted_time_ratio=1.0)]
    infeasible = []
    for flops in FLOPS:
        for round_to in ROUNDINGS:
            try:
                # Exact mode, as the committed results were measured (auto picks layerwise).
                model = kp.precrop(base, flops=flops, round_to=round_to, mode="exact")
            except kp.InfeasibleBudgetError as err:
                infeasible.append({"flops": flops, "round_to": round_to, "error": str(err)})
                continue
            out.append(_planned(f"precrop{flops}/r{round_to}", "precrop", model, base_prof, lm,
                                flops=flops, round_to=round_to, latency_budget=None))
    for ratio in LATENCY:
        try:
            model = kp.precrop(base, latency=ratio, latency_model=lm)
        except kp.InfeasibleBudgetError as err:
            infeasible.append({"latency_budget": ratio, "error": str(err)})
            continue
        out.append(_planned(f"latency{ratio}", "latency", model, base_prof, lm, flops=None,
                            round_to=1, latency_budget=ratio))
    target = next(v for v in out if v["flops"] == SYNFLOW_AT and v["round_to"] == 1)["params"]
    try:
        out.append(_synflow_variant(name, base_prof, target, synflow_iterations))
    except Exception as err:  # noqa: BLE001 - a baseline's bug must not void the other rows
        _log(f"  SynFlow failed on {name}: {type(err).__name__}: {err}")
        infeasible.append({"variant": "synflow", "error": f"{type(err).__name__}: {err}"})
    for v in out:
        v["activations_ratio"] = v["activations"] / out[0]["activations"]
    fit = {"batch_size": lm.batch_size, "block": lm.block, "error": lm.error,
           "fit_seconds": lm.fit_seconds, "variants": len(lm.variants)}
    return out, infeasible, fit


_MAKERS = {
    "latency": _timing.forward,
    "throughput": _timing.forward,
    "tflite": lambda model, batch: kp.latency.runner(model, batch, runtime="tflite"),
    "train": _timing.train_step,
}


def _profiled(v):
    """Whether the per-op profiles include a variant: the baseline, SynFlow and the 0.5 plans."""
    return v["kind"] in ("baseline", "synflow") or OPS_AT in (v["flops"], v["latency_budget"])


def _measure(name, variants, quick, ops_rounds):
    """Times every variant for each measurement; adds results to the variants.

    With ``ops_rounds`` > 0 also profiles per-op times of the baseline, the
    0.5 PreCrop models (FLOPs and latency budgets) and the SynFlow-masked
    model (TF batched inference and training); returns
    ``(batches, {measurement: {variant: {op type: ms per call}}})``.
    """
    throughput_batch, train_batch = MODELS[name]
    batches = {"latency": 1, "throughput": throughput_batch, "tflite": throughput_batch,
               "train": train_batch}
    ops = {}
    for what, (full, short, target_s) in MEASUREMENTS.items():
        _log(f"  {what} (batch {batches[what]}) ...")
        fns = {v["label"]: _MAKERS[what](v["model"], batches[what]) for v in variants}
        samples = _timing.interleaved(fns, short if quick else full, target_s=target_s)
        if ops_rounds and what in ("throughput", "train"):
            _log(f"  {what}: per-op profile ...")
            ops[what] = _timing.op_times(
                {v["label"]: fns[v["label"]] for v in variants if _profiled(v)},
                rounds=ops_rounds)
        base = samples["baseline"]
        for v in variants:
            v[what] = {"batch": batches[what], "seconds": _timing.summary(samples[v["label"]]),
                       "speedup": _timing.paired_speedup(base, samples[v["label"]])}
        if what == "train":
            losses = {v["label"]: fns[v["label"]]() for v in variants}
            bad = [k for k, loss in losses.items() if loss != loss or abs(loss) == float("inf")]
            if bad:
                raise FloatingPointError(f"{name}: training loss diverged for {bad}.")
    return batches, ops


def _bench_model(name, quick, synflow_iterations, ops_rounds):
    _log(f"{name}: building variants ...")
    start = time.perf_counter()
    variants, infeasible, fit = _variants(name, synflow_iterations, quick)
    _log(f"  built in {time.perf_counter() - start:.0f} s")
    batches, ops = _measure(name, variants, quick, ops_rounds)
    for v in variants:
        v.pop("model")
    keras.backend.clear_session()
    return {"model": name, "batches": batches, "variants": variants, "infeasible": infeasible,
            "ops": ops, "latency_model": fit}


def _goal_rows(rows):
    out = []
    for row in rows:
        if row["model"] not in GOAL_MODELS:
            continue
        for v in row["variants"]:
            if v["kind"] == "precrop" and v["flops"] == GOAL_FLOPS:
                goal, what = GOAL_SPEEDUP, ("throughput",)
            elif v["kind"] == "latency" and v["latency_budget"] == GOAL_LATENCY:
                goal, what = GOAL_LATENCY_SPEEDUP, ("throughput", "tflite")
            else:
                continue
            for w in what:
                s = v[w]["speedup"]
                out.append({"model": row["model"], "variant": v["label"], "runtime": w,
                            "macs_ratio": v["macs_ratio"], "throughput_speedup": s,
                            "goal": goal, "met": s >= goal})
    return out


def _fmt_ms(v, what):
    return f"{v[what]['seconds']['median'] * 1e3:.2f}"


def _op_category(op):
    """Coarse class of a TF op type for the per-op summary."""
    if "Depthwise" in op:
        return "depthwise"
    if "Conv2D" in op or "MatMul" in op:
        return "conv/dense"
    if op.startswith("StridedSlice"):  # ChannelSlice and its gradient
        return "StridedSlice"
    return "elementwise/other"


def _ops_summary_markdown(row):
    """Per-op times summed by category, as ratios to the baseline, next to the speedup."""
    cats = ("conv/dense", "depthwise", "elementwise/other", "StridedSlice")
    ratios = {v["label"]: v["activations_ratio"] for v in row["variants"]}
    lines = []
    for what, by_variant in row["ops"].items():
        sums = {}
        for label, ops in by_variant.items():
            sums[label] = dict.fromkeys(cats, 0.0)
            for op, ms in ops.items():
                sums[label][_op_category(op)] += ms
        base = sums["baseline"]
        total = sum(base.values())
        lines += ["", f"### {row['model']}, {what} (batch {row['batches'][what]}): time by op "
                  "class", "", "Baseline: share of its op time; others: op time / baseline's "
                  "(StridedSlice: ms added).", "",
                  "| variant | " + " | ".join(cats) + " | all ops | activations ratio | "
                  "measured speedup |", "|---|" + "---|" * (len(cats) + 3)]
        for label, by_cat in sums.items():
            speedup = next(v[what]["speedup"] for v in row["variants"] if v["label"] == label)
            if label == "baseline":
                cells = [f"{by_cat[c] / total:.0%}" for c in cats]
                all_ops = f"{total:.1f} ms"
            else:
                cells = [f"{by_cat[c] / base[c]:.2f}" if base[c] else
                         f"+{by_cat[c]:.1f} ms" if by_cat[c] else "-" for c in cats]
                all_ops = f"{sum(by_cat.values()) / total:.2f}"
            lines.append(f"| {label} | " + " | ".join(cells) + f" | {all_ops} | "
                         f"{ratios[label]:.2f} | {speedup:.2f}x |")
    return lines


def _ops_markdown(row):
    """Per-op tables of one model: ms per call and ratio to the baseline."""
    lines = []
    for what, by_variant in row["ops"].items():
        labels = list(by_variant)
        base = by_variant["baseline"]
        shown, covered = [], 0.0
        for op, ms in base.items():
            if covered >= OPS_SHOWN * sum(base.values()):
                break
            shown.append(op)
            covered += ms
        shown += sorted({op for label in labels for op, ms in by_variant[label].items()
                         if op not in shown and ms >= 0.02 * sum(by_variant[label].values())})
        lines += ["", f"### {row['model']}: per-op time, {what} (batch {row['batches'][what]})",
                  "", "ms per call summed over compute threads (TF profiler; median over "
                  "interleaved rounds); in brackets: ratio to the baseline.", "",
                  "| op type | " + " | ".join(labels) + " |", "|---|" + "---|" * len(labels)]
        for op in shown + ["(all ops)"]:
            cells = []
            for label in labels:
                ops = by_variant[label]
                ms = sum(ops.values()) if op == "(all ops)" else ops.get(op, 0.0)
                ref = sum(base.values()) if op == "(all ops)" else base.get(op, 0.0)
                cells.append(f"{ms:.1f}" if label == "baseline" or not ref
                             else f"{ms:.1f} ({ms / ref:.2f})")
            lines.append(f"| {op} | " + " | ".join(cells) + " |")
    return lines


def _markdown(result):
    """The benchmark's Markdown report: how it measured, one table per model, budgets, ops, goals."""
    lines = _intro_markdown(result)
    for row in result["models"]:
        lines += _model_markdown(row)
    lines += _budgets_markdown(result["models"])
    for row in result["models"]:
        lines += _ops_summary_markdown(row)
    for row in result["models"]:
        lines += _ops_markdown(row)
    lines += _goals_markdown(result["goals"])
    lines += ["", f"Command: `{result['command']}`; total {result['seconds']:.0f} s.", "",
              "![speedup vs ideal](speedup.png)"]
    return "\n".join(lines) + "\n"


def _intro_markdown(result):
    """The report's title, machine and how each column was measured."""
    m = result["machine"]
    return [
        "# PreCrop speedups on CPU",
        "",
        f"{'QUICK RUN (few repeats; not for quoting). ' if result['quick'] else ''}"
        f"{'' if result['complete'] else 'INCOMPLETE RUN (models still to come). '}"
        f"Machine: {m['cpu']}, {m['usable_cpus']} usable CPUs, TF {m['tensorflow']}, "
        f"Keras {m['keras']}, intra/inter-op threads {m['intra_op_threads']}/"
        f"{m['inter_op_threads']} (0 = TF default, one per core), load average at start "
        f"{', '.join(f'{x:.1f}' for x in m['load_average_at_start'])}.",
        "",
        "Times are medians over interleaved rounds (round-robin over the variants); speedup = "
        "median over rounds of baseline time / variant time in the same round; ideal = "
        "baseline MACs / variant MACs. Latency: batch 1 inference; throughput: images/s of "
        "batched inference; train: one SGD (momentum 0.9) step. SynFlow@precrop0.5 is the "
        "baseline architecture with SynFlow masks keeping as many nonzero parameters as "
        "PreCrop flops=0.5 (round_to=1); its kernels are dense with zeros inside, so it "
        "executes the baseline's MACs (column 'nonzero MACs' is what a perfect sparse kernel "
        "would execute). Activations ratio: layer output elements per example vs the "
        "baseline, the scale of the memory-bound elementwise work (batch norm, activations, "
        "padding, adds), which is linear in width while convolution MACs are quadratic. "
        "latencyR: PreCrop with latency=R (a latency model fitted first on this machine: TF "
        "inference at the throughput batch; exact mode, round_to=1). Pred. time: the plan's "
        "time as that latency model predicts it, vs the baseline. Objective: the plan's SynExp "
        "objective (sum over kernels of log density; 0 = unpruned; higher keeps more of the "
        "accuracy proxy). TFLite: batched inference in the TFLite interpreter (one thread per "
        "core) of the same models.",
    ]


def _model_markdown(row):
    """One model's section: its batches, latency model and the table of its variants."""
    b = row["batches"]
    fit = row["latency_model"]
    lines = [
        "",
        f"## {row['model']}",
        "",
        f"Batches: latency {b['latency']}, throughput {b['throughput']}, TFLite "
        f"{b['tflite']}, train {b['train']}. Latency model: {fit['variants']} variants at "
        f"batch {fit['batch_size']}, block {fit['block']}, held-out error median "
        f"{_timing.share(fit['error']['median'])}, worst "
        f"{_timing.share(fit['error']['worst'])}, on its last "
        f"refinement plans {_timing.plan_error(fit['error'])}, fitted in "
        f"{fit['fit_seconds']:.0f} s.",
        "",
        "| variant | params | MACs | MACs ratio | ideal | activations ratio | pred. time | "
        "objective | latency ms | speedup | throughput img/s | speedup | TFLite img/s | "
        "speedup | train step ms | speedup |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for v in row["variants"]:
        ideal = 1.0 / v["macs_ratio"]
        macs = f"{v['macs']:,}"
        if v["kind"] == "synflow":
            macs += f" (nonzero {v['nonzero_macs_ratio']:.2f}x)"
            params = f"{v['nonzero_params']:,} nonzero"
        else:
            params = f"{v['params']:,}"
        tput = b["throughput"] / v["throughput"]["seconds"]["median"]
        lite = b["tflite"] / v["tflite"]["seconds"]["median"]
        if "objective" in v:  # a planned variant
            planned = f"{v['predicted_time_ratio']:.3f} | {v['objective']:.1f}"
        else:
            planned = "- | -"
        lines.append(
            f"| {v['label']} | {params} | {macs} | {v['macs_ratio']:.3f} | {ideal:.2f}x | "
            f"{v['activations_ratio']:.3f} | {planned} | {_fmt_ms(v, 'latency')} | "
            f"{v['latency']['speedup']:.2f}x | {tput:.1f} | "
            f"{v['throughput']['speedup']:.2f}x | {lite:.1f} | {v['tflite']['speedup']:.2f}x | "
            f"{_fmt_ms(v, 'train')} | {v['train']['speedup']:.2f}x |")
    for bad in row["infeasible"]:
        if bad.get("variant") == "synflow":
            what = "SynFlow masks: FAILED"
        elif "latency_budget" in bad:
            what = f"PreCrop latency={bad['latency_budget']}: infeasible"
        else:
            what = f"PreCrop flops={bad['flops']}, round_to={bad['round_to']}: infeasible"
        lines.append(f"\n{what} ({bad['error']}).")
    return lines


def _goals_markdown(goals):
    """The table of the speedup goals, met or not (none without goals)."""
    if not goals:
        return []
    lines = ["", f"## Goals: PreCrop at 50% MACs, CPU throughput >= {GOAL_SPEEDUP}x; "
             f"latency={GOAL_LATENCY}, >= {GOAL_LATENCY_SPEEDUP}x (TF and TFLite)",
             "", "| model | variant | runtime | MACs ratio | throughput speedup | goal | met? |",
             "|---|---|---|---|---|---|---|"]
    for g in goals:
        lines.append(f"| {g['model']} | {g['variant']} | {g['runtime']} | "
                     f"{g['macs_ratio']:.3f} | {g['throughput_speedup']:.2f}x | "
                     f">= {g['goal']}x | {'met' if g['met'] else 'NOT met'} |")
    return lines


def _budgets_markdown(rows):
    """FLOPs-planned vs latency-planned models at the same budget ratio."""
    lines = ["", "## FLOPs budget vs latency budget at the same ratio", "",
             "Same ratio R: `precrop(flops=R)` (round_to 1 and 16) vs `precrop(latency=R)`. "
             "Objective: SynExp (sum of log densities; closer to 0 keeps more); the "
             "difference to the FLOPs plan (round_to=1) is what the latency plan gives up "
             "(negative) or keeps extra (positive).", "",
             "| model | R | variant | MACs ratio | pred. time | TF speedup | TFLite speedup | "
             "train speedup | objective | vs flops plan |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        by_label = {v["label"]: v for v in row["variants"]}
        for ratio in sorted(set(FLOPS) & set(LATENCY), reverse=True):
            ref = by_label.get(f"precrop{ratio}/r1")
            for label in (f"precrop{ratio}/r1", f"precrop{ratio}/r16", f"latency{ratio}"):
                v = by_label.get(label)
                if v is None:
                    continue
                diff = ("-" if ref is None or v is ref
                        else f"{v['objective'] - ref['objective']:+.1f}")
                lines.append(
                    f"| {row['model']} | {ratio} | {label} | {v['macs_ratio']:.3f} | "
                    f"{v['predicted_time_ratio']:.3f} | {v['throughput']['speedup']:.2f}x | "
                    f"{v['tflite']['speedup']:.2f}x | {v['train']['speedup']:.2f}x | "
                    f"{v['objective']:.1f} | {diff} |")
    return lines


def _plot(result, path):
    """Measured vs ideal speedup, one panel per measurement (colour: model; marker: variant)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    whats = list(MEASUREMENTS)
    markers = {**{f"r{r}": m for r, m in zip(ROUNDINGS, "os^")}, "latency": "D", "synflow": "x"}
    fig, axes = plt.subplots(1, len(whats), figsize=(5 * len(whats), 4.8), sharey=True)
    top = 1.0
    for ax, what in zip(axes, whats):
        for i, row in enumerate(result["models"]):
            for v in row["variants"]:
                if v["kind"] == "baseline":
                    continue
                synflow = v["kind"] == "synflow"
                x = 1.0 / (v["nonzero_macs_ratio"] if synflow else v["macs_ratio"])
                marker = markers[v["kind"] if v["kind"] in markers else f"r{v['round_to']}"]
                ax.scatter(x, v[what]["speedup"], marker=marker, color=f"C{i}", s=36)
                top = max(top, x, v[what]["speedup"])
        ax.set_title(what)
        ax.set_xlabel("ideal = baseline MACs / MACs")
        ax.grid(alpha=0.3)
    lim = [0.8, top * 1.1]
    for ax in axes:
        ax.plot(lim, lim, "k--", lw=1)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xlim(lim)
        ax.set_ylim(0.5, top * 1.1)
    axes[0].set_ylabel("measured speedup vs baseline (median)")
    handles = [plt.Line2D([], [], color="k", ls="--", label="ideal")]
    handles += [plt.Line2D([], [], color=f"C{i}", marker="o", ls="", label=row["model"])
                for i, row in enumerate(result["models"])]
    handles += [plt.Line2D([], [], color="k", marker=m, ls="",
                           label={"synflow": "SynFlow masks (x: nonzero MACs)",
                                  "latency": "PreCrop latency budget"}.get(
                               k, f"PreCrop round_to={k[1:]}")) for k, m in markers.items()]
    axes[0].legend(handles=handles, fontsize=7, loc="upper left")
    fig.suptitle(f"PreCrop vs SynFlow masks: CPU speedup vs MACs ratio "
                 f"({result['machine']['cpu']}, {result['machine']['usable_cpus']} CPUs)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="few repeats, resnet20 only unless --models is given")
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), help="models to run")
    parser.add_argument("--synflow-iterations", type=int, default=None,
                        help="SynFlow rounds (default 100, 10 with --quick); the mask pattern "
                             "does not change dense-kernel speed")
    parser.add_argument("--ops-rounds", type=int, default=None,
                        help="interleaved profiler rounds (2 calls each) for the per-op tables "
                             "(default 4, 2 with --quick; 0 skips them)")
    parser.add_argument("--intra-op-threads", type=int, default=0,
                        help="TensorFlow intra-op threads (0: TF default, one per core)")
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS,
                        help="folder for speedup.json/.md/.png (default benchmarks/results)")
    parser.add_argument("--render-only", action="store_true",
                        help="measure nothing: rewrite speedup.md and speedup.png from the "
                             "existing speedup.json")
    args = parser.parse_args()
    if args.render_only:
        result = json.loads((args.out / "speedup.json").read_text())
        _write(result, args.out, json_too=False)
        return
    if args.intra_op_threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.intra_op_threads)
    names = args.models or (["resnet20"] if args.quick else list(MODELS))
    iterations = args.synflow_iterations or (10 if args.quick else 100)

    ops_rounds = (2 if args.quick else 4) if args.ops_rounds is None else args.ops_rounds

    start = time.perf_counter()
    result = {
        "what": "CPU wall-clock speedup of PreCrop (exact mode) and SynFlow-masked models "
                "vs the dense baseline",
        "units": "seconds per call (median, quartiles over interleaved rounds); speedup = "
                 "median of same-round baseline/variant time ratios",
        "quick": args.quick,
        "command": " ".join(["python", "benchmarks/bench_speedup.py"] + sys.argv[1:]),
        "machine": _timing.machine_info(),
        "rounds": {k: (v[1] if args.quick else v[0]) for k, v in MEASUREMENTS.items()},
        "ops_rounds": ops_rounds,
        "synflow_iterations": iterations,
        "models": [],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    for name in names:
        result["models"].append(_bench_model(name, args.quick, iterations, ops_rounds))
        # Written after every model, so a long run that fails keeps what it measured.
        result["complete"] = len(result["models"]) == len(names)
        result["goals"] = _goal_rows(result["models"])
        result["seconds"] = time.perf_counter() - start
        text = _write(result, args.out)
    print(text)


def _write(result, out, json_too=True):
    """Writes speedup.json (unless ``json_too`` is false), speedup.md and speedup.png."""
    if json_too:
        (out / "speedup.json").write_text(json.dumps(result, indent=2) + "\n")
    text = _markdown(result)
    (out / "speedup.md").write_text(text)
    _plot(result, out / "speedup.png")
    return text


if __name__ == "__main__":
    main()
