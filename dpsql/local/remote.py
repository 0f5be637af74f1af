"""The collection client over the network: perturb on the device, send to ``dpsql serve``.

:class:`RemoteReporter` is a :class:`~dpsql.local.reporter.Reporter` whose reports go to a
server started with ``--reports FILE --report-auth FILE``. Perturbation always happens
here, on the client, with the OS CSPRNG: the server only ever receives outputs of the
mechanism (and refuses anything else), so it never sees a raw value. The request carries
no device id and no time; the server drops what the transport knows (token, address,
arrival time) before the reports reach its shuffler (:mod:`dpsql.local.ingest`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from types import TracebackType

import numpy.typing as npt

from dpsql.local.reporter import Reporter
from dpsql.policy import Policy

__all__ = ["RemoteReporter"]


class RemoteReporter:
    """Perturbs records of one local table locally and sends the reports to a server.

    Args:
        policy: The server's policy (a loaded :class:`~dpsql.policy.Policy` or a file): the
            client needs the table's bounds, categories and epsilon to perturb.
        table: The local table's name.
        location: ``grpc://host:port`` or ``grpc+tls://host:port`` of ``dpsql serve``.
        token: A reporting token (``dpsql token create NAME --auth FILE`` on the file the
            server was given with ``--report-auth``).
        tls_root_certs, timeout: as for :class:`dpsql.Client`.

    >>> reporter = RemoteReporter("policy.toml", "telemetry", "grpc://127.0.0.1:8815",
    ...                           token="...")                       # doctest: +SKIP
    >>> reporter.report({"temp": 21.5, "os": "mac"})                # doctest: +SKIP
    2
    """

    def __init__(self, policy: Policy | str | os.PathLike[str], table: str, location: str, token: str, *,
                 tls_root_certs: bytes | str | os.PathLike[str] | None = None, timeout: float = 60.0) -> None:
        from dpsql.client import Client

        self._reporter = Reporter(policy, table)  # the OS CSPRNG: no source can be injected here
        self._client = Client(location, token=token, tls_root_certs=tls_root_certs, timeout=timeout)

    @property
    def epsilon_per_record(self) -> float:
        """What one record spends against anyone who can link its reports (m columns x eps)."""
        return self._reporter.epsilon_per_record

    def report(self, record: Mapping[str, object]) -> int:
        """Perturb one record here and send its reports; returns how many the server accepted."""
        return self._client.report(self._reporter.report(record))

    def report_many(self, columns: Mapping[str, npt.ArrayLike | list[object]]) -> int:
        """Several records at once, given column-wise (at most 1,000 per call)."""
        return self._client.report(self._reporter.report_many(columns))

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> RemoteReporter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
