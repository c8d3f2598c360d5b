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


def exact_gaussian_epsilon(sigma, count, delta):
  """Exact eps of ``count`` compositions of the Gaussian mechanism with noise multiplier
  ``sigma`` (one Gaussian of sigma / sqrt(count); Balle & Wang 2018, Theorem 8), by bisection
  in 50-digit arithmetic (mpmath), independent of analysis.gaussian."""
  import mpmath  # pylint: disable=g-import-not-at-top
  with mpmath.workdps(50):
    s = mpmath.mpf(sigma) / mpmath.sqrt(count)

    def delta_of(eps):
      return mpmath.ncdf(1 / (2 * s) - eps * s) - mpmath.e**eps * mpmath.ncdf(-1 / (2 * s) - eps * s)
    low, high = mpmath.mpf(0), mpmath.mpf(1)
    while delta_of(high) > delta:
      high *= 2
    for _ in range(200):
      mid = (low + high) / 2
      low, high = (mid, high) if delta_of(mid) > delta else (low, mid)
    return float(high)
