"""``msprobe_hooks.record.Record``: the named tuple activation builds its records with (without typing)."""

from __future__ import annotations

import pickle

import pytest

from msprobe_hooks.record import Record


class Point(Record):
    x: int
    y: int = 0
    label: str = ""

    def norm1(self) -> int:
        return abs(self.x) + abs(self.y)


def test_a_record_is_the_tuple_of_its_fields_with_names():
    p = Point(3, label="a")
    assert p == (3, 0, "a") and hash(p) == hash((3, 0, "a"))
    assert (p.x, p.y, p.label) == (3, 0, "a") and p.norm1() == 3
    assert Point._fields == ("x", "y", "label") and p._asdict() == {"x": 3, "y": 0, "label": "a"}
    assert p._replace(y=-4) == Point(3, -4, "a") and repr(p) == "Point(x=3, y=0, label='a')"
    x, y, label = p
    assert (x, y, label) == (3, 0, "a")
    assert pickle.loads(pickle.dumps(p)) == p and type(pickle.loads(pickle.dumps(p))) is Point


@pytest.mark.parametrize(
    ("args", "kwargs", "said"),
    [((), {}, "missing value for 'x'"), ((1, 2, "c", 4), {}, "takes 3 values"), ((1,), {"z": 2}, "unexpected")],
)
def test_bad_construction_says_what_is_wrong(args, kwargs, said):
    with pytest.raises(TypeError, match=said):
        Point(*args, **kwargs)


def test_a_field_without_a_default_after_one_with_is_refused_when_the_class_is_made():
    with pytest.raises(TypeError, match="without a default after one with"):

        class Bad(Record):
            a: int = 1
            b: int
