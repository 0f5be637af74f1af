"""One statement as the Postgres front sees it: split, classified, parameters bound.

A Query message may hold several statements (``psql -c "SET ...; SELECT ..."``); they are
split on the semicolons sqlglot's tokenizer finds, so a ``;`` inside a string or a comment
never splits. Each piece is then one of: a session command dpsql answers itself (``SET``,
``SHOW``, ``RESET``, ``BEGIN``/``COMMIT``/``ROLLBACK``, ``DISCARD``, ``DEALLOCATE``), an
``EXPLAIN``, a catalog query (see :mod:`dpsql.pgwire.catalog`), or a query for the private
pipeline.

Parameters (``$1`` ...) of the extended protocol are bound on the sqlglot tree: each
placeholder node is replaced by a literal node (a number only after the text parsed as a
finite number, otherwise a string literal that the generator quotes), and the statement is
generated again from the tree. A parameter's text never becomes SQL syntax.

Per-query options go in a comment hint anywhere in the statement::

    SELECT /* dpsql: epsilon=0.3, delta=1e-7 */ region, COUNT(*) FROM visits GROUP BY region

Example:
    >>> [s.text for s in split("SET dpsql.epsilon = 0.5; SELECT ';' AS x;")]
    ['SET dpsql.epsilon = 0.5', "SELECT ';' AS x"]
    >>> bind("SELECT COUNT(*) FROM visits WHERE city = $1", ["x' OR '1'='1"], [0])
    "SELECT COUNT(*) FROM visits WHERE city = 'x'' OR ''1''=''1'"
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError
from sqlglot import Token, TokenType

from dpsql import params
from dpsql.errors import Error, QueryRejected, first_line
from dpsql.params import bind_tree
from dpsql.pgwire import messages as m

__all__ = ["Hint", "Statement", "bind", "decode_binary", "hint_of", "split"]

DIALECT = "duckdb"
_SESSION_WORDS = {"SET", "SHOW", "RESET", "BEGIN", "START", "COMMIT", "END", "ROLLBACK", "ABORT",
                  "SAVEPOINT", "RELEASE", "DISCARD", "DEALLOCATE", "EXPLAIN"}


class BadParameter(params.BadParameter):
    """A bound parameter that is not a value of its declared type (SQLSTATE 22P02)."""


class SyntaxProblem(QueryRejected):
    """The statement does not tokenize or parse (SQLSTATE 42601)."""


@dataclass(frozen=True)
class Statement:
    """One statement's text and its first word (upper case, '' when empty)."""

    text: str
    keyword: str

    @property
    def is_empty(self) -> bool:
        return not self.keyword


def _tokens(sql: str) -> list[Token]:
    try:
        return list(sqlglot.tokenize(sql, read=DIALECT))
    except (TokenError, ParseError) as exc:
        raise SyntaxProblem(f"the SQL does not tokenize: {first_line(exc)}. Check quotes and comments.") from None


def split(sql: str) -> list[Statement]:
    """Split ``sql`` at top-level semicolons; drop empty statements."""
    tokens = _tokens(sql)
    pieces: list[list[Token]] = [[]]
    for token in tokens:
        if token.token_type == TokenType.SEMICOLON:
            pieces.append([])
        else:
            pieces[-1].append(token)
    statements = []
    for piece in pieces:
        if piece:
            text = sql[piece[0].start:piece[-1].end + 1]
            comments = [c for t in piece for c in t.comments]
            hints = [c for c in comments if c.strip().lower().startswith("dpsql:")]
            if hints:  # keep hint comments that sit before the first token
                text = " ".join(f"/*{h}*/" for h in hints if f"/*{h}*/" not in text) + (" " if hints else "") + text
            statements.append(Statement(text.strip(), _keyword(piece)))
    return statements


def _keyword(tokens: Sequence[Token]) -> str:
    if not tokens:
        return ""
    word = tokens[0].text.upper()
    return word if word in _SESSION_WORDS else tokens[0].token_type.name


def one_statement(sql: str) -> Statement:
    """The single statement of an extended-protocol Parse (several are refused, as Postgres does)."""
    statements = split(sql)
    if len(statements) > 1:
        raise SyntaxProblem("cannot insert multiple commands into a prepared statement; send them one by one.")
    return statements[0] if statements else Statement("", "")


# ---------------------------------------------------------------- hints


@dataclass(frozen=True)
class Hint:
    """Options from a ``/* dpsql: ... */`` comment."""

    epsilon: float | None = None
    delta: float | None = None


_HINT_ITEM = re.compile(r"\s*([A-Za-z_]+)\s*=\s*([^\s,]+)\s*,?")


def hint_of(sql: str) -> Hint:
    """The options of the statement's ``dpsql:`` comment, if it has one."""
    found: dict[str, float] = {}
    for token in _tokens(sql):
        for comment in token.comments:
            text = comment.strip()
            if not text.lower().startswith("dpsql:"):
                continue
            body = text[len("dpsql:"):]
            at = 0
            while at < len(body.rstrip()):
                match = _HINT_ITEM.match(body, at)
                if not match:
                    raise Error(f"cannot read the dpsql hint {text!r}: write /* dpsql: epsilon=0.5, delta=1e-7 */.")
                key, value = match.group(1).lower(), match.group(2)
                if key not in ("epsilon", "delta"):
                    raise Error(f"unknown option {key!r} in the dpsql hint; use epsilon and delta.")
                found[key] = parse_amount(key, value)
                at = match.end()
    return Hint(found.get("epsilon"), found.get("delta"))


def parse_amount(name: str, value: str) -> float:
    """A finite, non-negative number for epsilon or delta."""
    try:
        number = float(value.strip().strip("'\""))
    except ValueError:
        number = math.nan
    if not math.isfinite(number) or number < 0:
        raise Error(f"{name} must be a finite number >= 0, got {value!r}.")
    return number


# ---------------------------------------------------------------- parameters


_INTEGER_TYPES = {m.INT2, m.INT4, m.INT8, m.OID}
_NUMBER_TYPES = {m.FLOAT4, m.FLOAT8, m.NUMERIC}
_TEXT_TYPES = {0, m.TEXT, m.VARCHAR, m.UNKNOWN, 1042, 19}  # 1042 bpchar, 19 name
_CAST_TYPES = {m.DATE: "DATE", m.TIMESTAMP: "TIMESTAMP", m.TIMESTAMPTZ: "TIMESTAMPTZ", m.TIME: "TIME"}
_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")


def parameter_count(sql: str) -> int:
    """The highest ``$n`` in ``sql`` (0 when none)."""
    highest = 0
    tokens = _tokens(sql)
    for i, token in enumerate(tokens):
        digits = ""
        if token.token_type == TokenType.PARAMETER and token.text[1:].isdigit():  # one token: $1
            digits = token.text[1:]
        elif token.token_type == TokenType.PARAMETER and token.text == "$" and i + 1 < len(tokens):
            following = tokens[i + 1]  # sqlglot 30 reads $1 as '$' then the number 1
            if following.token_type == TokenType.NUMBER and following.start == token.end + 1:
                digits = following.text
        if digits.isdigit():
            highest = max(highest, int(digits))
    return highest


def bind(sql: str, values: Sequence[str | None], oids: Sequence[int]) -> str:
    """``sql`` with ``$1``... replaced by literal nodes built from ``values`` (the one binding
    of :func:`dpsql.params.bind_tree`, with Postgres's typed text values)."""
    if not values:
        return sql
    try:
        tree = sqlglot.parse_one(sql, read=DIALECT)
    except (ParseError, TokenError) as exc:
        raise SyntaxProblem(f"the statement does not parse: {first_line(exc)}") from None

    def literal_for(index: int) -> exp.Expression:
        return literal(values[index - 1], oids[index - 1] if index - 1 < len(oids) else 0, index)

    try:
        bound = bind_tree(tree, len(values), literal_for, all_used=False)
    except params.BadParameter as exc:
        raise exc if isinstance(exc, BadParameter) else BadParameter(str(exc)) from None
    return bound.sql(dialect=DIALECT)


def literal(value: str | None, oid: int, index: int) -> exp.Expression:
    """A sqlglot literal for one parameter's text value of type ``oid``."""
    if value is None:
        return exp.Null()
    if oid in _INTEGER_TYPES or oid in _NUMBER_TYPES:
        text = value.strip()
        if not _NUMBER.fullmatch(text) or (oid in _INTEGER_TYPES and not re.fullmatch(r"[+-]?\d+", text)) \
                or not math.isfinite(float(text)):
            raise BadParameter(f"parameter ${index}: {value[:40]!r} is not a finite number of the type declared.")
        number = exp.Literal.number(text.lstrip("+"))
        return exp.Neg(this=exp.Literal.number(text[1:])) if text.startswith("-") else number
    if oid == m.BOOL:
        word = value.strip().lower()
        if word in ("t", "true", "1", "yes", "on", "y"):
            return exp.Boolean(this=True)
        if word in ("f", "false", "0", "no", "off", "n"):
            return exp.Boolean(this=False)
        raise BadParameter(f"parameter ${index}: {value[:40]!r} is not a boolean.")
    if oid in _CAST_TYPES:
        return exp.cast(exp.Literal.string(value), exp.DataType.build(_CAST_TYPES[oid]))
    if oid in _TEXT_TYPES:
        return exp.Literal.string(value)
    raise BadParameter(f"parameter ${index} has type OID {oid}, which dpsql does not bind; send it as text or a number.")


def decode_binary(data: bytes, oid: int, index: int) -> str:
    """A binary-format parameter as the text it stands for (the types psycopg sends in binary)."""
    formats = {m.INT2: "!h", m.INT4: "!i", m.INT8: "!q", m.FLOAT4: "!f", m.FLOAT8: "!d", m.OID: "!I"}
    try:
        if oid in formats:
            return repr(struct.unpack(formats[oid], data)[0])
        if oid == m.BOOL and len(data) == 1:
            return "t" if data != b"\0" else "f"
        if oid in _TEXT_TYPES:
            return data.decode("utf-8")
    except (struct.error, UnicodeDecodeError):
        raise BadParameter(f"parameter ${index}: malformed binary value for type OID {oid}.") from None
    raise BadParameter(f"parameter ${index}: binary format for type OID {oid} is not supported; send it as text.")
