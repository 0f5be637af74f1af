"""The public groups' grid is built once per policy values tuple (issue 16), and never
shared between values that merely compare equal (1, 1.0, True)."""

from __future__ import annotations

import pyarrow as pa

from dpsql.release.aggregates import _grid


def test_grid_is_the_product_in_order_and_kept_per_values_tuple() -> None:
    regions, devices = ("east", "west"), ("phone", "pc", "tv")
    grid = _grid((("r", regions), ("d", devices)))
    assert grid.to_pydict() == {"r": ["east"] * 3 + ["west"] * 3, "d": list(devices) * 2}
    assert _grid((("r", regions), ("d", devices))) is grid  # the same tuples: built once


def test_equal_looking_values_of_other_types_get_their_own_grid() -> None:
    ints, floats, bools = (1, 0), (1.0, 0.0), (True, False)
    assert ints == floats == bools  # what a cache keyed on values would confuse
    types = [_grid((("k", values),)).schema.field("k").type for values in (ints, floats, bools)]
    assert types == [pa.int64(), pa.float64(), pa.bool_()]
