"""README's quickstart on the install README names for it: a new virtualenv with ``.[cpu]`` alone.

The suite runs with the ``[test]`` extra, which installs more than a user's
``pip install -e ".[cpu]"`` does, so a package the quickstart needs and only
the test extra brings (``importlib_resources`` for ``kp.data.load``, issue 60)
goes unseen there. This test makes that install in a fresh virtualenv (from
this checkout, with pip's usual index and caches) and runs README's first
python block in it, on the local CIFAR-10 copy. Slow: the install alone takes
minutes.
"""

import os
import re
import subprocess
import venv

import pytest

from tests.conftest import REPO
from tests.test_readme import README, TFDS_DIR, readme_blocks

_QUICKSTART = "small = kp.precrop(model, flops=0.5)     # <= 50% of the MACs"


@pytest.mark.slow
def test_readme_quickstart_runs_on_a_fresh_cpu_install(tmp_path):
    if "TFDS_DATA_DIR" not in os.environ and not (TFDS_DIR / "cifar10").is_dir():
        pytest.skip(f"CIFAR-10 is not prepared in {TFDS_DIR} (nor TFDS_DATA_DIR set)")
    code = next(code for _, language, code, _ in readme_blocks(README)
                if language == "python" and _QUICKSTART in code)
    venv.create(tmp_path / "venv", with_pip=True)
    python = str(tmp_path / "venv" / "bin" / "python")
    install = subprocess.run([python, "-m", "pip", "install", "-q", "-e", f"{REPO}[cpu]"],
                             capture_output=True, text=True, timeout=1800)
    assert install.returncode == 0, install.stderr[-3000:]
    freeze = subprocess.run([python, "-m", "pip", "freeze"], capture_output=True, text=True).stdout
    assert not re.search(r"^(pytest|hypothesis|jax|torch)==", freeze, re.M), "more than .[cpu]"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.setdefault("TFDS_DATA_DIR", str(TFDS_DIR))
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    done = subprocess.run([python, "-c", code], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=1800)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    found = re.search(r"^([\d,]+) / ([\d,]+) params, ([\d,]+) / ([\d,]+) MACs$", done.stdout, re.M)
    assert found, done.stdout[-2000:]
    macs, original_macs = (int(found[i].replace(",", "")) for i in (3, 4))
    assert macs <= 0.5 * original_macs
    assert re.search(r"'accuracy': ", done.stdout), done.stdout[-2000:]
