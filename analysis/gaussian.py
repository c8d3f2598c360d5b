"""The exact privacy of the Gaussian mechanism and of its compositions (no sampling).

For a query of L2 sensitivity 1 released with N(0, sigma^2 I) noise, the mechanism is
(eps, delta)-DP exactly when (Balle & Wang 2018, "Improving the Gaussian mechanism for
differential privacy", Theorem 8)

    delta(eps) = Phi(1 / (2 sigma) - eps sigma) - e^eps Phi(-1 / (2 sigma) - eps sigma),

with Phi the standard normal CDF; delta(eps) is strictly decreasing in eps, so the smallest
eps for a delta is found by root finding.  Composing Gaussian mechanisms with noise multipliers
sigma_i, each k_i times, is exactly one Gaussian mechanism with

    sigma_eff = (sum_i k_i / sigma_i^2) ^ (-1/2)

(the privacy loss of each is N(mu_i, 2 mu_i) with mu_i = 1 / (2 sigma_i^2), and the means and
variances add).  So DP-SGD without amplification by sampling (q = 1: every step sees every
example, or each example is used once per epoch and each epoch is one Gaussian release) has
the exact epsilon ``epsilon(sigma_eff, delta)``, below any RDP bound.

Units: eps in nats; sigma is the noise standard deviation relative to the sensitivity.
"""
from __future__ import annotations

import math

import numpy as np
from scipy import optimize, special

from analysis import _checks


def delta_for_epsilon(sigma: float, epsilon: float) -> float:
  """``delta(eps)`` of the Gaussian mechanism with noise multiplier ``sigma`` (see module doc).

  Args:
    sigma: noise multiplier in (0, inf).
    epsilon: eps in [0, inf).

  Computed in log space (``log_ndtr``) so that it stays accurate when both terms are tiny.
  """
  sigma = _checks.check_finite_positive("sigma", sigma)
  epsilon = _checks.check_nonnegative("epsilon", epsilon)
  if math.isinf(epsilon):
    return 0.0
  a = 1.0 / (2.0 * sigma) - epsilon * sigma
  b = -1.0 / (2.0 * sigma) - epsilon * sigma
  log_first = special.log_ndtr(a)
  log_second = epsilon + special.log_ndtr(b)
  # first - second = first * (1 - exp(log_second - log_first)), log_second < log_first.
  return float(np.exp(log_first) * -np.expm1(min(log_second - log_first, 0.0)))


def epsilon_for_delta(sigma: float, delta: float) -> float:
  """The smallest eps >= 0 with ``delta(eps) <= delta`` (the exact Gaussian epsilon).

  Args:
    sigma: noise multiplier in (0, inf]; ``inf`` gives 0.
    delta: in (0, 1).
  """
  delta = _checks.check_delta("delta", delta)
  sigma = _checks.check_positive("sigma", sigma)
  if math.isinf(sigma) or delta_for_epsilon(sigma, 0.0) <= delta:
    return 0.0
  high = 1.0
  while delta_for_epsilon(sigma, high) > delta:
    high *= 2.0
    if high > 1e12:
      return math.inf
  # The root's relative precision: ~1e-14 of eps (brentq's xtol and rtol).
  return float(optimize.brentq(lambda e: delta_for_epsilon(sigma, e) - delta, 0.0, high,
                               xtol=1e-15, rtol=4 * np.finfo(float).eps, maxiter=500))


def composed_noise_multiplier(sigmas, counts) -> float:
  """``sigma_eff = (sum_i k_i / sigma_i^2)^(-1/2)``: the one Gaussian mechanism equal to
  composing the Gaussian mechanism with noise multiplier ``sigmas[i]`` ``counts[i]`` times.

  Args:
    sigmas: noise multipliers in (0, inf] (inf: that release reveals nothing).
    counts: integers >= 0, same length.

  Returns ``inf`` when nothing is released.
  """
  _checks.check_same_length(sigmas=sigmas, counts=counts)
  total = 0.0
  for i, (sigma, count) in enumerate(zip(sigmas, counts)):
    sigma = _checks.check_positive(f"sigmas[{i}]", sigma)
    count = _checks.check_count(f"counts[{i}]", count)
    if count and not math.isinf(sigma):
      total += count / sigma / sigma  # inf when sigma**2 underflows: no noise
  return math.inf if total == 0.0 else 1.0 / math.sqrt(total)


def composed_epsilon(sigmas, counts, delta: float) -> float:
  """Exact eps of composing Gaussian mechanisms (no sampling): ``epsilon_for_delta`` of
  :func:`composed_noise_multiplier`."""
  return epsilon_for_delta(composed_noise_multiplier(sigmas, counts), delta)


def noise_multiplier_for_epsilon(target_epsilon: float, delta: float, count: int = 1) -> float:
  """The smallest sigma such that ``count`` compositions of the Gaussian mechanism with noise
  multiplier sigma are (target_epsilon, delta)-DP: ``sqrt(count) * s`` where ``s`` solves
  ``delta(target_epsilon; s) = delta`` (delta(eps) decreases in sigma).

  The closed-form special case of :func:`analysis.calibration.calibrate` (which, with a
  composed ``GaussianEvent``, returns the same sigma up to its tolerance): a root of the exact
  curve to ~1e-15, rounded up, kept here because the accountants build on this module and
  calibration builds on them.

  Args:
    target_epsilon: in (0, inf); delta: in (0, 1); count: integer >= 1.
  """
  target_epsilon = _checks.check_finite_positive("target_epsilon", target_epsilon)
  delta = _checks.check_delta("delta", delta)
  count = _checks.check_count("count", count, minimum=1)
  low, high = 1e-3, 1.0
  while delta_for_epsilon(high, target_epsilon) > delta:
    low, high = high, high * 2.0
  while delta_for_epsilon(low, target_epsilon) <= delta and low > 1e-12:
    low /= 2.0
  single = optimize.brentq(lambda s: delta_for_epsilon(s, target_epsilon) - delta, low, high,
                           xtol=1e-15, rtol=4 * np.finfo(float).eps, maxiter=500)
  # Round up by a few ulps so the returned sigma meets the target despite root-finding error.
  return float(np.nextafter(math.sqrt(count) * single * (1 + 1e-12), math.inf))
