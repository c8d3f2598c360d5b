"""Shared pieces of :mod:`analysis.pate`: argument checks, log-space numerics and the
PATE 2018 Theorem 6 / PATE 2017 Theorem 2 curves (design: ``docs/design/pate.md``)."""
from __future__ import annotations

import math

import numpy as np

from analysis import _checks
from analysis._numerics import log1mexp
from analysis import rdp_accountant

_SQRT2 = math.sqrt(2.0)
_LOG_HALF = math.log(0.5)

# ------------------------------------------------------------------------------------------
# Argument checks (built on analysis._checks; the messages name the argument and its range).


def _check_votes(name: str, votes, *, shifted: bool = False) -> np.ndarray:
  """``votes`` as a read-only 1-D float64 array; see docs/design/pate.md for the ranges."""
  kind = "real numbers" if shifted else "non-negative integer vote counts"
  if votes is None or isinstance(votes, (str, bytes, dict, set)):
    raise ValueError(f"{name} must be a 1-D array of {kind} (one per class), got "
                     f"{_checks._describe(votes)}.")  # pylint: disable=protected-access
  try:
    array = np.array(votes, dtype=np.float64)
  except (TypeError, ValueError) as error:
    raise ValueError(f"{name} must be a 1-D array of {kind} (one per class), got "
                     f"{votes!r:.80}.") from error
  if array.ndim != 1:
    raise ValueError(f"{name} must be a 1-D array (one count per class), got an array of shape "
                     f"{array.shape}.")
  if array.size == 0:
    raise ValueError(f"{name} must have at least one class, got an empty array.")
  bad = np.flatnonzero(~np.isfinite(array))
  if bad.size:
    raise ValueError(f"{name} must be finite {kind}, got {name}[{bad[0]}] = {float(array[bad[0]])!r}.")
  if not shifted:
    bad = np.flatnonzero(array < 0)
    if bad.size:
      raise ValueError(f"{name} must be non-negative vote counts, got {name}[{bad[0]}] = "
                       f"{float(array[bad[0]])!r}.")
    bad = np.flatnonzero(array != np.floor(array))
    if bad.size:
      raise ValueError(f"{name} must be integer-valued vote counts, got {name}[{bad[0]}] = "
                       f"{float(array[bad[0]])!r} (a real-valued thresholded histogram needs "
                       f"shifted=True).")
  array.setflags(write=False)
  return array


def _check_finite_real(name: str, value) -> float:
  value = _checks.check_real(name, value)
  if not math.isfinite(value):
    raise ValueError(f"{name} must be a finite real number, got {value!r}.")
  return value


def _check_order(name: str, value) -> float:
  """One finite Renyi order in (1, 1e6]."""
  value = _checks.check_real(name, value, allow_nan=True)
  if not 1.0 < value <= rdp_accountant.MAX_ORDER:
    raise ValueError(f"{name} must be a finite Renyi order in (1, 1e6], got {value!r}.")
  return value


def _check_num_teachers(num_teachers, votes: np.ndarray, shifted: bool) -> int:
  n = _checks.check_integer("num_teachers", num_teachers, minimum=1)
  if not shifted and votes.sum() > n:
    raise ValueError(f"num_teachers must be at least the number of votes ({votes.sum():g}), "
                     f"got {n}.")
  return n


def _check_beta(beta) -> float:
  return _checks.check_finite_nonnegative("beta", beta)


# ------------------------------------------------------------------------------------------
# The RDP curves (PATE 2018 Theorem 6, PATE 2017 Theorem 2, Laplace).


def _theorem6(logq, s: float, orders: np.ndarray) -> np.ndarray:
  """F(q): PATE 2018 Theorem 6 with Proposition 10's orders, capped at lambda / s^2.

  ``logq``: array of log q bounds (shape (n,)); returns shape (n, len(orders)).  The bound is
  used only where its conditions hold and it is below the data-independent lambda / s^2;
  q = 0 (log q = -inf: a fixed answer) gives 0.
  """
  logq = np.asarray(logq, dtype=np.float64).reshape(-1, 1)
  lam = np.asarray(orders, dtype=np.float64).reshape(1, -1)
  variance = s * s
  indep = np.broadcast_to(lam / variance, (logq.shape[0], lam.shape[1]))
  with np.errstate(all="ignore"):
    neg = -logq
    mu2 = s * np.sqrt(neg)
    mu1 = mu2 + 1.0
    eps1, eps2 = mu1 / variance, mu2 / variance
    valid = ((mu2 > 1.0) & (lam <= mu1) & (neg > eps2) & np.isfinite(lam) & np.isfinite(logq)
             & (logq <= (mu2 - 1.0) * eps2
                - mu2 * (np.log1p(1.0 / (mu1 - 1.0)) + np.log1p(1.0 / (mu2 - 1.0)))))
    log1q = log1mexp(-logq)  # log(1 - q)
    log_a = (lam - 1.0) * (log1q - log1mexp(-(logq + eps2) * (1.0 - 1.0 / mu2)))
    log_b = (lam - 1.0) * (eps1 - logq / (mu1 - 1.0))
    dep = np.logaddexp(log1q + log_a, logq + log_b) / (lam - 1.0)
    out = np.where(valid & (dep < indep), np.maximum(dep, 0.0), indep)
  return np.where(np.isneginf(logq), 0.0, out)


def _lnmax_independent(eps: float, orders: np.ndarray) -> np.ndarray:
  """min(randomized response at eps, twice the Laplace mechanism at 1 / b = eps / 2)."""
  lam = np.asarray(orders, dtype=np.float64)
  out = np.full(lam.shape, eps)  # order inf: the max divergence, eps
  fin = np.isfinite(lam)
  a = lam[fin]
  rr = (np.logaddexp(a * eps, (1.0 - a) * eps) - np.logaddexp(0.0, eps)) / (a - 1.0)
  out[fin] = np.minimum(rr, 2.0 * _laplace_rdp(eps / 2.0, a))
  return np.maximum(out, 0.0)


def _laplace_rdp(inv_scale: float, orders: np.ndarray) -> np.ndarray:
  """RDP of the Laplace mechanism with 1 / noise multiplier ``inv_scale`` (Mironov 2017)."""
  a = np.asarray(orders, dtype=np.float64)
  out = np.full(a.shape, inv_scale)
  fin = np.isfinite(a)
  a = a[fin]
  out[fin] = np.logaddexp(np.log(a / (2.0 * a - 1.0)) + (a - 1.0) * inv_scale,
                          np.log((a - 1.0) / (2.0 * a - 1.0)) - a * inv_scale) / (a - 1.0)
  return np.maximum(out, 0.0)


def _lnmax_from_logq(logq, eps: float, orders: np.ndarray) -> np.ndarray:
  """PATE 2017 Theorem 2 (capped by the data-independent bound); shape (n, len(orders))."""
  logq = np.asarray(logq, dtype=np.float64).reshape(-1, 1)
  lam = np.asarray(orders, dtype=np.float64).reshape(1, -1)
  indep = np.broadcast_to(_lnmax_independent(eps, lam.ravel()).reshape(1, -1),
                          (logq.shape[0], lam.shape[1]))
  with np.errstate(all="ignore"):
    valid = (logq < -np.logaddexp(0.0, eps)) & np.isfinite(lam) & np.isfinite(logq)
    log1q = log1mexp(-logq)
    log_a = log1q - log1mexp(-(logq + eps))
    dep = np.logaddexp(log1q + (lam - 1.0) * log_a, logq + (lam - 1.0) * eps) / (lam - 1.0)
    out = np.where(valid & (dep < indep), np.maximum(dep, 0.0), indep)
  return np.where(np.isneginf(logq), 0.0, out)
