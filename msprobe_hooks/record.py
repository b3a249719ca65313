"""Records for what activation builds (the config's variables, the patch catalogue), cheap to define.

A record is a named tuple written as a class body of annotated fields, defaults as their values:

    class Patch(Record):
        name: str
        versions: str = ""

``typing.NamedTuple`` would import typing (with re, enum, functools, contextlib: ~4 ms) and
``collections.namedtuple`` builds each class by ``exec`` (~40 µs each, ~20 of them at activation),
in every Python process of a job. This builds them from the field list alone, with the same
behaviour: a tuple (equal to, and hashed as, its values), attribute access, ``_fields``,
``_replace``, ``_asdict``, positional or keyword construction, a readable ``repr``.
"""

from __future__ import annotations

from _collections import _tuplegetter

_MISSING = object()


class Record(tuple):
    __slots__ = ()
    _fields: tuple[str, ...] = ()
    _field_defaults: dict[str, object] = {}  # noqa: RUF012  (set per subclass, never mutated)

    def __init_subclass__(cls) -> None:
        own = [name for name in cls.__dict__.get("__annotations__", {}) if not name.startswith("_")]
        fields = (*cls._fields, *own)
        defaults = dict(cls._field_defaults)
        for name in own:
            value = cls.__dict__.get(name, _MISSING)
            if value is not _MISSING:
                defaults[name] = value
            elif defaults:
                raise TypeError(f"{cls.__name__}.{name}: a field without a default after one with a default")
        for index, name in enumerate(fields):
            setattr(cls, name, _tuplegetter(index, f"field {index}: {name}"))
        cls._fields, cls._field_defaults = fields, defaults

    def __new__(cls, *args: object, **kwargs: object) -> Record:
        if len(args) > len(cls._fields):
            raise TypeError(f"{cls.__name__} takes {len(cls._fields)} values, got {len(args)}")
        values = list(args)
        for name in cls._fields[len(args) :]:
            if name in kwargs:
                values.append(kwargs.pop(name))
            elif name in cls._field_defaults:
                values.append(cls._field_defaults[name])
            else:
                raise TypeError(f"{cls.__name__}() missing value for {name!r}")
        if kwargs:
            raise TypeError(f"{cls.__name__}() got unexpected or repeated fields: {', '.join(kwargs)}")
        return tuple.__new__(cls, values)

    def __getnewargs__(self) -> tuple:
        return tuple(self)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{n}={v!r}' for n, v in zip(self._fields, self, strict=True))})"

    def _replace(self, **changes: object) -> Record:
        return type(self)(**{**self._asdict(), **changes})

    def _asdict(self) -> dict[str, object]:
        return dict(zip(self._fields, self, strict=True))
