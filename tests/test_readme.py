"""Every ``python`` and ``bash`` code block of README.md and docs/guide.md runs as written.

Blocks are found anew on every run, so a section added to the README or the
guide is tested without touching this file. An HTML comment on the line before a
block's fence (blank lines between are allowed) marks it:

* ``<!-- test: slow -->``: it takes more than ~20 s; runs with ``pytest -m slow``;
* ``<!-- test: skip (why) -->``: it cannot run here (it needs a TPU, the network,
  or it runs this very test suite).

Each block runs in a fresh temporary folder with this checkout first on
``PYTHONPATH``: python blocks in a fresh interpreter as ``python -c`` would run
them (a new ``__main__`` namespace), bash blocks under ``bash -e``
with ``pip install`` lines left out (the checkout is used as it is) and
``keras-precrop`` and ``python`` found first on ``PATH`` as this checkout's
command line and this interpreter. The folder links ``experiments`` to this
checkout's (the README's trained model is read from there, as from the
repository's root), and TFDS finds CIFAR-10 in ``../shared/tfds`` beside the
checkout (``TFDS_DATA_DIR``). A block that imports an optional runtime
(``ai_edge_litert``, ``onnxruntime``, ``keras_hub``) or loads CIFAR-10 is skipped,
with the reason, where that is not installed or prepared.

Running is not enough: each block must also do what the prose around it
says. ``BLOCK_CHECKS`` maps a distinctive line of every runnable block to a
check of what the block leaves behind, against references computed here
(Keras' ``count_params()``, the MACs of TensorFlow's traced graph, the layers'
own widths): a python block's namespace and printed output (the check runs
in the block's interpreter, right after it), a bash block's output and files.
A runnable block without exactly one check, or a check whose line is in no
runnable block, fails the tests, so an edited README cannot skip its checks.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
# The documents whose blocks run: the README's quickstarts and the guide's details.
DOCUMENTS = (README, REPO / "docs" / "guide.md")
TFDS_DIR = REPO.parent / "shared" / "tfds"
_OPTIONAL_MODULES = ("ai_edge_litert", "onnxruntime", "keras_hub")
_FENCE = re.compile(r"^```(\w*)\s*$")
_MARK = re.compile(r"^<!--\s*test:\s*(\w+)\b.*-->\s*$")
_MARKS = ("slow", "skip")
_LANGUAGES = ("python", "bash")


def readme_blocks(path=README):
    """``(first line number, language, code, mark)`` of each fenced block of ``path``.

    ``mark`` is ``"slow"``, ``"skip"`` or None, from a ``<!-- test: ... -->``
    comment before the block's fence.

    Raises:
        ValueError: for an unknown mark or an unclosed fence, so a typo in the
            README cannot silently drop a block from the tests.
    """
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        before = next((line for line in reversed(lines[:i]) if line.strip()), "")
        mark = _MARK.match(before.strip())
        if mark and mark.group(1) not in _MARKS:
            raise ValueError(f"{path.name}:{i}: unknown mark {mark.group(1)!r}; use one of {_MARKS}")
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), None)
        if end is None:
            raise ValueError(f"{path.name}:{i + 1}: code block never closed")
        blocks.append((i + 2, fence.group(1), "\n".join(lines[i + 1:end]) + "\n",
                       mark.group(1) if mark else None))
        i = end + 1
    return blocks


def _params():
    params = []
    for path in DOCUMENTS:
        for line, language, code, mark in readme_blocks(path):
            if language not in _LANGUAGES:
                continue  # text (a folder layout, output)
            skip = pytest.mark.skip(reason=f"marked skip in {path.name}")
            marks = {"slow": [pytest.mark.slow], "skip": [skip]}
            params.append(pytest.param(language, code, marks=marks.get(mark, []),
                                       id=f"{path.name}:{line}:{language}"))
    return params


def _skip_unless_available(code):
    """Skips a block whose optional runtime is not installed, or whose CIFAR-10 is not prepared."""
    for module in _OPTIONAL_MODULES:
        if re.search(rf"^\s*(from|import) {module}\b", code, re.M):
            pytest.importorskip(module)
    if "kp.data.load(" in code and "TFDS_DATA_DIR" not in os.environ and not (TFDS_DIR / "cifar10").is_dir():
        pytest.skip(f"CIFAR-10 is not prepared in {TFDS_DIR} (nor TFDS_DATA_DIR set)")


_INSTALL = re.compile(r"^\s*pip install [^&]*(&&\s*|$)")


def _shell_without_installs(code):
    """The block with its ``pip install`` commands left out (``pip install X && cmd`` keeps ``cmd``)."""
    kept = (_INSTALL.sub("", line) for line in code.splitlines())
    return "\n".join(line for line in kept if line.strip()) + "\n"


def _command_line_first_on_path(folder):
    """A ``bin`` folder with this checkout's ``keras-precrop`` and this ``python``."""
    bin_dir = folder / "bin"
    bin_dir.mkdir()
    script = bin_dir / "keras-precrop"
    script.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m keras_precrop "$@"\n')
    script.chmod(0o755)
    (bin_dir / "python").symlink_to(sys.executable)
    return bin_dir


# Runs a python block as ``python -c`` would (``sys.argv == ["-c"]``, a fresh ``__main__``
# namespace), keeping a copy of what it prints, then its check on the namespace it leaves.
_RUN_AND_CHECK = """\
import pathlib
import sys

code, checked = sys.argv.pop(1), sys.argv.pop(1)


class _Tee:
    def __init__(self, stream):
        self.stream, self.parts = stream, []

    def write(self, text):
        self.parts.append(text)
        return self.stream.write(text)

    def __getattr__(self, name):
        return getattr(self.stream, name)


sys.stdout = _Tee(sys.stdout)
namespace = {"__name__": "__main__"}
exec(compile(code, "<README.md block>", "exec"), namespace)
printed, sys.stdout = "".join(sys.stdout.parts), sys.stdout.stream
from tests.test_readme import block_check

block_check(code)(namespace, printed, pathlib.Path.cwd())
print("\\n" + checked)
"""
_CHECKED = "README block checked"


@pytest.mark.parametrize("language,code", _params())
def test_readme_block_runs(language, code, tmp_path):
    check = block_check(code)
    _skip_unless_available(code)
    work = tmp_path / "work"
    work.mkdir()
    (work / "experiments").symlink_to(REPO / "experiments")
    path = [str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path), "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.setdefault("TFDS_DATA_DIR", str(TFDS_DIR))
    if language == "python":
        command = [sys.executable, "-c", _RUN_AND_CHECK, code, _CHECKED]
    else:
        env["PATH"] = os.pathsep.join([str(_command_line_first_on_path(tmp_path)), env["PATH"]])
        command = ["bash", "-e", "-c", _shell_without_installs(code)]
    done = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    if language == "python":  # checked in the block's interpreter; not skipped by an early exit
        assert done.stdout.rstrip().endswith(_CHECKED), done.stdout[-3000:]
    else:
        check(None, done.stdout, work)


def test_marks_and_blocks_are_read_as_written(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(
        "# T\n\n```python\nprint(1)\n```\n\n<!-- test: slow -->\n\n```bash\necho a\n```\n"
        "<!-- test: skip (needs a TPU) -->\n```python\nx = 1\n\ny = 2\n```\n\n```\nlayout/\n```\n")
    assert readme_blocks(readme) == [
        (4, "python", "print(1)\n", None),
        (10, "bash", "echo a\n", "slow"),
        (14, "python", "x = 1\n\ny = 2\n", "skip"),
        (20, "", "layout/\n", None),
    ]
    readme.write_text("<!-- test: slwo -->\n```bash\necho a\n```\n")
    with pytest.raises(ValueError, match="unknown mark 'slwo'"):
        readme_blocks(readme)
    assert _shell_without_installs('pip install -e ".[cpu]"\nkeras-precrop list\n') == "keras-precrop list\n"
    one_line = 'pip install -e ".[cpu]" && keras-precrop list\n'
    assert _shell_without_installs(one_line) == "keras-precrop list\n"


def test_readme_has_runnable_python_and_bash_blocks():
    languages = [language for _, language, _, mark in readme_blocks() if mark != "skip"]
    assert languages.count("python") >= 2 and languages.count("bash") >= 2


# -- what each block must do, beyond exiting 0 ------------------------------------


def _tf_macs(model):
    """MACs per example by TensorFlow's traced graph (the suite's independent reference)."""
    from tests.conftest import tf_macs

    return tf_macs(model)


def _layer_names(model):
    return {layer.name for layer in model.layers}


def _widths(model):
    """``{name: filters or units}`` of the layers that have either."""
    return {layer.name: getattr(layer, "filters", None) or layer.units
            for layer in model.layers if hasattr(layer, "filters") or hasattr(layer, "units")}


def _check_main_job(namespace, printed, cwd):
    """``keras-precrop reconfigure resnet20 --params 0.8 --flops 1.0``: re-balanced widths at
    <= 80% of ResNet-20's parameters and the same MACs, as Keras and TensorFlow count them."""
    import keras_precrop as kp

    resnet = kp.models.get("resnet20")
    totals = {name: (int(a.replace(",", "")), int(b.replace(",", "")))
              for name, a, b in re.findall(r"^(Params|MACs): ([\d,]+) -> ([\d,]+)", printed, re.M)}
    assert totals["Params"][0] == resnet.count_params(), printed[-2000:]
    assert totals["Params"][1] <= 0.8 * resnet.count_params()
    macs = _tf_macs(resnet)
    assert totals["MACs"][0] == macs
    assert 0.98 * macs <= totals["MACs"][1] <= macs  # "the same FLOPs"
    # Re-balanced: the table's output channels ("before -> after") grow in some layers, shrink in others.
    out_channels = re.findall(r"^\|[^|]+\|[^|]+\|\s*(\d+) -> (\d+)\s*\|", printed, re.M)
    changes = [(int(a), int(b)) for a, b in out_channels]
    assert any(b > a for a, b in changes) and any(b < a for a, b in changes), changes


def _check_python_api(namespace, printed, cwd):
    """``small``: <= 50% of the parameters, ``fast``: <= 50% of the MACs, ``config``: re-distributed
    widths at <= 80% of the parameters and <= 100% of the MACs; every layer name kept; the profile's
    totals are Keras' and TensorFlow's."""
    model, small, fast, config = (namespace[k] for k in ("model", "small", "fast", "config"))
    params, macs = model.count_params(), _tf_macs(model)
    assert re.search(rf"^Total params: {params:,}$", printed, re.M), printed[-2000:]
    assert re.search(rf"^Total MACs:\s+{macs:,} ", printed, re.M), printed[-2000:]
    assert small.count_params() <= 0.5 * params
    fast_macs = _tf_macs(fast)
    assert fast_macs <= 0.5 * macs
    assert config.count_params() <= 0.8 * params
    assert _tf_macs(config) <= macs
    before, after = _widths(model), _widths(config)
    assert any(after[k] > before[k] for k in before) and any(after[k] < before[k] for k in before)
    for new in (small, fast, config):
        assert _layer_names(model) <= _layer_names(new)
    assert f"{small.count_params():,} / {params:,} params, {fast_macs:,} / {macs:,} MACs" in printed


def _check_solve_once_build_later(namespace, printed, cwd):
    """The plan meets both budgets with widths in multiples of 8 (or the original's), survives its
    JSON file, and the model built from that file is exactly the plan (Keras' params, TF's MACs);
    the summary lists the layers whose parameters changed, and only those."""
    import keras_precrop as kp

    model, plan, pruned = (namespace[k] for k in ("model", "plan", "pruned"))
    assert pruned.count_params() == plan.params <= 0.5 * model.count_params()
    assert f"{pruned.count_params():,} params == plan.params {plan.params:,}" in printed
    assert _tf_macs(pruned) == plan.macs <= 0.6 * _tf_macs(model)
    assert kp.profile(pruned).total_params == plan.params
    before, after = _widths(model), _widths(pruned)
    assert before.keys() == after.keys()
    assert all(after[k] % 8 == 0 or after[k] == before[k] for k in after), after
    assert after != before
    loaded = kp.Plan.from_json(str(cwd / "plan.json"))
    assert (loaded.widths, loaded.params, loaded.macs) == (plan.widths, plan.params, plan.macs)
    # only_changed=True: a row for each layer whose parameters changed (by Keras' count), no other.
    changed = {layer.name for layer in model.layers
               if layer.count_params() != pruned.get_layer(layer.name).count_params()}
    listed = set(re.findall(r"^\| (\S+) \(\w+\)", printed, re.M)) - {"Layer"}  # less the header
    assert changed and listed == changed, listed ^ changed


def _check_latency_budgets(namespace, printed, cwd):
    """The printed predicted time ratio is <= 0.5; the saved latency model predicts the same; the
    calibrated plan is the least pruned one that measured within the budget (else the fastest)."""
    import keras_precrop as kp

    model, lm, fast = (namespace[k] for k in ("model", "lm", "fast"))
    ratios = [float(line) for line in printed.splitlines() if re.fullmatch(r"\s*\d+\.\d+(e-?\d+)?\s*", line)]
    assert len(ratios) == 1 and 0 < ratios[0] <= 0.5, ratios
    reloaded = kp.LatencyModel.from_json(str(cwd / "resnet20_latency.json"))
    assert reloaded.predict(model) == pytest.approx(lm.predict(model), rel=1e-9)
    plan = fast.precrop_plan
    assert fast.count_params() == plan.params
    calibration = plan.solver["latency_calibration"]
    measured = [r["measured"] for r in calibration["rounds"]]
    assert calibration["target"] == 0.5 and 1 <= len(measured) <= 3  # calibrate=2: at most 2 re-plans
    meeting = [m for m in measured if m <= 0.5 * 1.03]
    assert calibration["met"] == bool(meeting)
    assert calibration["measured"] == (max(meeting) if meeting else min(measured))


def _check_registered_runtime(namespace, printed, cwd):
    """The registered runtime is in the table, and the latency model records it through a JSON
    round trip that predicts as it does."""
    import keras_precrop as kp

    model, lm = namespace["model"], namespace["lm"]
    assert "predict" in kp.latency.RUNTIMES and lm.runtime == "predict"
    assert printed.splitlines()[-1] == "predict"
    reloaded = kp.LatencyModel.from_json(lm.to_json())
    assert reloaded.runtime == "predict"
    assert reloaded.predict(model) == pytest.approx(lm.predict(model), rel=1e-9) and lm.predict(model) > 0


def _check_deployment(namespace, printed, cwd):
    """``small`` has <= 50% of ResNet-20's MACs and the two extra layers; what ONNX Runtime and the
    LiteRT interpreter compute from the exported files is what the Keras model computes."""
    import numpy as np

    import keras_precrop as kp

    small, x = namespace["small"], namespace["x"]
    assert _tf_macs(small) <= 0.5 * _tf_macs(kp.models.get("resnet20"))
    kinds = {type(layer) for layer in small.layers}
    assert kp.ChannelSlice in kinds and kp.PrefixAdd in kinds
    expected = np.asarray(small(x, training=False))
    np.testing.assert_allclose(namespace["expected"], expected, rtol=1e-5, atol=1e-6)
    for name in ("onnx_out", "litert_out"):
        assert namespace[name].shape == expected.shape == (1, 10)
        np.testing.assert_allclose(namespace[name], expected, rtol=1e-4, atol=1e-5, err_msg=name)
    assert (cwd / "small.onnx").is_file() and (cwd / "small.tflite").is_file()
    errors = [float(word) for word in printed.split()]
    assert len(errors) == 2 and max(errors) < 1e-4, printed[-2000:]


def _check_command_line(namespace, printed, cwd):
    """The files the commands write: a plan within 30% of the parameters, a model applied from it
    with exactly its parameters, and a latency-budgeted model within half the predicted time."""
    import keras

    import keras_precrop as kp

    resnet = kp.models.get("resnet20")
    assert "resnet20" in printed.split()  # keras-precrop list
    profiled = re.search(r"^Total params: ([\d,]+)$", printed, re.M)  # keras-precrop profile efficientnet_b0
    assert int(profiled.group(1).replace(",", "")) == kp.models.get("efficientnet_b0").count_params()
    plan = kp.Plan.from_json(str(cwd / "plan.json"))
    assert plan.params <= 0.3 * resnet.count_params()
    small = keras.saving.load_model(cwd / "small.keras")  # written by --apply plan.json
    assert small.count_params() == plan.params and _tf_macs(small) == plan.macs
    lm = kp.LatencyModel.from_json(str(cwd / "lm.json"))
    assert lm.predict(keras.saving.load_model(cwd / "fast.keras")) <= 0.5 * lm.predict(resnet) * (1 + 1e-9)


def _check_compare(namespace, printed, cwd):
    """Each mode's row is the model that mode builds (Keras' params, TensorFlow's MACs); uniform
    scales every width by its factor, and spends fewer MACs than the pruned layouts at equal params."""
    import keras_precrop as kp

    model, comparison = namespace["model"], namespace["comparison"]
    for row in comparison.rows:
        built = kp.precrop(model, params=0.1103, mode=row["mode"])
        assert (built.count_params(), _tf_macs(built)) == (row["params"], row["macs"])
        assert row["params"] <= 0.1103 * model.count_params()
    uniform = comparison.row("uniform")
    assert uniform["macs"] < min(comparison.row(m)["macs"] for m in ("exact", "layerwise"))
    assert f"{uniform['uniform_ratio']} {uniform['macs_ratio']}" in printed
    assert re.search(r"^\| uniform +\|", printed, re.M) and "(auto)" in printed


def _check_compare_measured(namespace, printed, cwd):
    """The command line prints a measured speedup for each of the three modes."""
    rows = re.findall(r"^\| (exact|layerwise|uniform)\b.*\| +([\d.]+)x \|$", printed, re.M)
    assert [mode for mode, _ in rows] == ["exact", "layerwise", "uniform"], printed[-2000:]
    assert all(float(speedup) > 0 for _, speedup in rows)
    assert "Measured: tf, batch 64, inference" in printed


def _check_subclassed(namespace, printed, cwd):
    """The subclassed net's trace: Keras' own counts, its blocks' layers named by place, and at
    most half the MACs of TensorFlow's own trace of the subclassed call."""
    import keras_precrop as kp

    net, small = namespace["net"], namespace["small_net"]
    assert kp.profile(net).total_params == net.count_params()
    assert small.count_params() == small.precrop_plan.params < net.count_params()
    assert _tf_macs(small) == small.precrop_plan.macs <= 0.5 * _tf_macs(net)
    assert {"block1_conv1", "block2_bn1", "block2_conv2"} <= {layer.name for layer in small.layers}
    assert printed.split() == [str(small.get_layer("block1_conv1").filters),
                               str(small.count_params()), str(net.count_params())]


def _test_batches(dataset):
    """The images and labels of a batched ``(x, y)`` dataset, as two arrays."""
    import numpy as np

    xs, ys = zip(*((np.asarray(x), np.asarray(y)) for x, y in dataset))
    return np.concatenate(xs), np.concatenate(ys)


def _accuracy(model, x, y):
    """Top-1 accuracy by NumPy from ``model.predict`` (not Keras' metric)."""
    import numpy as np

    return float(np.mean(np.argmax(model.predict(x, verbose=0), axis=-1) == y))


def _check_fresh_model(namespace, printed, cwd):
    """``small`` is its plan's size (Keras' count) at <= 50% of TensorFlow's MACs with every layer
    name kept; it trained one epoch; the test images are normalized per channel (mean 0, std 1) and
    the printed accuracy is NumPy's argmax accuracy of its predictions on them, near chance after
    four steps, as the comment says."""
    import numpy as np

    model, small, test = (namespace[k] for k in ("model", "small", "test"))
    params, macs, small_macs = model.count_params(), _tf_macs(model), _tf_macs(small)
    assert small.count_params() == small.precrop_plan.params < params
    assert small_macs <= 0.5 * macs and _layer_names(model) <= _layer_names(small)
    assert f"{small.count_params():,} / {params:,} params, {small_macs:,} / {macs:,} MACs" in printed
    loss = small.history.history["loss"]
    assert len(loss) == 1 and np.isfinite(loss).all()
    x, y = _test_batches(test)
    assert x.shape == (500, 32, 32, 3) and set(np.unique(y)) <= set(range(10))
    assert np.abs(x.mean(axis=(0, 1, 2))).max() < 0.1 and np.abs(x.std(axis=(0, 1, 2)) - 1).max() < 0.1
    reported = float(re.search(r"'accuracy': ([\d.e-]+)", printed).group(1))
    assert abs(reported - _accuracy(small, x, y)) <= 1 / len(y)
    assert reported < 0.3  # "4 steps here: still at chance"


def _check_trained_model(namespace, printed, cwd):
    """The teacher scores what its run recorded on the whole test set (the preprocessing is the
    training's); pruned with kept weights it is its plan's size, every kernel the teacher's at the
    kept channels, and scores far less (by NumPy's count, as printed); fine-tuning distilled and
    moved the weights."""
    import json

    import numpy as np

    import keras_precrop as kp

    teacher, small, test, history = (namespace[k] for k in ("teacher", "small", "test", "history"))
    run = REPO / "experiments" / "runs" / "resnet20-baseline-ep10-s3" / "results.json"
    recorded = json.loads(run.read_text())["final_accuracy"]
    trained, pruned = map(float, re.search(r"trained ([\d.]+), pruned ([\d.]+)", printed).groups())
    x, y = _test_batches(test)
    assert abs(trained - _accuracy(teacher, x, y)) <= 1e-3 + 1 / len(y)
    assert abs(trained - recorded) < 0.04, (trained, recorded)  # 1,000 of its 10,000 test images
    kept = kp.precrop(teacher, params=0.5, weights="keep")  # ``small`` before fine-tuning
    assert abs(pruned - _accuracy(kept, x, y)) <= 1e-3 + 1 / len(y)
    assert 0.25 <= pruned <= 0.55 and pruned < trained - 0.2  # "0.82 -> about 0.4"
    assert small.count_params() == kept.count_params() == small.precrop_plan.params
    assert small.count_params() <= 0.5 * teacher.count_params()
    kernels = [layer.name for layer in kept.layers if hasattr(layer, "kernel")]
    for name in kernels:
        kernel = np.asarray(kept.get_layer(name).kernel)
        assert np.isin(kernel, np.asarray(teacher.get_layer(name).kernel)).all(), name
    assert np.isfinite(history.history["distillation_loss"]).all()
    assert any(not np.array_equal(np.asarray(kept.get_layer(n).kernel), np.asarray(small.get_layer(n).kernel))
               for n in kernels)


def _check_quick_command_line(namespace, printed, cwd):
    """The profile's total is Keras' count; the saved model is exactly the written plan (Keras'
    params, TensorFlow's MACs) at <= 50% of ResNet-20's MACs, with widths in multiples of 8."""
    import keras

    import keras_precrop as kp

    resnet = kp.models.get("resnet20")
    profiled = re.search(r"^Total params: ([\d,]+)$", printed, re.M)
    assert int(profiled.group(1).replace(",", "")) == resnet.count_params(), printed[-2000:]
    plan = kp.Plan.from_json(str(cwd / "plan.json"))
    small = keras.saving.load_model(cwd / "small.keras")
    assert small.count_params() == plan.params and _tf_macs(small) == plan.macs <= 0.5 * _tf_macs(resnet)
    before, after = _widths(resnet), _widths(small)
    assert after != before and all(after[k] % 8 == 0 or after[k] == before[k] for k in after), after


def _check_gradual(namespace, printed, cwd):
    """The fitted model's masked weights are zero and the rebuilt ``small`` (its plan's size by Keras'
    count) computes what it computes; the block asserts both, this checks the masks independently
    (every channel the plan removes is zero in some kernel), that the teacher is the saved model
    still (weight for weight) and that the LiteRT file computes what ``small`` does."""
    import keras
    import numpy as np

    model, small, plan, teacher, x = (namespace[k] for k in ("model", "small", "plan", "teacher", "x"))
    assert small.count_params() == plan.predicted["params"] < model.count_params()
    kernels = [layer.kernel for layer in model.layers if hasattr(layer, "kernel")]
    zero_filters = sum(int(np.all(np.asarray(k) == 0, axis=tuple(range(k.ndim - 1))).sum())
                       for k in kernels)
    assert zero_filters > 0 and "GradualPruning: step 4, 100%" in printed
    saved = keras.saving.load_model(cwd / "trained.keras")
    for got, want in zip(teacher.weights, saved.weights, strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(cwd / "small.tflite"))
    interpreter.allocate_tensors()
    interpreter.set_tensor(interpreter.get_input_details()[0]["index"], x[:1])
    interpreter.invoke()
    got = interpreter.get_tensor(interpreter.get_output_details()[0]["index"])
    np.testing.assert_allclose(got, np.asarray(small(x[:1])), rtol=1e-4, atol=1e-4)


def _check_keras_hub_task(namespace, printed, cwd):
    """The pruned task is still a ``ResNetImageClassifier``, compiled (with the task's defaults) and
    ready to train, whose backbone is the plan's: at most half the parameters, by Keras' count."""
    task, small, backbone = (namespace[k] for k in ("task", "small", "backbone"))
    assert type(small) is type(task) and small.compiled
    assert small.backbone.count_params() == small.precrop_plan.params <= 0.5 * backbone.count_params()
    assert f"ResNetImageClassifier {small.backbone.count_params():,} / {backbone.count_params():,}" in printed


def _check_vit_task(namespace, printed, cwd):
    """The pruned ViT is a ``ViTImageClassifier`` of a new config (the head size kept: hidden width
    = heads x 16), at most half the parameters by Keras' count, with the original's kept weights in
    place (its class token's values are among the original's), and the summary notes the norms."""
    task, small = namespace["task"], namespace["small"]
    backbone = small.backbone
    assert type(small) is type(task) and type(backbone) is type(task.backbone)
    assert backbone.hidden_dim == 16 * backbone.num_heads and backbone.hidden_dim < 64
    assert small.count_params() == small.precrop_plan.params <= 0.5 * task.count_params()
    assert f"{backbone.hidden_dim} {backbone.num_heads} {backbone.mlp_dim}" in printed
    token = [w for w in small.weights if w.path.endswith("class_token")][0].numpy().ravel()
    original = [w for w in task.weights if w.path.endswith("class_token")][0].numpy().ravel()
    assert set(token.tolist()) <= set(original.tolist())
    assert "normalize across channels" in printed


# A distinctive line of each runnable block -> its check (see the module docstring).
BLOCK_CHECKS = {
    # README.md
    "keras-precrop reconfigure resnet20 --params 0.8 --flops 1.0": _check_main_job,
    "small = kp.precrop(model, flops=0.5)     # <= 50% of the MACs": _check_fresh_model,
    'small = kp.precrop(teacher, params=0.5, weights="keep")': _check_trained_model,
    "pruning = kp.GradualPruning(plan, end_step=4, frequency=2,": _check_gradual,
    "lm = kp.latency_model(model, batch_size=64, variants=8, rounds=3)": _check_latency_budgets,
    'small.export("small.onnx", format="onnx", verbose=False)': _check_deployment,
    'small = kp.hub.precrop(task, params=0.5, weights="keep")  # a ViTImageClassifier': _check_vit_task,
    "keras-precrop precrop resnet20 --flops 0.5 --round_to 8 --out small.keras --plan plan.json":
        _check_quick_command_line,
    # docs/guide.md
    "small = kp.precrop(model, params=0.5)": _check_python_api,
    "plan = kp.plan(model, params=0.5, flops=0.6, round_to=8)": _check_solve_once_build_later,
    "small_net = kp.precrop(net, flops=0.5)": _check_subclassed,
    "comparison = kp.compare(model, params=0.1103)": _check_compare,
    "keras-precrop compare resnet20 --flops 0.5 --measure --batch_size 64": _check_compare_measured,
    "keras-precrop precrop model.keras --apply plan.json --out small.keras": _check_command_line,
    "small = kp.hub.precrop(task, params=0.5)": _check_keras_hub_task,
    'kp.register_runtime("predict", predict, doc="Keras\' predict_on_batch")': _check_registered_runtime,
}


def _keys_in(code, checks=BLOCK_CHECKS):
    """The keys of ``checks`` that are part of a line of ``code``."""
    return [key for key in checks if any(key in line for line in code.splitlines())]


def block_check(code):
    """The check of the block ``code``; fails unless exactly one ``BLOCK_CHECKS`` line is in it."""
    keys = _keys_in(code)
    assert len(keys) == 1, f"README block needs exactly one entry in BLOCK_CHECKS, has {keys}:\n{code}"
    return BLOCK_CHECKS[keys[0]]


def _check_table_problems(documents, checks=BLOCK_CHECKS):
    """What is wrong between the documents' blocks (``{name: readme_blocks(path)}``) and ``checks``:
    a runnable block without exactly one check, a skipped block with one (it would never run), a
    check in no block."""
    problems, runnable = [], []
    for name, blocks in documents.items():
        for line, language, code, mark in blocks:
            if language not in _LANGUAGES:
                continue
            keys = _keys_in(code, checks)
            runnable.append(code)
            if mark == "skip" and keys:
                problems.append(f"{name}:{line} is marked skip, so its check {keys} would never run")
            elif mark != "skip" and len(keys) != 1:
                problems.append(f"{name}:{line} needs exactly one entry in BLOCK_CHECKS, has {keys}")
    for key in checks:
        if not any(_keys_in(code, [key]) for code in runnable):
            problems.append(f"BLOCK_CHECKS[{key!r}] names a line that is in no README or guide block")
    return problems


def test_every_runnable_block_has_one_check_and_every_check_one_block(tmp_path):
    assert _check_table_problems({path.name: readme_blocks(path) for path in DOCUMENTS}) == []
    readme, guide = tmp_path / "README.md", tmp_path / "guide.md"
    readme.write_text("```python\nx = 1\n```\n<!-- test: skip (why) -->\n```bash\necho b\n```\n"
                      "```\ntext\n```\n")
    guide.write_text("```bash\necho a\n```\n")
    checks = {"echo a": None, "echo b": None, "x = 2": None}
    assert _check_table_problems({"README.md": readme_blocks(readme), "guide.md": readme_blocks(guide)},
                                 checks) == [
        "README.md:2 needs exactly one entry in BLOCK_CHECKS, has []",
        "README.md:6 is marked skip, so its check ['echo b'] would never run",
        "BLOCK_CHECKS['x = 2'] names a line that is in no README or guide block",
    ]
