"""JSON input and output shared by the library's records (plans, latency models).

A record read from a file may have been edited by hand. A record class that
declares a ``_SCHEMA`` (see :func:`check`) has its JSON checked once, as it is
read: a field that holds what the record cannot use is refused by
:class:`FieldError`, naming the file and the field's path
(``variables[3].new``), instead of failing later, far from the file, with a
``KeyError``.
"""

import dataclasses
import json
import math
import reprlib
from collections.abc import Callable


class FieldError(ValueError):
    """A record's JSON with a field that holds what the record cannot use.

    Attributes:
        source: where the JSON came from (``file 'plan.json'``, ``the JSON text``).
        field: the field's path in the JSON (``variables[3].new``).
        reason: what is wrong with it (``must be a positive integer, got 'abc'``).
    """

    def __init__(self, source, field, reason):
        self.source, self.field, self.reason = source, field, reason
        super().__init__(f"{source}: {field} {reason}")


@dataclasses.dataclass(frozen=True)
class Value:
    """What a JSON field must hold: in words (``"a positive integer"``), and the test."""

    what: str
    test: Callable

    def __or__(self, other):
        """This value or ``other`` (``POSITIVE | NULL``)."""
        return Value(f"{self.what} or {other.what}", lambda v: self.test(v) or other.test(v))


def _integer(v):
    return isinstance(v, int) and not isinstance(v, bool)


STRING = Value("a string", lambda v: isinstance(v, str))
BOOLEAN = Value("true or false", lambda v: isinstance(v, bool))
NULL = Value("null", lambda v: v is None)
COUNT = Value("an integer >= 0", lambda v: _integer(v) and v >= 0)
POSITIVE = Value("a positive integer", lambda v: _integer(v) and v > 0)
NUMBER = Value("a finite number",
               lambda v: (_integer(v) or isinstance(v, float)) and math.isfinite(v))
OBJECT = Value("an object", lambda v: isinstance(v, dict))


@dataclasses.dataclass(frozen=True)
class Nullable:
    """A field that holds ``schema`` or null (a :func:`check` schema of a list or object)."""

    schema: object


def one_of(*values):
    """A :class:`Value` that is one of ``values`` (strings)."""
    return Value(" or ".join(map(repr, values)), lambda v: v in values)


def _shown(value):
    """``value`` as a message shows it: short, JSON's words for null, true and false."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    return reprlib.repr(value)


def check(data, schema, source, path=""):
    """Refuse the first place where ``data`` (parsed JSON) does not fit ``schema``.

    Args:
        data: the parsed JSON, or a part of it.
        schema: a :class:`Value`; a :class:`Nullable`; ``[item]``: a list whose items fit ``item``;
            ``{key: schema}``: an object whose keys fit theirs (a key ending in
            ``"?"`` may be absent; key ``"*"`` holds for every other key);
            other keys are let through.
        source: where the JSON came from, for the message.
        path: where ``data`` is in the whole (empty for the whole).

    Raises:
        FieldError: naming ``source`` and the field's path.
    """
    where = path or "the JSON"
    if isinstance(schema, Nullable):
        if data is not None:
            check(data, schema.schema, source, path)
    elif isinstance(schema, Value):
        if not schema.test(data):
            raise FieldError(source, where, f"must be {schema.what}, got {_shown(data)}")
    elif isinstance(schema, list):
        if not isinstance(data, list):
            raise FieldError(source, where, f"must be a list, got {_shown(data)}")
        for i, item in enumerate(data):
            check(item, schema[0], source, f"{path}[{i}]")
    else:
        if not isinstance(data, dict):
            raise FieldError(source, where, f"must be an object, got {_shown(data)}")
        for key, value in data.items():
            inner = schema.get(key, schema.get(f"{key}?", schema.get("*")))
            if inner is not None:
                check(value, inner, source, f"{path}.{key}" if path else key)
        missing = [k for k in schema if k != "*" and not k.endswith("?") and k not in data]
        if missing:
            raise FieldError(source, where, f"lacks the field {missing[0]!r}")


class JsonDataclass:
    """Mixin for dataclasses of JSON-ready fields: ``to_json`` and ``from_json``.

    A subclass may set ``_SCHEMA`` (a schema of :func:`check`) to have
    :meth:`from_json` check its JSON's fields.
    """

    _SCHEMA = None

    def to_dict(self):
        return dataclasses.asdict(self)

    def to_json(self, path=None, **kwargs):
        """The record as JSON text; also written to ``path`` if given."""
        text = json.dumps(self.to_dict(), indent=kwargs.pop("indent", 1), **kwargs)
        if path is not None:
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        return text

    @classmethod
    def from_dict(cls, data):
        """The record from a dict; every field without a default is required."""
        fields = dataclasses.fields(cls)
        required = {f.name for f in fields if f.default is dataclasses.MISSING
                    and f.default_factory is dataclasses.MISSING}
        missing = required - set(data)
        if missing:
            raise ValueError(f"{cls.__name__} data lacks fields {sorted(missing)}")
        return cls(**{f.name: data[f.name] for f in fields if f.name in data})

    @classmethod
    def from_json(cls, text_or_path):
        """Load the record from JSON text or from a ``.json`` file path."""
        text, source = str(text_or_path), "the JSON text"
        if not text.lstrip().startswith(("{", "[")):  # not a JSON object or array: a path
            source = f"file {text!r}"
            with open(text, encoding="utf-8") as f:  # a missing file: OSError naming it
                text = f.read()
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"{source} is not a {cls.__name__} JSON: {err}") from None
        if not isinstance(data, dict):
            fields = ", ".join(f.name for f in dataclasses.fields(cls))
            raise ValueError(f"{source} is not a {cls.__name__} JSON: it holds a "
                             f"{type(data).__name__}, not an object; a {cls.__name__} file "
                             f"holds one JSON object with the fields {fields} (as to_json "
                             "writes it)")
        try:
            record = cls.from_dict(data)
        except (KeyError, TypeError, ValueError) as err:  # an object, of another kind of record
            if source in str(err):
                raise
            raise ValueError(f"{source} is not a {cls.__name__} JSON: {str(err).rstrip('.')}; "
                             f"it holds the fields {sorted(data)[:12]}") from None
        if cls._SCHEMA is not None:  # a record of this kind: are its fields usable?
            check(data, cls._SCHEMA, source)
        return record
