"""The Postgres wire protocol front: psql, psycopg, SQLAlchemy and BI tools talk to dpsql.

``dpsql serve ... --pg-port PORT`` runs :class:`~dpsql.pgwire.listener.PgServer` next to
the Arrow Flight server, over the same :class:`dpsql.server.Service` (one hardened engine,
one ledger, one Connection per analyst) and the same auth file: user = analyst name,
password = the analyst's token.

Why our own protocol code. We looked for a maintained library first (measured on this
machine, Python 3.11, PyPI only):

- riffq 0.1.11 (Rust, pyo3): no wheel for CPython 3.11 on x86-64 Linux on PyPI, and its
  source build fetches a git dependency from GitHub, so it cannot install in CI.
- buenavista 0.5.0: MD5 authentication only (needs the plain password on the server; we
  keep only scrypt hashes), no TLS, reads a client's announced message length without a
  cap (one packet can make it allocate gigabytes), sends exception text to the client,
  and pulls in FastAPI and pydantic.
- iris-pgwire 1.7.3: built for InterSystems IRIS (its driver, OpenTelemetry, psycopg2 ...).
- postgres-wire 1.0.2: needs Python 3.13.

None has SCRAM-SHA-256 against a stored verifier together with bounded reads, so the v3
subset dpsql needs is here, threaded like the Flight server (a query blocks on the engine
anyway), in small modules: :mod:`~dpsql.pgwire.messages` (framing, bounded reads,
type OIDs), :mod:`~dpsql.pgwire.scram` (SCRAM-SHA-256 with hashlib/hmac and the verifier
file), :mod:`~dpsql.pgwire.statements` (splitting, hints, parameter binding on the sqlglot
tree), :mod:`~dpsql.pgwire.catalog` (pg_catalog from the policy), :mod:`~dpsql.pgwire.session`
(the connection), :mod:`~dpsql.pgwire.answer` (one statement), :mod:`~dpsql.pgwire.describe`
(a statement's columns and parameter types before it runs) and :mod:`~dpsql.pgwire.listener`.

Authentication. Without TLS the server asks for SCRAM-SHA-256, checked against the
verifier ``dpsql token create`` writes beside the auth file (``<auth>.scram``; see
:mod:`dpsql.pgwire.scram`); the token never crosses the wire. With ``--tls-cert/--tls-key``
every connection must use TLS and sends the token as a password inside it, checked by
:class:`dpsql.auth.TokenVerifier` like a Flight bearer token. A wrong, revoked or unknown
credential fails with SQLSTATE 28P01 after at least :data:`~dpsql.pgwire.listener.AUTH_FLOOR_SECONDS`.

SQL. Queries are read as Postgres SQL (sqlglot's ``postgres`` reader, as
``conn.execute(sql, dialect="postgres")`` reads them), then checked like any query.

Prepared statements. Describe of a statement or a portal answers from the plan (nothing
charged, no private row read, planning time only; :mod:`~dpsql.pgwire.describe`), so drivers
that prepare server-side get the result columns and the parameter types before they bind
(tested with asyncpg and psycopg 3 with ``prepare=True``: ``tests/test_pgwire_clients.py``);
results go in text or binary format, as Bind asks.

What is not Postgres. ``BEGIN``/``COMMIT``/``ROLLBACK`` are accepted and do nothing (a
query is charged when it runs; a rollback refunds nothing); a query runs when its portal is
first executed; a parameter nobody typed is typed from the column it is compared with (else
``text``); cancel requests are ignored (a charged query always finishes).
"""

from dpsql.pgwire.listener import PgServer

__all__ = ["PgServer"]
