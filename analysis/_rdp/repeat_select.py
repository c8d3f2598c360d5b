"""RDP of releasing the best of a random number of runs (Papernot & Steinke 2022;
docs/design/rdp_accountant.md, "RDP of the best of a random number of runs").
"""
from __future__ import annotations

import functools
import math

import numpy as np

from analysis import events as _events
from analysis._checks import check_real
from analysis._numerics import log_expm1
from analysis._rdp.conversion import _best, _checked_rdp_curve

def truncated_negative_binomial_log_mean(log_inv_gamma: float, shape: float) -> float:
  """log E[K] for K ~ D_{eta, gamma}, from L = log(1/gamma) > 0 and eta = ``shape`` > -1.

  E[K] = eta (1 - gamma) / (gamma (1 - gamma^eta)) = expm1(L) eta / (-expm1(-eta L)) for
  eta != 0 and (1/gamma - 1) / log(1/gamma) = expm1(L) / L for eta = 0 (the limit); evaluated
  in log space (no overflow for large L).  Increasing in L, from 1 (L -> 0) to inf.
  """
  L = check_real("log_inv_gamma", log_inv_gamma, allow_nan=True)
  if not 0.0 < L < math.inf:
    raise ValueError(f"log_inv_gamma must be in (0, inf), got {L!r}.")
  eta = _events.check_repeat_shape("shape", shape)
  if math.isinf(eta):
    raise ValueError("shape must be finite for the truncated negative binomial, got inf.")
  base = log_expm1(L)
  if eta == 0.0:
    return base - math.log(L)
  if eta > 0.0:
    return base + math.log(eta) - math.log(-math.expm1(-eta * L))
  return base + math.log(-eta) - log_expm1(-eta * L)


def truncated_negative_binomial_gamma(mean: float, shape: float) -> tuple[float, float]:
  """``(log(1/gamma), E[K])`` of the D_{eta, gamma} with mean ``mean``, gamma rounded down.

  Bisection on L = log(1/gamma) for :func:`truncated_negative_binomial_log_mean` = log(mean),
  returning the upper end L (so gamma = exp(-L) is at most the exact one, by ~1e-15
  relative) and the mean E[K] >= ``mean`` of that distribution.  Sample K with this gamma
  (:func:`analysis.tuning.sample_runs`) and the RDP bound is that of the distribution sampled.

  Args:
    mean: finite, > 1 (mean 1 is K = 1 surely, gamma = 1, no L > 0).
    shape: eta, finite, > -1.

  Raises:
    ValueError: an argument out of range.
  """
  mean = _events.check_repeat_mean("mean", mean)
  if mean == 1.0:
    raise ValueError("mean must be > 1 for gamma in (0, 1) (mean 1 is K = 1 surely).")
  eta = _events.check_repeat_shape("shape", shape)
  if math.isinf(eta):
    raise ValueError("shape must be finite for the truncated negative binomial, got inf.")
  return _tnb_gamma(mean, eta)


@functools.lru_cache(maxsize=256)
def _tnb_gamma(mean: float, eta: float) -> tuple[float, float]:
  """:func:`truncated_negative_binomial_gamma` on checked arguments (cached)."""
  target = math.log(mean)
  log_mean = lambda L: truncated_negative_binomial_log_mean(L, eta)  # noqa: E731
  lo, hi = 0.0, 1.0
  while log_mean(hi) < target:
    lo, hi = hi, 2.0 * hi
  for _ in range(2000):
    mid = 0.5 * (lo + hi)
    if not lo < mid < hi:
      break
    if log_mean(mid) < target:
      lo = mid
    else:
      hi = mid
  return hi, max(mean, math.exp(log_mean(hi)))


def compute_rdp_repeat_and_select(orders, rdp, mean: float, shape: float, *,
                                  delta_of_epsilon=None):
  """RDP of releasing the best of K runs of a mechanism with RDP ``rdp`` at ``orders``.

  Papernot & Steinke (2022), Theorem 2 (``shape`` = eta in (-1, inf): K truncated negative
  binomial with mean ``mean``) and Theorem 6 (``shape`` = inf: K Poisson with mean ``mean``);
  formulas on the design page.  The second order of Theorem 2 ranges over ``orders``;
  the result is made non-increasing towards lower orders (RDP is monotone in the order).  For
  the truncated negative binomial with ``mean`` = 1 (K = 1 surely) ``rdp`` is returned.

  Args:
    orders: non-empty sequence of orders, each in (1, inf].
    rdp: RDP of one run at ``orders`` (nats, each in [0, inf]), same length.
    mean: E[K], finite, >= 1.
    shape: eta in (-1, inf), or inf for Poisson.
    delta_of_epsilon: Poisson only: a function eps -> delta such that one run is
      (eps, delta)-DP (e.g. an accountant's ``get_delta``); default: from ``rdp`` by the
      conversion of :func:`get_privacy_spent`.

  Returns:
    ``np.ndarray`` of RDP values (nats, in [0, inf]) at ``orders``.

  Raises:
    ValueError: an argument out of range (the message names it).
  """
  alphas, eps = _checked_rdp_curve(orders, rdp)
  mean = _events.check_repeat_mean("mean", mean)
  eta = _events.check_repeat_shape("shape", shape)
  out = np.full(alphas.shape, math.inf)
  if math.isinf(eta):  # Theorem 6
    if delta_of_epsilon is None:
      delta_of_epsilon = lambda e: _best(alphas, eps, e, None)[1]  # noqa: E731
    for i, lam in enumerate(alphas):
      if math.isinf(lam) or eps[i] == math.inf:
        continue  # the theorem needs a finite order
      eps_hat = math.log1p(1.0 / (lam - 1.0))
      delta_hat = float(delta_of_epsilon(eps_hat))
      out[i] = eps[i] + mean * delta_hat + math.log(mean) / (lam - 1.0)
  elif mean == 1.0:
    out = eps.copy()  # K = 1 surely
  else:  # Theorem 2
    log_inv_gamma, expected_k = truncated_negative_binomial_gamma(mean, eta)
    with np.errstate(invalid="ignore"):
      second = np.where(np.isinf(alphas), eps,
                        (1.0 - 1.0 / alphas) * eps + log_inv_gamma / alphas)
    second = second[~np.isnan(second)]
    c = (1.0 + eta) * float(np.min(second, initial=math.inf))
    for i, lam in enumerate(alphas):
      tail = 0.0 if math.isinf(lam) else math.log(expected_k) / (lam - 1.0)
      out[i] = eps[i] + c + tail
  # RDP is non-decreasing in the order: a bound at a higher order holds at every lower one.
  order = np.argsort(alphas, kind="stable")
  running = math.inf
  for i in order[::-1]:
    running = min(running, out[i])
    out[i] = running
  return np.maximum(out, 0.0)
