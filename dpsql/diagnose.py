"""Messages that name what the user wrote: syntax errors, size limits, "did you mean".

Every parse of an analyst's SQL goes through :func:`parse_statements`, which

- refuses, before the parser runs, SQL too long or nested too deeply for it (the parser and
  the passes after it recurse, and a bare ``RecursionError`` is not a refusal), and after
  it, a tree deeper than the passes handle (a 1,000-term ``OR``);
- turns sqlglot's parse and tokenizer errors into one :class:`~dpsql.errors.QueryRejected`
  that says what is wrong in the user's words, with the caret under the token at fault,
  with no terminal colour codes and no internal class names.

:func:`did_you_mean` suggests a close name from the names the analyst may use, and only
those: a denied or unlisted name is never suggested, so a typo cannot reveal one.

>>> print(syntax_message("SELECT COUNT(*) FROM visits WHERE age > 3 AND"))
the query is not valid SQL: AND needs a condition after it.
  SELECT COUNT(*) FROM visits WHERE age > 3 AND
                                            ^^^
>>> did_you_mean("agee", ["age", "income", "region"])
" Did you mean 'age'?"
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

import sqlglot
import sqlglot.errors
import sqlglot.expressions as exp
from sqlglot import Token, TokenType
from sqlglot.dialects.dialect import Dialect

from dpsql.errors import QueryRejected

__all__ = [
    "MAX_PAREN_DEPTH",
    "MAX_SQL_LENGTH",
    "MAX_TREE_DEPTH",
    "did_you_mean",
    "edit_distance",
    "parse_statements",
    "quote",
    "source_text",
    "span",
    "syntax_message",
    "underline",
    "with_article",
]

DIALECT = "duckdb"
#: Characters of SQL accepted (an IN list of tens of thousands of values fits).
MAX_SQL_LENGTH = 1_000_000
#: Parentheses open at once (sqlglot's parser recurses about 15 frames per level).
MAX_PAREN_DEPTH = 32
#: Type words of typed literals (``DATE '2024-01-01'``), which a pass may turn into strings.
_TYPED_LITERALS = {"DATE", "TIMESTAMP", "TIME", "TIMESTAMPTZ", "INTERVAL"}
#: Depth of the parsed tree (a chain of 1,000 ORs is 1,000 deep).
MAX_TREE_DEPTH = 120


# ---------------------------------------------------------------- pointing at the SQL


def underline(sql: str, start: int, end: int) -> str:
    """The line of ``sql`` holding offset ``start``, with ``^`` under ``start..end``
    (inclusive; clipped to that line).

    >>> print(underline("SELECT x\\nFROM t WHERE y", 16, 20))
      FROM t WHERE y
             ^^^^^
    """
    start = max(0, min(start, len(sql) - 1)) if sql else 0
    line_start = sql.rfind("\n", 0, start) + 1
    line_end = sql.find("\n", start)
    line = sql[line_start: line_end if line_end != -1 else len(sql)]
    width = max(1, min(end, line_start + len(line) - 1) - start + 1)
    return f"  {line}\n  {' ' * (start - line_start)}{'^' * width}"


def span(sql: str, node: exp.Expr) -> tuple[int, int] | None:
    """Where the user wrote ``node`` in ``sql``: (first, last) offsets, inclusive, or
    ``None`` when unknown. A call includes its name and closing parenthesis, a typed
    literal its type word (sqlglot records neither)."""
    spans = [(n.meta["start"], n.meta["end"]) for n in node.walk() if "start" in n.meta]
    if not spans:
        return None
    start, end = min(s for s, _ in spans), max(e for _, e in spans)
    if isinstance(node, exp.Func):
        call = re.search(r"([A-Za-z_][A-Za-z_0-9]*)\s*\(\s*$", sql[:start])
        if call is not None and not sql[start:end + 1].lstrip().upper().startswith(call.group(1).upper()):
            start = call.start(1)
        depth = 0
        for i in range(start, len(sql)):  # the closing parenthesis
            if sql[i] == "(":
                depth += 1
            elif sql[i] == ")":
                depth -= 1
                if depth == 0:
                    end = max(end, i)
                    break
    if isinstance(node, (exp.Cast, exp.Literal)) and start > 0:  # a typed literal: DATE '2024-01-01'
        word = re.search(r"([A-Za-z_]+)\s*$", sql[:start])
        typed = node.to.sql(dialect=DIALECT).upper() if isinstance(node, exp.Cast) else None
        if word and (word.group(1).upper() == typed or (
                typed is None and node.is_string and word.group(1).upper() in _TYPED_LITERALS)):
            start = word.start(1)
    return start, end


def source_text(sql: str, node: exp.Expr) -> str | None:
    """What the user wrote for ``node``: its span in ``sql`` (``None`` when unknown).

    >>> tree = sqlglot.parse_one("SELECT COUNT(1) FROM t", read="duckdb")
    >>> source_text("SELECT COUNT(1) FROM t", tree.expressions[0])
    'COUNT(1)'
    """
    where = span(sql, node)
    return None if where is None else sql[where[0]: where[1] + 1]


def quote(sql: str, node: exp.Expr, limit: int = 60) -> str:
    """What the user wrote for ``node``, shortened to ``limit`` characters, for a message
    (the generated SQL when its position is unknown).

    >>> tree = sqlglot.parse_one("SELECT COUNT(*) FROM t WHERE TRY_CAST(x AS INT) > 1", read="duckdb")
    >>> quote("SELECT COUNT(*) FROM t WHERE TRY_CAST(x AS INT) > 1", tree.find(exp.TryCast))
    'TRY_CAST(x AS INT)'
    """
    text = source_text(sql, node) or node.sql(dialect=DIALECT)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ---------------------------------------------------------------- did you mean


def edit_distance(a: str, b: str) -> int:
    """Optimal-string-alignment distance (insertions, deletions, substitutions and swaps of
    neighbours each cost 1), case-insensitive.

    >>> edit_distance("agee", "age"), edit_distance("regoin", "region"), edit_distance("a", "xyz")
    (1, 1, 3)
    """
    a, b = a.casefold(), b.casefold()
    previous2: list[int] = []
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i] + [0] * len(b)
        for j, cb in enumerate(b, 1):
            current[j] = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb))
            if i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                current[j] = min(current[j], previous2[j - 2] + 1)
        previous2, previous = previous, current
    return previous[-1]


def with_article(noun: str) -> str:
    """``noun`` with its indefinite article (``with_article("INTEGER")`` is ``"an INTEGER"``)."""
    return f"{'an' if noun[:1].upper() in 'AEIOU' else 'a'} {noun}"


def did_you_mean(name: str, allowed: Iterable[str]) -> str:
    """``" Did you mean 'x'?"`` for the allowed name(s) closest to ``name``, or ``""``.

    Only ``allowed`` is searched: pass the names the analyst may use, never a denied one.
    Close means an edit distance of at most 1 for names of up to 4 characters, 2 up to 8,
    3 beyond; a name differing only in case is always close.

    >>> did_you_mean("visit", ["visits", "regions"]), did_you_mean("zzz", ["visits"])
    (" Did you mean 'visits'?", '')
    """
    limit = 1 if len(name) <= 4 else 2 if len(name) <= 8 else 3
    scored = sorted((edit_distance(name, a), a) for a in set(allowed) if a != name)
    best = [a for d, a in scored if d <= limit and d == scored[0][0]] if scored else []
    if not best:
        return ""
    if len(best) == 1:
        return f" Did you mean '{best[0]}'?"
    return " Did you mean " + ", ".join(f"'{a}'" for a in best[:-1]) + f" or '{best[-1]}'?"


# ---------------------------------------------------------------- parsing


def parse_statements(sql: str, read: str = DIALECT) -> list[exp.Expr]:
    """Parse ``sql`` (in dialect ``read``, DuckDB's by default) within the size limits, or
    raise a clear :class:`QueryRejected`.

    >>> len(parse_statements("SELECT COUNT(*) FROM t"))
    1
    >>> parse_statements("SELECT COUNT(*) FROM t WHERE " + "(" * 50 + "x > 1" + ")" * 50)
    Traceback (most recent call last):
    ...
    dpsql.errors.QueryRejected: the query nests parentheses 50 deep; at most 32 are allowed. Simplify the expression.
      SELECT COUNT(*) FROM t WHERE ((((((((((((((((((((((((((((((((((((((((((((((((((x > 1))))))))))))))))))))))))))))))))))))))))))))))))))
                                                                   ^
    """
    if len(sql) > MAX_SQL_LENGTH:
        raise QueryRejected(
            f"the query is {len(sql):,} characters long; at most {MAX_SQL_LENGTH:,} are accepted. "
            "Split it into several queries."
        )
    tokens = _tokens(sql, read)
    _check_parentheses(sql, tokens)
    try:  # the tokens read once: the parser does not change them (tokenizing again was 65 us)
        statements = [s for s in Dialect.get_or_raise(read).parser().parse(tokens, sql) if s is not None]
    except sqlglot.errors.ParseError as exc:
        raise QueryRejected(_parse_error_message(sql, tokens, exc)) from None
    except sqlglot.errors.SqlglotError as exc:
        first = str(exc).splitlines()[0] if str(exc) else "cannot be read"
        raise QueryRejected(f"the query is not valid SQL: {_no_class_names(first)}.") from None
    except RecursionError:
        raise QueryRejected(
            "the query nests too deeply for dpsql to read (long chains of NOT, unary minus or "
            "nested CASE); simplify it."
        ) from None
    for statement in statements:
        _check_depth(sql, statement)
    return statements


def syntax_message(sql: str) -> str:
    """The message :func:`parse_statements` refuses ``sql`` with (``""`` when it parses)."""
    try:
        parse_statements(sql)
    except QueryRejected as exc:
        return str(exc)
    return ""


def _tokens(sql: str, read: str = DIALECT) -> list[Token]:
    try:
        return list(sqlglot.tokenize(sql, read=read))
    except sqlglot.errors.SqlglotError:
        raise QueryRejected(_token_error_message(sql)) from None


def _token_error_message(sql: str) -> str:
    """Find the quote or comment left open, by a scan that knows SQL's quoting."""
    i, n = 0, len(sql)
    while i < n:
        c = sql[i]
        if sql.startswith("--", i):
            end = sql.find("\n", i)
            i = n if end == -1 else end + 1
            continue
        if sql.startswith("/*", i):
            end = sql.find("*/", i + 2)
            if end == -1:
                return "the query is not valid SQL: a /* comment is never closed (add */).\n" + underline(sql, i, i + 1)
            i = end + 2
            continue
        if c in "'\"":
            j = i + 1
            while j < n:
                if sql[j] == c and sql.startswith(c * 2, j):
                    j += 2
                    continue
                if sql[j] == c:
                    break
                j += 1
            if j >= n:
                what = "string" if c == "'" else "quoted name"
                return (f"the query is not valid SQL: the {what} starting here is never closed "
                        f"(add a closing {c}; write {c}{c} for a {c} inside it).\n" + underline(sql, i, i))
            i = j + 1
            continue
        i += 1
    return "the query is not valid SQL: it cannot be split into words (check quotes and comments)."


def _check_parentheses(sql: str, tokens: Sequence[Token]) -> None:
    depth, opened = 0, []
    for token in tokens:
        if token.token_type == TokenType.L_PAREN:
            opened.append(token)
            depth += 1
            if depth > MAX_PAREN_DEPTH:
                deepest = _deepest(tokens)
                raise QueryRejected(
                    f"the query nests parentheses {deepest} deep; at most {MAX_PAREN_DEPTH} are allowed. "
                    "Simplify the expression.\n" + underline(sql, token.start, token.end)
                )
        elif token.token_type == TokenType.R_PAREN:
            if not opened:
                raise QueryRejected("the query is not valid SQL: this ')' closes no '('.\n"
                                    + underline(sql, token.start, token.end))
            opened.pop()
            depth -= 1
    if opened:
        token = opened[-1]
        raise QueryRejected("the query is not valid SQL: this '(' is never closed (add a ')').\n"
                            + underline(sql, token.start, token.end))


def _deepest(tokens: Sequence[Token]) -> int:
    depth = deepest = 0
    for token in tokens:
        depth += token.token_type == TokenType.L_PAREN
        depth -= token.token_type == TokenType.R_PAREN
        deepest = max(deepest, depth)
    return deepest


def _check_depth(sql: str, tree: exp.Expr) -> None:
    """Refuse a tree deeper than :data:`MAX_TREE_DEPTH` (measured without recursion)."""
    stack: list[tuple[exp.Expr, int]] = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_TREE_DEPTH:
            raise QueryRejected(_too_deep(node))
        for child in node.iter_expressions():
            stack.append((child, depth + 1))


def _too_deep(node: exp.Expr) -> str:
    """Name the chain that makes the tree deep: the operator most of the node's ancestors are."""
    kinds: dict[str, list[exp.Expr]] = {}
    ancestor = node.parent
    while ancestor is not None:
        kinds.setdefault(type(ancestor).__name__, []).append(ancestor)
        ancestor = ancestor.parent
    kind, chain = max(kinds.items(), key=lambda item: len(item[1]))
    word = _WORDS.get(kind, "nested expression")
    hint = {"Or": " Write a long OR of equalities as IN (...), or split the query.",
            "And": " Split the conditions over several queries, or use IN / BETWEEN."}.get(kind, " Simplify it.")
    terms = 1
    current: exp.Expr | None = chain[-1]
    while current is not None and type(current).__name__ == kind:  # down the chain, iteratively
        terms += 1
        current = next((c for c in current.iter_expressions() if type(c).__name__ == kind), None)
    return (f"the query nests expressions more than {MAX_TREE_DEPTH} levels deep (a chain of {terms} "
            f"terms joined by {word}); dpsql reads at most {MAX_TREE_DEPTH}.{hint}")


# ---------------------------------------------------------------- parse errors, in words

#: sqlglot node names as the user writes them.
_WORDS = {
    "Add": "+", "Sub": "-", "Mul": "*", "Div": "/", "Mod": "%", "DPipe": "||", "Neg": "-",
    "And": "AND", "Or": "OR", "Not": "NOT", "EQ": "=", "NEQ": "<>", "GT": ">", "GTE": ">=",
    "LT": "<", "LTE": "<=", "Is": "IS", "Like": "LIKE", "ILike": "ILIKE", "In": "IN",
    "Between": "BETWEEN", "Where": "WHERE", "Having": "HAVING", "Limit": "LIMIT",
    "Offset": "OFFSET", "Group": "GROUP BY", "Order": "ORDER BY", "Ordered": "ORDER BY",
    "Alias": "AS", "Case": "CASE", "If": "WHEN", "Cast": "CAST", "Select": "SELECT", "From": "FROM",
    "Join": "JOIN", "Distinct": "DISTINCT", "Paren": "(",
}
_CONDITIONS = {"And", "Or", "Not", "Where", "Having", "If"}
_REQUIRED = re.compile(r"Required keyword: '(\w+)' missing for <class '[\w.]*?(\w+)'>")
_STATEMENT_WORDS = {"SELECT", "WITH", "FROM", "VALUES", "TABLE", "EXPLAIN", "SHOW", "DESCRIBE", "SET",
                    "INSERT", "UPDATE", "DELETE", "CREATE", "DROP", "ALTER", "COPY", "ATTACH", "PRAGMA",
                    "(", "CALL", "USE", "SUMMARIZE", "PIVOT", "UNPIVOT", "DETACH", "EXPORT", "IMPORT",
                    "INSTALL", "LOAD", "CHECKPOINT", "BEGIN", "COMMIT", "ROLLBACK", "VACUUM"}


def _error_token(tokens: Sequence[Token], line: int, col: int) -> int | None:
    """Index of the token sqlglot's (line, col) points at (its last character)."""
    for i, token in enumerate(tokens):
        if token.line == line and token.col == col:
            return i
    for i, token in enumerate(tokens):  # a column inside the token
        if token.line == line and token.col - len(token.text) < col <= token.col:
            return i
    return None


def _parse_error_message(sql: str, tokens: Sequence[Token], exc: sqlglot.errors.ParseError) -> str:
    if tokens and tokens[0].text.upper() not in _STATEMENT_WORDS and tokens[0].token_type != TokenType.L_PAREN:
        first = tokens[0]
        suggestion = did_you_mean(first.text.upper(), ["SELECT", "WITH"])
        return (f"the query is not valid SQL: it must start with SELECT, not {first.text!r}.{suggestion}\n"
                + underline(sql, first.start, first.end))
    detail = exc.errors[0] if exc.errors else {}
    description = str(detail.get("description", "")).strip()
    index = _error_token(tokens, int(detail.get("line") or 0), int(detail.get("col") or 0))
    token = tokens[index] if index is not None else None
    what = _describe(description, tokens, index)
    where = underline(sql, token.start, token.end) if token is not None else ""
    if index is not None and what.startswith("a comma") and index >= 1:
        previous = tokens[index - 1]
        where = underline(sql, previous.start, previous.end)
    return f"the query is not valid SQL: {what}" + (f"\n{where}" if where else "")


def _describe(description: str, tokens: Sequence[Token], index: int | None) -> str:
    token = tokens[index] if index is not None else None
    required = _REQUIRED.search(description)
    if required:
        node = required.group(2)
        word = _WORDS.get(node, token.text.upper() if token is not None else "an expression")
        needs = "a condition" if node in _CONDITIONS else "a value"
        if node == "Between":
            return "BETWEEN needs both ends: x BETWEEN low AND high."
        return f"{word} needs {needs} after it."
    if description.startswith("Expecting )") and token is not None:
        return f"expected ')' before {token.text!r}."
    if description.startswith("Expecting") and token is not None:
        return f"{_no_class_names(description).lower()} near {token.text!r}."
    if token is not None:
        if (token.token_type == TokenType.L_PAREN and index is not None and index >= 2
                and tokens[index - 1].token_type == TokenType.VAR
                and tokens[index - 2].token_type in (TokenType.VAR, TokenType.IDENTIFIER, TokenType.R_PAREN)):
            return f"a comma is missing before {tokens[index - 1].text!r}?"
        return f"unexpected {token.text!r} here."
    return _no_class_names(description) + "."


def _no_class_names(text: str) -> str:
    """sqlglot's wording without Python class names."""
    text = _REQUIRED.sub(lambda m: f"{_WORDS.get(m.group(2), 'an expression')} is incomplete", text)
    return re.sub(r"<class '[\w.]*?(\w+)'>", lambda m: _WORDS.get(m.group(1), "an expression"), text).rstrip(".")
