"""Privacy accounting: what each query costs, how costs compose, and the persistent ledger.

- :mod:`~dpsql.privacy.charges`: :class:`Charge`, :class:`BudgetStatus` and the exact
  integer units budgets are kept in;
- :mod:`~dpsql.privacy.accountants`: basic composition, and the accountant a policy names;
- :mod:`~dpsql.privacy.pld`: the privacy loss distribution accountant (dp-accounting);
- :mod:`~dpsql.privacy.tradeoff`: trade-off curves of what has been spent, and their plot;
- :mod:`~dpsql.privacy.ledger`: the SQLite ledger, the one place where the budget is checked.
"""

from __future__ import annotations

from dpsql.privacy.accountants import (
    Accountant,
    BasicAccountant,
    UnitAccountant,
    accountant_named,
    gaussian_mu,
)
from dpsql.privacy.charges import (
    BudgetStatus,
    Charge,
    ChargeRecord,
    GroupPrivacy,
    delta_to_units_up,
    epsilon_to_units_up,
    units_to_delta,
    units_to_epsilon,
)
from dpsql.privacy.ledger import Ledger

__all__ = [
    "Accountant",
    "BasicAccountant",
    "BudgetStatus",
    "Charge",
    "ChargeRecord",
    "GroupPrivacy",
    "Ledger",
    "UnitAccountant",
    "accountant_named",
    "delta_to_units_up",
    "epsilon_to_units_up",
    "gaussian_mu",
    "units_to_delta",
    "units_to_epsilon",
]
