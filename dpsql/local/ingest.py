"""Ingestion through the server: check every report against the policy, shuffle, store.

``dpsql serve --reports FILE --report-auth FILE`` takes reports from reporting clients (the
``report`` Flight action, body in :mod:`dpsql.local.codec`) and hands them to one
:class:`Collector`. A report is accepted only if it could have come out of the policy's
mechanism (:func:`check_reports`), because the server cannot see whether a client
perturbed its values, only whether what it sent is a possible output:

- the table is in the policy with ``model = "local"``; the request reports every column of
  it exactly once, with the same number of records in each (a record's missing column
  would be visible, and ``COUNT(*)`` counts records);
- each bundle's ``params`` equals what the policy's mechanism for that column produces
  (:func:`dpsql.local.reporter.mechanisms_for`): same bounds, epsilon, oracle, domain;
- every value is a possible output of that mechanism: adaptive range exactly ``c - A`` or
  ``c + A``; GRR a category index in ``[0, d)``; OUE a row of ``ceil(d / 8)`` bytes whose
  padding bits are 0; OLH a bucket in ``[0, g)`` and a key ``a * P + b`` with
  ``1 <= a < P`` and ``0 <= b < P``; and no other field.

So a raw value (a temperature of 21.5, a category name) is refused with a
:class:`~dpsql.local.ReportError` and never stored. A request is all or nothing. What no
check can stop is a client that picks its outputs instead of drawing them (always ``c + A``):
such poisoning is possible in every local-DP protocol; the per-token rate limit bounds how
fast one token can do it.

Accepted reports go into one :class:`~dpsql.local.shuffle.Shuffler` for the whole server,
without anything of their sender: the reporting token's name is used only by the rate
limit, before the reports are read, and is never stored or logged with them; nor is the
address or the arrival time. Each released batch (pools of at least ``k`` reports) goes to
the :class:`~dpsql.local.store.ReportStore`, so fewer than ``k`` reports of a column are
never visible to a query. Reports still below ``k`` when the server stops are discarded
(they were never visible; their clients' epsilon was spent for nothing). Logs say only
counts.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from dpsql.local._common import ReportError
from dpsql.local.codec import decode_reports
from dpsql.local.frequency import HASH_PRIME
from dpsql.local.reporter import ColumnMechanism, mechanisms_for
from dpsql.local.reports import Reports
from dpsql.local.shuffle import Shuffler
from dpsql.local.store import ReportStore
from dpsql.noise import RandomSource
from dpsql.policy import Policy
from dpsql.service import RateLimiter

__all__ = ["Collector", "check_reports"]

log = logging.getLogger("dpsql.server")

_RAW_VALUE = ("perturb on the client (dpsql.local.Reporter or RemoteReporter); the server stores "
              "only outputs of the policy's mechanism, never raw values")
_RATE_REFUSAL = ("reporting token {name!r} sent more than {per_minute} report requests a minute (the "
                 "server's limit, dpsql serve --report-rate); wait {wait:.1f} s and try again. Nothing was stored.")


def check_reports(policy: Policy, bundles: Sequence[Reports]) -> None:
    """Refuse ``bundles`` unless they are whole records of a local table, made by its mechanisms.

    Raises:
        ReportError: naming the table or column, what is wrong and what to do.

    >>> import numpy as np
    >>> from dpsql.policy import parse_policy
    >>> policy = parse_policy('''
    ... [privacy]
    ... max_epsilon_per_query = 1.0
    ... max_delta_per_query = 0
    ... default_epsilon = 1.0
    ... [budget]
    ... default = { epsilon = 5.0, delta = 0 }
    ... [tables.telemetry]
    ... model = "local"
    ... epsilon = 1.0
    ... [tables.telemetry.columns]
    ... temp = { bounds = [-10, 50] }
    ... ''')
    >>> params = "range;lower=-10.0;upper=50.0;epsilon=1.0"
    >>> check_reports(policy, [Reports("telemetry", "temp", params, values=np.array([21.5]))])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    dpsql.local._common.ReportError: 1 of 1 report(s) of telemetry.temp are not outputs of the adaptive-range mechanism (each is exactly -44.9... or 84.9...): perturb on the client (dpsql.local.Reporter or RemoteReporter); the server stores only outputs of the policy's mechanism, never raw values
    """
    if not bundles:
        raise ReportError("the request holds no reports; send Reporter.report(record)")
    name = bundles[0].table
    if any(b.table != name for b in bundles):
        raise ReportError("one request carries reports of one table; send each table's apart")
    mechanisms = _local_mechanisms(policy, name)
    columns = [b.column for b in bundles]
    if len(set(columns)) != len(columns) or set(columns) != set(mechanisms):
        raise ReportError(f"a report request carries each column of {name!r} exactly once, got {columns}; "
                          f"the policy lists {sorted(mechanisms)} (a client reports whole records)")
    sizes = {len(b) for b in bundles}
    if len(sizes) != 1:
        raise ReportError(f"every column needs one report per record, got {sorted(sizes)} reports in "
                          f"different columns of {name!r}")
    for bundle in bundles:
        _check_bundle(bundle, mechanisms[bundle.column])


def _local_mechanisms(policy: Policy, name: str) -> dict[str, ColumnMechanism]:
    table = policy.table(name)
    if table is None:
        raise ReportError(f"the policy has no table {name!r}; reports are taken only for its "
                          'model = "local" tables')
    if table.model != "local":
        raise ReportError(f"table {name!r} is a central table: dpsql holds its raw rows, and takes no "
                          'reports for it; reports go only to tables with model = "local"')
    return mechanisms_for(table)


def _check_bundle(bundle: Reports, mechanism: ColumnMechanism) -> None:
    where = f"{bundle.table}.{bundle.column}"
    if bundle.params != mechanism.params:
        raise ReportError(f"the reports of {where} were made with {bundle.params!r}, but the policy's "
                          f"mechanism is {mechanism.params!r}; the client must report with the "
                          "server's policy (the same bounds, categories and epsilon)")
    kind = "range" if mechanism.range is not None else mechanism.oracle.kind  # type: ignore[union-attr]
    fields = {name for name in ("values", "items", "keys", "bits") if getattr(bundle, name) is not None}
    expected = {"range": {"values"}, "grr": {"items"}, "oue": {"bits"}, "olh": {"items", "keys"}}[kind]
    if fields != expected:
        raise ReportError(f"reports of {where} ({kind}) carry {sorted(expected)}, got {sorted(fields)}; "
                          f"{_RAW_VALUE}")
    bad, what = _impossible(bundle, mechanism, kind)
    if bad:
        raise ReportError(f"{bad} of {len(bundle)} report(s) of {where} are not outputs of {what}: {_RAW_VALUE}")


def _impossible(bundle: Reports, mechanism: ColumnMechanism, kind: str) -> tuple[int, str]:
    """How many reports no run of the mechanism could produce, and what the mechanism outputs."""
    if mechanism.range is not None:
        low, high = mechanism.range.outputs
        assert bundle.values is not None  # _check_bundle checked the fields
        bad = int(np.count_nonzero((bundle.values != low) & (bundle.values != high)))
        return bad, f"the adaptive-range mechanism (each is exactly {low!r} or {high!r})"
    oracle = mechanism.oracle
    assert oracle is not None
    if kind == "grr":
        return _outside(bundle.items, oracle.domain), f"GRR (a category index in [0, {oracle.domain}))"
    if kind == "olh":
        assert bundle.keys is not None
        a = bundle.keys // HASH_PRIME  # the key is a * P + b; b = key mod P is in [0, P) whenever key >= 0
        keys_bad = (bundle.keys < 0) | (a < 1) | (a >= HASH_PRIME)
        return (int(np.count_nonzero(keys_bad | _outside_mask(bundle.items, oracle.buckets))),
                f"OLH (a bucket in [0, {oracle.buckets}) and a key a * {HASH_PRIME} + b, 1 <= a < {HASH_PRIME})")
    width = -(-oracle.domain // 8)
    bits = bundle.bits
    assert bits is not None
    what = f"OUE (rows of {width} bytes, {oracle.domain} bits and zero padding)"
    if bits.shape[1] != width:
        return len(bundle), what
    padding = width * 8 - oracle.domain
    if not padding:
        return 0, what
    mask = np.uint8((1 << padding) - 1)  # packbits is big-endian: the padding is the low bits
    return int(np.count_nonzero(bits[:, -1] & mask)), what


def _outside_mask(items: npt.NDArray[np.int64] | None, size: int) -> npt.NDArray[np.bool_]:
    assert items is not None  # _check_bundle checked the fields
    return (items < 0) | (items >= size)


def _outside(items: npt.NDArray[np.int64] | None, size: int) -> int:
    return int(np.count_nonzero(_outside_mask(items, size)))


class Collector:
    """The server's ingestion: rate limit, decode, check, shuffle, store (one per server).

    Args:
        policy: The server's policy (its ``model = "local"`` tables take reports).
        store: Where released batches go; analysts' queries read it.
        k: The shuffler's threshold: a column's reports become visible ``k`` at a time.
        per_minute: Report requests one reporting token may send a minute.
        source: A seeded source for unit tests only; by default the OS CSPRNG.
    """

    def __init__(self, policy: Policy, store: ReportStore, *, k: int = 100, per_minute: int = 600,
                 source: RandomSource | None = None) -> None:
        self._policy = policy
        self._store = store
        self._shuffler = Shuffler(k, source=source)
        self._rate = RateLimiter(per_minute, refusal=_RATE_REFUSAL)
        self._lock = threading.Lock()

    @property
    def k(self) -> int:
        return self._shuffler.k

    def submit(self, reporter: str, body: bytes) -> int:
        """Take one request of reports from ``reporter`` (used only for the rate limit);
        returns how many reports were accepted.

        Raises:
            RateLimited: the reporter sent too many requests; nothing was read.
            ReportError: the request is malformed or a report is not a possible output of
                the policy's mechanism; nothing of it was accepted.
        """
        self._rate.take(reporter)
        del reporter  # nothing below knows who sent the reports
        bundles = decode_reports(body)
        check_reports(self._policy, bundles)
        with self._lock:  # one release at a time, so batches reach the store in order
            self._shuffler.submit(bundles)
            batch = self._shuffler.release()
            if batch is not None:
                stored = self._store.ingest(batch)
                log.info("report batch released to the store: %d reports in %d pool(s) of at least %d",
                         stored, len(batch.pools), batch.k)
        accepted = sum(len(b) for b in bundles)
        log.debug("report request accepted: %d report(s) in %d column(s)", accepted, len(bundles))
        return accepted

    def close(self) -> None:
        """Forget the reports still below ``k`` (they were never visible); log how many."""
        with self._lock:
            waiting = sum(self._shuffler.pending().values())
            self._shuffler = Shuffler(self._shuffler.k)
        if waiting:
            log.info("discarded %d report(s) that had not reached a batch of k = %d", waiting, self.k)
