"""Smooth sensitivity of the PATE data-dependent RDP and the GNSS release's own cost.

Local-sensitivity bounds U^(d) for GNMax and the threshold check (PATE 2018, Section 4 and
Appendices B-C); how they are built and why they are sound: ``docs/design/pate.md``
("Smooth sensitivity")."""
from __future__ import annotations

import functools
import math

import numpy as np
from scipy import special

from analysis import _checks
from analysis._numerics import log1mexp
from analysis.pate._common import (_LOG_HALF, _SQRT2, _check_beta, _check_finite_real,
                                   _check_num_teachers, _check_order, _check_votes,
                                   _theorem6)
from analysis.pate._mechanisms import _log_q_gnmax

# ------------------------------------------------------------------------------------------
# Smooth sensitivity.


def _shift_logq(logq, m: int, shift):
  """log of (m - 1) Phi(Phi^-1(q / (m - 1)) + shift), capped at log(1 - 1/m) (B_U / B_L)."""
  logq = np.asarray(logq, dtype=np.float64)
  log_m1 = math.log(m - 1)
  with np.errstate(all="ignore"):
    z = special.ndtri_exp(np.minimum(logq - log_m1, 0.0))
    out = log_m1 + special.log_ndtr(z + shift)
  out = np.where(np.isneginf(logq), -np.inf, out)
  return np.minimum(out, math.log1p(-1.0 / m))


@functools.lru_cache(maxsize=1024)
def _log_q0(s: float, order: float) -> float:
  """log q0: F(q) is the data-independent bound for q >= q0 (F = Theorem 6 curve, s, order).

  Bisection on log q between a point where the data-dependent bound applies and is smaller
  and log q = 0, where it does not; -inf when it applies nowhere above exp(-1e12).
  """
  indep = order / s**2

  def below(logq: float) -> bool:
    return bool(_theorem6([logq], s, [order])[0, 0] < indep)

  low = -1.0
  while not below(low):
    low *= 2.0
    if low < -1e12:
      return -math.inf
  high = 0.0
  for _ in range(200):
    middle = 0.5 * (low + high)
    if below(middle):
      low = middle
    else:
      high = middle
    if high - low <= 1e-12 * max(1.0, abs(low)):
      break
  return high


def _grid_logq(s: float, order: float, top: float) -> np.ndarray | None:
  """An increasing grid of log q from far below q0 to ``top`` (geometric in -log q).

  The bottom is where F, at a generous over-estimate of B_U of it (log q + 3 sqrt(-2 log q) / s
  + 20), has fallen below 1e-15 of lambda / s^2; only the tightness depends on this choice (the
  bound used below the grid is exact, see :func:`_gnmax_table`).  None when F is the constant
  data-independent bound (q0 = 0).
  """
  logq0 = _log_q0(s, order)
  if not math.isfinite(logq0):
    return None
  indep = order / s**2
  bottom = min(4.0 * logq0, top) - 100.0
  while (_theorem6([bottom + 3.0 * math.sqrt(-bottom) * _SQRT2 / s + 20.0], s, [order])[0, 0]
         > 1e-15 * indep and bottom > -1e9):
    bottom *= 2.0
  grid = -np.geomspace(-bottom, max(-top, 1e-12), _GRID_POINTS)
  grid[-1] = top
  return grid


_GRID_POINTS = 20001


@functools.lru_cache(maxsize=256)
def _gnmax_table(s: float, order: float, m: int):
  """Cell bounds on G for GNMax's local sensitivity (docs/design/pate.md), or None if F is constant.

  Returns ``(grid, bounds, c5)``: ``grid`` increasing log q values g_0 < ... < g_N = log(1 - 1/m);
  ``bounds[0]`` bounds G on (0, e^g_0] and ``bounds[k + 1]`` bounds G on [e^g_k, e^g_(k+1)]:
  for q in that cell, F non-decreasing gives F(B_U(q)) - F(q) <= F(B_U(e^g_(k+1))) - F(e^g_k) and
  F(q) - F(B_L(q)) <= F(e^g_(k+1)) - F(B_L(e^g_k)); below g_0, G <= F(B_U(e^g_0)).  ``c5``:
  whether F is non-decreasing on the grid (condition C5; if not, the bounds are not used).
  """
  cap = math.log1p(-1.0 / m)
  grid = _grid_logq(s, order, cap)
  if grid is None:
    return None
  step = _SQRT2 / s
  f = _theorem6(grid, s, [order])[:, 0]
  f_up = _theorem6(_shift_logq(grid, m, step), s, [order])[:, 0]
  f_down = _theorem6(_shift_logq(grid, m, -step), s, [order])[:, 0]
  c5 = bool(np.all(np.diff(f) >= -1e-9 * order / s**2))
  cells = np.maximum(f_up[1:] - f[:-1], f[1:] - f_down[:-1])
  bounds = np.maximum(np.concatenate([[f_up[0]], cells]), 0.0)
  return grid, bounds, c5


def _gnmax_g_many(logq, s: float, order: float, m: int) -> np.ndarray:
  """G(q) = max(F(B_U(q)) - F(q), F(q) - F(B_L(q)), 0) >= LS at each log q, for F non-decreasing."""
  logq = np.asarray(logq, dtype=np.float64).ravel()
  f = _theorem6(logq, s, [order])[:, 0]
  up = _theorem6(_shift_logq(logq, m, _SQRT2 / s), s, [order])[:, 0]
  down = _theorem6(_shift_logq(logq, m, -_SQRT2 / s), s, [order])[:, 0]
  return np.maximum(np.maximum(up - f, f - down), 0.0)


def _gnmax_g(logq: float, s: float, order: float, m: int) -> float:
  """G at one log q (see :func:`_gnmax_g_many`)."""
  return float(_gnmax_g_many([logq], s, order, m)[0])


@functools.lru_cache(maxsize=256)
def _gnmax_unimodal(s: float, order: float, m: int):
  """Where PATE 2018's conditions C5 and C6 hold, what makes G unimodal; None elsewhere.

  C5: F non-decreasing (checked by :func:`_gnmax_table`).  C6: F(B_U(q)) - F(q) non-decreasing
  for q <= q1 = B_L(q0).  Together they make G non-decreasing on (0, q1], at most
  lambda / s^2 - F(q1) on [q1, q0] and non-increasing on [q0, 1) (design page).  Checked on
  :func:`_gnmax_table`'s grid, on G itself: the running maximum of G from the left (up to q1)
  and from the right (from q0) may exceed G by at most ``slack`` = 1e-9 lambda / s^2, which is
  added to every value read off G.

  Returns ``(log_q1, log_q0, plateau, floor, slack)``: ``plateau`` bounds G everywhere,
  ``floor`` = F(B_U(e^g_0)) bounds G below the grid.
  """
  table = _gnmax_table(s, order, m)
  if table is None or not table[2]:
    return None
  grid, bounds, _ = table
  indep = order / s**2
  slack = 1e-9 * indep
  log_q0 = _log_q0(s, order)
  log_q1 = float(_shift_logq([log_q0], m, -_SQRT2 / s)[0])
  if not log_q1 <= log_q0:
    return None
  g = _gnmax_g_many(grid, s, order, m)
  rising = g[grid <= log_q1]
  if np.any(np.maximum.accumulate(rising) - rising > slack):
    return None  # C6 fails
  falling = g[grid >= log_q0][::-1]
  if np.any(np.maximum.accumulate(falling) - falling > slack):
    return None
  inside = g[(grid >= log_q1) & (grid <= log_q0)]
  floor = float(bounds[0])
  plateau = max(_gnmax_g(log_q1, s, order, m), _gnmax_g(log_q0, s, order, m),
                indep - float(_theorem6([log_q1], s, [order])[0, 0]),
                float(inside.max()) if inside.size else 0.0, floor) + slack
  return log_q1, log_q0, plateau, floor, slack


def _reach_gnmax(votes: np.ndarray, num_teachers: int, sigma: float):
  """The exact range of the capped Proposition 7 log q over histograms within distance d.

  For d = 0..num_teachers returns ``(log_lo, log_hi, hi_exact)``: ``log_lo[d]`` is the least log
  q within distance d (d votes moved, one at a time, from the largest non-top count to the
  top: greedy is optimal for this separable convex problem); ``log_hi[d]`` the largest, reached
  by moving d votes from the top to the second count where that keeps the top (gap
  n_(1) - n_(2) >= 2 d: ``hi_exact``), else the cap log(1 - 1/m).  Proof: design page.
  """
  m = votes.size
  cap = math.log1p(-1.0 / m)
  ordered = np.sort(votes)[::-1]
  top, rest = ordered[0], ordered[1:]
  d = np.arange(num_teachers + 1, dtype=np.float64)
  scale = _SQRT2 * sigma

  def capped_logq(gaps):  # rows of gaps to the top -> capped log q
    terms = special.log_ndtr(-gaps / scale)
    peak = terms.max(axis=1, keepdims=True)
    return np.minimum(peak[:, 0] + np.log(np.exp(terms - peak).sum(axis=1)), cap)

  # Largest: (top - d, second + d, the others unchanged).
  hi_exact = top - rest[0] >= 2.0 * d
  gaps = (top - rest)[None, :] - d[:, None]
  gaps[:, 0] -= d
  log_hi = np.where(hi_exact, capped_logq(np.maximum(gaps, 0.0)), cap)
  # Least: k = min(d, sum(rest)) votes taken from the largest non-top counts, i.e. every count
  # above a level L cut to L, where R(L) = sum max(0, rest - L) <= k < R(L - 1), and the
  # k - R(L) votes left taken one each from counts at L.
  k = np.minimum(d, rest.sum())
  levels = np.arange(int(rest[0]) + 1, dtype=np.float64)
  removed = np.maximum(rest[None, :] - levels[:, None], 0.0).sum(axis=1)  # R(L), decreasing
  index = np.searchsorted(-removed, -k, side="left")
  left = np.minimum(rest[None, :], levels[index][:, None])
  left -= np.arange(rest.size)[None, :] < (k - removed[index])[:, None]
  log_lo = capped_logq((top + k)[:, None] - left)
  return log_lo, log_hi, hi_exact


def _ls_gnmax(votes: np.ndarray, num_teachers: int, sigma: float, order: float) -> np.ndarray:
  m = votes.size
  out = np.zeros(num_teachers + 1)
  if m == 1:
    return out  # the answer is fixed: f = 0 everywhere
  table = _gnmax_table(sigma, order, m)
  if table is None:
    return out  # F is the constant lambda / sigma^2: f never changes
  grid, bounds, c5 = table
  if not c5:
    out[:] = order / sigma**2  # 0 <= F <= lambda / sigma^2: the trivial bound
    return out
  logq = _log_q_gnmax(votes, sigma)
  log_lo, log_hi, hi_exact = _reach_gnmax(votes, num_teachers, sigma)
  shape = _gnmax_unimodal(sigma, order, m)
  if shape is not None:
    # C5 and C6 hold: G is unimodal, so its maximum over [lo, hi] is G at the end nearer the
    # plateau [q1, q0], or at most the plateau value when the range meets [q1, q0].
    log_q1, log_q0, plateau, floor, slack = shape
    rising = hi_exact & (log_hi < log_q1)
    falling = log_lo > log_q0
    out[:] = plateau
    out[rising] = np.maximum(_gnmax_g_many(log_hi[rising], sigma, order, m) + slack, floor)
    out[falling] = _gnmax_g_many(log_lo[falling], sigma, order, m) + slack
    out[0] = _gnmax_g(logq, sigma, order, m)  # LS(votes) <= G(q) directly
    return np.maximum.accumulate(out)
  # Cell bounds: index into ``bounds`` of the cell holding each end (0: below the grid).
  last = bounds.size - 1
  i_lo = np.clip(np.searchsorted(grid, log_lo, side="right"), 0, last)
  i_hi = np.clip(np.searchsorted(grid, log_hi, side="right"), 0, last)
  centre = int(np.clip(np.searchsorted(grid, logq, side="right"), 0, last))
  left = np.maximum.accumulate(bounds[:centre + 1][::-1])[::-1]  # max bounds[i..centre]
  right = np.maximum.accumulate(bounds[centre:])  # max bounds[centre..j]
  out = np.maximum(left[np.minimum(i_lo, centre)], right[np.maximum(i_hi, centre) - centre])
  out[0] = _gnmax_g(logq, sigma, order, m)  # LS(votes) <= G(q) directly
  out = np.maximum.accumulate(out)
  out[-1] = max(out[-1], float(bounds.max()))  # all histograms are in reach: global maximum
  return out


def local_sensitivity_gnmax(votes, num_teachers: int, sigma: float, order: float) -> np.ndarray:
  """Bounds U^(d), d = 0..num_teachers, on the local sensitivity of :func:`rdp_gnmax` at
  ``order`` anywhere within distance d (moved votes) of ``votes`` (PATE 2018, Appendix B).

  U^(d) bounds G(q) = max(F(B_U(q)) - F(q), F(q) - F(B_L(q))) >= LS over the exact range of q
  within distance d.  Where PATE 2018's conditions C5 and C6 hold for (sigma, order, number of
  classes), checked at run time, G is unimodal and U^(d) is G at the end of that range nearer
  its peak, as in PATE 2018's Algorithms 3-5; where C6 fails, the maximum of cell bounds on G
  over the range; where C5 fails, lambda / sigma^2.  ``docs/design/pate.md`` has the proofs.

  Non-decreasing in d; U^(d)(D) <= U^(d+1)(D') for neighbours; the last entry bounds every
  histogram with the same number of votes (all are within num_teachers), so it holds for every
  larger d.

  Args:
    votes: per-class vote counts (non-negative integers).
    num_teachers: integer >= 1, at least sum(votes).
    sigma: GNMax noise standard deviation, finite and > 0.
    order: one Renyi order in (1, 1e6].

  Returns:
    Array of length num_teachers + 1 (nats).
  """
  votes = _check_votes("votes", votes)
  n = _check_num_teachers(num_teachers, votes, shifted=False)
  sigma = _checks.check_finite_positive("sigma", sigma)
  order = _check_order("order", order)
  return _ls_gnmax(votes, n, sigma, order)


def _discounted_max(beta: float, ls: np.ndarray) -> float:
  return float(np.max(ls * np.exp(-beta * np.arange(ls.size))))


def smooth_sensitivity_gnmax(beta: float, votes, num_teachers: int, sigma: float,
                             order: float) -> float:
  """beta-smooth sensitivity max_d e^(-beta d) U^(d) of :func:`rdp_gnmax` at ``order``.

  ``beta`` finite, >= 0; other arguments as :func:`local_sensitivity_gnmax`.  Private: it is
  computed from the votes (publish only through the GNSS release).
  """
  beta = _check_beta(beta)
  return _discounted_max(beta, local_sensitivity_gnmax(votes, num_teachers, sigma, order))


@functools.lru_cache(maxsize=1024)
def _threshold_c5(s: float, order: float) -> bool:
  """F non-decreasing in q on (0, 1/2] (the check's q never exceeds 1/2), on a grid."""
  grid = _grid_logq(s, order, _LOG_HALF)
  if grid is None:
    return True
  f = _theorem6(grid, s, [order])[:, 0]
  return bool(np.all(np.diff(f) >= -1e-9 * order / s**2))


def _threshold_r(x, threshold: float, sigma1: float, order: float) -> np.ndarray:
  """r(x): the threshold check's data-dependent RDP when the checked maximum is x."""
  log_p = special.log_ndtr((np.asarray(x, dtype=np.float64) - threshold) / sigma1)
  logq = np.minimum(log_p, log1mexp(-log_p))
  return _theorem6(logq, _SQRT2 * sigma1, [order])[:, 0]


_WINDOW_STEP = 1.0 / 16.0  # h: the grid of window starts for shifted histograms


@functools.lru_cache(maxsize=256)
def _threshold_windows(threshold: float, sigma1: float, order: float):
  """Bounds on the oscillation of the unimodal r over every window [a, a + 1].

  Returns ``(k0, osc, left_tail, right_tail)``: for a in [k h, (k + 1) h), [a, a + 1] lies in
  [k h, k h + 1 + h], whose oscillation (r peaks at the threshold) is
  ``osc[k - k0]``, for k0 <= k < k0 + osc.size; windows further left have oscillation at most
  ``left_tail`` (= r at the grid's left end: r increases up to there), further right at most
  ``right_tail``.  The grid spans the threshold +- K, K doubling until r <= 1e-15 r(T) there.
  """
  h = _WINDOW_STEP
  peak = float(_threshold_r([threshold], threshold, sigma1, order)[0])
  reach = 12.0 * sigma1 + 4.0
  while (float(_threshold_r([threshold - reach], threshold, sigma1, order)[0]) > 1e-15 * peak
         and reach < 1e7):
    reach *= 2.0
  k0 = math.floor((threshold - reach) / h)
  k1 = math.ceil((threshold + reach) / h)
  starts = np.arange(k0, k1 + 1, dtype=np.float64) * h
  ends = starts + 1.0 + h
  top = _threshold_r(np.clip(threshold, starts, ends), threshold, sigma1, order)
  low = np.minimum(_threshold_r(starts, threshold, sigma1, order),
                   _threshold_r(ends, threshold, sigma1, order))
  osc = np.maximum(top - low, 0.0)
  left_tail = float(_threshold_r([k0 * h], threshold, sigma1, order)[0])
  right_tail = float(_threshold_r([(k1 + 1) * h], threshold, sigma1, order)[0])
  return k0, osc, left_tail, right_tail


def _ls_threshold(votes: np.ndarray, num_teachers: int, threshold: float, sigma1: float,
                  order: float, shifted: bool) -> np.ndarray:
  n = num_teachers
  x = float(np.max(votes))
  out = np.empty(n + 1)
  if not shifted:
    r = _threshold_r(np.arange(n + 1), threshold, sigma1, order)
    steps = np.abs(np.diff(r))  # steps[k] = |r(k+1) - r(k)|
    ls = np.zeros(n + 1)
    ls[:-1] = steps
    ls[1:] = np.maximum(ls[1:], steps)
    xi = int(x)
    for d in range(n + 1):
      out[d] = ls[max(0, xi - d):min(n, xi + d) + 1].max()
    out[-1] = ls.max()
    return out
  if not _threshold_c5(_SQRT2 * sigma1, order):
    out[:] = order / (2.0 * sigma1**2)  # 0 <= r <= lambda / (2 sigma1^2)
    return out
  k0, osc, left_tail, right_tail = _threshold_windows(threshold, sigma1, order)
  h = _WINDOW_STEP
  # d = 0: the neighbour's maximum y is in [x - 1, x + 1]; r unimodal.
  near = _threshold_r(np.array([x - 1.0, x, x + 1.0, float(np.clip(threshold, x - 1, x + 1))]),
                      threshold, sigma1, order)
  out[0] = max(near[3] - near[1], near[1] - min(near[0], near[2]), 0.0)
  # d >= 1: pairs (y, y'), y within d of x, |y - y'| <= 1, lie in [a, a + 1] for some
  # a in [x - d - 1, x + d]: windows k = floor((x - d - 1) / h) .. floor((x + d) / h).
  d = np.arange(1, n + 1, dtype=np.float64)
  k_lo = np.floor((x - d - 1.0) / h).astype(np.int64) - k0
  k_hi = np.floor((x + d) / h).astype(np.int64) - k0
  centre = int(np.clip(math.floor(x / h) - k0, 0, osc.size - 1))
  left = np.maximum.accumulate(osc[:centre + 1][::-1])[::-1]  # max osc[i..centre]
  right = np.maximum.accumulate(osc[centre:])  # max osc[centre..j]
  value = np.maximum(left[np.clip(k_lo, 0, centre)],
                     right[np.clip(k_hi, centre, osc.size - 1) - centre])
  value = np.where(k_lo < 0, np.maximum(value, left_tail), value)
  value = np.where(k_hi >= osc.size, np.maximum(value, right_tail), value)
  out[1:] = value
  out = np.maximum.accumulate(out)
  out[-1] = max(out[-1], float(osc.max()), left_tail, right_tail)  # the global maximum
  return out


def local_sensitivity_threshold(votes, num_teachers: int, threshold: float, sigma1: float,
                                order: float, *, shifted: bool = False) -> np.ndarray:
  """Bounds U^(d), d = 0..num_teachers, on the local sensitivity of :func:`rdp_threshold` at
  ``order`` within distance d of ``votes`` (PATE 2018, Appendix B; docs/design/pate.md).

  Exact for integer votes; for ``shifted=True`` (real-valued thresholded histograms) the
  window bound of docs/design/pate.md.  Non-decreasing in d; the last entry is the global
  maximum.

  Args:
    votes: per-class vote counts, or the thresholded histogram with ``shifted=True``.
    num_teachers: integer >= 1 (at least sum(votes) for integer votes).
    threshold: T, finite.
    sigma1: finite, > 0.
    order: one Renyi order in (1, 1e6].
  """
  votes = _check_votes("votes", votes, shifted=shifted)
  n = _check_num_teachers(num_teachers, votes, shifted=shifted)
  threshold = _check_finite_real("threshold", threshold)
  sigma1 = _checks.check_finite_positive("sigma1", sigma1)
  order = _check_order("order", order)
  return _ls_threshold(votes, n, threshold, sigma1, order, shifted)


def smooth_sensitivity_threshold(beta: float, votes, num_teachers: int, threshold: float,
                                 sigma1: float, order: float, *, shifted: bool = False) -> float:
  """beta-smooth sensitivity max_d e^(-beta d) U^(d) of :func:`rdp_threshold` at ``order``.

  ``beta`` finite, >= 0; other arguments as :func:`local_sensitivity_threshold`.  Private.
  """
  beta = _check_beta(beta)
  return _discounted_max(beta, local_sensitivity_threshold(
      votes, num_teachers, threshold, sigma1, order, shifted=shifted))


def rdp_smooth_sensitivity_release(beta: float, sigma_ss: float, order: float) -> float:
  """RDP at ``order`` of the GNSS mechanism f(D) + SS_beta(D) N(0, sigma_ss^2).

  PATE 2018, Theorem 23: lambda e^(2 beta) / sigma_ss^2 + (beta lambda
  - log(1 - 2 lambda beta) / 2) / (lambda - 1), for a beta-smooth upper bound SS_beta on the
  local sensitivity of f.  Data-independent (publishable).

  Args:
    beta: in [0, 1 / (2 order)).
    sigma_ss: finite, > 0 (noise in units of the smooth sensitivity).
    order: lambda, finite, in (1, 1e6].
  """
  order = _check_order("order", order)
  beta = _check_beta(beta)
  if not beta < 1.0 / (2.0 * order):
    raise ValueError(f"beta must be in [0, 1 / (2 order)) = [0, {1.0 / (2.0 * order):g}) for "
                     f"order {order:g}, got {beta!r}.")
  sigma_ss = _checks.check_finite_positive("sigma_ss", sigma_ss)
  return (order * math.exp(2.0 * beta) / sigma_ss**2
          + (beta * order - 0.5 * math.log1p(-2.0 * order * beta)) / (order - 1.0))
