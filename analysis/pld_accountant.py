"""Privacy-loss-distribution (PLD) accounting for DP-SGD by FFT composition.

One step is the Poisson-subsampled Gaussian; its "remove" and "add" privacy-loss
distributions are discretised pessimistically ("connect the dots") on a grid of
``value_discretization_interval`` nats, composed by one real FFT per direction, and every
truncation, wrap-around and round-off is bounded and added to delta, so ``delta(eps)`` (and the
epsilon searched from it) is an upper bound.  Supported: ``noise_multiplier`` in [0, inf]
(discretised inside [1e-3, 1e12], soundly clamped outside), ``steps`` in [0, 1e10]
(:data:`MAX_STEPS`), ``value_discretization_interval`` in (0, 1].  Where the grid must be
coarsened (very many steps) the bound loosens; :func:`compute_epsilon_with_rdp_cap` (the
``"pld"`` accountant name) returns the smaller of the PLD and the RDP bound.  The method, its
error bounds and measured ranges: docs/design/pld_accountant.md.  No TensorFlow import; numpy
and scipy only.
"""
from __future__ import annotations

import math
import warnings
from typing import NamedTuple, Sequence

import numpy as np
from scipy import fft as sp_fft
from scipy import signal as sp_signal
from scipy import special

from analysis import accountant as _accountant
from analysis import events as _events
from analysis import _numerics, rdp_accountant
from analysis._checks import (check_delta, check_finite_positive, check_nonnegative,
                              check_probability, check_same_length, check_steps)

__all__ = [
    "MAX_NOISE_MULTIPLIER",
    "MAX_STEPS",
    "MAX_VALUE_DISCRETIZATION_INTERVAL",
    "MIN_NOISE_MULTIPLIER",
    "CappedEpsilon",
    "PLDAccountant",
    "compute_delta",
    "compute_epsilon",
    "compute_epsilon_heterogeneous",
    "compute_epsilon_with_rdp_cap",
]

# Total probability mass that truncation / wrap-around may add to delta (design page).
_TAIL_MASS = 1e-18
# Largest number of grid points for the one-step PLD and for the composed (cyclic) grid.
_MAX_GRID_SIZE = 1 << 22
# Number of coarse blocks used to bound the moment generating function of a one-step PLD.
_MGF_BLOCKS = 4096

_REMOVE = "remove"
_ADD = "add"

#: Largest number of steps (per phase and in total) that the PLD accountant accepts.
MAX_STEPS = 10**10
#: Noise multipliers in (0, MIN_NOISE_MULTIPLIER) are accounted as 0 (sound, design page).
MIN_NOISE_MULTIPLIER = _numerics.PLD_NOISE_FLOOR
#: Noise multipliers in (MAX_NOISE_MULTIPLIER, inf) are accounted as MAX_NOISE_MULTIPLIER.
MAX_NOISE_MULTIPLIER = _numerics.PLD_NOISE_CEILING
#: Largest value_discretization_interval accepted (nats).
MAX_VALUE_DISCRETIZATION_INTERVAL = 1.0
_STEPS_WHY = "the PLD accountant's supported range; use the RDP accountant beyond it"


# ------------------------------------------------------------------------------------------
# Argument validation.


def _check_value_discretization_interval(value) -> float:
  h = check_finite_positive("value_discretization_interval", value)
  if h > MAX_VALUE_DISCRETIZATION_INTERVAL:
    raise ValueError(
        f"value_discretization_interval must be in (0, {MAX_VALUE_DISCRETIZATION_INTERVAL:g}] "
        f"nats (coarser grids give vacuous bounds), got {value!r}.")
  return h


def _check_phase(sampling_probability, noise_multiplier, steps,
                 names=("sampling_probability", "noise_multiplier", "steps")):
  q = check_probability(names[0], sampling_probability)
  sigma = check_nonnegative(names[1], noise_multiplier)
  count = check_steps(names[2], steps, maximum=MAX_STEPS, why=_STEPS_WHY)
  return q, sigma, count


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


# ------------------------------------------------------------------------------------------
# Composition.


class _DiscretePLD:
  """A composed discrete PLD: mass pmf[k] at loss (start + k) * h, mass p_inf at +inf."""

  def __init__(self, start: int, pmf: np.ndarray, p_inf: float, h: float):
    self.start = start
    self.pmf = pmf
    self.p_inf = min(max(p_inf, 0.0), 1.0)
    self.h = h

  def losses(self) -> np.ndarray:
    return (self.start + np.arange(self.pmf.size, dtype=np.float64)) * self.h

  def delta(self, epsilon: float) -> float:
    """Curve (1): p_inf + sum_k pmf[k] (1 - exp(eps - t_k))_+, a number in [0, 1]."""
    if self.p_inf >= 1.0 or math.isinf(epsilon):
      return self.p_inf
    t = self.losses()
    above = t > epsilon
    value = self.p_inf + float(np.sum(self.pmf[above] * -np.expm1(epsilon - t[above])))
    return min(value, 1.0)

  def epsilon(self, delta: float) -> float:
    """Smallest eps >= 0 with delta(eps) <= delta (inf if none); exact for the discrete PLD.

    With y_m = sum_{j >= m} pmf_j e^{-(j - m) h} (a stable first-order recursion), the curve at
    grid points is D_k = p_inf + (1 - e^-h) sum_{m > k} y_m, a sum of non-negative terms, and
    between t_{k-1} and t_k it is p_inf + S_{k-1} - e^(eps - t_{k-1}) e^-h y_k, solved in closed
    form (S_k = mass above t_k).
    """
    if self.p_inf > delta:
      return math.inf
    pmf = self.pmf
    n = pmf.size
    decay = math.exp(-self.h)
    y = sp_signal.lfilter([1.0], [1.0, -decay], pmf[::-1])[::-1]  # y_m, m = 0..n-1
    tail_y = np.concatenate([np.cumsum(y[::-1])[::-1][1:], [0.0]])  # sum_{m > k} y_m
    d = self.p_inf + (-math.expm1(-self.h)) * tail_y  # D_k, non-increasing
    k = int(np.argmax(d <= delta))  # first index where the curve is low enough (d[-1]=p_inf)
    t_k = (self.start + k) * self.h
    if k == 0:
      # Below t_0 all finite mass lies above eps: D(eps) = p_inf + S - e^(eps - t_0) y_0.
      total = float(np.sum(pmf))
      excess = self.p_inf + total - delta
      if excess <= 0.0 or y[0] <= 0.0:
        return 0.0
      return max(0.0, t_k + math.log(excess / y[0]))
    g_prev = decay * y[k]  # sum_{j >= k} pmf_j e^{-(t_j - t_{k-1})}
    d_prev = d[k - 1]
    if g_prev <= 0.0:
      return max(0.0, t_k)
    eps = (t_k - self.h) + math.log1p((d_prev - delta) / g_prev)
    return max(0.0, min(eps, t_k))


def _log_mgf_bounds(i_lo: int, pmf: np.ndarray, h: float, lams: np.ndarray) -> np.ndarray:
  """Upper bounds on log sum_k pmf_k exp(lam t_k) for each lam (finite part of the PLD).

  The pmf is summed over at most _MGF_BLOCKS blocks, each placed at its largest loss for
  lam > 0 and at its smallest for lam < 0, which can only increase the sum.
  """
  n = pmf.size
  width = max(1, -(-n // _MGF_BLOCKS))
  n_blocks = -(-n // width)
  padded = np.zeros(n_blocks * width)
  padded[:n] = pmf
  block_mass = padded.reshape(n_blocks, width).sum(axis=1)
  first = (i_lo + np.arange(n_blocks) * width) * h
  last = np.minimum(first + (width - 1) * h, (i_lo + n - 1) * h)
  with np.errstate(divide="ignore"):
    log_mass = np.log(block_mass)
  loc = np.where(lams[:, None] > 0.0, last[None, :], first[None, :])
  return special.logsumexp(log_mass[None, :] + lams[:, None] * loc, axis=1)


def _fft_compose(steps_pmfs, lo_idx: int, size: int, lam: float, h: float):
  """Cyclic FFT composition of the one-step PLDs exponentially tilted by exp(lam t).

  Each one-step pmf w is replaced by w e^{lam t} / M(lam) with M(lam) = sum_t w e^{lam t}
  (a probability vector), raised to its step count in the Fourier domain, and the phases are
  multiplied.  Returns (c, log_scale): the composed (untilted) mass at loss (lo_idx + k) h is
  c[k] * exp(log_scale - lam (lo_idx + k) h), with log_scale = sum count * log M(lam).
  Tilting by the saddle point of the query makes the FFT's absolute round-off (~1e-17 of the
  largest value) relative to the mass near the query instead of relative to the bulk.

  The finite part of each one-step PLD has total mass 1 - p_inf (1 when tilted), but its
  float64 sum is off by ~1e-16, and raising to ``count`` multiplies that: at 1e9 steps a sum
  of 1 - 1.1e-16 loses 1e-7 of the composed mass (delta under-reported by 1e-7 relative).  So
  the composition is scaled up by prod (expected / computed sum)^count over the phases where
  the sum fell short (never down: extra mass only increases delta).
  """
  spectrum = None
  log_scale = 0.0
  log_fix = 0.0
  for i_lo, pmf, p_inf, count in steps_pmfs:
    if lam == 0.0:
      w = pmf
      log_expected = math.log1p(-p_inf)
    else:
      t = (i_lo + np.arange(pmf.size)) * h
      with np.errstate(divide="ignore"):
        log_w = np.log(pmf) + lam * t
      top = float(np.max(log_w))
      w = np.exp(log_w - top)
      total = float(np.sum(w))
      w /= total
      log_scale += count * (top + math.log(total))
      log_expected = 0.0
    idx = (i_lo + np.arange(w.size)) % size
    wrapped = np.bincount(idx, weights=w, minlength=size)
    one_step = sp_fft.rfft(wrapped)
    computed = float(one_step[0].real)  # the sum that is raised to the power count
    if computed > 0.0:
      log_fix += count * max(0.0, log_expected - math.log(computed))
    factor = np.power(one_step, count)
    spectrum = factor if spectrum is None else spectrum * factor
  composed = sp_fft.irfft(spectrum, n=size)
  # Round-off leaves noise of ~1e-17 of the largest value, partly negative; clip at 0.
  np.maximum(composed, 0.0, out=composed)
  if log_fix > 0.0:
    composed *= math.exp(log_fix)
  return np.roll(composed, -lo_idx), log_scale  # composed[k] is at loss (lo_idx + k) h


class _ComposedDirection:
  """The composed PLD of one direction (add or remove), with tail-accurate queries.

  ``plain`` is the untilted composition.  A query at eps (or at the epsilon found from
  ``plain``) is refined with a composition tilted at the Chernoff-optimal lam for eps, keeping
  only grid losses >= eps_low = eps - margin, where the untilted values are recovered without
  overflow.  Tilting changes what cyclic wrap-around costs: a true loss s above the tilted
  window's top aliases down to s - m N h and, if that lies above eps_low, with its weight
  multiplied by at most e^{lam (s - eps_low)}.  The total is at most
  exp(K(theta) - lam eps_low - (theta - lam) top) for any theta > lam (K the log-MGF bound of
  the composition), which is added to delta (nothing when the window reaches the support's top).
  """

  def __init__(self, steps_pmfs, h, lo_idx, size, support, p_inf, wrap_mass, lams, log_mgf):
    self._steps_pmfs = steps_pmfs
    self._lo_support, self._hi_support = support  # grid indices bounding the true support
    self._p_inf = p_inf  # exact mass at +inf (from the one-step truncations)
    self._h = h
    self._lams = lams
    self._log_mgf = log_mgf
    composed, _ = _fft_compose(steps_pmfs, lo_idx, size, 0.0, h)
    self.plain = _DiscretePLD(lo_idx, composed, p_inf + wrap_mass, h)
    self._tilted = {}

  def _tilt_for(self, epsilon: float):
    """Grid lam > 0 minimising the Chernoff exponent K(lam) - lam eps; None if eps <= mean."""
    pos = self._lams > 0.0
    lams, log_mgf = self._lams[pos], self._log_mgf[pos]
    best = int(np.argmin(log_mgf - lams * epsilon))
    if best == 0 and log_mgf[0] - lams[0] * epsilon >= 0.0:
      return None
    return float(lams[best])

  def _tail(self, lam: float, eps_low: float):
    """Untilted composed PLD restricted to grid losses >= eps_low (a _DiscretePLD), or None.

    The tilted composition gets its own cyclic window [bottom, top]: ``top`` is chosen so that
    the aliasing bound of the class docstring is <= _TAIL_MASS / 4, ``bottom`` <= eps_low so
    that the window is at least 40 / lam wide (mass below it aliases upwards with weight at
    most e^{-lam N h} <= e^{-40}, which can only increase delta).  None if that window would
    exceed _MAX_GRID_SIZE or no exponent theta > lam is available.
    """
    h = self._h
    above = self._lams > lam
    if not np.any(above):
      return None
    thetas, log_mgf = self._lams[above], self._log_mgf[above]
    log_inv = math.log(4.0 / _TAIL_MASS)
    reach = float(np.min((log_mgf - lam * eps_low + log_inv) / (thetas - lam)))
    top = self._hi_support
    if reach < top * h:
      top = max(math.ceil(reach / h), math.floor(eps_low / h))
    bottom = min(math.floor(eps_low / h), top - math.ceil(40.0 / (lam * h)))
    bottom = max(bottom, self._lo_support)
    size = sp_fft.next_fast_len(top - bottom + 1, real=True)
    if size > _MAX_GRID_SIZE:
      return None
    key = (lam, bottom, size)
    if key not in self._tilted:
      self._tilted.clear()  # keep at most one tilted grid in memory
      self._tilted[key] = _fft_compose(self._steps_pmfs, bottom, size, lam, h)
    composed, log_scale = self._tilted[key]
    j0 = min(max(math.ceil(eps_low / h) - bottom, 0), size - 1)
    t = (bottom + j0 + np.arange(size - j0)) * h
    with np.errstate(divide="ignore"):
      log_pmf = np.log(composed[j0:]) + log_scale - lam * t
    pmf = np.exp(np.minimum(log_pmf, 700.0))
    p_inf = self._p_inf
    if top < self._hi_support:
      # True losses s > top alias to positions above eps_low with weight <= e^{lam(s-eps_low)}.
      wrap = float(np.min(log_mgf - lam * eps_low - (thetas - lam) * top * h))
      p_inf += math.exp(min(wrap, 0.0))
    return _DiscretePLD(bottom + j0, pmf, p_inf, h)

  def delta(self, epsilon: float) -> float:
    lam = None if math.isinf(epsilon) else self._tilt_for(epsilon)
    tail = None if lam is None else self._tail(lam, epsilon)
    if tail is None:
      return self.plain.delta(epsilon)
    return tail.delta(epsilon)

  def epsilon(self, delta: float) -> float:
    anchor = self.plain.epsilon(delta)
    if math.isinf(anchor):
      return anchor
    lam = self._tilt_for(anchor)
    if lam is None:
      return anchor
    margin = min(1.0, 30.0 / lam)
    tail = self._tail(lam, anchor - margin)
    if tail is None or tail.delta(tail.start * self._h) <= delta:
      return anchor  # the solution lies below the refined range; keep the plain one
    return tail.epsilon(delta)


def _compose_direction(steps_pmfs, h: float):
  """Composes [(i_lo, pmf, p_inf, count)] one-step PLDs; returns (_ComposedDirection, size).

  Returns None instead of the composition when the grid would exceed _MAX_GRID_SIZE.
  """
  log_finite = 0.0
  for _, _, p_inf, count in steps_pmfs:
    log_finite += count * math.log1p(-p_inf) if p_inf < 1.0 else -math.inf
  p_inf_total = -math.expm1(log_finite)
  if p_inf_total >= 1.0:
    return _DiscretePLD(0, np.zeros(1), 1.0, h), 1

  # Support of the composition and moments for choosing Chernoff exponents.
  lo_support = hi_support = 0
  var = 0.0
  for i_lo, pmf, _, count in steps_pmfs:
    nz = np.flatnonzero(pmf)
    if nz.size == 0:
      continue
    lo_support += count * (i_lo + int(nz[0]))
    hi_support += count * (i_lo + int(nz[-1]))
    t = (i_lo + np.arange(pmf.size)) * h
    w = pmf / np.sum(pmf)
    m = float(np.sum(w * t))
    var += count * float(np.sum(w * (t - m) ** 2))
  wrap_tail = _TAIL_MASS / 4.0
  log_inv = math.log(1.0 / wrap_tail)
  lam_star = math.sqrt(2.0 * log_inv / max(var, 1e-300))
  lam_star = min(max(lam_star, 1e-8), 1e8)
  # The Gaussian guess lam_star can be far off for very skewed one-step PLDs (e.g. a mass of
  # ~1e-16 one grid step up, over 1e8 steps: the useful lam is ~1e-5 lam_star), so the grid
  # spans eleven decades; a poor range makes the Chernoff window as wide as the support.
  lams = lam_star * np.logspace(-8.0, 3.0, 133)
  lams = np.concatenate([lams, -lams])
  log_mgf = np.zeros(lams.size)
  for i_lo, pmf, _, count in steps_pmfs:
    log_mgf += count * _log_mgf_bounds(i_lo, pmf, h, lams)
  pos = lams > 0.0
  # P(S >= a) <= exp(K(lam) - lam a) <= wrap_tail  for  a = (K(lam) + log_inv) / lam.
  a = float(np.min((log_mgf[pos] + log_inv) / lams[pos]))
  b = float(np.max((log_mgf[~pos] + log_inv) / lams[~pos]))  # lams[~pos] < 0
  hi_idx = hi_support
  wrap_mass = 0.0
  if math.isfinite(a) and a < hi_support * h:
    hi_idx = max(math.ceil(a / h), lo_support)
    # Mass above hi_idx * h aliases to smaller losses: add its Chernoff bound to delta.
    wrap_mass = math.exp(min(0.0, float(np.min(log_mgf[pos] - lams[pos] * hi_idx * h))))
  lo_idx = lo_support
  if math.isfinite(b) and b > lo_support * h:
    lo_idx = min(math.floor(b / h), hi_idx)
  size = sp_fft.next_fast_len(hi_idx - lo_idx + 1, real=True)
  if size > _MAX_GRID_SIZE:
    return None, size
  return _ComposedDirection(steps_pmfs, h, lo_idx, size, (lo_support, hi_support),
                            p_inf_total, wrap_mass, lams, log_mgf), size


class PLDAccountant(_accountant.Accountant):
  """PLD accountant implementing :class:`analysis.accountant.Accountant`.

  Supports plain Gaussian releases and the Poisson-subsampled Gaussian (``q`` in [0, 1],
  add-or-remove-one or zero-out adjacency), i.e. the atoms of :func:`analysis.events.flatten`
  except sampling without replacement (use the RDP accountant for those).  Atoms with the same
  (q, sigma) are merged (composition commutes).  The composed PLDs are built lazily on the
  first query and cached until the next ``compose``.  Noise multipliers below 1e-3 are
  accounted as 0 and above 1e12 as 1e12 (sound; docs/design/pld_accountant.md).  At most 1e10
  steps in total.

  Args:
    value_discretization_interval: grid spacing ``h`` of privacy losses, in nats, in (0, 1].
      Smaller is tighter and slower (cost ~ 1/h); the excess of the bound shrinks ~h^2.
    rdp_cap: if True, :meth:`get_epsilon` / :meth:`get_delta` report the smaller of the PLD
      and the RDP bound (both valid; see :func:`compute_epsilon_with_rdp_cap`); this is what
      the public accountant name ``"pld"`` means.  Default False: the PLD bound alone.

  Raises:
    ValueError: h outside (0, 1]; in :meth:`compose`, an argument out of range or a total
      number of steps above :data:`MAX_STEPS` (1e10).
    analysis.events.UnsupportedEventError: in :meth:`compose`, sampling without replacement.
  """

  #: The most steps this accountant composes (:data:`MAX_STEPS`).
  max_steps = MAX_STEPS

  #: How this accountant's bound is described in a privacy statement.
  method = "privacy-loss-distribution (PLD) accounting"

  def __init__(self, value_discretization_interval: float = 1e-4, *, rdp_cap: bool = False):
    super().__init__()
    self._h = _check_value_discretization_interval(value_discretization_interval)
    if not isinstance(rdp_cap, bool):
      raise ValueError(f"rdp_cap must be True or False, got {rdp_cap!r}.")
    self._rdp_cap = rdp_cap
    self._composed = None
    self._h_used = self._h
    #: Whether the last epsilon query with ``rdp_cap`` returned the RDP bound, and its order.
    self.last_from_rdp = False
    self.last_rdp_order = None
    self.last_rdp_order = None

  @property
  def value_discretization_interval(self) -> float:
    """The requested grid spacing h (nats)."""
    return self._h

  @property
  def value_discretization_interval_used(self) -> float:
    """The spacing actually used by the last query (larger than requested only if the grid
    would otherwise exceed 2**22 points)."""
    return self._h_used

  @property
  def _phases(self) -> dict:
    """{(q, accounted sigma): steps} of the ledger (q = 1 for plain Gaussian releases)."""
    phases: dict[tuple[float, float], int] = {}
    for atom in self.atoms:
      key = (1.0 if atom.sampling is None else atom.sampling,
             _numerics.clamp_noise(atom.noise_multiplier, MIN_NOISE_MULTIPLIER,
                                  MAX_NOISE_MULTIPLIER))
      phases[key] = phases.get(key, 0) + atom.count
    return phases

  def _check_atoms(self, atoms) -> None:
    for atom in atoms:
      if isinstance(atom.sampling, tuple):
        raise _events.UnsupportedEventError(
            "The PLD accountant does not support sampling without replacement; use the RDP "
            "accountant (analysis.rdp_accountant.RdpAccountant, accountant='rdp').")
    total = sum(a.count for a in self.atoms)
    for atom in atoms:
      total += atom.count
      if total > MAX_STEPS:
        raise ValueError(
            f"steps must keep the accountant's total in [0, {MAX_STEPS}] ({_STEPS_WHY}); "
            f"adding {atom.count} steps would make it {total}.")

  def _changed(self) -> None:
    self._composed = None

  def _build(self):
    if self._composed is not None:
      return self._composed
    if not self._phases:
      self._composed = []
      return self._composed
    total_steps = sum(self._phases.values())
    step_tail = _TAIL_MASS / 4.0 / total_steps
    h = self._h
    widest = max(_step_loss_range(q, s, d, step_tail)
                 for (q, s) in self._phases for d in (_REMOVE, _ADD))
    if widest / h > _MAX_GRID_SIZE - 2:
      h = widest / (_MAX_GRID_SIZE - 2) * 1.01
    for _ in range(8):
      composed = []
      too_big = 0
      for direction in (_REMOVE, _ADD):
        steps_pmfs = []
        for (q, sigma), count in self._phases.items():
          i_lo, pmf, p_inf = _discretize_step(q, sigma, h, direction, step_tail)
          steps_pmfs.append((i_lo, pmf, p_inf, count))
        pld, size = _compose_direction(steps_pmfs, h)
        if pld is None:
          too_big = max(too_big, size)
          break
        composed.append(pld)
      if not too_big:
        self._h_used = h
        self._composed = composed
        return composed
      h *= too_big / _MAX_GRID_SIZE * 1.05
    raise RuntimeError("PLD grid could not be sized; this is a bug.")  # pragma: no cover

  def pld_epsilon(self, delta: float) -> float:
    """The PLD bound on epsilon alone (no exact-Gaussian rule, no RDP cap); delta in (0, 1)."""
    delta = check_delta("delta", delta)
    composed = self._build()
    return max(pld.epsilon(delta) for pld in composed) if composed else 0.0

  def pld_delta(self, epsilon: float) -> float:
    """The PLD bound on delta alone (no exact-Gaussian rule, no RDP cap); epsilon >= 0."""
    epsilon = check_nonnegative("epsilon", epsilon)
    composed = self._build()
    return max(pld.delta(epsilon) for pld in composed) if composed else 0.0

  def _epsilon(self, delta: float) -> float:
    pld_eps = self.pld_epsilon(delta)
    self.last_from_rdp, self.last_rdp_order = False, None
    if self._rdp_cap:
      rdp_eps, order = _rdp_epsilon([(q, s, c) for (q, s), c in self._phases.items()], delta)
      if rdp_eps < pld_eps:
        self.last_from_rdp, self.last_rdp_order = True, order
        return rdp_eps
    return pld_eps

  def _delta(self, epsilon: float) -> float:
    pld_delta = self.pld_delta(epsilon)
    if self._rdp_cap:
      pld_delta = min(pld_delta, _rdp_accountant_for(self._phases).get_delta(epsilon))
    return pld_delta


# ------------------------------------------------------------------------------------------
# Functional API.


def compute_epsilon(sampling_probability: float, noise_multiplier: float, steps: int,
                    delta: float, *, value_discretization_interval: float = 1e-4) -> float:
  """Epsilon (nats, >= 0, possibly inf) of ``steps`` DP-SGD steps; an upper bound.

  Args:
    sampling_probability: Poisson sampling probability q in [0, 1] (batch size / dataset size).
    noise_multiplier: noise std over the clipping norm, in [0, inf]; values below 1e-3 are
      accounted as 0 and values above 1e12 as 1e12 (sound upper bounds; design page).
    steps: number of steps, integer in [0, 1e10].
    delta: target delta in (0, 1).
    value_discretization_interval: loss grid spacing h (nats), in (0, 1].

  q = 0, steps = 0 or noise = inf give 0.  Noise 0 (or below 1e-3) with q > 0 gives inf
  unless 1 - (1 - q)^steps <= delta (then the exact, finite answer of the discrete PLD).

  Raises:
    ValueError: an argument out of the ranges above; the message names it.
  """
  q, sigma, count = _check_phase(sampling_probability, noise_multiplier, steps)
  delta = check_delta("delta", delta)
  accountant = PLDAccountant(value_discretization_interval)
  return accountant.compose(_poisson(q, sigma), count).pld_epsilon(delta)


def compute_delta(sampling_probability: float, noise_multiplier: float, steps: int,
                  epsilon: float, *, value_discretization_interval: float = 1e-4) -> float:
  """Delta in [0, 1] of ``steps`` DP-SGD steps at ``epsilon`` (nats, >= 0); an upper bound.

  Arguments (and their ranges) as in :func:`compute_epsilon`.  Noise 0 (or below 1e-3) with
  q > 0 gives 1 - (1 - q)^steps (up to the discretisation of the add direction, which cannot
  exceed that value).
  """
  q, sigma, count = _check_phase(sampling_probability, noise_multiplier, steps)
  epsilon = check_nonnegative("epsilon", epsilon)
  accountant = PLDAccountant(value_discretization_interval)
  return accountant.compose(_poisson(q, sigma), count).pld_delta(epsilon)


def compute_epsilon_heterogeneous(sampling_probabilities: Sequence[float],
                                  noise_multipliers: Sequence[float],
                                  steps_list: Sequence[int], delta: float, *,
                                  value_discretization_interval: float = 1e-4) -> float:
  """Epsilon (nats) of consecutive DP-SGD phases with their own q, sigma and step count.

  Phase i runs ``steps_list[i]`` steps with ``sampling_probabilities[i]`` and
  ``noise_multipliers[i]`` (ranges as in :func:`compute_epsilon`; at most 1e10 steps in
  total); all three sequences must have the same length (0 allowed, giving 0).  Each phase's
  one-step PLD is raised to its step count in the Fourier domain and the phases are multiplied
  there, all on one common grid; add and remove directions are composed
  separately and the larger epsilon is returned.  An upper bound, like compute_epsilon.
  """
  lengths = check_same_length(sampling_probabilities=sampling_probabilities,
                              noise_multipliers=noise_multipliers, steps_list=steps_list)
  delta = check_delta("delta", delta)
  accountant = PLDAccountant(value_discretization_interval)
  for i in range(lengths):
    q, sigma, count = _check_phase(
        sampling_probabilities[i], noise_multipliers[i], steps_list[i],
        names=(f"sampling_probabilities[{i}]", f"noise_multipliers[{i}]", f"steps_list[{i}]"))
    accountant.compose(_poisson(q, sigma), count)
  return accountant.pld_epsilon(delta)


class CappedEpsilon(NamedTuple):
  """Result of :func:`compute_epsilon_with_rdp_cap` (all epsilons in nats, in [0, inf]).

  Attributes:
    epsilon: min(pld_epsilon, rdp_epsilon), a valid epsilon at the given delta.
    pld_epsilon: the PLD bound (:func:`compute_epsilon_heterogeneous`).
    rdp_epsilon: the RDP bound (see :func:`compute_epsilon_with_rdp_cap`).
    rdp_order: the Renyi order attaining ``rdp_epsilon`` (None if it is inf or 0 without one).
    from_rdp: True when ``rdp_epsilon < pld_epsilon``, i.e. ``epsilon`` is the RDP bound.
  """
  epsilon: float
  pld_epsilon: float
  rdp_epsilon: float
  rdp_order: float | None
  from_rdp: bool


def _poisson(q: float, sigma: float) -> _events.DpEvent:
  return _events.PoissonSampledEvent(q, _events.GaussianEvent(sigma))


def _rdp_accountant_for(phases: dict) -> rdp_accountant.RdpAccountant:
  """An RDP accountant holding {(q, sigma): steps} phases."""
  rdp = rdp_accountant.RdpAccountant()
  for (q, sigma), count in phases.items():
    rdp.compose(_poisson(q, sigma), count)
  return rdp


def _rdp_epsilon(phases, delta: float):
  """(eps, order) of the RDP accountant for [(q, sigma, steps)] phases (steps > 0, q > 0).

  One phase: order optimised over the reals (``get_privacy_spent_optimal_order``, never worse
  than DEFAULT_ORDERS).  Several: sum of the phases' RDP on DEFAULT_ORDERS, best order.
  """
  if not phases:
    return 0.0, None
  if len(phases) == 1:
    (q, sigma, count), = phases
    eps, _, order = rdp_accountant.get_privacy_spent_optimal_order(q, sigma, count,
                                                                   target_delta=delta)
    return float(eps), order
  orders = rdp_accountant.DEFAULT_ORDERS
  qs, sigmas, counts = (list(column) for column in zip(*phases))
  rdp = rdp_accountant.compute_heterogeneous_rdp(qs, sigmas, counts, orders)
  with warnings.catch_warnings():
    # An optimum at the end of the orders is still a valid (if looser) bound.
    warnings.simplefilter("ignore", rdp_accountant.OrderAtBoundaryWarning)
    eps, _, order = rdp_accountant.get_privacy_spent(orders, rdp, target_delta=delta)
  return float(eps), order


def compute_epsilon_with_rdp_cap(sampling_probabilities: Sequence[float],
                                 noise_multipliers: Sequence[float],
                                 steps_list: Sequence[int], delta: float, *,
                                 value_discretization_interval: float = 1e-4) -> CappedEpsilon:
  """The smaller of the PLD and the RDP epsilon of consecutive DP-SGD phases.

  Phases and ranges as in :func:`compute_epsilon_heterogeneous` (Poisson sampling, add-or-
  remove-one adjacency, at most 1e10 steps in total, delta in (0, 1)).  Both bounds are valid
  upper bounds on the same epsilon, so their minimum is one too.  PLD is the tighter one while
  the grid spacing actually used stays below about half the one-step loss spread (see "Range of
  validity against RDP" in docs/design/pld_accountant.md: e.g. up to ~35,000 epochs of
  MNIST, batch 256 and sigma 1.1); past that the RDP bound takes over.  The RDP bound is
  ``rdp_accountant.get_privacy_spent_optimal_order`` (order optimised over the reals) for a
  single (q, sigma) phase, else the summed RDP of the phases over
  ``rdp_accountant.DEFAULT_ORDERS``.

  Returns:
    A :class:`CappedEpsilon`; its ``epsilon`` is the number to report.

  Raises:
    ValueError: an argument out of range, as :func:`compute_epsilon_heterogeneous`.
  """
  pld_eps = compute_epsilon_heterogeneous(
      sampling_probabilities, noise_multipliers, steps_list, delta,
      value_discretization_interval=value_discretization_interval)  # validates everything
  merged: dict[tuple[float, float], int] = {}
  for q, sigma, count in zip(sampling_probabilities, noise_multipliers, steps_list):
    q, sigma, count = float(q), float(sigma), int(count)
    if count and q > 0.0 and not math.isinf(sigma):
      merged[(q, sigma)] = merged.get((q, sigma), 0) + count
  rdp_eps, order = _rdp_epsilon([(q, s, c) for (q, s), c in merged.items()], float(delta))
  from_rdp = rdp_eps < pld_eps
  return CappedEpsilon(epsilon=min(pld_eps, rdp_eps), pld_epsilon=float(pld_eps),
                       rdp_epsilon=rdp_eps, rdp_order=order, from_rdp=from_rdp)
