"""Project conventions that a change can silently break."""

import re

from tests.conftest import REPO


def test_readme_test_command_is_what_ci_runs():
    """README's second code block starts with the command that ``.ci/run`` ends with."""
    blocks = re.findall(r"```[a-z]*\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    ci = (REPO / ".ci" / "run").read_text().strip().splitlines()
    assert blocks[1].splitlines()[0] == ci[-1] == (
        'pip install -e ".[test]" && pip install --no-deps keras-hub tokenizers && ruff check . '
        "&& python -m pytest -q")
