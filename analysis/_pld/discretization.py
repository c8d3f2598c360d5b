"""One step's privacy-loss distributions, discretised pessimistically on a grid of h nats
(docs/design/pld_accountant.md, "Discretisation").
"""
from __future__ import annotations

import math

import numpy as np
from scipy import special

from analysis import _numerics

_REMOVE = "remove"
_ADD = "add"


# ------------------------------------------------------------------------------------------
# The privacy loss of the "remove" pair as a function of the observation x, and its inverse.
# L_rem(x) = log((1 - q) + q exp(u)), u = (2x - 1) / (2 sigma^2), is increasing in x; the "add"
# pair has loss -L_rem(x) with x ~ N(0, sigma^2).


def _loss_remove(x: float, q: float, sigma: float) -> float:
  """L_rem(x) in nats, for sigma > 0 and q in (0, 1]."""
  u = (2.0 * x - 1.0) / (2.0 * sigma * sigma)
  if q == 1.0:
    return u
  return float(np.logaddexp(math.log1p(-q), math.log(q) + u))


def _x_of_loss_remove(t: np.ndarray, q: float, sigma: float) -> np.ndarray:
  """The x with L_rem(x) = t (non-decreasing in t); -inf where t <= log(1 - q), inf-free."""
  if q == 1.0:
    u = t.astype(np.float64, copy=True)
  else:
    z = t - math.log1p(-q)  # L_rem = t  <=>  exp(u) = (1 - q) expm1(z) / q
    u = np.full_like(t, -np.inf, dtype=np.float64)
    pos = z > 0.0
    u[pos] = math.log1p(-q) - math.log(q) + _numerics.log_expm1(z[pos])
  return 0.5 + sigma * sigma * u


def _normal_interval_masses(z: np.ndarray):
  """Standard normal masses below z[0], on [z[k], z[k+1]] and above z[-1] (z ascending).

  Differences are taken between lower-tail CDFs left of 0 and upper-tail CDFs right of 0, so
  the masses of short intervals deep in a tail keep their relative accuracy.
  """
  cdf = special.ndtr(z)
  sf = special.ndtr(-z)
  a = z[:-1]
  inner = np.where(a >= 0.0, sf[:-1] - sf[1:], cdf[1:] - cdf[:-1])
  return float(cdf[0]), np.maximum(inner, 0.0), float(sf[-1])


# ------------------------------------------------------------------------------------------
# One-step discrete PLDs.  A discrete PLD is (i_lo, pmf, p_inf): mass pmf[k] at loss
# (i_lo + k) * h and mass p_inf at +inf.


def _split_point_mass(y: float, mass: float, h: float):
  """Connect-the-dots split of a point mass at finite loss y onto the grid (i_lo, pmf)."""
  i = math.floor(y / h)
  frac = y - i * h
  if frac <= 0.0:
    return i, np.array([mass])
  # Weight to the lower point: (e^-y - e^-t_{i+1}) / (e^-t_i - e^-t_{i+1}).
  w_lo = math.exp(-frac) * (-math.expm1(-(h - frac))) / (-math.expm1(-h))
  w_lo = min(max(w_lo, 0.0), 1.0)
  return i, np.array([mass * w_lo, mass * (1.0 - w_lo)])


def _discretize_step(q: float, sigma: float, h: float, direction: str, tail: float):
  """Pessimistic discrete PLD of one step, for q in (0, 1], sigma in [0, inf).

  ``tail`` bounds the P-mass beyond each end of the grid: the upper part goes to +inf, the
  lower part is moved up to the first grid point.
  """
  log1mq = math.log1p(-q) if q < 1.0 else -math.inf
  if sigma == 0.0:
    # remove: L = log(1 - q) w.p. 1 - q and +inf w.p. q;  add: L = -log(1 - q) w.p. 1.
    if direction == _REMOVE:
      if q == 1.0:
        return 0, np.zeros(1), 1.0
      i_lo, pmf = _split_point_mass(log1mq, 1.0 - q, h)
      return i_lo, pmf, q
    if q == 1.0:
      return 0, np.zeros(1), 1.0
    i_lo, pmf = _split_point_mass(-log1mq, 1.0, h)
    return i_lo, pmf, 0.0

  t_lo, t_hi = _loss_range(q, sigma, direction, tail)
  i_lo = math.floor(t_lo / h)
  i_hi = max(math.ceil(t_hi / h), i_lo + 1)
  t = np.arange(i_lo, i_hi + 1, dtype=np.float64) * h

  if direction == _REMOVE:
    x = _x_of_loss_remove(t, q, sigma)
  else:  # L_add in (t_k, t_k+1]  <=>  L_rem in [-t_k+1, -t_k); ascending x for descending t.
    x = _x_of_loss_remove(-t[::-1], q, sigma)
  n0_below, n0_inner, n0_above = _normal_interval_masses(x / sigma)
  n1_below, n1_inner, n1_above = _normal_interval_masses((x - 1.0) / sigma)
  mix_below = (1.0 - q) * n0_below + q * n1_below
  mix_inner = (1.0 - q) * n0_inner + q * n1_inner
  mix_above = (1.0 - q) * n0_above + q * n1_above
  if direction == _REMOVE:
    p_int, q_int = mix_inner, n0_inner
    p_lower_tail, p_upper_tail = mix_below, mix_above
  else:
    p_int, q_int = n0_inner[::-1], mix_inner[::-1]
    p_lower_tail, p_upper_tail = n0_above, n0_below

  # Mass to the upper end of interval k: E_P[(1 - e^(t_k - L)); L in (t_k, t_k+1]] / (1 - e^-h)
  # = (P - e^t_k Q) / (1 - e^-h).  Clipping guards against round-off only.
  with np.errstate(divide="ignore"):
    q_scaled = np.exp(t[:-1] + np.log(q_int))
  m_hi = np.clip((p_int - q_scaled) / (-math.expm1(-h)), 0.0, p_int)
  m_lo = p_int - m_hi
  pmf = np.zeros(t.size)
  pmf[:-1] += m_lo
  pmf[1:] += m_hi
  pmf[0] += p_lower_tail
  return i_lo, pmf, float(p_upper_tail)


def _loss_range(q: float, sigma: float, direction: str, tail: float) -> tuple[float, float]:
  """Ends ``(t_lo, t_hi)`` (nats) of the one-step privacy-loss grid for ``sigma > 0``: the
  losses at the N(0,1) upper-tail quantile of ``tail`` (or the loss's bound log(1 - q))."""
  z_tail = -float(special.ndtri(tail))  # N(0,1) upper-tail quantile of `tail`
  log1mq = math.log1p(-q) if q < 1.0 else -math.inf
  if direction == _REMOVE:
    t_hi = _loss_remove(1.0 + sigma * z_tail, q, sigma)
    t_lo = log1mq if q < 1.0 else _loss_remove(1.0 - sigma * z_tail, q, sigma)
  else:
    t_hi = -log1mq if q < 1.0 else -_loss_remove(-sigma * z_tail, q, sigma)
    t_lo = -_loss_remove(sigma * z_tail, q, sigma)
  return t_lo, t_hi


def _step_loss_range(q: float, sigma: float, direction: str, tail: float) -> float:
  """Width (nats) of the one-step grid that _discretize_step would build."""
  if sigma == 0.0:
    return 0.0
  t_lo, t_hi = _loss_range(q, sigma, direction, tail)
  return t_hi - t_lo
