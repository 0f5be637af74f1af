"""The catalog clients ask about, answered from the policy and never from the data.

psql's ``\\dt`` and ``\\d visits``, SQLAlchemy's and a BI tool's connection checks query
``pg_catalog`` and ``information_schema``. dpsql answers them from a private in-memory
DuckDB that holds one *empty* table per policy table, with the columns the policy lets an
analyst use (denied columns are left out), typed from the policy: a column with numeric
bounds or numeric public values is numeric, every other column is text. DuckDB's own
Postgres-compatible catalog views then describe those tables. The data file is never
attached to this instance, so a catalog query cannot read a row however it is written.

The instance is hardened like the engine (no external access, one thread, a memory cap, a
locked configuration), only ``SELECT``s over catalog relations are sent to it, and each
query is interrupted after :data:`TIMEOUT_SECONDS`.

A few Postgres idioms DuckDB lacks are rewritten on the sqlglot tree first (``OPERATOR(
pg_catalog.~)``, ``COLLATE pg_catalog.default``, ``pg_catalog.f(...)``, ``'name'::regclass``)
and a few functions are supplied as macros (``pg_get_userbyid``, ``to_regtype`` ...).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

import duckdb
import pyarrow as pa
import sqlglot
from sqlglot import exp

from dpsql.version import __version__
from dpsql.errors import Error, QueryRejected, first_line
from dpsql.hardened import lock, open_private
from dpsql.policy import ColumnPolicy, Policy

__all__ = ["CATALOG_SCHEMAS", "Catalog", "SERVER_VERSION", "is_catalog_relation"]

SERVER_VERSION = "15.0"
VERSION_TEXT = f"PostgreSQL {SERVER_VERSION} (dpsql {__version__}, differentially private; answers are noisy)"
DATABASE = "dpsql"
SCHEMA = "public"
TIMEOUT_SECONDS = 2.0
MAX_ROWS = 10_000
CATALOG_SCHEMAS = frozenset({"pg_catalog", "information_schema"})

_MACROS = [
    "CREATE MACRO pg_get_userbyid(id) AS 'dpsql'",
    "CREATE MACRO to_regtype(name) AS (SELECT min(oid) FROM pg_catalog.pg_type WHERE typname = name)",
    "CREATE MACRO to_regclass(name) AS (SELECT min(oid) FROM pg_catalog.pg_class WHERE relname = name)",
    "CREATE MACRO pg_get_expr(node, relation, pretty := true) AS NULL",
    "CREATE MACRO obj_description(id, kind) AS NULL",
    "CREATE MACRO col_description(id, column_number) AS NULL",
    "CREATE MACRO shobj_description(id, kind) AS NULL",
    "CREATE MACRO pg_encoding_to_char(code) AS 'UTF8'",
    "CREATE MACRO pg_get_indexdef(id) AS NULL",
    "CREATE MACRO pg_get_constraintdef(id, pretty := true) AS NULL",
    "CREATE MACRO pg_get_partkeydef(id) AS NULL",
    "CREATE MACRO pg_tablespace_location(id) AS NULL",
    "CREATE MACRO pg_relation_size(id) AS 0",
    "CREATE MACRO pg_total_relation_size(id) AS 0",
    "CREATE MACRO pg_table_size(id) AS 0",
    "CREATE MACRO current_user() AS 'dpsql'",
    "CREATE MACRO session_user() AS 'dpsql'",
    "CREATE MACRO pg_backend_pid() AS 0",
    "CREATE MACRO pg_postmaster_start_time() AS TIMESTAMP '2000-01-01'",
    "CREATE MACRO inet_server_addr() AS NULL",
    "CREATE MACRO inet_server_port() AS NULL",
    "CREATE MACRO pg_is_in_recovery() AS false",
    "CREATE MACRO txid_current() AS 1",
    "CREATE MACRO pg_get_statisticsobjdef_columns(id) AS NULL",
    "CREATE MACRO array_upper(items, dimension) AS len(items)",
    "CREATE MACRO pg_collation_is_visible(id) AS true",
    "CREATE MACRO dpsql_format_type(wanted_type, wanted_mod) AS CASE pg_catalog.format_type(wanted_type, wanted_mod) "
    "WHEN 'int8' THEN 'bigint' WHEN 'int4' THEN 'integer' WHEN 'int2' THEN 'smallint' "
    "WHEN 'float8' THEN 'double precision' WHEN 'float4' THEN 'real' WHEN 'varchar' THEN 'text' "
    "WHEN 'bool' THEN 'boolean' ELSE pg_catalog.format_type(wanted_type, wanted_mod) END",
    "CREATE MACRO pg_type_is_visible(id) AS true",
    "CREATE MACRO array_lower(items, dimension) AS 1",
    "CREATE MACRO pg_relation_is_publishable(id) AS false",
    "CREATE MACRO pg_get_triggerdef(id, pretty := true) AS NULL",
    "CREATE MACRO pg_get_ruledef(id, pretty := true) AS NULL",
    "CREATE MACRO pg_get_partition_constraintdef(id) AS NULL",
    "CREATE MACRO pg_get_serial_sequence(tab, col) AS NULL",
    "CREATE MACRO pg_get_function_result(id) AS NULL",
    "CREATE MACRO pg_get_function_arguments(id) AS NULL",
]


class Catalog:
    """An empty DuckDB that mirrors the policy's tables, for catalog queries only."""

    def __init__(self, policy: Policy) -> None:
        self._lock = threading.Lock()
        self._con = open_private(threads=1, memory_limit="256MB")
        con = self._con
        con.execute(f'ATTACH \':memory:\' AS "{DATABASE}"')
        con.execute(f'USE "{DATABASE}"')
        con.execute(f'CREATE SCHEMA "{SCHEMA}"')
        con.execute(f'USE "{DATABASE}"."{SCHEMA}"')
        for statement in _MACROS:
            con.execute(statement)
        for table in policy.tables.values():
            columns = [c for c in table.columns.values() if c.access != "deny"]
            if table.privacy_unit and table.privacy_unit.casefold() not in table.columns:
                columns.insert(0, ColumnPolicy(table.privacy_unit, "filter"))
            body = ", ".join(f"{_quote(c.name)} {_type_of(c)}" for c in columns) or '"_" VARCHAR'
            con.execute(f"CREATE TABLE {_quote(table.name)} ({body})")
        lock(con)
        self.tables = frozenset(policy.tables)

    def answer(self, statement: exp.Expression) -> pa.Table:
        """Run a catalog SELECT (already checked by :func:`is_catalog_query`)."""
        sql = rewrite_for_duckdb(statement.copy()).sql(dialect="duckdb")
        with self._lock:
            timer = threading.Timer(TIMEOUT_SECONDS, self._con.interrupt)
            timer.start()
            try:
                table = self._con.sql(sql).to_arrow_table()
            except duckdb.InterruptException:
                raise QueryRejected(f"the catalog query took longer than {TIMEOUT_SECONDS:g} s and was stopped.") from None
            except duckdb.Error as exc:
                first = first_line(exc)
                raise Error(f"dpsql cannot answer this catalog query ({first}).") from None
            finally:
                timer.cancel()
        if table.num_rows > MAX_ROWS:
            raise QueryRejected(f"the catalog query returned more than {MAX_ROWS:,} rows; narrow it.")
        return table

    def close(self) -> None:
        with self._lock:
            self._con.close()


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _type_of(column: ColumnPolicy) -> str:
    values: Iterable[object] = column.bounds or column.public_values or ()
    values = list(values)
    if values and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return "BIGINT"
    if values and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return "DOUBLE"
    return "VARCHAR"


# ---------------------------------------------------------------- what goes to the catalog


def is_catalog_relation(table: exp.Table) -> bool:
    """Whether ``table`` names a pg_catalog / information_schema relation."""
    schema = table.db.casefold()
    name = table.name.casefold()
    if schema in CATALOG_SCHEMAS:
        return True
    return not schema and name.startswith("pg_")


def is_catalog_query(statement: exp.Expr, policy_tables: Iterable[str]) -> bool:
    """A SELECT whose relations are all catalog relations (or none, as in ``SELECT 1``)."""
    if not isinstance(statement, (exp.Select, exp.Union, exp.Intersect, exp.Except)):
        return False
    ctes = {cte.alias_or_name.casefold() for cte in statement.find_all(exp.CTE)}
    policy = {name.casefold() for name in policy_tables}
    for table in statement.find_all(exp.Table):
        if not isinstance(table.this, exp.Identifier):
            if _function_name(table.this) in _TABLE_FUNCTIONS:
                continue
            return False  # any other table function: read_csv(...), range(...)
        name = table.name.casefold()
        if name in policy:
            return False
        if name in ctes and not table.db:
            continue
        if not is_catalog_relation(table):
            return False
    return True


_TABLE_FUNCTIONS = {"generate_series", "exploding_generate_series", "unnest"}  # psql's \\d uses them; bounded by the timeout


# ---------------------------------------------------------------- Postgres idioms -> DuckDB


_OID_TYPES = {"regclass", "regtype", "regproc", "regprocedure", "regnamespace", "regrole", "oid", "regoper"}


def rewrite_for_duckdb(tree: exp.Expr) -> exp.Expr:
    """Rewrite Postgres-only syntax the catalog queries use into what DuckDB runs."""
    for _ in range(3):  # a replaced node's children are not revisited in the same pass
        tree = tree.transform(_rewrite_node)
    return tree


def _rewrite_node(node: exp.Expr) -> exp.Expr:
    if isinstance(node, exp.Collate):
        collated: exp.Expr = node.this
        return collated
    if isinstance(node, exp.Operator):
        op = str(node.args.get("operator", "")).rsplit(".", 1)[-1].strip()
        pairs = {"~": exp.RegexpLike, "=": exp.EQ, "<>": exp.NEQ, "<": exp.LT, ">": exp.GT,
                 "<=": exp.LTE, ">=": exp.GTE, "~~": exp.Like}
        if op in pairs:
            return pairs[op](this=node.this, expression=node.expression)
        if op == "!~":
            return exp.not_(exp.RegexpLike(this=node.this, expression=node.expression))
        return node
    if isinstance(node, exp.Dot) and isinstance(node.this, exp.Identifier) and node.this.name.casefold() == "pg_catalog" \
            and isinstance(node.expression, exp.Func):
        return _rewrite_node(node.expression)
    if isinstance(node, exp.CurrentVersion) or (isinstance(node, exp.Anonymous) and _function_name(node) == "version"):
        return exp.Literal.string(VERSION_TEXT)
    if isinstance(node, exp.Anonymous) and _function_name(node) == "format_type":
        node.set("this", "dpsql_format_type")  # Postgres's type names, not DuckDB's
        return node
    if isinstance(node, exp.Anonymous) and _function_name(node) in ("json_build_object", "jsonb_build_object"):
        return exp.Null()  # only for identity columns and collations, which the mirror has none of
    if isinstance(node, exp.Cast):
        return _rewrite_cast(node)
    if isinstance(node, exp.Column) and node.args.get("db") is not None:
        node.set("db", None)  # pg_catalog.pg_class.relname -> pg_class.relname
        node.set("catalog", None)
        return node
    if isinstance(node, exp.DataType) and isinstance(node.args.get("kind"), exp.Dot):
        name = node.args["kind"].name.casefold()  # pg_catalog.int2 -> int2
        if name not in _OID_TYPES:
            return exp.DataType.build({"name": "text", "char": "text"}.get(name, name), dialect="postgres")
    if isinstance(node, exp.Table) and not isinstance(node.this, exp.Identifier) and node.args.get("db"):
        node.set("db", None)  # pg_catalog.generate_series(...)
        return node
    if isinstance(node, exp.Table) and node.name.casefold() in _EMPTY_RELATIONS \
            and node.db.casefold() in ("pg_catalog", ""):
        return _empty_relation(node)
    if isinstance(node, exp.Table) and node.name.casefold() in _EXTRA_COLUMNS and not node.catalog \
            and node.db.casefold() in ("pg_catalog", ""):
        return _extended_relation(node)
    return node


_EMPTY_RELATIONS = {
    "pg_am": "oid BIGINT, amname VARCHAR, amhandler BIGINT, amtype VARCHAR",
    "pg_attrdef": "oid BIGINT, adrelid BIGINT, adnum INTEGER, adbin VARCHAR",
    "pg_collation": "oid BIGINT, collname VARCHAR, collnamespace BIGINT",
    "pg_inherits": "inhrelid BIGINT, inhparent BIGINT, inhseqno INTEGER, inhdetachpending BOOLEAN",
    "pg_policy": "oid BIGINT, polname VARCHAR, polrelid BIGINT, polcmd VARCHAR, polpermissive BOOLEAN, "
                 "polroles BIGINT[], polqual VARCHAR, polwithcheck VARCHAR",
    "pg_statistic_ext": "oid BIGINT, stxrelid BIGINT, stxname VARCHAR, stxnamespace BIGINT, stxkeys INTEGER[], "
                        "stxkind VARCHAR[], stxstattarget INTEGER",
    "pg_publication": "oid BIGINT, pubname VARCHAR, puballtables BOOLEAN, pubviaroot BOOLEAN",
    "pg_publication_rel": "oid BIGINT, prpubid BIGINT, prrelid BIGINT, prqual VARCHAR, prattrs INTEGER[]",
    "pg_publication_namespace": "oid BIGINT, pnpubid BIGINT, pnnspid BIGINT",
    "pg_trigger": "oid BIGINT, tgrelid BIGINT, tgname VARCHAR, tgisinternal BOOLEAN, tgenabled VARCHAR, "
                  "tgparentid BIGINT",
    "pg_rewrite": "oid BIGINT, ev_class BIGINT, rulename VARCHAR",
    "pg_foreign_table": "ftrelid BIGINT, ftserver BIGINT, ftoptions VARCHAR[]",
    "pg_partitioned_table": "partrelid BIGINT, partstrat VARCHAR",
    "pg_roles": "oid BIGINT, rolname VARCHAR, rolsuper BOOLEAN, rolinherit BOOLEAN, rolcreaterole BOOLEAN, "
                "rolcreatedb BOOLEAN, rolcanlogin BOOLEAN, rolconnlimit INTEGER, rolvaliduntil TIMESTAMP",
    "pg_user": "usename VARCHAR, usesysid BIGINT, usecreatedb BOOLEAN, usesuper BOOLEAN",
    "pg_extension": "oid BIGINT, extname VARCHAR, extversion VARCHAR, extnamespace BIGINT",
    "pg_matviews": "schemaname VARCHAR, matviewname VARCHAR, definition VARCHAR",
}


_EXTRA_COLUMNS = {  # columns Postgres has and DuckDB's catalog views lack
    "pg_class": "false AS relforcerowsecurity",
    "pg_database": "6 AS encoding, 'C' AS datcollate, 'C' AS datctype, 10 AS datdba, 0 AS dattablespace, "
                   "-1 AS datconnlimit, NULL::VARCHAR[] AS datacl",
    "pg_attribute": "NULL::VARCHAR AS attcollation_name",
}


def _extended_relation(table: exp.Table) -> exp.Expr:
    name = table.name.casefold()
    alias = table.alias or table.name
    return sqlglot.parse_one(
        f"(SELECT *, {_EXTRA_COLUMNS[name]} FROM system.pg_catalog.{name}) AS {_quote(alias)}", read="duckdb")


def _empty_relation(table: exp.Table) -> exp.Expr:
    """A catalog relation DuckDB lacks, as an empty inline relation with Postgres's columns."""
    columns = _EMPTY_RELATIONS[table.name.casefold()]
    select = ", ".join(f"CAST(NULL AS {kind}) AS {name}" for name, kind in
                       (part.strip().split(" ", 1) for part in columns.split(", ")))
    alias = table.alias or table.name
    return sqlglot.parse_one(f"(SELECT {select} WHERE false) AS {_quote(alias)}", read="duckdb")


def _function_name(node: exp.Expr) -> str:
    if isinstance(node, exp.Anonymous):
        return str(node.name).casefold()
    return node.sql_name().casefold() if isinstance(node, exp.Func) else ""


def _rewrite_cast(node: exp.Cast) -> exp.Expr:
    target = node.to
    kind = target.args.get("kind") if isinstance(target, exp.DataType) else None
    name = (kind.name if isinstance(kind, exp.Dot) else target.name if target else "").casefold()
    if not name and isinstance(target, exp.DataType) and target.this == exp.DataType.Type.USERDEFINED:
        name = str(kind).casefold()
    if isinstance(target, exp.ObjectIdentifier):
        name = target.name.casefold()
    if name == "regclass" and isinstance(node.this, exp.Literal) and node.this.is_string:
        relation = node.this.name.split(".")[-1].strip('"')
        return sqlglot.parse_one(
            f"(SELECT min(oid) FROM pg_catalog.pg_class WHERE relname = {exp.Literal.string(relation).sql()})",
            read="duckdb",
        )
    if name in _OID_TYPES:
        return exp.cast(node.this, exp.DataType.build("BIGINT"))
    if isinstance(kind, exp.Dot) and name in ("text", "name", "char", "int2", "int4", "int8", "bool", "oid"):
        mapped = {"name": "text", "char": "text", "oid": "bigint"}.get(name, name)
        return exp.cast(node.this, exp.DataType.build(mapped, dialect="postgres"))
    return node
