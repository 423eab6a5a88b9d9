"""JSON input and output shared by the library's records (plans, latency models)."""

import dataclasses
import json


class JsonDataclass:
    """Mixin for dataclasses of JSON-ready fields: ``to_json`` and ``from_json``."""

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
            return cls.from_dict(data)
        except (KeyError, TypeError, ValueError) as err:  # an object, of another kind of record
            if source in str(err):
                raise
            raise ValueError(f"{source} is not a {cls.__name__} JSON: {str(err).rstrip('.')}; "
                             f"it holds the fields {sorted(data)[:12]}") from None
