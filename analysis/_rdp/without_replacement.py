"""RDP of the Gaussian on batches sampled without replacement (docs/design/rdp_accountant.md,
"Sampling without replacement").
"""
from __future__ import annotations

import functools
import math

import numpy as np
from scipy import special

from analysis._numerics import log_expm1, logsumexp
from analysis._rdp.common import _EPS, _one_step, _rdp_curve
from analysis._rdp.forward_differences import (_WOR_FD_MAX_ORDER,
                                               _log_gauss_forward_differences)

@functools.lru_cache(maxsize=4096)
def _wor_log_moment_int(q: float, s: float, alpha: int) -> float:
  """Bound on (alpha - 1) eps_S(alpha) for the Gaussian, integer alpha: WBK19 Thms 9 and 27."""
  if alpha == 1:
    return 0.0
  m = 1.0 / (2.0 * s * s)
  log_q = math.log(q)
  j = np.arange(2, alpha + 1, dtype=np.float64)
  log_binom = special.gammaln(alpha + 1.0) - special.gammaln(j + 1.0) - special.gammaln(
      alpha - j + 1.0)
  # Theorem 9: 2 exp((j - 1) eps(j)) = 2 exp(m j (j - 1)).
  log_moment = math.log(2.0) + m * j * (j - 1.0)
  if alpha <= _WOR_FD_MAX_ORDER:
    # Theorem 27: 4 Delta^j for even j, 4 sqrt(Delta^(j-1) Delta^(j+1)) for odd j.
    log_fd = _log_gauss_forward_differences(s)[0]
    ji = np.arange(2, alpha + 1)
    odd = ji % 2
    log_xi = 0.5 * (log_fd[ji - odd] + log_fd[ji + odd])  # log_fd[j] itself for even j
    log_moment = np.minimum(log_moment, math.log(4.0) + log_xi)
  log_terms = log_binom + j * log_q + log_moment
  # j = 2: min(4 (e^{eps(2)} - 1), 2 e^{eps(2)}) (= 4 Delta^2 in Theorem 27 too).
  eps2 = 2.0 * m
  log_terms[0] = log_binom[0] + 2.0 * log_q + min(
      math.log(4.0) + log_expm1(eps2), math.log(2.0) + eps2)
  log_sum = logsumexp(log_terms)
  scale = (special.gammaln(alpha + 1.0) + np.abs(log_terms)).max() + alpha
  log_sum += 8.0 * _EPS * scale
  bound = float(np.logaddexp(0.0, log_sum))
  return min(bound, (alpha - 1.0) * alpha / (2.0 * s * s))


def _wor_interior(q: float, s: float, alpha: float) -> float:
  """The bound for 0 < q < 1, 0 < s < inf, 1 < alpha < inf (fractional orders interpolate)."""
  if float(alpha).is_integer():
    return _wor_log_moment_int(q, s, int(alpha)) / (alpha - 1.0)
  f, c = math.floor(alpha), math.ceil(alpha)
  t = alpha - f
  moment = (1.0 - t) * _wor_log_moment_int(q, s, f) + t * _wor_log_moment_int(q, s, c)
  return moment / (alpha - 1.0)


def _wor_one_step(q: float, s: float, alpha: float) -> float:
  return _one_step(q, s, alpha, _wor_interior)


def compute_rdp_sample_without_replacement(q: float, noise_multiplier: float, steps: int,
                                           orders):
  """RDP upper bound of ``steps`` Gaussian steps on fixed-size batches sampled without replacement.

  Replace-one adjacency; Wang, Balle & Kasiviswanathan (2019) Theorem 9 at integer orders
  >= 2, with the Gaussian-specific forward-difference terms of their Theorem 27 (orders up to
  256, as dp_accounting; docs/design/rdp_accountant.md), capped by the unsampled Gaussian's
  alpha / (2 s^2); at fractional orders the linear interpolation of (alpha - 1) * eps between
  floor(alpha) and ceil(alpha), which is an upper bound because (alpha - 1) * eps(alpha) is
  convex in alpha (at floor 1 it is 0).  The forward differences are evaluated without
  cancellation, so the values are the exact bound up to ~1e-12 relative: never above
  dp_accounting's by more than that, and below it where its float forward differences lose
  precision (e.g. 3.2e-5 against 0.415 at q = 0.9, sigma = 1000, alpha = 64, where the Gaussian
  cap binds).  Examples: q = 0.01, sigma = 2.5, 50 steps, alpha = 50: 0.0985
  (Theorem 9 alone: 0.154); q = 0.1, sigma = 2, 1000 steps, alpha = 3: 17.63 (18.80).

  Args:
    q: batch size / dataset size, in [0, 1].
    noise_multiplier: noise std / replace-one L2 sensitivity (2C for DP-SGD with clipping norm
      C), in [0, inf].
    steps: integer in [0, 2**53].
    orders: one order or a non-empty sequence of orders, each in (1, 1e6] or inf.

  Returns:
    Float for a scalar order, else ``np.ndarray``; nats, in [0, inf].  q = 0 gives 0; q = 1
    gives ``steps * alpha / (2 s^2)``; noise 0 (q > 0) or alpha = inf gives inf.

  Raises:
    ValueError: as :func:`compute_rdp`.
  """
  return _rdp_curve(_wor_one_step, q, noise_multiplier, steps, orders)
