"""Every ``python`` and ``bash`` code block of README.md runs as written.

Blocks are found anew on every run, so a section added to the README is
tested without touching this file. An HTML comment on the line before a
block's fence (blank lines between are allowed) marks it:

* ``<!-- test: slow -->``: it takes more than ~20 s; runs with ``pytest -m slow``;
* ``<!-- test: skip (why) -->``: it cannot run here (it needs a TPU, the network,
  or it runs this very test suite).

Each block runs in a fresh temporary folder with this checkout first on
``PYTHONPATH``: python blocks as ``python -c``, bash blocks under ``bash -e``
with ``pip install`` lines left out (the checkout is used as it is) and
``keras-precrop`` and ``python`` found first on ``PATH`` as this checkout's
command line and this interpreter.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
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
    for line, language, code, mark in readme_blocks():
        if language not in _LANGUAGES:
            continue  # text (a folder layout, output)
        marks = {"slow": [pytest.mark.slow], "skip": [pytest.mark.skip(reason="marked skip in README.md")]}
        params.append(pytest.param(language, code, marks=marks.get(mark, []),
                                   id=f"README.md:{line}:{language}"))
    return params


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


@pytest.mark.parametrize("language,code", _params())
def test_readme_block_runs(language, code, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    path = [str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path), "TF_CPP_MIN_LOG_LEVEL": "2"}
    if language == "python":
        command = [sys.executable, "-c", code]
    else:
        env["PATH"] = os.pathsep.join([str(_command_line_first_on_path(tmp_path)), env["PATH"]])
        command = ["bash", "-e", "-c", _shell_without_installs(code)]
    done = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


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
