"""Project conventions that a change can silently break."""

import re
import runpy
import shutil
import sys

import pytest
import setuptools

from tests.conftest import REPO, git

sys.path.insert(0, str(REPO / "experiments"))
import run  # noqa: E402  (experiments/run.py: the grids and which runs keep their models)


def test_readme_test_command_is_what_ci_runs():
    """README's second code block starts with the command that ``.ci/run`` ends with."""
    blocks = re.findall(r"```[a-z]*\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    ci = (REPO / ".ci" / "run").read_text().strip().splitlines()
    assert blocks[1].splitlines()[0] == ci[-1] == (
        'pip install -e ".[test]" && pip install --no-deps keras-hub tokenizers && ruff check . '
        "&& python -m pytest -q -n 2 --dist loadfile")


# ------------------------------------------------------------------ packaging (issue 60)


def _extras():
    """``{extra: {normalized requirement name}}`` of setup.py, read by running it with a stand-in
    for ``setuptools.setup``."""
    found = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(setuptools, "setup", lambda **kwargs: found.update(kwargs))
        patch.chdir(REPO)  # setup.py reads README.md from where it runs
        runpy.run_path(str(REPO / "setup.py"))
    return {extra: {re.sub(r"[-_.]+", "-", re.match(r"[\w.-]+", req)[0]).lower() for req in reqs}
            for extra, reqs in found["extras_require"].items()}


def test_every_extra_with_tensorflow_datasets_installs_what_its_download_imports():
    """``kp.data.load(..., download=True)`` imports importlib_resources through TFDS, which does
    not require it: a fresh ``pip install -e ".[cpu]"`` failed README's data example without it."""
    with_tfds = {extra: names for extra, names in _extras().items() if "tensorflow-datasets" in names}
    assert {"cpu", "gpu", "tf", "test"} <= set(with_tfds)
    assert [extra for extra, names in with_tfds.items() if "importlib-resources" not in names] == []


def test_the_docs_extra_installs_the_site_builder_alone_and_the_docs_use_it():
    extras = _extras()
    assert extras["docs"] == {"mkdocs", "mkdocstrings"}
    assert extras["docs"] <= extras["test"]  # tests/test_docs.py builds the site
    assert 'pip install -e ".[docs]"' in (REPO / "docs" / "index.md").read_text(encoding="utf-8")


# ------------------------------------------------------------------ what the repository carries (issue 44)

# A lent accelerator receives a copy of the working tree of at most 64 MiB, and a clone carries the
# whole tracked tree: it stays well under that, with room for what a call carries beside it (44 MB
# since the third ViT teacher's model, 3 MB, was retrained and committed: over 20 MB of room left).
_TRACKED_LIMIT = 44 * 10**6
# Text files whose absolute paths are checked, and the paths of a machine: its home or work folders,
# an installed interpreter. The scratch folder (``tmp``) is allowed in the files listed here alone.
_TEXT = (".json", ".log", ".md", ".csv", ".txt", ".py")
_MACHINE_PATH = re.compile(r"(?<![\w.~$-])/(?:work|home|root|opt|Users|usr/lib|usr/local)/")
_TMP_PATH = re.compile(r"(?<![\w.~$-])/(?:tmp)/")
_TMP_ALLOWED = {
    # Usage examples and defaults: a scratch folder of the user's choice, not a path of a checkout.
    "examples/train_cifar.py", "examples/train_imagenet.py", "benchmarks/bench_trained_speed.py",
    "benchmarks/RESULTS.md", "experiments/long_schedule.py", "tpu/README.md",
    # Recorded benchmark commands whose --out was a scratch folder: they rerun as they are anywhere.
    *(f"benchmarks/results/{run}/latency_runtimes.{ext}"
      for run in ("floor_default", "streamfloor_default", "streamfloor_runtimes") for ext in ("json", "md")),
    # A run id made of an absolute --init_model path.
    "tests/test_experiments.py",
}


def _tracked():
    """The tracked files (paths relative to the repository) that exist in the working tree."""
    if not (REPO / ".git").exists() or shutil.which("git") is None:
        pytest.skip("not a git checkout: which files are tracked is unknown")
    return [path for path in git(REPO, "ls-files", "-z").split("\0") if path and (REPO / path).is_file()]


def test_tracked_tree_fits_a_device_call():
    sizes = {path: (REPO / path).stat().st_size for path in _tracked()}
    largest = sorted(sizes, key=sizes.get)[-3:]
    assert sum(sizes.values()) < _TRACKED_LIMIT, (
        f"the tracked tree is {sum(sizes.values()) / 1e6:.1f} MB (limit {_TRACKED_LIMIT / 1e6:.0f} MB); "
        f"largest: {', '.join(f'{p} ({sizes[p] / 1e6:.1f} MB)' for p in largest)}")


def test_no_tracked_text_holds_an_absolute_path_of_a_machine():
    """Run records (``results.json`` commands, ``train.log``), plans and docs write paths relative
    to the repository (``experiments/runs/...``, ``../shared/tfds``), so a command reruns from any
    clone; the scratch folder appears only in the files of ``_TMP_ALLOWED``, each of which still
    has one."""
    found, tmp = [], set()
    for path in _tracked():
        if not path.endswith(_TEXT):
            continue
        text = (REPO / path).read_text(encoding="utf-8", errors="replace")
        if _TMP_PATH.search(text):
            tmp.add(path)
        for number, line in enumerate(text.splitlines(), 1):
            if _MACHINE_PATH.search(line) or (path not in _TMP_ALLOWED and _TMP_PATH.search(line)):
                found.append(f"{path}:{number}: {line.strip()[:160]}")
    assert not found, f"{len(found)} lines with an absolute path, e.g.:\n" + "\n".join(found[:10])
    assert tmp == _TMP_ALLOWED, f"allowed a scratch path but hold none now: {sorted(_TMP_ALLOWED - tmp)}"


def test_committed_checkpoints_are_those_that_runs_start_from():
    """Every tracked ``.keras`` is the ``final_model.keras`` of a run whose grid says ``"keep_model":
    true`` (``experiments/run.py`` commits no other), and every grid's ``init_model`` names such a
    run, so that a clone holds the model each run starts from."""
    grids = sorted((REPO / "experiments" / "grids").glob("*.json"))
    kept = run.kept_runs(grids)
    models = [path for path in _tracked() if path.endswith(".keras")]
    assert models
    for path in models:
        parts = path.split("/")
        assert parts[:2] == ["experiments", "runs"] and parts[3:] == ["final_model.keras"], path
        # The ViT teachers are trained by experiments/train_vit_teacher.py, not by a grid.
        assert parts[2] in kept or parts[2].startswith("vit_cifar-teacher-"), \
            f"{path}: no grid with \"keep_model\": true trains {parts[2]}"
    starts = {f["init_model"] for grid in grids for f in run.load_grid(grid) if f.get("init_model")}
    assert starts
    for path in starts:
        parts = path.split("/")
        assert parts[:2] == ["experiments", "runs"] and parts[2] in kept, f"init_model {path} is not kept"
