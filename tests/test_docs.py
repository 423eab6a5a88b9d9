"""The API reference (``mkdocs.yml``, ``docs/``) builds without a warning and covers the public API.

``mkdocs build --strict`` turns every warning into an error: a docstring
parameter the signature lacks, a malformed Google-style section, a
cross-reference to nothing. The built site must then hold a documented entry
(a heading mkdocstrings writes with the object's path as its id) for every
name of ``keras_precrop.__all__``, found where Python says the object is
defined, and for every public function and class of the public subpackages;
and the command-line page must show the help of every subcommand that
``keras-precrop --help`` lists. MkDocs and mkdocstrings come with the
``[test]`` extra: without them the build, and so this test, fails.
"""

import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest

import keras_precrop as kp

REPO = Path(__file__).resolve().parents[1]
# mkdocstrings' heading of a documented object: <h2 id="keras_precrop.planning.plan" class="doc doc-heading">
_HEADING = re.compile(r'id="([\w.]+)" class="doc doc-heading"')
_SUBPACKAGES = ("data", "hub", "models", "pai", "train")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The built site's HTML pages, {path relative to the site: text}."""
    out = tmp_path_factory.mktemp("site")
    build = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)],
                           cwd=REPO, capture_output=True, text=True, timeout=300)
    log = build.stdout + build.stderr
    assert build.returncode == 0, log
    assert "WARNING" not in log, log
    return {str(page.relative_to(out)): page.read_text(encoding="utf-8")
            for page in out.rglob("*.html")}


@pytest.fixture(scope="module")
def documented(site):
    """The paths of the objects the site documents."""
    return {path for html in site.values() for path in _HEADING.findall(html)}


def _defined_at(obj):
    """Where Python says ``obj`` is defined: a module's name, else module.qualname."""
    return obj.__name__ if inspect.ismodule(obj) else f"{obj.__module__}.{obj.__qualname__}"


def _public_members(module):
    """A subpackage's public names: its ``__all__``, else the functions and classes it defines."""
    names = getattr(module, "__all__", None)
    if names is None:
        names = [name for name, value in vars(module).items()
                 if not name.startswith("_") and (inspect.isfunction(value) or inspect.isclass(value))
                 and value.__module__ == module.__name__]
    return names


def test_every_public_name_is_documented(documented):
    missing = [name for name in kp.__all__ if _defined_at(getattr(kp, name)) not in documented]
    assert not missing, f"no API reference entry for keras_precrop.{missing}"


@pytest.mark.parametrize("subpackage", _SUBPACKAGES)
def test_subpackage_members_are_documented(documented, subpackage):
    module = getattr(kp, subpackage)
    names = _public_members(module)
    assert names
    # Documented where the subpackage exports it, or where it is defined (a function that
    # shares its module's name, like models.vgg, is documented by its full path).
    missing = [name for name in names
               if f"{module.__name__}.{name}" not in documented
               and not (hasattr(getattr(module, name), "__qualname__")
                        and _defined_at(getattr(module, name)) in documented)]
    assert not missing, f"no API reference entry for {module.__name__}.{missing}"


def test_cli_page_shows_every_subcommand(site):
    top = subprocess.run([sys.executable, "-m", "keras_precrop", "--help"], cwd=REPO,
                         capture_output=True, text=True, timeout=60, check=True).stdout
    commands = re.search(r"\{([^}]+)\}", top)[1].split(",")
    page = site["cli/index.html"]
    assert "usage: keras-precrop [-h]" in page
    for command in commands:
        assert f"usage: keras-precrop {command}" in page, command
