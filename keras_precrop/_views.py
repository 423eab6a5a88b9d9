"""A tuple that follows a table: the names of a registry, read anew at every use.

The runtime table (``latency/runtimes.py``) and the importance table
(``transfer/criteria.py``) publish their names as such views, so that an
``argparse`` ``choices=``, a membership test or ``RUNTIMES + ("mine",)``
made before a user registers an entry still sees it, and the names stay a
tuple to every reader (indexing, ``len``, ``==``, ``+``) as they were.
"""

from __future__ import annotations

from collections.abc import Sequence


class NameView(Sequence):
    """A read-only, tuple-like view of a table's names; subclasses say which (``_names``)."""

    def _names(self):
        """The names, in table order, as a tuple."""
        raise NotImplementedError

    def __getitem__(self, index):
        return self._names()[index]

    def __len__(self):
        return len(self._names())

    def __eq__(self, other):
        return self._names() == (other._names() if isinstance(other, NameView) else other)

    __hash__ = None  # it changes with the table

    def __add__(self, other):
        return self._names() + tuple(other)

    def __radd__(self, other):
        return tuple(other) + self._names()

    def __repr__(self):
        return repr(self._names())
