"""One statement of a pgwire session: transaction words, ``SET``/``SHOW``/``RESET``,
``EXPLAIN``, catalog queries and private queries; and the SQLSTATE of every error.

:class:`Answering` is the half of :class:`~dpsql.pgwire.session.Session` that turns one
statement into an :class:`Outcome`; the session (:mod:`dpsql.pgwire.session`) keeps the
connection's life and the protocol's messages. Every private query goes through
:class:`dpsql.server.Service`, exactly as a Flight request does.
"""

from __future__ import annotations

import logging
import re
import secrets
import time
import traceback
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa
import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError

from dpsql import errors
from dpsql.display import with_bias_columns, with_intervals
from dpsql.errors import AuthenticationError, Error
from dpsql.local.query import references_local_table
from dpsql.pgwire import catalog as cat
from dpsql.pgwire import messages as m
from dpsql.pgwire import statements as st
from dpsql.pgwire.describe import column_types, parameter_type

if TYPE_CHECKING:
    from dpsql.result import Result

log = logging.getLogger("dpsql.server.pg")

_LOGGED_SQL_CHARS = 300

_STATIC = {
    "server_version": cat.SERVER_VERSION,
    "server_version_num": "150000",
    "server_encoding": "UTF8",
    "client_encoding": "UTF8",
    "datestyle": "ISO, MDY",
    "intervalstyle": "postgres",
    "timezone": "UTC",
    "integer_datetimes": "on",
    "standard_conforming_strings": "on",
    "is_superuser": "off",
    "transaction_isolation": "read committed",
    "transaction_read_only": "on",
    "default_transaction_read_only": "on",
    "search_path": '"$user", public',
    "max_identifier_length": "63",
    "lc_collate": "C",
    "lc_ctype": "C",
    "extra_float_digits": "1",
    "application_name": "",
    "statement_timeout": "0",
}
_REPORTED = ["server_version", "server_encoding", "client_encoding", "datestyle", "intervalstyle", "timezone",
             "integer_datetimes", "standard_conforming_strings", "is_superuser", "application_name"]
_REPORTED_NAMES = {"datestyle": "DateStyle", "intervalstyle": "IntervalStyle", "timezone": "TimeZone"}

_DPSQL = {"dpsql.epsilon", "dpsql.delta", "dpsql.accuracy", "dpsql.bias"}

_SET = re.compile(r"SET\s+(?:SESSION\s+|LOCAL\s+)?(?P<name>[A-Za-z_][\w.$]*|\"[^\"]+\")\s*(?:=|\s+TO\s+)\s*(?P<value>.*)",
                  re.IGNORECASE | re.DOTALL)

_OTHER_SET = re.compile(r"SET\s+(?:SESSION\s+|LOCAL\s+)?(TIME\s+ZONE|SESSION\s+CHARACTERISTICS|TRANSACTION|NAMES)\b",
                        re.IGNORECASE)

_TRANSACTION_TAGS = {"BEGIN": "BEGIN", "START": "START TRANSACTION", "COMMIT": "COMMIT", "END": "COMMIT",
                     "ROLLBACK": "ROLLBACK", "ABORT": "ROLLBACK", "SAVEPOINT": "SAVEPOINT", "RELEASE": "RELEASE"}


class Host(Protocol):
    """What a session reads of the server that accepted it (:class:`~dpsql.pgwire.PgServer`)."""

    service: Any
    catalog: Any
    verifier: Any
    scram: Any
    tls: Any
    idle_timeout: float
    auth_floor_seconds: float
    stopping: Any
    describer: Any


class Refusal(Error):
    """A refusal the session makes itself, with its SQLSTATE."""

    def __init__(self, sqlstate: str, message: str) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


@dataclass
class Outcome:
    """What one statement answers: rows (when ``columns`` is not None) and a command tag."""

    tag: str
    columns: list[m.Column] | None = None
    rows: list[list[bytes | None]] = field(default_factory=list)
    sent: int = 0
    empty: bool = False
    values: list[list[Any]] | None = None  # the rows' Python values, for binary results


@dataclass
class Described:
    """What Describe learns of a statement: its columns (``None``: it answers no rows), the
    engine types of the columns it reads (for its parameters' types), and its outcome when
    learning the columns meant answering it (a catalog query, SHOW: free, no private row)."""

    columns: list[m.Column] | None
    types: dict[str, int] = field(default_factory=dict)
    outcome: Outcome | None = None


class Answering:
    """Answers one statement for a session (mixed into :class:`~dpsql.pgwire.session.Session`)."""

    server: Host
    user: str
    settings: dict[str, str]
    status: bytes
    _out: list[bytes]

    def _run(self, statement: st.Statement, sql: str) -> Outcome:
        try:
            outcome = self._answer(statement, sql)
        except Exception:
            if self.status == b"T":
                self.status = b"E"
            raise
        return outcome

    def _answer(self, statement: st.Statement, sql: str) -> Outcome:
        keyword = statement.keyword
        if keyword in _TRANSACTION_TAGS:
            self.status = b"T" if keyword in ("BEGIN", "START") else b"I" if keyword not in ("SAVEPOINT", "RELEASE") else self.status
            return Outcome(_TRANSACTION_TAGS[keyword])
        if keyword == "SET":
            return self._set(sql)
        if keyword == "RESET":
            return self._reset(sql)
        if keyword == "SHOW":
            return self._show(sql)
        if keyword == "DISCARD":
            self.settings = {k: v for k, v in self.settings.items() if k == "application_name"}
            return Outcome("DISCARD ALL")
        if keyword == "DEALLOCATE":
            return Outcome("DEALLOCATE")
        if keyword == "EXPLAIN":
            return self._explain(re.sub(r"^\s*EXPLAIN\s*", "", sql, flags=re.IGNORECASE))
        return self._query(sql)

    def _query(self, sql: str) -> Outcome:
        tree = _parse(sql)
        inner = _explain_call(tree)
        if inner is not None:
            return self._explain(inner)
        if tree is not None and cat.is_catalog_query(tree, self.server.catalog.tables):
            table = self.server.catalog.answer(tree)
            return _table_outcome(table)
        epsilon, delta = self._amounts(sql)
        started = time.perf_counter()
        described = _describe(sql, epsilon, delta)
        try:
            result = self.server.service.execute(self.user, sql, epsilon, delta, dialect="postgres",
                                                 bias=self._setting("dpsql.bias") == "on")
        except Error as exc:
            if tree is None and isinstance(exc, errors.QueryRejected):
                exc = st.SyntaxProblem(str(exc))
            charged = isinstance(exc, errors.QueryFailed)
            log.info("query analyst=%r %s %s: %s [pg]", self.user, described,
                     "failed after the charge" if charged else "refused",
                     type(exc).__name__ if charged else f"{type(exc).__name__} (nothing charged)")
            raise exc from None
        elapsed = 1e3 * (time.perf_counter() - started)
        if getattr(result, "cached", False):
            log.info("query analyst=%r %s repeat of a released answer, charged nothing, rows=%d in %.1f ms [pg]",
                     self.user, described, len(result), elapsed)
        else:
            log.info("query analyst=%r %s charged epsilon=%g delta=%g rows=%d in %.1f ms [pg]", self.user, described,
                     result.privacy.epsilon, result.privacy.delta, len(result), elapsed)
        return self._result_outcome(result)

    def _columns(self, statement: st.Statement, sql: str, *, types: bool = True) -> Described:
        """The columns ``sql`` will answer and (with ``types``) the parameter types of the
        columns it reads, known without charging or reading a private row (Describe;
        :mod:`dpsql.pgwire.describe`)."""
        keyword = statement.keyword
        if not keyword or keyword in _TRANSACTION_TAGS or keyword in ("SET", "RESET", "DISCARD", "DEALLOCATE"):
            return Described(None)
        if keyword in ("SHOW", "EXPLAIN"):  # a setting, the budget, a dry run: nothing charged
            outcome = self._answer(statement, sql)
            return Described(outcome.columns, outcome=outcome)
        tree = _parse(sql)
        if _explain_call(tree) is not None:
            return Described([m.Column("QUERY PLAN", m.TEXT)])
        if tree is not None and cat.is_catalog_query(tree, self.server.catalog.tables):
            outcome = _table_outcome(self.server.catalog.answer(tree))
            return Described(outcome.columns, outcome=outcome)
        policy = self.server.service.policy
        if (tree is not None and _public_only(tree, policy)) or references_local_table(sql, policy):
            outcome = self._query(sql)  # public rows, or post-processing of local reports: free
            return Described(outcome.columns, self._public_types(tree) if types else {}, outcome)
        epsilon, delta = self._amounts(sql)
        plan = self.server.service.connection(self.user).plan(sql, epsilon=epsilon, delta=delta, dialect="postgres")
        columns = self.server.describer.columns(plan, accuracy=self._setting("dpsql.accuracy") == "on",
                                                bias=self._setting("dpsql.bias") == "on")
        return Described(columns, column_types(plan))

    def _public_types(self, tree: exp.Expr | None) -> dict[str, int]:
        """The parameter types of the public tables' columns, from their (public, free) columns."""
        seen: dict[str, set[int]] = {}
        for table in {t.name for t in tree.find_all(exp.Table)} if tree is not None else ():
            empty = self._query(f"SELECT * FROM {exp.to_identifier(table, quoted=True).sql()} LIMIT 0")
            for column in empty.columns or ():
                seen.setdefault(column.name.casefold(), set()).add(parameter_type(column.oid))
        return {name: kinds.pop() for name, kinds in seen.items() if len(kinds) == 1}

    def _result_outcome(self, result: Result) -> Outcome:
        table = result.arrow()
        if self._setting("dpsql.accuracy") == "on":
            table = _with_intervals(result)
        if result.bias is not None:  # SET dpsql.bias = on: a <column>_bias text column after each aggregate
            table = with_bias_columns(result, table)
        return _table_outcome(table)

    def _amounts(self, sql: str) -> tuple[float | None, float | None]:
        hint = st.hint_of(sql)
        epsilon = hint.epsilon if hint.epsilon is not None else _number(self.settings.get("dpsql.epsilon"))
        delta = hint.delta if hint.delta is not None else _number(self.settings.get("dpsql.delta"))
        return epsilon, delta

    def _explain(self, sql: str) -> Outcome:
        if re.match(r"\s*(\(|ANALYZE\b|VERBOSE\b)", sql, re.IGNORECASE):
            if re.match(r"\s*(\([^)]*\bANALYZE\b|ANALYZE\b)", sql, re.IGNORECASE):
                raise Refusal("0A000", "EXPLAIN ANALYZE would run (and charge) the query; use EXPLAIN for a free dry run.")
            sql = re.sub(r"^\s*(\([^)]*\)|VERBOSE\b)\s*", "", sql, flags=re.IGNORECASE)
        tree = _parse(sql)
        if tree is not None and cat.is_catalog_query(tree, self.server.catalog.tables):
            lines = ["catalog query: answered from the policy, charges nothing"]
        else:
            epsilon, delta = self._amounts(sql)
            explanation = self.server.service.explain(self.user, sql, epsilon, delta, dialect="postgres")
            log.info("explain analyst=%r %s (nothing charged) [pg]", self.user, _describe(sql, epsilon, delta))
            lines = repr(explanation).splitlines() + ["bounded SQL:"] + [
                "  " + line for line in str(explanation.bounded_sql).splitlines()]
        return Outcome(f"SELECT {len(lines)}", [m.Column("QUERY PLAN", m.TEXT)], [[line.encode()] for line in lines])

    # ------------------------------------------------------------ SET, SHOW, RESET

    def _set(self, sql: str) -> Outcome:
        if _OTHER_SET.match(sql):
            return Outcome("SET")
        match = _SET.match(sql)
        if not match:
            raise st.SyntaxProblem("cannot read this SET: write SET name = value (e.g. SET dpsql.epsilon = 0.5).")
        name = match.group("name").strip('"').lower()
        value = match.group("value").strip()
        if value.upper() == "DEFAULT":
            self.settings.pop(name, None)
            return Outcome("SET")
        if len(value) >= 2 and value[0] == value[-1] == "'":
            value = value[1:-1].replace("''", "'")
        if name in ("dpsql.epsilon", "dpsql.delta"):
            value = repr(st.parse_amount(name, value))
        elif name in ("dpsql.accuracy", "dpsql.bias"):
            word = value.lower()
            if word not in ("on", "off", "true", "false", "1", "0"):
                raise Refusal("22023", f"{name} is on or off, not {value!r}.")
            value = "on" if word in ("on", "true", "1") else "off"
        elif name.startswith("dpsql."):
            raise Refusal("42704", f'unrecognized configuration parameter "{name}"; dpsql knows {", ".join(sorted(_DPSQL))}.')
        elif name == "client_encoding" and value.upper().replace("-", "") not in ("UTF8", "UNICODE"):
            raise Refusal("22023", f"dpsql speaks UTF8 only, not {value!r}.")
        self.settings[name] = value[:200]
        if name in _REPORTED:
            self._out.append(m.parameter_status(_REPORTED_NAMES.get(name, name), self._setting(name)))
        return Outcome("SET")

    def _reset(self, sql: str) -> Outcome:
        name = re.sub(r"^\s*RESET\s+", "", sql, flags=re.IGNORECASE).strip().strip('"').lower()
        if name == "all":
            self.settings = {k: v for k, v in self.settings.items() if k == "application_name"}
        else:
            self.settings.pop(name, None)
        return Outcome("RESET")

    def _setting(self, name: str) -> str:
        if name in self.settings:
            return self.settings[name]
        if name == "dpsql.epsilon":
            return repr(self.server.service.policy.default_epsilon)
        if name == "dpsql.delta":
            return "0.0"
        if name in ("dpsql.accuracy", "dpsql.bias"):
            return "off"
        if name == "session_authorization":
            return self.user
        return _STATIC.get(name, "")

    def _show(self, sql: str) -> Outcome:
        name = re.sub(r"^\s*SHOW\s+", "", sql, flags=re.IGNORECASE).strip().strip('"').lower()
        name = {"transaction isolation level": "transaction_isolation", "time zone": "timezone"}.get(
            " ".join(name.split()), name)
        if name == "dpsql.budget":
            status = self.server.service.budget(self.user)
            log.info("budget analyst=%r: epsilon %g of %g spent [pg]", self.user, status.epsilon_spent, status.epsilon_total)
            names = ["analyst", "epsilon_spent", "epsilon_remaining", "epsilon_total", "delta_spent",
                     "delta_remaining", "delta_total"]
            table = pa.table({n: [getattr(status, n)] for n in names})
            return _table_outcome(table, tag="SHOW")
        if name == "all":
            known = sorted(set(_STATIC) | _DPSQL | set(self.settings))
            rows: list[list[bytes | None]] = [[n.encode(), self._setting(n).encode()] for n in known]
            return Outcome("SHOW", [m.Column("name", m.TEXT), m.Column("setting", m.TEXT)], rows)
        if name not in _STATIC and name not in _DPSQL and name not in self.settings and name != "session_authorization":
            raise Refusal("42704", f'unrecognized configuration parameter "{name}"')
        return Outcome("SHOW", [m.Column(name, m.TEXT)], [[self._setting(name).encode()]])

    # ------------------------------------------------------------ errors

    def _error(self, exc: BaseException) -> None:
        sqlstate, text = _sqlstate(exc)
        if sqlstate == "XX000" and not isinstance(exc, Error):
            incident = secrets.token_hex(4)
            log.error("pg session of %r failed with an unexpected %s (incident %s); stack:\n%s", self.user,
                      type(exc).__name__, incident, "".join(traceback.format_tb(exc.__traceback__)))
            text = str(errors.InternalError(
                f"the dpsql server failed unexpectedly (incident {incident}, logged on the server)"))
        first, _, rest = text.partition("\n")
        self._out.append(m.error_response(sqlstate, first, detail=rest.strip("\n") or None))


def _sqlstate(exc: BaseException) -> tuple[str, str]:
    query_failed = getattr(errors, "QueryFailed", None)
    rate_limited = getattr(errors, "RateLimited", None)
    if isinstance(exc, Refusal):
        return exc.sqlstate, str(exc)
    if query_failed is not None and isinstance(exc, query_failed):
        return "XX000", getattr(query_failed, "MESSAGE", "the query was charged but could not be answered.")
    if rate_limited is not None and isinstance(exc, rate_limited):
        return "53000", str(exc)
    table: list[tuple[type[BaseException], str]] = [
        (AuthenticationError, "28P01"),
        (errors.BudgetExceeded, "53400"),
        (errors.PolicyViolation, "42501"),
        (st.SyntaxProblem, "42601"),
        (st.BadParameter, "22P02"),
        (errors.QueryRejected, "0A000"),
        (errors.InternalError, "XX000"),
        (Error, "0A000"),
    ]
    for kind, sqlstate in table:
        if isinstance(exc, kind):
            return sqlstate, str(exc)
    return "XX000", ""


def _parse(sql: str) -> exp.Expr | None:
    for dialect in ("postgres", "duckdb"):  # catalog queries are Postgres SQL
        try:
            tree = sqlglot.parse_one(sql, read=dialect)
        except (ParseError, TokenError, ValueError):
            continue
        if tree is not None:
            return tree
    return None


def _explain_call(tree: exp.Expr | None) -> str | None:
    """The SQL inside ``SELECT dpsql.explain('...')``, or None."""
    if not isinstance(tree, exp.Select) or tree.args.get("from_") or tree.args.get("from") or len(tree.expressions) != 1:
        return None
    node = tree.expressions[0]
    node = node.this if isinstance(node, exp.Alias) else node
    if isinstance(node, exp.Dot) and str(node.this.name if hasattr(node.this, "name") else "").lower() == "dpsql":
        call = node.expression
        if isinstance(call, exp.Anonymous) and call.name.lower() == "explain" and len(call.expressions) == 1 \
                and isinstance(call.expressions[0], exp.Literal) and call.expressions[0].is_string:
            return str(call.expressions[0].name)
    return None


def _public_only(tree: exp.Expr, policy: Any) -> bool:
    """Whether every table ``tree`` reads is a public table of the policy (its answer is
    exact, free and reads no private row)."""
    ctes = {cte.alias_or_name.casefold() for cte in tree.find_all(exp.CTE)}
    tables = [t for t in tree.find_all(exp.Table) if t.name.casefold() not in ctes]
    if not tables:
        return False
    for table in tables:
        entry = policy.table(table.name) if isinstance(table.this, exp.Identifier) else None
        if entry is None or not entry.public:
            return False
    return True


def _table_outcome(table: pa.Table, tag: str | None = None) -> Outcome:
    columns = [table.column(i).to_pylist() for i in range(table.num_columns)]
    values = [list(row) for row in zip(*columns)] if columns else []
    rows = [[m.text_value(v) for v in row] for row in values]
    return Outcome(tag or f"SELECT {table.num_rows}", m.columns_of(table.schema), rows, values=values)


def _with_intervals(result: Result) -> pa.Table:
    """The result with a ``<column>_ci95`` column after each noisy column (as ``res.df(accuracy=True)``)."""
    return with_intervals(result)


def _number(value: str | None) -> float | None:
    return None if value is None else float(value)


def _describe(sql: str, epsilon: float | None, delta: float | None) -> str:
    text = " ".join(sql.split())
    if len(text) > _LOGGED_SQL_CHARS:
        text = text[:_LOGGED_SQL_CHARS] + "..."

    def amount(v: float | None) -> str:
        return "default" if v is None else f"{v:g}"

    return f"sql={text!r} epsilon={amount(epsilon)} delta={amount(delta)}"
