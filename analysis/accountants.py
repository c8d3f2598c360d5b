"""The accountants by public name: the one place where ``"rdp"`` and ``"pld"`` become objects.

The command line, calibration, ``tf_dpkit.budget`` and ``tf_dpkit.make_private`` take these
names; below them only :class:`analysis.accountant.Accountant` objects are passed around.  No
TensorFlow import.
"""
from __future__ import annotations

from analysis import _checks
from analysis.accountant import Accountant

__all__ = ["ACCOUNTANTS", "make_accountant"]

#: Public accountant names accepted by :func:`make_accountant`.
ACCOUNTANTS = ("rdp", "pld")


def make_accountant(name: str = "rdp") -> Accountant:
  """A fresh accountant by public name.

  ``"rdp"``: :class:`analysis.rdp_accountant.RdpAccountant` over
  ``rdp_accountant.DEFAULT_ORDERS``.  ``"pld"``:
  :class:`analysis.pld_accountant.PLDAccountant` with ``rdp_cap=True`` (the smaller of the PLD
  and the RDP bound; see ``analysis.pld_accountant``).

  Raises:
    ValueError: ``name`` not one of :data:`ACCOUNTANTS`.
  """
  _checks.check_choice("accountant", name, ACCOUNTANTS)
  if name == "pld":
    from analysis import pld_accountant  # pylint: disable=g-import-not-at-top
    return pld_accountant.PLDAccountant(rdp_cap=True)
  from analysis import rdp_accountant  # pylint: disable=g-import-not-at-top
  return rdp_accountant.RdpAccountant()
