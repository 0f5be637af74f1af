"""The PEP 249 cursor over a dpsql :class:`~dpsql.connection.Connection` (:mod:`dpsql.dbapi`
is the module PEP 249 describes; the cursor lives here so that the connection, which makes
cursors, and ``dbapi.connect``, which makes connections, import each other in one
direction only)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

from dpsql.errors import InterfaceError, ProgrammingError
from dpsql.params import bind_values

if TYPE_CHECKING:
    from dpsql.connection import Connection
    from dpsql.result import Result

__all__ = ["Cursor", "DBAPIConnection", "Description"]

# ---------------------------------------------------------------- the cursor

Description = tuple[str, str, None, None, None, None, bool]


class Cursor:
    """A PEP 249 cursor over a dpsql :class:`~dpsql.connection.Connection`.

    Attributes:
        epsilon, delta: what each ``execute`` spends unless it names its own (``None``:
            the policy's ``default_epsilon``, and 0).
        arraysize: rows ``fetchmany()`` returns by default (1, as PEP 249 says).
        result: the last answer as a :class:`~dpsql.result.Result` (privacy, accuracy),
            ``None`` before the first.
    """

    def __init__(self, connection: Connection, *, epsilon: float | None = None, delta: float | None = None) -> None:
        self.connection = connection
        self.epsilon = epsilon
        self.delta = delta
        self.arraysize = 1
        self.result: Result | None = None
        self._rows: list[tuple[Any, ...]] = []
        self._position = 0
        self._closed = False

    # -- executing ----------------------------------------------------------------------

    def execute(
        self,
        operation: str,
        parameters: Sequence[object] | None = None,
        *,
        epsilon: float | None = None,
        delta: float | None = None,
    ) -> Cursor:
        """Answer one SELECT with differential privacy, charging (epsilon, delta).

        ``parameters`` fill the ``?`` (or ``$1``...) placeholders, bound as literals.
        Returns the cursor (so ``cur.execute(...).fetchall()`` works, as in sqlite3).

        Raises:
            ProgrammingError: the query is refused (nothing charged) or a parameter cannot
                be bound; :class:`dpsql.QueryRejected` and :class:`dpsql.PolicyViolation`
                are ProgrammingErrors.
            OperationalError: the budget cannot pay (:class:`dpsql.BudgetExceeded`), or
                the run failed after the charge (:class:`dpsql.QueryFailed`).
        """
        self._check_open()
        sql = bind_values(operation, parameters)
        result = self.connection.execute(
            sql,
            epsilon=self.epsilon if epsilon is None else epsilon,
            delta=self.delta if delta is None else delta,
        )
        self.result = result
        self._rows = result.fetchall()
        self._position = 0
        return self

    def executemany(self, operation: str, seq_of_parameters: Sequence[Sequence[object]]) -> Cursor:
        """Execute ``operation`` once per parameter sequence; each run is charged.

        The cursor then holds the last run's answer.
        """
        self._check_open()
        for parameters in seq_of_parameters:
            self.execute(operation, parameters)
        return self

    # -- results ------------------------------------------------------------------------

    @property
    def description(self) -> list[Description] | None:
        """Per column (name, type_code, None, None, None, None, null_ok); ``None`` before
        any query."""
        if self.result is None:
            return None
        schema = self.result.arrow().schema
        return [(f.name, str(f.type), None, None, None, None, f.nullable) for f in schema]

    @property
    def rowcount(self) -> int:
        """Rows in the last answer; -1 before any."""
        return -1 if self.result is None else len(self._rows)

    @property
    def rownumber(self) -> int | None:
        """The index of the next row ``fetchone`` returns (PEP 249 extension)."""
        return None if self.result is None else self._position

    lastrowid = None

    def fetchone(self) -> tuple[Any, ...] | None:
        """The next row, or ``None`` when there is none left."""
        rows = self._remaining(1)
        return rows[0] if rows else None

    def fetchmany(self, size: int | None = None) -> list[tuple[Any, ...]]:
        """Up to ``size`` (default ``arraysize``) further rows; an empty list at the end."""
        size = self.arraysize if size is None else size
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ProgrammingError(f"fetchmany needs a row count >= 0, got {size!r}.")
        return self._remaining(size)

    def fetchall(self) -> list[tuple[Any, ...]]:
        """Every remaining row."""
        return self._remaining(None)

    def _remaining(self, size: int | None) -> list[tuple[Any, ...]]:
        self._check_open()
        if self.result is None:
            raise ProgrammingError("no results to fetch: call execute() first.")
        end = len(self._rows) if size is None else min(len(self._rows), self._position + size)
        rows = self._rows[self._position:end]
        self._position = end
        return rows

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return self

    def __next__(self) -> tuple[Any, ...]:
        row = self.fetchone()
        if row is None:
            raise StopIteration
        return row

    # -- what PEP 249 asks for and dpsql does not need ----------------------------------

    def setinputsizes(self, sizes: object) -> None:
        """Does nothing (PEP 249 allows it)."""

    def setoutputsize(self, size: object, column: object = None) -> None:
        """Does nothing (PEP 249 allows it)."""

    def close(self) -> None:
        """Close the cursor; the connection stays open. Closing twice is harmless."""
        self._closed = True
        self._rows = []

    def __enter__(self) -> Cursor:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise InterfaceError("this cursor is closed; open a new one with conn.cursor().")
        closed = getattr(self.connection, "closed", False)
        if closed:
            raise InterfaceError("this dpsql connection is closed; open a new one with dpsql.connect().")

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{self.rowcount} rows" if self.result is not None else "no query yet"
        return f"<dpsql Cursor: {state}>"


class DBAPIConnection:
    """What makes :class:`~dpsql.connection.Connection` a PEP 249 connection besides
    ``close()``: ``cursor()``, ``commit()`` and ``rollback()``."""

    epsilon: float | None = None
    delta: float | None = None

    _check_open: Callable[[], None]  # the Connection's

    def cursor(self, *, epsilon: float | None = None, delta: float | None = None) -> Cursor:
        """A DB-API cursor spending ``epsilon``/``delta`` per execute (default: the
        connection's ``epsilon``/``delta``); see :mod:`dpsql.dbapi`."""
        self._check_open()
        return Cursor(self, epsilon=self.epsilon if epsilon is None else epsilon,  # type: ignore[arg-type]
                      delta=self.delta if delta is None else delta)

    def commit(self) -> None:
        """Nothing to commit (DB-API): dpsql only reads, and a charge is recorded when made."""

    def rollback(self) -> None:
        """Nothing to roll back (DB-API): a charge is final and is never undone."""
