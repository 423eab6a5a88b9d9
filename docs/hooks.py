"""MkDocs hook: the command-line page shows ``keras-precrop --help`` as the installed CLI prints it.

The page ``cli.md`` holds the marker ``<!-- keras-precrop help -->``; this hook
replaces it with the top-level help and each subcommand's, read from
``keras_precrop.cli.main`` in this process, so the page cannot drift from the
parser. The parser imports neither Keras nor TensorFlow, so this stays fast.
Likewise the marker ``<!-- importance table -->`` becomes the table of channel
rankings (``keras_precrop/transfer/criteria.py``) that ``importance=`` reads, and
``<!-- keras-precrop runtimes -->`` the table of runtimes (``keras_precrop/latency/runtimes.py``).
"""

import contextlib
import io
import os
import re

from keras_precrop import cli
from keras_precrop.latency import runtimes
from keras_precrop.transfer import criteria

MARKER = "<!-- keras-precrop help -->"
IMPORTANCE_MARKER = "<!-- importance table -->"
RUNTIMES_MARKER = "<!-- keras-precrop runtimes -->"  # the guide's table of runtimes
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


def _importance_table():
    """The table of channel rankings as Markdown: each name, its need, what it ranks by, where."""
    rows = ["| `importance=` | needs | ranks channels by | ranks in |", "| --- | --- | --- | --- |"]
    for name in criteria.IMPORTANCE:
        ranking = criteria.criterion(name)
        places = ", ".join(f"`{place}`" for place, kinds in criteria.PLACES.items()
                           if criteria.kind_of(ranking) in kinds)
        rows.append(f"| `{name}` | {ranking.needs} | {ranking.summary.replace('|', '&#124;')} | "
                    f"{places} |")
    return "\n".join(rows)


def on_page_markdown(markdown, page, **kwargs):
    """Put the CLI's help texts in place of the marker on the command-line page, and the table
    of channel rankings in place of its marker."""
    markdown = markdown.replace(IMPORTANCE_MARKER, _importance_table())
    markdown = markdown.replace(RUNTIMES_MARKER, runtimes.markdown_table())  # the runtime table's
    if MARKER not in markdown:
        return markdown
    top = _help(["--help"])
    sections = [f"```text\n$ keras-precrop --help\n{top}\n```"]
    for command in _commands(top):
        text = _help([command, "--help"])
        sections.append(f"## `keras-precrop {command}`\n\n```text\n{text}\n```")
    return markdown.replace(MARKER, "\n\n".join(sections))
