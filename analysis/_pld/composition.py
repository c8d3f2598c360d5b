"""Composition of discrete privacy-loss distributions by FFT, with every truncation,
wrap-around and round-off bounded (docs/design/pld_accountant.md, "Truncation and wrap-around").
"""
from __future__ import annotations

import math

import numpy as np
from scipy import fft as sp_fft
from scipy import signal as sp_signal
from scipy import special

# Total probability mass that truncation / wrap-around may add to delta (design page).
_TAIL_MASS = 1e-18
# Largest number of grid points for the one-step PLD and for the composed (cyclic) grid.
_MAX_GRID_SIZE = 1 << 22
# Number of coarse blocks used to bound the moment generating function of a one-step PLD.
_MGF_BLOCKS = 4096


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
