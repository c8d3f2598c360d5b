"""PATE mechanisms: GNMax, the threshold check of Confident / Interactive GNMax, LNMax.

Data-independent and data-dependent RDP and the bounds on q they use; formulas and
conditions in ``docs/design/pate.md`` ("Mechanisms and bounds")."""
from __future__ import annotations

import math

import numpy as np
from scipy import special

from analysis import _checks
from analysis._numerics import finish as _finish
from analysis._numerics import log1mexp, logsumexp
from analysis.pate._common import (_SQRT2, _check_finite_real, _check_votes, _lnmax_from_logq,
                                   _lnmax_independent, _theorem6)

# ------------------------------------------------------------------------------------------
# GNMax.


def _log_q_gnmax(votes: np.ndarray, sigma: float) -> float:
  m = votes.size
  if m == 1:
    return -math.inf
  top = int(np.argmax(votes))
  gaps = votes[top] - np.delete(votes, top)
  logq = logsumexp(special.log_ndtr(-gaps / (_SQRT2 * sigma)))
  return min(logq, math.log1p(-1.0 / m))


def log_q_gnmax(votes, sigma: float) -> float:
  """log of PATE 2018 Proposition 7's bound on q = Pr[GNMax answer != argmax votes].

  q <= sum_{i != i*} Phi(-(n_i* - n_i) / (sqrt(2) sigma)), capped at 1 - 1/m (docs/design/pate.md);
  -inf for one class (the answer is fixed).

  Args:
    votes: per-class vote counts (non-negative integers, at least one class).
    sigma: GNMax noise standard deviation, finite and > 0.
  """
  votes = _check_votes("votes", votes)
  sigma = _checks.check_finite_positive("sigma", sigma)
  return _log_q_gnmax(votes, sigma)


def rdp_gnmax_data_independent(sigma: float, orders):
  """RDP of one GNMax answer for any votes: lambda / sigma^2 (PATE 2018, Proposition 8).

  The Gaussian mechanism with noise multiplier sigma / sqrt(2) (L2 sensitivity sqrt(2)); argmax
  is post-processing.  ``orders`` in (1, inf]; float for one order, else an array (nats).
  """
  sigma = _checks.check_finite_positive("sigma", sigma)
  alphas, scalar = _checks.check_orders("orders", orders)
  return _finish(alphas / sigma**2, scalar)


def rdp_gnmax(votes, sigma: float, orders):
  """Data-dependent RDP of one GNMax answer on ``votes`` (PATE 2018, Theorem 6 + Prop. 7).

  The bound on D_lambda(M(votes) || M(votes')) for every neighbour votes' (one vote moved);
  at most :func:`rdp_gnmax_data_independent`; 0 for one class.  Formulas: docs/design/pate.md.

  Args:
    votes: per-class vote counts (non-negative integers, at least one class).
    sigma: noise standard deviation, finite and > 0.
    orders: one order or a non-empty sequence, each in (1, inf].

  Returns:
    Float (one order) or array of RDP values in nats.
  """
  votes = _check_votes("votes", votes)
  sigma = _checks.check_finite_positive("sigma", sigma)
  alphas, scalar = _checks.check_orders("orders", orders)
  return _finish(_theorem6([_log_q_gnmax(votes, sigma)], sigma, alphas)[0], scalar)


# ------------------------------------------------------------------------------------------
# Threshold check (Confident / Interactive GNMax).


def _log_pr_answered(votes: np.ndarray, threshold: float, sigma1: float) -> float:
  return float(special.log_ndtr((float(np.max(votes)) - threshold) / sigma1))


def _threshold_logq(log_p: float) -> float:
  """log min(p, 1 - p): the bound on the less likely outcome of the check."""
  return float(min(log_p, float(log1mexp(-log_p))))


def log_pr_answered(votes, threshold: float, sigma1: float, *, shifted: bool = False) -> float:
  """log Pr[max_j votes_j + N(0, sigma1^2) >= threshold] = log Phi((max votes - T) / sigma1).

  Args:
    votes: per-class vote counts; with ``shifted=True`` any finite reals (Interactive GNMax's
      ``votes - alpha * student_probabilities``), used as they are (no rounding).
    threshold: T, a finite real.
    sigma1: noise standard deviation of the check, finite and > 0.
  """
  votes = _check_votes("votes", votes, shifted=shifted)
  threshold = _check_finite_real("threshold", threshold)
  sigma1 = _checks.check_finite_positive("sigma1", sigma1)
  return _log_pr_answered(votes, threshold, sigma1)


def rdp_threshold_data_independent(sigma1: float, orders):
  """RDP of one threshold check for any votes: lambda / (2 sigma1^2) (sensitivity-1 Gaussian)."""
  sigma1 = _checks.check_finite_positive("sigma1", sigma1)
  alphas, scalar = _checks.check_orders("orders", orders)
  return _finish(alphas / (2.0 * sigma1**2), scalar)


def rdp_threshold(votes, threshold: float, sigma1: float, orders, *, shifted: bool = False):
  """Data-dependent RDP of one threshold check (PATE 2018, Theorem 6 on the binary outcome).

  q = min(p, 1 - p) with p = :func:`log_pr_answered`, and the Gaussian's RDP curve
  lambda / (2 sigma1^2), i.e. Theorem 6's formulas with s = sqrt(2) sigma1; at most
  :func:`rdp_threshold_data_independent`.  The cost is paid whether or not the query is
  answered.

  Args:
    votes: per-class vote counts, or with ``shifted=True`` the thresholded real-valued
      histogram of Interactive GNMax.
    threshold: T, a finite real.
    sigma1: finite, > 0.
    orders: one order or a non-empty sequence, each in (1, inf].
  """
  votes = _check_votes("votes", votes, shifted=shifted)
  threshold = _check_finite_real("threshold", threshold)
  sigma1 = _checks.check_finite_positive("sigma1", sigma1)
  alphas, scalar = _checks.check_orders("orders", orders)
  logq = _threshold_logq(_log_pr_answered(votes, threshold, sigma1))
  return _finish(_theorem6([logq], _SQRT2 * sigma1, alphas)[0], scalar)


# ------------------------------------------------------------------------------------------
# LNMax.


def _log_q_lnmax(votes: np.ndarray, scale: float) -> float:
  m = votes.size
  if m == 1:
    return -math.inf
  top = int(np.argmax(votes))
  x = (votes[top] - np.delete(votes, top)) / scale
  logq = logsumexp(np.log(2.0 + x) - x - math.log(4.0))
  return min(logq, math.log1p(-1.0 / m))


def log_q_lnmax(votes, laplace_scale: float) -> float:
  """log of PATE 2017 Theorem 3's bound on q = Pr[LNMax answer != argmax votes].

  q <= sum_{i != i*} (2 + g_i / b) / (4 exp(g_i / b)), g_i = n_i* - n_i, capped at 1 - 1/m;
  -inf for one class.

  Args:
    votes: per-class vote counts (non-negative integers).
    laplace_scale: b, the Laplace noise scale on each count, finite and > 0.
  """
  votes = _check_votes("votes", votes)
  scale = _checks.check_finite_positive("laplace_scale", laplace_scale)
  return _log_q_lnmax(votes, scale)


def rdp_lnmax_data_independent(laplace_scale: float, orders):
  """RDP of one LNMax answer for any votes (docs/design/pate.md).

  min(randomized response at eps = 2 / b, 2 x Laplace mechanism RDP at noise multiplier b);
  both exact for what they describe, and at most eps = 2 / b (the value at order inf).
  """
  scale = _checks.check_finite_positive("laplace_scale", laplace_scale)
  alphas, scalar = _checks.check_orders("orders", orders)
  return _finish(_lnmax_independent(2.0 / scale, alphas), scalar)


def rdp_lnmax(votes, laplace_scale: float, orders):
  """Data-dependent RDP of one LNMax answer (PATE 2017, Theorems 2 and 3).

  Pure eps = 2 / b per answer; for q < 1 / (e^eps + 1) the Theorem 2 bound, capped by
  :func:`rdp_lnmax_data_independent`; 0 for one class.

  Args:
    votes: per-class vote counts (non-negative integers).
    laplace_scale: b, finite and > 0.
    orders: one order or a non-empty sequence, each in (1, inf].
  """
  votes = _check_votes("votes", votes)
  scale = _checks.check_finite_positive("laplace_scale", laplace_scale)
  alphas, scalar = _checks.check_orders("orders", orders)
  return _finish(_lnmax_from_logq([_log_q_lnmax(votes, scale)], 2.0 / scale, alphas)[0],
                 scalar)
