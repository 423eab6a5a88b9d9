"""tpu/precrop_tpu.ipynb is a valid notebook whose code runs on CPU with USE_TPU = False.

The code cells are executed in one namespace, as Colab would, after flipping
the notebook's switch the way a user would edit it; the install cell (this
checkout is already importable) and magic (``%``) lines are skipped. TFDS
serves mock CIFAR-10 examples, and MODEL_DIR is redirected to a temporary
folder.

The install cell itself runs in IPython, as in Colab, with its variables
edited as a user would, and pip told (through its environment variables)
to install into a temporary folder without dependencies or downloads; the
package is then imported from that folder.
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

nbformat = pytest.importorskip("nbformat")
import tensorflow_datasets as tfds  # noqa: E402

import keras_precrop as kp  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "tpu" / "precrop_tpu.ipynb"
SWITCH_ON, SWITCH_OFF = "USE_TPU = True", "USE_TPU = False"
INSTALL = "REPO_URL = "  # marks the install cell


@pytest.fixture(scope="module")
def notebook():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    return nb


def _code(nb):
    return [cell.source for cell in nb.cells if cell.cell_type == "code"]


def test_notebook_installs_the_package_and_defaults_to_tpu_and_gcs(notebook):
    cells = _code(notebook)
    install = cells[0]
    assert INSTALL in install and "CHECKOUT = " in install
    # keras-precrop is not on the package index: never `pip install keras-precrop`.
    assert not re.search(r"pip install\b[^\n]*\bkeras-precrop\s*$", "\n".join(cells), re.M)
    settings = next(c for c in cells if SWITCH_ON in c)
    assert settings.count(SWITCH_ON) == 1
    assert 'DATA_DIR = "gs://' in settings
    source = "\n".join(cells)
    assert 'get_strategy("tpu" if USE_TPU' in source


@pytest.mark.slow
def test_notebook_runs_on_cpu_with_the_switch_off(notebook, tmp_path):
    namespace = {}
    with tfds.testing.mock_data(num_examples=5 * 32):  # STEPS_PER_EPOCH x BATCH_PER_REPLICA
        for source in _code(notebook):
            if INSTALL in source:
                continue
            if SWITCH_ON in source:
                source = source.replace(SWITCH_ON, SWITCH_OFF)
            code = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("!", "%")))
            exec(compile(code, str(NOTEBOOK), "exec"), namespace)  # noqa: S102 - the notebook under test
            if "MODEL_DIR" in namespace:
                namespace["MODEL_DIR"] = str(tmp_path)

    assert namespace["strategy"].num_replicas_in_sync == 1
    result, plan, model = namespace["result"], namespace["plan"], namespace["model"]
    assert [row["epoch"] for row in result.history] == list(range(namespace["EPOCHS"]))
    # The trained model is the planned one, within the PreConfig budgets.
    reference = kp.models.get(namespace["MODEL"])
    assert model.count_params() == plan.params <= namespace["PARAMS"] * reference.count_params()
    assert kp.profile(model).total_macs == plan.macs
    # The saved plan rebuilds the same architecture.
    saved = kp.Plan.from_json(str(tmp_path / "plan.json"))
    assert kp.apply_plan(reference, saved).count_params() == model.count_params()
    assert (tmp_path / "history.csv").exists() and (tmp_path / "best.keras").exists()


# Runs a notebook cell (read from stdin) in IPython, whose %pip runs pip in a subprocess.
_IPYTHON = """
import sys
from IPython.core.interactiveshell import InteractiveShell
sys.exit(0 if InteractiveShell.instance().run_cell(sys.stdin.read()).success else 1)
"""


def _install(notebook, target, **settings):
    """Runs the install cell with ``settings`` edited in; pip installs into ``target``.

    Returns what ``import keras_precrop`` from ``target`` (and nowhere else)
    reports: the package's folder and its zoo's model names.
    """
    pytest.importorskip("IPython")
    cell = next(c for c in _code(notebook) if INSTALL in c)
    for name, value in settings.items():
        cell, count = re.subn(rf"^{name} = .*$", f"{name} = {value!r}", cell, flags=re.M)
        assert count == 1, f"{name} is not set once in the install cell"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # --target, --no-deps, --no-index, --no-build-isolation (pip reads "0" as "isolation off").
    env.update(PIP_TARGET=str(target), PIP_NO_DEPS="1", PIP_NO_INDEX="1",
               PIP_NO_BUILD_ISOLATION="0", PIP_DISABLE_PIP_VERSION_CHECK="1")
    done = subprocess.run([sys.executable, "-c", _IPYTHON], input=cell, env=env, cwd=target.parent,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    env["PYTHONPATH"] = str(target)
    done = subprocess.run(
        [sys.executable, "-c", "import keras_precrop as kp; print(kp.__file__); print(*kp.models.list())"],
        env=env, cwd=target.parent, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    where, names = done.stdout.splitlines()[-2:]
    return Path(where).parent, names.split()


@pytest.mark.slow
def test_install_cell_installs_a_local_checkout(notebook, tmp_path):
    # A copy of this checkout, so that pip's build folders do not land in it.
    checkout = tmp_path / "keras-precrop"
    shutil.copytree(REPO, checkout, ignore=shutil.ignore_patterns(
        ".git", "build", "dist", "*.egg-info", "__pycache__", "experiments", "benchmarks"))
    package, names = _install(notebook, tmp_path / "site", CHECKOUT=str(checkout))
    assert package == tmp_path / "site" / "keras_precrop"
    assert names == kp.models.list()


@pytest.mark.slow
def test_install_cell_installs_from_the_repository_without_a_checkout(notebook, tmp_path):
    package, names = _install(notebook, tmp_path / "site", CHECKOUT=str(tmp_path / "none"),
                              REPO_URL=f"file://{REPO}")
    assert package == tmp_path / "site" / "keras_precrop"
    assert names == kp.models.list()
