"""The privacy budget: crash-safe SQLite ledgers and the rolling-period accountant.

- ``WindowLedger``: every scheduled window once, with its stored alert record.
- ``BudgetAccountant``: may this window be released within the rolling period's budget
  (basic or PLD composition)? ``release()`` decides, draws and records in one step.
- ``ReferenceLedger``: the reference data's total budget; ``charge()`` raises
  ``BudgetExhausted`` when a query would exceed it.

>>> import tempfile, pathlib
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> acc = BudgetAccountant(WindowLedger(d / "w.sqlite"), 10.0, 1e-5, 86400, "pld")
>>> acc.decide(0.0, 60.0, (1.0, 1e-6)).released
True
"""

from monitor.budget.accountant import BudgetAccountant, Decision, ReleaseOutcome
from monitor.budget.composition import basic_spend, max_windows, pld_epsilon
from monitor.budget.ledger import Charge, LedgerEntry, WindowLedger
from monitor.budget.reference import ReferenceCharge, ReferenceLedger
from monitor.budget._sqlite import LedgerError
from monitor.errors import BudgetExhausted

__all__ = [
    "BudgetAccountant",
    "Decision",
    "ReleaseOutcome",
    "WindowLedger",
    "LedgerEntry",
    "Charge",
    "ReferenceLedger",
    "ReferenceCharge",
    "LedgerError",
    "BudgetExhausted",
    "basic_spend",
    "pld_epsilon",
    "max_windows",
]
