"""The forward differences Delta^n of the Gaussian's moments, bounded from both sides without
cancellation (docs/design/rdp_accountant.md, "Sampling without replacement").
"""
from __future__ import annotations

import functools
import math

import numpy as np
from scipy import special

from analysis._rdp.common import _EPS

#: Forward differences of the Gaussian moments (WBK19 Thm 27) are used up to this order, as
#: dp_accounting does; above it the Theorem 9 terms alone.
_WOR_FD_MAX_ORDER = 256
def _fd_series_max_x(n: np.ndarray) -> np.ndarray:
  """Largest x_n = m n (n - 1) at which Delta^n is summed as a positive series.

  n (ln(n) / 2 + 1) + 20: about twice the x at which the alternating binomial sum's condition
  number falls below 1e4 (computed with mpmath for n <= 1025); beyond it that sum is used, with
  its round-off bound.
  """
  return n * (0.5 * np.log(np.maximum(n, 1.0)) + 1.0) + 20.0


@functools.lru_cache(maxsize=256)
def _log_gauss_forward_differences(s: float):
  """(upper, lower) bounds on log Delta^n, n = 0 .. _WOR_FD_MAX_ORDER + 1 (design page).

  Delta^n = sum_l C(n, l) (-1)^(n-l) exp(m l (l - 1)) = E_{z~N(0,s^2)}[(L(z) - 1)^n] with
  m = 1 / (2 s^2) and L the likelihood ratio N(1, s^2) / N(0, s^2).  Where no accurate value
  is available an upper entry is inf and a lower one -inf (the callers then fall back).
  The arrays are cached: do not modify them.
  """
  n_max = _WOR_FD_MAX_ORDER + 1
  m = 1.0 / (2.0 * s * s)
  log_m = math.log(m)
  n = np.arange(n_max + 1, dtype=np.float64)
  x = m * n * (n - 1.0)
  out = np.full(n_max + 1, math.inf)
  low = np.full(n_max + 1, -math.inf)
  out[0], out[1] = 0.0, -math.inf  # Delta^0 = 1, Delta^1 = E[L] - 1 = 0
  low[0] = 0.0
  # Positive series: (l (l - 1))^j = sum_k c_{j,k} l (l-1) ... (l-k+1) with c_{j,k} >= 0, so
  # Delta^n = n! sum_j m^j c_{j,n} / j!.  Scaled v_{j,k} = c_{j,k} m^(j - h_k) h_k! / j!
  # (h_k = ceil(k/2)) obeys the positive recurrence below; Delta^n = n! m^h_n / h_n! sum_j v_{j,n}.
  use_series = (n >= 2) & (x <= _fd_series_max_x(n))
  series = np.flatnonzero(use_series)
  if series.size:
    k_cut = int(series[-1])
    k = np.arange(k_cut + 1, dtype=np.float64)
    h = np.ceil(k / 2.0)
    c_a = h[2:]                                                          # times v_{j,k-2}
    c_b = 2.0 * (k[1:] - 1.0) * np.where(k[1:] % 2 == 0, m, (k[1:] + 1.0) / 2.0)  # v_{j,k-1}
    c_c = k * (k - 1.0) * m                                              # times v_{j,k}
    v = np.zeros(k_cut + 1)
    v[0] = 1.0
    acc = v.copy()
    log_scale = 0.0
    xs = x[series]
    log_xs = np.log(xs)
    hs = h[series]
    log_prefactor = special.gammaln(series + 1.0) - special.gammaln(hs + 1.0) + hs * log_m
    x_top = float(xs.max())
    j_max = int(k_cut // 2 + x_top + 12.0 * math.sqrt(x_top) + 200)
    j = 0
    while True:
      new = c_c * v
      new[1:] += c_b * v[:-1]
      new[2:] += c_a * v[:-2]
      j += 1
      v = new / j
      acc += v
      if j % 16 == 0 or j >= j_max:
        top = float(acc.max())
        if top > 1e200:  # rescale (a step multiplies by at most ~x_top / j + n^2)
          v /= top
          acc /= top
          log_scale += math.log(top)
        # Tail after term j: sum_{i > j} x^i / i! <= x^(j+1) / (j+1)! / (1 - x / (j+2)), from
        # n! c_{i,n} <= (n (n-1))^i (evaluate the expansion at l = n: all terms >= 0).
        with np.errstate(divide="ignore"):
          partial = log_prefactor + log_scale + np.log(acc[series])
        ratio = xs / (j + 2.0)
        log_tail = np.where(ratio < 1.0, (j + 1.0) * log_xs - special.gammaln(j + 2.0)
                            - np.log1p(-np.where(ratio < 1.0, ratio, 0.0)), math.inf)
        if np.all(log_tail <= partial + math.log(_EPS) - 2.0) or j >= j_max:
          break
    # Round-off: every operation is on non-negative numbers (<= 4 ulps per step and term),
    # and the log-space prefactor carries eps times the size of its parts.
    log_parts = (special.gammaln(series + 1.0) + special.gammaln(hs + 1.0) + hs * abs(log_m)
                 + abs(log_scale) + 1.0)
    rel = 4.0 * (j + 8.0) * _EPS + 4.0 * _EPS * log_parts
    out[series] = np.logaddexp(partial + np.log1p(rel), log_tail)
    low[series] = partial + np.log1p(-rel)  # the partial sum of positive terms, less round-off
  # Alternating binomial sum, with a bound on its floating-point error, for the other n
  # (one row per n; entries l > n are masked out).
  rest = np.flatnonzero((n >= 2) & ~use_series)
  if rest.size:
    nn = n[rest][:, None]
    l = n[None, : int(rest[-1]) + 1]
    valid = l <= nn
    log_fact = special.gammaln(n + 1.0)
    ni, li = rest[:, None], np.arange(int(rest[-1]) + 1)[None, :]
    log_t = np.where(valid, log_fact[ni] - log_fact[li] - log_fact[np.maximum(ni - li, 0)]
                     + (m * l) * (l - 1.0), -math.inf)
    shift = log_t.max(axis=1, keepdims=True)
    w = np.exp(log_t - shift)
    sign = np.where((nn - l) % 2 == 0, 1.0, -1.0)
    total = np.sum(sign * w, axis=1)
    # Each term has relative error <~ eps (|log term| + 16); the summation adds <= n eps sum w.
    err = 4.0 * _EPS * np.sum(w * (np.abs(np.where(valid, log_t, 0.0)) + 16.0 + nn), axis=1)
    upper, lower = total + err, total - err
    with np.errstate(divide="ignore"):
      log_upper = shift[:, 0] + np.log(np.where(upper > 0.0, upper, 1.0))
      log_lower = shift[:, 0] + np.log(np.where(lower > 0.0, lower, 1.0))
    # Delta^n > 0 (design page), so a non-positive bound means no information.
    out[rest] = np.where(upper > 0.0, log_upper, math.inf)
    low[rest] = np.where(lower > 0.0, log_lower, -math.inf)
  return out, low
