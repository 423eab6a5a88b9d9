"""MkDocs hook: the command-line page shows ``keras-precrop --help`` as the installed CLI prints it.

The page ``cli.md`` holds the marker ``<!-- keras-precrop help -->``; this hook
replaces it with the top-level help and each subcommand's, read from
``keras_precrop.cli.main`` in this process, so the page cannot drift from the
parser. The parser imports neither Keras nor TensorFlow, so this stays fast.
"""

import contextlib
import io
import os
import re

from keras_precrop import cli

MARKER = "<!-- keras-precrop help -->"
# argparse wraps help to the terminal's width; a fixed width keeps the page the same everywhere.
WIDTH = "90"


def _help(argv):
    """What ``keras-precrop ARGV`` prints to stdout (argv ends with --help)."""
    out = io.StringIO()
    columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH
    try:
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            cli.main(argv)
    finally:
        if columns is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = columns
    return out.getvalue().rstrip()


def _commands(top_help):
    """The subcommands named in the top-level usage line's ``{a,b,...}``."""
    return re.search(r"\{([^}]+)\}", top_help).group(1).split(",")


def on_page_markdown(markdown, page, **kwargs):
    """Put the CLI's help texts in place of the marker on the command-line page."""
    if MARKER not in markdown:
        return markdown
    top = _help(["--help"])
    sections = [f"```text\n$ keras-precrop --help\n{top}\n```"]
    for command in _commands(top):
        text = _help([command, "--help"])
        sections.append(f"## `keras-precrop {command}`\n\n```text\n{text}\n```")
    return markdown.replace(MARKER, "\n\n".join(sections))
