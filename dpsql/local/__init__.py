"""Local differential privacy: clients perturb their own values; dpsql estimates from reports.

The collector is not trusted with raw values (telemetry, surveys, federated learning), so
each client perturbs every value before it leaves (DESIGN's central model does the
opposite). The pieces, each its own module:

- :func:`perturb` (:mod:`~dpsql.local.ranges`): the adaptive-range mechanism of LDP-FL for
  a bounded number: two possible outputs, unbiased, ``epsilon``-LDP.
- :func:`perturb_category` (:mod:`~dpsql.local.frequency`): GRR, OUE or OLH for a category,
  whichever has the smaller variance, with unbiased count estimates.
- :class:`Shuffler` (:mod:`~dpsql.local.shuffle`): pools per-column reports, forgets their
  senders, releases them shuffled in batches of at least ``k``; :func:`amplified_epsilon`.
- :class:`Reporter` (:mod:`~dpsql.local.reporter`): the client for a ``model = "local"``
  table of the policy; :class:`ReportStore` (:mod:`~dpsql.local.store`): where the
  collector keeps shuffled reports; :mod:`~dpsql.local.query`: SQL over them
  (``dpsql.connect(..., reports=PATH)``), free of central budget.
- Through the server: :class:`RemoteReporter` (:mod:`~dpsql.local.remote`) perturbs on the
  client and sends to ``dpsql serve --reports FILE --report-auth FILE``, whose
  :mod:`~dpsql.local.ingest` checks every report against the policy (wire format:
  :mod:`~dpsql.local.codec`), shuffles and stores.

>>> import dpsql, numpy as np
>>> reports = dpsql.local.perturb(np.array([3.0, 7.0]), 0.0, 10.0, epsilon=1.0)
>>> reports.shape
(2,)
"""

from __future__ import annotations

from dpsql.local._common import ReportError
from dpsql.local.frequency import CategoryReports, CountEstimate, FrequencyOracle, choose_oracle, perturb_category
from dpsql.local.query import answer, references_local_table
from dpsql.local.ranges import AdaptiveRange, perturb
from dpsql.local.remote import RemoteReporter
from dpsql.local.reporter import Reporter
from dpsql.local.reports import Reports
from dpsql.local.shuffle import Batch, Shuffler, amplified_epsilon
from dpsql.local.store import ReportStore

__all__ = [
    "AdaptiveRange",
    "Batch",
    "CategoryReports",
    "CountEstimate",
    "FrequencyOracle",
    "RemoteReporter",
    "ReportError",
    "ReportStore",
    "Reporter",
    "Reports",
    "Shuffler",
    "amplified_epsilon",
    "answer",
    "choose_oracle",
    "perturb",
    "perturb_category",
    "references_local_table",
]
