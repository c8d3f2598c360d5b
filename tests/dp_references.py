"""The independent references the analysis tests compare against (dp_accounting, a test extra).

Each getter skips only the test that calls it when dp_accounting is missing.
"""
import pytest


def dp_accounting():
  """dp_accounting itself."""
  return pytest.importorskip("dp_accounting")


def dp_rdp():
  """dp_accounting's RDP accountant module."""
  return pytest.importorskip("dp_accounting.rdp.rdp_privacy_accountant")


def dp_pld():
  """dp_accounting's PLD accountant module."""
  return pytest.importorskip("dp_accounting.pld.pld_privacy_accountant")
