"""UDF faults through SQL: a registered function that raises, returns NaN, inf, huge values
or the wrong type, sleeps, loops, kills its process or writes to its input must never crash
the query, never release anything outside the bounds, and be charged exactly once. A
``local_sensitivity`` that fails must be treated as the widest bound (fail closed).

(Registration is a trusted, data-owner operation: the function sees raw values. These
tests are about robustness and about dpsql failing closed on a broken function, not about a
hostile registrant, who could simply copy the values out.)
"""

from __future__ import annotations

import math
import os
import sys
import time
from decimal import Decimal

import numpy as np
import pytest

import dpsql

from attack_helpers import connect, make_db, policy

pytestmark = [pytest.mark.attack, pytest.mark.udf_timeout]

POLICY = policy("""
[tables.t]
privacy_unit = "u"
max_groups_per_unit = 1
max_rows_per_unit = 2
[tables.t.columns]
g = { public_values = ["a", "b"] }
x = { bounds = [0, 100] }
""")
LO, HI = 0.0, 100.0
#: 120 units (two rows each) and a few NULL / NaN / inf rows the function must never see.
ROWS = ([(i, ["a", "b"][i % 2], float(i % 100)) for i in range(120) for _ in range(2)]
        + [(500, "a", None), (501, "a", math.nan), (502, "b", math.inf), (503, "b", -math.inf)])
EXACT_MEAN = float(np.mean([r[2] for r in ROWS if r[2] is not None and math.isfinite(r[2])]))


class _BadFloat:
    def __float__(self) -> float:
        raise ValueError("no")


def _recurse(v: np.ndarray) -> float:
    return _recurse(v)


def _loop(v: np.ndarray) -> float:
    while True:
        pass


def _raise(exc: BaseException):  # type: ignore[no-untyped-def]
    def fn(v: np.ndarray) -> float:
        raise exc
    return fn


FAULTY = {
    "raises": _raise(ValueError("boom")),
    "keyboard_interrupt": _raise(KeyboardInterrupt()),
    "system_exit": _raise(SystemExit(3)),
    "memory_error": _raise(MemoryError()),
    "recursion": _recurse,
    "nan": lambda v: math.nan,
    "pos_inf": lambda v: math.inf,
    "neg_inf": lambda v: -math.inf,
    "huge": lambda v: 1e308,
    "neg_huge": lambda v: -1e308,
    "huge_int": lambda v: 10**400,
    "none": lambda v: None,
    "text": lambda v: "50",
    "list": lambda v: [50.0],
    "array": lambda v: np.array([1.0, 2.0]),
    "scalar_array": lambda v: np.array(50.0),
    "float32_nan": lambda v: np.float32("nan"),
    "complex": lambda v: 1 + 1j,
    "decimal": lambda v: Decimal("50"),
    "boolean": lambda v: True,
    "bad_float": lambda v: _BadFloat(),
    "writes_input": lambda v: v.__setitem__(0, 1e9) or 50.0,
    "exits_process": lambda v: os._exit(9),
    "sleeps": lambda v: time.sleep(10) or 50.0,
    "loops": _loop,
    "sees_non_finite": lambda v: HI if not np.isfinite(v).all() else LO,
}


@pytest.fixture(scope="module")
def conn(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    path = make_db(tmp_path_factory.mktemp("udf") / "u.duckdb", {"t": ("u BIGINT, g VARCHAR, x DOUBLE", ROWS)})
    with connect(path, POLICY) as c:
        for name, fn in FAULTY.items():
            c.register_udf(f"f_{name}", fn, bounds=(LO, HI), time_limit=0.05)
        yield c


@pytest.mark.parametrize("name", list(FAULTY))
def test_a_faulty_function_gives_a_bounded_charged_answer(conn, name: str) -> None:  # type: ignore[no-untyped-def]
    before = conn.budget()
    started = time.monotonic()
    res = conn.execute(f"SELECT f_{name}(x) AS v FROM t", epsilon=1.0)
    assert time.monotonic() - started < 30
    values = [row[0] for row in res.fetchall()]
    assert len(values) == 1 and all(v is not None and math.isfinite(v) and LO <= v <= HI for v in values), values
    after = conn.budget()
    assert after.queries == before.queries + 1 and after.epsilon_spent == pytest.approx(before.epsilon_spent + 1.0)
    assert res.privacy.columns["v"].mechanism == "sample_and_aggregate"


def test_the_function_never_sees_null_nan_or_inf(conn) -> None:  # type: ignore[no-untyped-def]
    """f_sees_non_finite returns the upper bound if its block holds a non-finite value, the
    lower bound otherwise. At epsilon 1e4 the noise (scale (hi - lo) / (k eps) < 0.1) is
    far below the gap: the answer is ~0, never ~100 (which any NaN/inf in any block would
    push up by 100 / k >= 8)."""
    (value,) = conn.execute("SELECT f_sees_non_finite(x) AS v FROM t", epsilon=1e4).fetchall()[0]
    assert value < 4, value


SENSITIVITIES = {
    "raises": lambda v, k: 1 / 0,
    "nan": lambda v, k: math.nan,
    "pos_inf": lambda v, k: math.inf,
    "text": lambda v, k: "tiny",
    "none": lambda v, k: None,
    "array": lambda v, k: np.array([1e-9, 1e-9]),
}


def _mean(v: np.ndarray) -> float:
    return float(np.mean(v)) if v.size else 50.0


@pytest.mark.parametrize("name", list(SENSITIVITIES))
@pytest.mark.parametrize("strategy", ["smooth", "ptr"])
def test_a_broken_local_sensitivity_is_the_widest_bound(conn, name: str, strategy: str) -> None:  # type: ignore[no-untyped-def]
    """Treated as hi - lo: smooth sensitivity then adds noise of scale ~2 x 100 / epsilon0
    (~200 here), PTR refuses (at hi - lo the data is never 'stable' for a smaller
    proposal). Either way the answer is far from exact: P(|noise| <= 1) ~ 1/200 per
    release for smooth, so 4 releases all within 1 of the exact mean has probability
    below 1e-9."""
    conn.register_udf(f"ls_{name}", _mean, bounds=(LO, HI), local_sensitivity=SENSITIVITIES[name], strategy=strategy)
    values = [conn.execute(f"SELECT ls_{name}(x) AS v FROM t", epsilon=1.0, delta=1e-6).fetchall()[0][0]
              for _ in range(4)]
    assert any(v is None or abs(v - EXACT_MEAN) > 1 for v in values), values


@pytest.mark.parametrize("bad", [-1.0, -math.inf])
def test_a_negative_local_sensitivity_is_the_widest_bound(conn, bad: float) -> None:  # type: ignore[no-untyped-def]
    name = "neg" if bad == -1.0 else "neg_inf"
    conn.register_udf(f"ls_{name}", _mean, bounds=(LO, HI), local_sensitivity=lambda v, k: bad, strategy="smooth")
    values = [conn.execute(f"SELECT ls_{name}(x) AS v FROM t", epsilon=1.0, delta=1e-6).fetchall()[0][0]
              for _ in range(4)]
    assert any(v is None or abs(v - EXACT_MEAN) > 1 for v in values), values


def test_a_faulty_function_under_ptr_gets_the_midpoint(conn) -> None:  # type: ignore[no-untyped-def]
    """PTR and smooth sensitivity run the function once on all the values: if it fails
    there, the midpoint is used (bounded), and the query is still answered and charged."""
    conn.register_udf("ptr_raises", _raise(RuntimeError("x")), bounds=(LO, HI),
                      local_sensitivity=lambda v, k: 0.01, strategy="smooth")
    before = conn.budget().queries
    (value,) = conn.execute("SELECT ptr_raises(x) AS v FROM t", epsilon=1.0, delta=1e-6).fetchall()[0]
    assert value is not None and LO <= value <= HI and conn.budget().queries == before + 1


def test_registration_refuses_what_cannot_be_bounded() -> None:
    from dpsql.release.udf import validate_udf

    for kwargs in ({"bounds": (0, math.inf)}, {"bounds": (math.nan, 1)}, {"bounds": (5, 5)}, {}):
        with pytest.raises(dpsql.QueryRejected):
            validate_udf("my_f", _mean, **kwargs)  # type: ignore[arg-type]
    assert sys.getrecursionlimit() > 0  # the recursion fault above left the interpreter usable
