"""tpu/precrop_tpu.ipynb is a valid notebook whose code runs on CPU with USE_TPU = False.

The code cells are executed in one namespace, as Colab would, after flipping
the notebook's switch the way a user would edit it; shell (``!``) and magic
(``%``) lines are skipped. TFDS serves mock CIFAR-10 examples, and MODEL_DIR
is redirected to a temporary folder.
"""

import os
from pathlib import Path

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

nbformat = pytest.importorskip("nbformat")
import tensorflow_datasets as tfds  # noqa: E402

import keras_precrop as kp  # noqa: E402

NOTEBOOK = Path(__file__).resolve().parents[1] / "tpu" / "precrop_tpu.ipynb"
SWITCH_ON, SWITCH_OFF = "USE_TPU = True", "USE_TPU = False"


@pytest.fixture(scope="module")
def notebook():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    return nb


def _code(nb):
    return [cell.source for cell in nb.cells if cell.cell_type == "code"]


def test_notebook_installs_the_package_and_defaults_to_tpu_and_gcs(notebook):
    cells = _code(notebook)
    assert any(
        line.startswith("!pip install") and "keras-precrop" in line for c in cells for line in c.splitlines()
    )
    settings = next(c for c in cells if SWITCH_ON in c)
    assert settings.count(SWITCH_ON) == 1
    assert 'DATA_DIR = "gs://' in settings
    source = "\n".join(cells)
    assert 'get_strategy("tpu" if USE_TPU' in source


def test_notebook_runs_on_cpu_with_the_switch_off(notebook, tmp_path):
    namespace = {}
    with tfds.testing.mock_data(num_examples=5 * 32):  # STEPS_PER_EPOCH x BATCH_PER_REPLICA
        for source in _code(notebook):
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
