"""Griffe extension: the docstrings' Sphinx roles become links in the API reference.

The package's docstrings cross-reference with Sphinx roles (``:func:`plan```,
``:class:`~keras_precrop.errors.ArgumentError```), which Markdown would print
as they are. Once griffe has loaded the package, each role becomes the name in
code, linked to its entry when the reference documents it (an optional
autoref: a private or undocumented target stays plain code, no warning); a
reST ``::`` that opens a literal block becomes ``:`` (the indented block is
Markdown code already), and a doctest (``>>>`` lines up to a blank line) a
fenced code block, which Markdown would run together as a paragraph.

Names resolve as Python would in the docstring's scope, or from the top: a
public ``keras_precrop.NAME`` (which the package imports lazily, out of a
static analyzer's sight) through the table ``keras_precrop`` keeps of where
each public name lives.
"""

import re

import griffe

import keras_precrop

_ROLE = re.compile(r":(func|class|meth|attr|mod|exc|data|obj):`(~?)([^`]+)`")
_LITERAL_BLOCK = re.compile(r"(?<=\S)::\n\n", re.MULTILINE)
_DOCTEST = re.compile(r"^(?P<indent> *)>>> .*(?:\n(?P=indent)\S.*)*", re.MULTILINE)
# Where the package's lazily imported public names live: name -> module path.
_LAZY = {**{name: f"{module}.{name}" for name, module in keras_precrop._PUBLIC.items()},
         **keras_precrop._SUBPACKAGES}


def _find(collection, path):
    """The canonical path of the object at ``path``, or None when griffe does not know one.

    A module that holds a function or class of its own name (``pai.random_masks``) stands
    for that object: ``:func:`` means the function, and a package's ``__init__`` that
    imports it shadows the module under the same name.
    """
    try:
        found = collection.get_member(path)
        found = found.final_target if found.is_alias else found
        if found.is_module and found.name in found.members:
            found = found.members[found.name]
            found = found.final_target if found.is_alias else found
        return found.path
    except (KeyError, griffe.AliasResolutionError, griffe.CyclicAliasError):
        return None


def _target(obj, name, collection):
    """The canonical path ``name`` means in ``obj``'s docstring, or None."""
    head, _, rest = name.partition(".")
    if head == "keras_precrop" and rest.split(".")[0] in _LAZY:
        first, _, tail = rest.partition(".")
        return _find(collection, ".".join(filter(None, (_LAZY[first], tail))))
    try:
        resolved = obj.resolve(head)
    except griffe.NameResolutionError:
        return _find(collection, name)
    return _find(collection, ".".join(filter(None, (resolved, rest))))


def _rewrite(obj, collection):
    """The docstring of ``obj`` with its roles as optional autorefs."""

    def link(match):
        name = match[3].removesuffix("()")
        shown = f"<code>{name.rsplit('.', 1)[-1] if match[2] else name}</code>"
        path = _target(obj, name, collection)
        return f'<autoref identifier="{path}" optional>{shown}</autoref>' if path else shown

    def fence(match):
        return f"{match['indent']}```pycon\n{match[0]}\n{match['indent']}```"

    text = _LITERAL_BLOCK.sub(":\n\n", _ROLE.sub(link, obj.docstring.value))
    return _DOCTEST.sub(fence, text)


def _objects(obj):
    """``obj`` and every object defined under it (aliases are documented where they point)."""
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from _objects(member)


class SphinxRoles(griffe.Extension):
    """Rewrites the roles once the whole package is loaded, so that every name can resolve."""

    def on_package(self, *, pkg, loader, **kwargs):
        if pkg.name != "keras_precrop":
            return
        for obj in _objects(pkg):
            if obj.docstring:
                obj.docstring.value = _rewrite(obj, loader.modules_collection)
