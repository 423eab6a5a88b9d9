"""Benchmark: latency budgets on one GPU, under JAX (XLA) and PyTorch (CUDA) (issue 44).

The one command to run on the GPU machine (about 8 minutes on one H200; JAX,
PyTorch and Keras installed, TensorFlow not needed)::

    python benchmarks/bench_gpu.py --out benchmarks/results/gpu

and the CPU dry run of the same code with tiny settings (ResNet-8, the zoo's
CIFAR ResNet at depth 8, at 16x16 and batch 2, the fewest latency-model
variants and rounds the library accepts, 2 timing rounds; its numbers mean
nothing, it checks the code; ``tests/test_bench_gpu.py`` runs it, in about a
minute)::

    python benchmarks/bench_gpu.py --quick

For each backend (a child process of this script per backend, ``KERAS_BACKEND``
set, since Keras picks its backend once per process) and each of ResNet-20 at
batch 1024 and 256 and keras.applications MobileNetV2 at 224x224, batch 64:

1. fit a latency model of inference (``kp.latency_model(runtime=backend)``);
2. plan ``latency=0.5`` in the default mode and in ``mode="uniform"``, and
   ``flops=0.5``, with it; a latency budget below what the narrowest model
   costs (the per-call launch floor) raises ``InfeasibleBudgetError``: the floor
   and the reason are recorded, and the plan is made at the floor instead
   (5% above it), so the table shows the speedup that is reachable;
3. time the original and the plans with this script's own timer, not the
   latency model's: inputs placed on the device once, every call waits for
   the device (``block_until_ready`` on a ``jax.jit`` step's outputs,
   ``torch.cuda.synchronize()`` after an eager torch call on CUDA), warm-up
   after compiling, the models round-robin, the order rotated each round,
   medians over rounds; speedups are the original's time over the plan's in
   the same round (median, min-max over rounds), for inference and for an SGD
   training step (forward, mean-square loss, backward, ``SGD(momentum=0.9)``).

Goal (issue 44): ``latency=0.5`` measures >= 1.8x on MobileNetV2 224 at batch
64 and on ResNet-20 at batch 1024, on both backends; where it cannot, the
floor with its reason.

Time budget (``--budget-s``, default 470 s of the 8 minutes): compiling
dominates on a GPU, not timing. Per backend: imports ~15 s; per network the
latency model's 8 variants and 1 refinement plan, each rebuilt (JAX compiles
its random initializers per new kernel shape) and compiled; the 3 plans
rebuilt; then 4 models x (inference + training step) compiled by this
script, whose timing itself is 5 rounds of ~0.05 s per model. Estimated (not
yet measured) on an H200: JAX ~60 s per ResNet-20 batch size and ~120 s for
MobileNetV2, torch (eager: nothing to compile) about half that. The JAX
child gets 3/5 of the budget, torch what is left. Every network's inference
is timed before any training step (the goals first: ResNet-20 at 1024, then
MobileNetV2, ResNet-20 at 256 last), and every step runs under a wall-clock
guard (``--step-s``, never past the child's share), so a slow step is
skipped with a note rather than overrunning; each child writes its JSON
after every step, so a stopped child's finished steps are kept.

Writes ``results.json`` and ``results.md`` into ``OUT/<device>/`` (e.g.
``benchmarks/results/gpu/nvidia-h200/``), the device named by the backends.
``benchmarks/results/gpu/`` holds GPU evidence only: a run on a CPU (the
``--quick`` dry run, or a machine without a GPU) writes into a new temporary
folder instead, and says where, so it never leaves files in the repository
that read as GPU results.
"""

import argparse
import json
import math
import os
import pathlib
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

HERE = pathlib.Path(__file__).resolve().parent
GPU_RESULTS = HERE / "results" / "gpu"  # committed GPU evidence: no CPU run writes here
# name, input size, batch, whether a training step is timed: the goal configurations first, so
# a short budget cuts the last one. The dry run is one small network: under JAX every layer costs
# compiles (its initializers per new kernel shape, each model's inference and training step).
CONFIGS = {False: (("resnet20", 32, 1024, True), ("mobilenet_v2", 224, 64, True),
                   ("resnet20", 32, 256, True)),
           True: (("resnet8", 16, 2, True),)}
# names that are not the zoo's: the dry run's ResNet-8 is the zoo's CIFAR ResNet at its smallest
# depth, ResNet-20's stem, stages, strided shortcuts and residual streams with 9 convolutions, not 21
ZOO = {"resnet8": ("resnet20", {"depth": 8})}
FIT = {False: dict(variants=8, rounds=3, refine=(0.5,), refine_rounds=1),
       True: dict(variants=6, rounds=1, refine_rounds=0)}
TIMING = {False: dict(rounds=5, target_s=0.05, warmup=2), True: dict(rounds=2, target_s=0.005, warmup=1)}
BUDGET = 0.5
PLANS = {f"latency{BUDGET}": dict(latency=BUDGET), f"latency{BUDGET} uniform": dict(latency=BUDGET,
                                                                                   mode="uniform"),
         "flops0.5": dict(flops=0.5)}
GOAL = 1.8  # measured inference speedup of latency=0.5 (default mode)
GOAL_CONFIGS = {("resnet20", 1024), ("mobilenet_v2", 64)}
SHARE = {"jax": 3, "torch": 2}  # weights of the backends' shares of the time budget
FLOOR_MARGIN = 1.05  # an infeasible latency budget is planned this far above its floor
ORIGINAL = "original"


def _log(tag, text):
    print(f"[bench_gpu {tag}] {text}", file=sys.stderr, flush=True)


# -- the child: one backend ----------------------------------------------------------------


def _jax_step(model, x, training):
    """One ``jax.jit`` inference pass or SGD step on ``x`` (on the device), waited for.

    The training step threads the weights, batch-norm statistics and optimizer
    state through the compiled function, as a JAX training loop does, and waits
    for all of them, not only the loss.
    """
    import jax
    import keras

    x = jax.device_put(x)
    state = [[v.value for v in model.trainable_variables],
             [v.value for v in model.non_trainable_variables]]
    if not training:
        forward = jax.jit(lambda tv, ntv, inputs: model.stateless_call(tv, ntv, inputs)[0])
        return lambda: forward(*state, x).block_until_ready()
    optimizer = keras.optimizers.SGD(learning_rate=1e-3, momentum=0.9)
    optimizer.build(model.trainable_variables)
    state.append([v.value for v in optimizer.variables])

    def loss_of(tv, ntv, inputs):
        y, ntv = model.stateless_call(tv, ntv, inputs, training=True)
        return keras.ops.mean(keras.ops.square(y)), ntv

    @jax.jit
    def update(tv, ntv, ov, inputs):
        (loss, ntv), grads = jax.value_and_grad(loss_of, has_aux=True)(tv, ntv, inputs)
        tv, ov = optimizer.stateless_apply(ov, grads, tv)
        return [tv, ntv, ov], loss

    def step():
        state[:], loss = update(*state, x)
        return jax.block_until_ready((state, loss))

    return step


def _torch_step(model, x, training):
    """One eager torch inference pass or SGD step on ``x`` (on the weights' device), waited for
    with ``torch.cuda.synchronize()`` on CUDA (a CPU call returns when it is done)."""
    import torch

    device = model.weights[0].value.device
    x = torch.as_tensor(x, device=device)
    wait = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    if not training:
        def forward():
            with torch.no_grad():
                y = model(x, training=False)
            wait()
            return y

        return forward
    optimizer = torch.optim.SGD([v.value for v in model.trainable_variables], lr=1e-3, momentum=0.9)

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss = torch.mean(torch.square(model(x, training=True)))
        loss.backward()
        optimizer.step()
        wait()
        return loss

    return step


def _interleaved(steps, rounds, target_s, warmup):
    """This script's clock: seconds per call of each step, round-robin, one entry per round.

    Each step is warmed up (compiling, allocator, autotuning), its inner loop
    sized to about ``target_s``, then every round times every step once, the
    order rotated by one each round so a slow phase hits all alike. Steps wait
    for the device themselves, so the clock reads finished work.
    """
    names = list(steps)
    for name in names:
        for _ in range(warmup):
            steps[name]()
    inner = {}
    for name in names:
        start = time.perf_counter()
        steps[name]()
        inner[name] = max(1, math.ceil(target_s / max(time.perf_counter() - start, 1e-6)))
    samples = {name: [] for name in names}
    for r in range(rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            start = time.perf_counter()
            for _ in range(inner[name]):
                steps[name]()
            samples[name].append((time.perf_counter() - start) / inner[name])
    return samples


def _measure(models, backend, batch, training, timing):
    """The speedup of each model over the original, timed interleaved by :func:`_interleaved`."""
    import numpy as np

    make = {"jax": _jax_step, "torch": _torch_step}[backend]
    x = np.random.default_rng(0).standard_normal((batch, *models[ORIGINAL].input_shape[1:]))
    steps = {name: make(model, x.astype("float32"), training) for name, model in models.items()}
    samples = _interleaved(steps, **timing)
    base = samples[ORIGINAL]
    out = {}
    for name, seconds in samples.items():
        ratios = [b / s for b, s in zip(base, seconds)]
        out[name] = {"median_s": statistics.median(seconds), "speedup": statistics.median(ratios),
                     "speedup_min": min(ratios), "speedup_max": max(ratios), "rounds": len(ratios)}
    return out


class _Overrun(Exception):
    """A step ran past its wall-clock guard."""


def _alarm(signum, frame):
    raise _Overrun


class _Guard:
    """Runs the child's steps within its time budget, each under a wall-clock alarm.

    A step gets ``step_s`` seconds, never more than the budget has left; one
    that overruns or fails is skipped with a note in the result's ``notes``
    (so a slow compile cannot eat the whole run), and the result is written
    to ``path`` after every step, so what finished survives a killed process.
    """

    MIN_S = 5.0  # a step is not started with less time left than this

    def __init__(self, result, path, budget_s, step_s):
        self.result, self.path, self.step_s = result, path, step_s
        self.start = time.monotonic()
        self.deadline = self.start + budget_s
        signal.signal(signal.SIGALRM, _alarm)

    def log(self, text):
        _log(f"{self.result['backend']} {time.monotonic() - self.start:.0f}s", text)

    def __call__(self, what, fn):
        """``fn()``, or None (with a note) where it overran, failed or had no time left."""
        left = self.deadline - time.monotonic()
        seconds = min(self.step_s, left)
        if left < self.MIN_S:
            return self._note(f"{what}: not run, the backend's time budget was spent")
        self.log(f"{what} (guard {seconds:.0f} s)")
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            value = fn()
        except _Overrun:
            return self._note(f"{what}: skipped, it ran past its {seconds:.0f} s guard")
        except Exception as err:  # a failed step is a note in the table, not a lost run
            traceback.print_exc()
            return self._note(f"{what}: failed: {type(err).__name__}: {err}")
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        self.save()
        return value

    def _note(self, text):
        self.result["notes"].append(text)
        self.log(text)
        self.save()

    def save(self):
        self.result["seconds"] = time.monotonic() - self.start
        self.path.write_text(json.dumps(self.result, indent=2) + "\n")


def _latency_floor(err, lm):
    """The smallest feasible latency ratio an ``InfeasibleBudgetError`` names, or None."""
    import keras_precrop as kp

    limit = err.limit.get(kp.latency.ROW) if isinstance(err.limit, dict) else None
    return None if limit is None else float(limit) / lm.seconds


def _plan(base, lm, options):
    """One plan and its rebuilt model; an infeasible latency budget is planned at its floor.

    Returns:
        ``(record, model or None)``: the plan's mode, params and MACs ratios,
        predicted time ratio, and, for an infeasible budget, ``infeasible``:
        the floor ratio, the reason and the budget planned instead.
    """
    import keras_precrop as kp

    record = {"options": dict(options)}
    try:
        plan = kp.plan(base, latency_model=lm, **options)
    except kp.InfeasibleBudgetError as err:
        floor = _latency_floor(err, lm)
        retry = None if floor is None or floor * FLOOR_MARGIN >= 1 else floor * FLOOR_MARGIN
        record["infeasible"] = {"floor_ratio": floor, "why": str(err), "planned_at": retry}
        if retry is None:
            return record, None
        plan = kp.plan(base, latency_model=lm, **{**options, "latency": retry})
    record.update(mode=plan.mode_label, params_ratio=plan.params / plan.original["params"],
                  macs_ratio=plan.macs / plan.original["macs"],
                  predicted_ratio=plan.latency / plan.original["latency"])
    return record, kp.apply_plan(base, plan)


def _prepare(guard, study, backend, quick, plan_options):
    """Builds one network, fits its latency model and makes the plans, filling ``study``.

    ``plan_options`` are added to every plan's (see :func:`_torch_cpu_workarounds`).

    Returns:
        ``{name: model}``: the original and each plan's rebuilt model, or None
        where the network or its latency model could not be made in time.
    """
    import keras_precrop as kp

    tag = f"{study['model']} batch {study['batch']}"
    zoo_name, options = ZOO.get(study["model"], (study["model"], {}))
    base = guard(f"{tag}: building", lambda: kp.models.get(
        zoo_name, input_shape=(study["input"], study["input"], 3), **options))
    if base is None:
        return None
    study["params"] = base.count_params()
    lm = guard(f"{tag}: fitting the latency model", lambda: kp.latency_model(
        base, study["batch"], runtime=backend, verbose=1, **FIT[quick]))
    if lm is None:
        return None
    study["fit"] = {"seconds": lm.fit_seconds, "predicted_s": lm.seconds, "block": lm.block,
                    "error": {k: lm.error.get(k) for k in ("median", "worst", "plans_median", "plans_worst")}}
    models = {ORIGINAL: base}
    for label, options in PLANS.items():
        planned = guard(f"{tag}: planning {label}", lambda: _plan(base, lm, {**options,
                                                                             **plan_options}))
        if planned is not None:
            study["plans"][label], model = planned
            if model is not None:
                models[label] = model
    guard.save()
    return models


def _time(guard, study, models, backend, kind, quick):
    """Times ``models`` interleaved (``kind``: ``"inference"`` or ``"training"``) into ``study``."""
    measured = guard(f"{study['model']} batch {study['batch']}: timing {kind} of {len(models)} models",
                     lambda: _measure(models, backend, study["batch"], kind == "training",
                                      TIMING[quick]))
    if measured is not None:
        study[kind] = measured
        guard.save()


def _torch_cpu_workarounds(result):
    """Works around two torch 2.13 CPU bugs in the backward pass of narrow convolutions.

    Both come from the channels-last kernels Keras passes to torch. With
    oneDNN (mkldnn) the backward pass aborted the process ("corrupted
    double-linked list", "free(): invalid size") on narrow rebuilt
    ResNet-20s, so it is turned off; without it, ``slow_conv2d`` raises
    "grad_weight must be contiguous" for a 3x3 convolution with one output
    channel, so plans keep at least 2 channels per width (``min_channels=2``).
    Both are said in ``result["caveats"]``; CUDA runs need neither.

    Returns:
        The options added to every plan.
    """
    import torch

    torch.backends.mkldnn.enabled = False
    result["caveats"] += ["torch on the CPU ran without oneDNN (torch.backends.mkldnn): its "
                          "backward pass aborted on narrow rebuilt ResNet-20s",
                          "torch on the CPU planned with min_channels=2: its backward pass "
                          "without oneDNN fails on 3x3 convolutions with 1 output channel"]
    return {"min_channels": 2}


def child(args):
    """Runs every configuration under the current backend; writes the JSON to ``--child-json``.

    Inference first for every network (the goals), then the training steps
    with what time is left.
    """
    import keras

    import _timing

    backend = keras.backend.backend()
    if backend != args.child:
        raise SystemExit(f"--child {args.child} needs KERAS_BACKEND={args.child}, got {backend!r}")
    result = {"backend": backend, "device": _timing.device(backend),
              "machine": _timing.machine_info(), "studies": [], "notes": [], "caveats": []}
    on_cpu_torch = backend == "torch" and result["device"].startswith("CPU")
    plan_options = _torch_cpu_workarounds(result) if on_cpu_torch else {}
    guard = _Guard(result, pathlib.Path(args.child_json), args.budget_s, args.step_s)
    guard.log(f"device: {result['device']}; budget {args.budget_s:.0f} s")
    prepared = []
    for name, size, batch, training in CONFIGS[args.quick]:
        study = {"model": name, "input": size, "batch": batch, "plans": {}}
        result["studies"].append(study)
        models = _prepare(guard, study, backend, args.quick, plan_options)
        if models is not None:
            _time(guard, study, models, backend, "inference", args.quick)
            prepared += [(study, models)] if training else []
    for study, models in prepared:
        _time(guard, study, models, backend, "training", args.quick)
    guard.save()
    return 0


# -- the parent: one child per backend, merged ---------------------------------------------


def _run_child(backend, args, budget_s, folder):
    """Runs the child of ``backend`` (its output streams through); returns its result."""
    path = pathlib.Path(folder) / f"{backend}.json"
    command = [sys.executable, __file__, "--child", backend, "--child-json", str(path),
               "--budget-s", f"{budget_s:.1f}", "--step-s", str(args.step_s)]
    command += ["--quick"] if args.quick else []
    env = {**os.environ, "KERAS_BACKEND": backend}
    note = None
    try:
        code = subprocess.run(command, env=env, timeout=budget_s + 60).returncode
        note = None if code == 0 else f"the {backend} process exited with status {code}"
    except subprocess.TimeoutExpired:
        note = f"the {backend} process was stopped {budget_s + 60:.0f} s after it started"
    result = json.loads(path.read_text()) if path.exists() else {"backend": backend, "studies": [],
                                                                 "notes": []}
    result["notes"] += [note] if note else []
    return result


def _installed(backend):
    import importlib.util

    return importlib.util.find_spec(backend) is not None


def run(args):
    """Runs one child per backend within ``--budget-s``; writes the merged JSON and Markdown."""
    start = time.monotonic()
    results = {}
    with tempfile.TemporaryDirectory() as folder:
        for i, backend in enumerate(args.backends):
            if not _installed(backend):
                results[backend] = {"backend": backend, "studies": [],
                                    "notes": [f"{backend} is not installed here"]}
                continue
            left = args.budget_s - (time.monotonic() - start)
            share = SHARE[backend] / sum(SHARE[b] for b in args.backends[i:])
            results[backend] = _run_child(backend, args, left * share, folder)
    result = {"command": " ".join(["python", "benchmarks/bench_gpu.py", *sys.argv[1:]]),
              "settings": {"quick": args.quick, "budget_s": args.budget_s, "step_s": args.step_s,
                           "fit": FIT[args.quick], "timing": TIMING[args.quick],
                           "plans": PLANS, "goal_speedup": GOAL},
              "seconds": time.monotonic() - start, "backends": results}
    result["goals"] = goals(result)
    device = next((r["device"] for r in results.values() if r.get("device")), "unknown device")
    out = _out_folder(args.out, device) / _slug(device)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    text = markdown(result)
    (out / "results.md").write_text(text)
    print(text)
    _log("done", f"{result['seconds']:.0f} s; wrote {out}/results.json and results.md")
    return 0


def _out_folder(out, device):
    """Where the results go: ``--out``, else ``results/gpu/`` for a GPU run; a new temporary
    folder for a run on a CPU that would write under ``results/gpu/`` (the dry run, by default)."""
    on_gpu = device != "unknown device" and not device.startswith("CPU")
    if on_gpu or (out is not None and not out.resolve().is_relative_to(GPU_RESULTS)):
        return out or GPU_RESULTS
    if out is not None:
        _log("out", f"{device} is no GPU and {out} holds GPU results only: writing elsewhere")
    return pathlib.Path(tempfile.mkdtemp(prefix="bench_gpu_"))


def _slug(device):
    """A folder name for a device: ``"NVIDIA H200"`` -> ``"nvidia-h200"``."""
    return re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-") or "device"


# -- goals and Markdown ---------------------------------------------------------------------


def goals(result):
    """Per backend and network: whether ``latency=0.5`` measured >= 1.8x, or the floor and why."""
    rows = []
    for backend, r in result["backends"].items():
        for s in r["studies"]:
            plan = s["plans"].get(f"latency{BUDGET}", {})
            timed = s.get("inference", {}).get(f"latency{BUDGET}")
            infeasible = plan.get("infeasible")
            rows.append({"backend": backend, "model": s["model"], "batch": s["batch"],
                         "issue_goal": (s["model"], s["batch"]) in GOAL_CONFIGS,
                         "speedup": timed and timed["speedup"],
                         "reached": bool(timed and not infeasible and timed["speedup"] >= GOAL),
                         "floor_ratio": infeasible and infeasible["floor_ratio"],
                         "planned_at": infeasible and infeasible["planned_at"],
                         "why": infeasible["why"] if infeasible else None})
    return rows


def _ratio(x):
    return "-" if x is None else f"{x:.3f}"


def _speedup(timed):
    if timed is None:
        return "-"
    return f"{timed['speedup']:.2f}x ({timed['speedup_min']:.2f}-{timed['speedup_max']:.2f})"


def _plan_rows(backend, device, s):
    """The table rows of one study: the original, then each plan (or why it is missing)."""
    rows = []
    for label in [ORIGINAL, *PLANS]:
        p = s["plans"].get(label, {})
        if label != ORIGINAL and not p:
            continue
        floor = p.get("infeasible")
        name = label if not floor else (
            f"{label}: infeasible, floor {_ratio(floor['floor_ratio'])}; planned at "
            f"{_ratio(floor['planned_at'])}")
        cells = [backend, device, s["model"], f"{s['input']}", f"{s['batch']}", name,
                 p.get("mode", "-"), _ratio(p.get("params_ratio", 1.0 if label == ORIGINAL else None)),
                 _ratio(p.get("macs_ratio", 1.0 if label == ORIGINAL else None)),
                 _ratio(p.get("predicted_ratio", 1.0 if label == ORIGINAL else None)),
                 _speedup(s.get("inference", {}).get(label)), _speedup(s.get("training", {}).get(label))]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def _goal_line(g):
    verdict = "**yes**" if g["reached"] else "no"
    text = (f"- {g['backend']}, {g['model']} batch {g['batch']}"
            f"{' (issue goal)' if g['issue_goal'] else ''}: latency=0.5 measured "
            f"{'-' if g['speedup'] is None else format(g['speedup'], '.2f') + 'x'}; >= {GOAL}x: {verdict}")
    if g["why"]:
        text += (f". Not reachable: the narrowest model (every free width at its minimum) is predicted "
                 f"at {_ratio(g['floor_ratio'])} of the original's time, the time that does not "
                 "shrink with width (per-layer launch and dispatch); "
                 + (f"the speedup above is measured on a plan {FLOOR_MARGIN - 1:.0%} above that floor"
                    if g["planned_at"] else "too close to 1 to plan and time anything")
                 + f". The planner: {g['why']}")
    return text


def _share(x):
    """A share as a percentage; "-" where the latency model had none (too few held-out variants)."""
    return "-" if x is None else f"{x:.1%}"


def _fit_line(backend, st):
    fit, e = st["fit"], st["fit"]["error"]
    return (f"- {backend}, {st['model']} batch {st['batch']}: fitted in {fit['seconds']:.0f} s, "
            f"held-out error median {_share(e['median'])}, worst {_share(e['worst'])}, on its "
            f"refinement plans {_share(e['plans_median'])}; predicted time of "
            f"the original {fit['predicted_s'] * 1e3:.2f} ms per batch")


def markdown(result):
    """The results page: settings, the goals, one table row per plan, the fits and the notes."""
    s = result["settings"]
    lines = ["# Latency budgets on a GPU: JAX (XLA) and PyTorch (CUDA)", "",
             f"Command: `{result['command']}`; {result['seconds']:.0f} s (budget {s['budget_s']:.0f} s). "
             f"Latency models: {s['fit']}; timing: {s['timing']} (this script's clock; every call waits "
             "for the device). Speedup: median over rounds of the original's time / the plan's in the "
             "same round, min-max over rounds in brackets; *predicted*: the latency model's time ratio.",
             "", "## Goals", "", *[_goal_line(g) for g in result["goals"]], "",
             "## Plans", "",
             "| backend | device | model | input | batch | plan | mode | params | MACs | predicted "
             "| inference speedup | training step speedup |",
             "|---|---|---|---:|---:|---|---|---:|---:|---:|---:|---:|"]
    fits, notes = [], []
    for backend, r in result["backends"].items():
        notes += [f"- {backend}: {n}" for n in r["notes"] + r.get("caveats", [])]
        for st in r["studies"]:
            lines += _plan_rows(backend, r.get("device", "-"), st)
            fits += [_fit_line(backend, st)] if "fit" in st else []
    lines += ["", "## Latency models", "", *(fits or ["- none fitted"]), "", "## Notes", "",
              *(notes or ["- every step ran"])]
    return "\n".join(lines) + "\n"


def _parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=pathlib.Path,
                        help="results go to OUT/<device name>/results.{json,md} (default: "
                        "benchmarks/results/gpu on a GPU, a new temporary folder on a CPU)")
    parser.add_argument("--quick", action="store_true", help="tiny settings: a CPU dry run of the code")
    parser.add_argument("--backends", nargs="+", default=["jax", "torch"], choices=sorted(SHARE))
    parser.add_argument("--budget-s", type=float, default=None,
                        help="wall-clock budget of the whole run (default 470 s; --quick: 400 s)")
    parser.add_argument("--step-s", type=float, default=150.0,
                        help="wall-clock guard of one step (fit, planning, timing)")
    parser.add_argument("--child", choices=sorted(SHARE), help=argparse.SUPPRESS)
    parser.add_argument("--child-json", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.budget_s is None:
        args.budget_s = 400.0 if args.quick else 470.0
    return args


def main(argv=None):
    args = _parse(argv)
    if args.child:
        sys.path.insert(0, str(HERE))  # _timing, next to this script
        return child(args)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
