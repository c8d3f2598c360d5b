"""Privacy analysis of PATE (Private Aggregation of Teacher Ensembles), without TensorFlow.

Notation and units
------------------
* ``votes``: a 1-D NumPy array (or sequence) of per-class teacher counts, one entry per class
  (m >= 1 classes; with one class every aggregator's answer is fixed and its data-dependent
  cost is 0).  Entries are non-negative and integer-valued, except where a function takes
  ``shifted=True`` (the thresholded histogram of Interactive GNMax, ``votes - alpha * p`` with
  the student's probabilities ``p``: any finite reals).
* Neighbouring vote histograms: one vote moved from one class to another (L1 change 2, L2
  change sqrt(2), every count by at most 1); the number of votes stays fixed.  Distances
  between histograms count moved votes.  Two data sets give such histograms when they differ
  in the data of one teacher only.  With ``tf_dpkit.pate.partition_indices`` (a fixed
  permutation of positions cut into balanced shards) that holds for *replacing* one record,
  the relation :attr:`PateAccountant.neighboring_relation` reports; adding or removing a record
  would shift later positions into other shards, so add/remove needs a partition that assigns
  every record by its own identity (e.g. a keyed hash of a record id), not by position.
* ``orders``: Renyi orders in (1, inf] (one number, giving a float, or a non-empty sequence,
  giving an array); all RDP values and epsilons are in nats.
* Noise: ``sigma`` (GNMax, Confident GNMax's ``sigma2``) and ``sigma1`` are standard
  deviations of the Gaussian noise on each count (votes units); ``laplace_scale`` b is the scale
  of the Laplace noise on each count.  All finite and > 0.

Every function validates its arguments and raises ``ValueError`` naming the argument and its
allowed range.

Mechanisms and bounds
---------------------
GNMax (Papernot, Song, Mironov, Raghunathan, Talwar & Erlingsson 2018, "Scalable Private
Learning with PATE", ICLR; "PATE 2018" below) answers ``argmax_j (n_j + N(0, sigma^2))``.

* Data-independent: the noisy histogram is the Gaussian mechanism with L2 sensitivity sqrt(2),
  i.e. noise multiplier sigma / sqrt(2), and argmax is post-processing:
  RDP(lambda) = lambda / sigma^2 (PATE 2018, Proposition 8) -- :func:`rdp_gnmax_data_independent`.
* q: with i* the argmax (any one of tied maxima) and gaps g_i = n_i* - n_i, Proposition 7's
  union bound q <= sum_{i != i*} Pr[N(0, 2 sigma^2) >= g_i] = sum_i Phi(-g_i / (sqrt(2) sigma)),
  capped at 1 - 1/m (with i.i.d. noise the largest count is the most likely answer, so
  Pr[answer = i*] >= 1/m) -- :func:`log_q_gnmax`.
* Data-dependent (Theorem 6): a mechanism that is (mu1, eps1)- and (mu2, eps2)-RDP and answers
  i* except with probability <= q satisfies, at D and for every neighbour D',

      D_lambda(M(D) || M(D')) <= log((1 - q) A^(lambda - 1) + q B^(lambda - 1)) / (lambda - 1),
      A = (1 - q) / (1 - (q e^eps2)^((mu2 - 1) / mu2)),   B = e^eps1 / q^(1 / (mu1 - 1)),

  provided mu2 > 1, lambda <= mu1, q e^eps2 < 1 and
  q <= e^((mu2 - 1) eps2) / (mu1 / (mu1 - 1) * mu2 / (mu2 - 1))^mu2.  The orders follow
  Proposition 10: mu2 = s sqrt(log(1/q)), mu1 = mu2 + 1, eps_i = mu_i / s^2 (s = sigma).
  :func:`rdp_gnmax` returns this bound where the conditions hold and it is below the
  data-independent lambda / s^2, and lambda / s^2 otherwise (never above it).  The bound is
  one-directional (it bounds D_lambda(M(D) || M(D')), D the actual data), as in the paper.

Confident GNMax's threshold check answers iff ``max_j n_j + N(0, sigma1^2) >= T``
(PATE 2018, Algorithm 1); Interactive GNMax applies the same check to the shifted histogram
``n - alpha p`` (Algorithm 2: ``shifted=True``).  Either way the checked number moves by at
most 1 between neighbours (each count moves by at most 1; the student's ``p`` is
post-processing of earlier answers), so the check is a Gaussian mechanism of sensitivity 1:
data-independent RDP lambda / (2 sigma1^2) (:func:`rdp_threshold_data_independent`).  Its
data-dependent cost is Theorem 6 for this binary outcome with q = min(p, 1 - p),
p = Pr[answered] = Phi((max_j n_j - T) / sigma1) (:func:`log_pr_answered`), and the Gaussian's
RDP curve, i.e. the formulas above with s = sqrt(2) sigma1 (as in the paper's reference code).
No rounding of the shifted maximum is done.

LNMax (Papernot, Abadi, Erlingsson, Goodfellow & Talwar 2017, "Semi-supervised Knowledge
Transfer for Deep Learning from Private Training Data", ICLR; "PATE 2017") answers
``argmax_j (n_j + Lap(b))``.

* Pure DP: one vote move changes two counts by 1 (L1 sensitivity 2), so each answer is
  eps = 2 / b pure-DP (PATE 2017: gamma = 1/b, "(2 gamma, 0)-DP").  (A bound of 1/b, which
  counts one changed count, is wrong for a moved vote.)
* Data-independent RDP, :func:`rdp_lnmax_data_independent`: the smaller of two exact bounds.
  (i) The tight RDP of any eps-pure-DP mechanism, that of randomized response,
  log((e^(lambda eps) + e^((1 - lambda) eps)) / (1 + e^eps)) / (lambda - 1): every eps-DP pair of
  output distributions is a post-processing of binary randomized response with
  Pr = e^eps / (1 + e^eps) (Kairouz, Oh & Viswanath 2015, the eps-DP case of their
  randomized-response dominance), so by data processing its
  Renyi divergences are at most these; it is at most min(eps, lambda eps^2 / 2) (Bun &
  Steinke 2016, Prop. 3.3).  (ii) The noisy histogram itself: a moved vote shifts two
  independent Laplace(b) coordinates by 1, whose RDP is twice the Laplace mechanism's
  (Mironov 2017, "Renyi Differential Privacy", Table II), 2 log(lambda/(2 lambda - 1)
  e^((lambda - 1)/b) + (lambda - 1)/(2 lambda - 1) e^(-lambda/b)) / (lambda - 1); argmax is
  post-processing.
* q, :func:`log_q_lnmax`: PATE 2017 Theorem 3, q <= sum_{i != i*} (2 + g_i / b) / (4 e^(g_i / b))
  (the exact tail of the difference of two Laplace(b) variables, union bound), capped at 1 - 1/m.
* Data-dependent, :func:`rdp_lnmax`: PATE 2017 Theorem 2 (moments accountant,
  alpha(l) = l * RDP(l + 1)): for q < 1 / (e^eps + 1),

      RDP(lambda) <= log((1 - q) ((1 - q) / (1 - e^eps q))^(lambda - 1) + q e^(eps (lambda - 1)))
                     / (lambda - 1),

  which is also PATE 2018's Theorem 6 in the limit mu1, mu2 -> inf for a mechanism that is
  eps-RDP at every order (so it holds for real lambda); capped by the data-independent bound.

Smooth sensitivity (PATE 2018, Section 4 and Appendix B-C)
----------------------------------------------------------
The data-dependent RDP at a fixed order, f(D), depends on the votes and is itself private.
PATE 2018 publishes it through the GNSS mechanism ``f(D) + SS_beta(D) * N(0, sigma_ss^2)``,
where ``SS_beta(D) = max_{d >= 0} e^(-beta d) U^(d)(D)`` and U^(d)(D) bounds the local
sensitivity of f anywhere within distance d of D.  SS_beta is a beta-smooth upper bound on the
local sensitivity when U^(0) >= LS and U^(d)(D) <= U^(d+1)(D') for neighbours D, D'; the GNSS
mechanism is then (lambda, eps)-RDP for 1 < lambda < 1/(2 beta) with (PATE 2018, Theorem 23)

    eps = lambda e^(2 beta) / sigma_ss^2 + (beta lambda - log(1 - 2 lambda beta) / 2) / (lambda - 1)

(:func:`rdp_smooth_sensitivity_release`).  The bounds U^(d) computed here:

* GNMax (:func:`local_sensitivity_gnmax`): f = F(q) with F the bound of :func:`rdp_gnmax` as a
  function of q = the capped Proposition 7 bound.  For a neighbour, q' lies in [B_L(q), B_U(q)],

      B_U(q) = (m - 1) Phi(Phi^-1(q / (m - 1)) + sqrt(2) / sigma),
      B_L(q) = (m - 1) Phi(Phi^-1(q / (m - 1)) - sqrt(2) / sigma)

  (every gap drops by at most 2, each term Phi(-g / (sqrt(2) sigma)) grows accordingly, and
  t -> Phi(Phi^-1(t) + c) is concave, so equal terms are the worst case: Jensen; a change of
  argmax only happens across a gap <= 2 and is covered by the same sum; PATE 2018's B_U, B_L
  in Phi rather than erfc form).  Within distance d, q lies in [B_L^d(q), B_U^d(q)] (shift
  +-sqrt(2) d / sigma inside Phi, capped at 1 - 1/m), nested between neighbours (the shifts
  add up), so U^(d)(D) <= U^(d+1)(D').  With G(q) = max(F(B_U(q)) - F(q), F(q) - F(B_L(q)))
  >= LS (F non-decreasing), U^(d) is the maximum of G over that interval, bounded cell by cell
  on a fixed grid g_0 < ... < g_N of log q (20001 points, geometric in -log q, from far below
  q0 to log(1 - 1/m)): on a cell [e^g_k, e^g_(k+1)],
  G <= max(F(B_U(e^g_(k+1))) - F(e^g_k), F(e^g_(k+1)) - F(B_L(e^g_k))), and below the grid
  G <= F(B_U(e^g_0)).  U^(0) = G(q) at the actual q.  At d = num_teachers every histogram is
  in reach and U is the global maximum.  This replaces the reasoning of PATE 2018's
  Algorithms 3-5 / Proposition 13, which also needs F(B_U(q)) - F(q) non-decreasing below
  B_L(q0) (their condition C6): that fails for many (sigma, order) (e.g. sigma = 1, order 5),
  and the cell bounds do not need it.  They do need F non-decreasing in q (condition C5); it
  is verified on the grid for each (sigma, order, m), numerically as in the paper, and where
  it fails U^(d) = lambda / sigma^2 (always valid: 0 <= F <= that).
* Threshold (:func:`local_sensitivity_threshold`): f = r(x) with x the checked maximum.  For
  integer votes x is an integer in [0, num_teachers] moving by at most 1 per vote, so
  U^(d) = max over x' in [x - d, x + d] of max(|r(x' +- 1) - r(x')|), exactly (no condition
  needed).  For shifted (real) histograms the neighbour's x is anywhere in [x - 1, x + 1], so
  each pair (y, y') to bound lies in a window [a, a + 1] with a in [x - d - 1, x + d], and each
  such window in one of the fixed windows [k h, k h + 1 + h] (h = 1/16), whose oscillation
  follows exactly from r's unimodality (peak at x = T; C5 for s = sqrt(2) sigma1, verified on a
  grid; fallback lambda / (2 sigma1^2)).  The windows are fixed, not centred on x, so the
  bounds stay nested between neighbours.

:class:`PateAccountant` composes the queries actually made and reports (i) the data-dependent
epsilon (private), (ii) the data-independent epsilon (publishable) and (iii) the
smooth-sensitivity-sanitised epsilon (publishable); see its docstring for which is which.

No TensorFlow import; numpy and scipy only.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import warnings

import numpy as np
from scipy import optimize, special

from analysis import _checks, _secrecy
from analysis import accountant as _accountant
from analysis import events
from analysis import rdp_accountant

__all__ = [
    "PateAccountant",
    "SanitizedEpsilon",
    "local_sensitivity_gnmax",
    "local_sensitivity_threshold",
    "log_pr_answered",
    "log_q_gnmax",
    "log_q_lnmax",
    "rdp_gnmax",
    "rdp_gnmax_data_independent",
    "rdp_lnmax",
    "rdp_lnmax_data_independent",
    "rdp_smooth_sensitivity_release",
    "rdp_threshold",
    "rdp_threshold_data_independent",
    "smooth_sensitivity_gnmax",
    "smooth_sensitivity_threshold",
]

_SQRT2 = math.sqrt(2.0)
_LOG_HALF = math.log(0.5)
_MAX_SEARCH_ORDER = 1e4  # upper end of the real-order search

# ------------------------------------------------------------------------------------------
# Argument checks (built on analysis._checks; the messages name the argument and its range).


def _check_votes(name: str, votes, *, shifted: bool = False) -> np.ndarray:
  """``votes`` as a read-only 1-D float64 array; see the module docstring for the ranges."""
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


def _finish(values: np.ndarray, scalar: bool):
  values = np.asarray(values, dtype=np.float64)
  return float(values[0]) if scalar else values


# ------------------------------------------------------------------------------------------
# Numerics.


def _log1mexp(x):
  """log(1 - e^x) for x <= 0 (-inf at 0), elementwise, without cancellation."""
  x = np.asarray(x, dtype=np.float64)
  with np.errstate(divide="ignore", invalid="ignore"):
    return np.where(x > -math.log(2.0), np.log(-np.expm1(x)), np.log1p(-np.exp(x)))


def _logsumexp(x: np.ndarray) -> float:
  top = float(np.max(x))
  if not math.isfinite(top):
    return top
  return top + math.log(float(np.sum(np.exp(x - top))))


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
    log1q = _log1mexp(logq)
    log_a = (lam - 1.0) * (log1q - _log1mexp((logq + eps2) * (1.0 - 1.0 / mu2)))
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
    log1q = _log1mexp(logq)
    log_a = log1q - _log1mexp(logq + eps)
    dep = np.logaddexp(log1q + (lam - 1.0) * log_a, logq + (lam - 1.0) * eps) / (lam - 1.0)
    out = np.where(valid & (dep < indep), np.maximum(dep, 0.0), indep)
  return np.where(np.isneginf(logq), 0.0, out)


# ------------------------------------------------------------------------------------------
# GNMax.


def _log_q_gnmax(votes: np.ndarray, sigma: float) -> float:
  m = votes.size
  if m == 1:
    return -math.inf
  top = int(np.argmax(votes))
  gaps = votes[top] - np.delete(votes, top)
  logq = _logsumexp(special.log_ndtr(-gaps / (_SQRT2 * sigma)))
  return min(logq, math.log1p(-1.0 / m))


def log_q_gnmax(votes, sigma: float) -> float:
  """log of PATE 2018 Proposition 7's bound on q = Pr[GNMax answer != argmax votes].

  q <= sum_{i != i*} Phi(-(n_i* - n_i) / (sqrt(2) sigma)), capped at 1 - 1/m (see module doc);
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
  at most :func:`rdp_gnmax_data_independent`; 0 for one class.  Formulas: module docstring.

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
  return float(min(log_p, float(_log1mexp(log_p))))


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
  logq = _logsumexp(np.log(2.0 + x) - x - math.log(4.0))
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
  """RDP of one LNMax answer for any votes (see the module docstring).

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
  """Cell bounds on G for GNMax's local sensitivity (module docstring), or None if F is constant.

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


def _gnmax_g(logq: float, s: float, order: float, m: int) -> float:
  """G(q) = max(F(B_U(q)) - F(q), F(q) - F(B_L(q))) >= LS, for F non-decreasing."""
  f = _theorem6([logq], s, [order])[0, 0]
  up = _theorem6(_shift_logq([logq], m, _SQRT2 / s), s, [order])[0, 0]
  down = _theorem6(_shift_logq([logq], m, -_SQRT2 / s), s, [order])[0, 0]
  return float(max(up - f, f - down, 0.0))


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
  d = np.arange(num_teachers + 1, dtype=np.float64)
  step = _SQRT2 / sigma
  log_hi = _shift_logq(np.full(d.shape, logq), m, step * d)  # B_U^d(q)
  log_lo = _shift_logq(np.full(d.shape, logq), m, -step * d)  # B_L^d(q)
  # Index into ``bounds`` of the cell holding each end (0: below the grid).
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
  ``order`` anywhere within distance d (moved votes) of ``votes`` (PATE 2018, Appendix B's
  B_U / B_L with cell bounds instead of condition C6; module docstring).

  Non-decreasing in d; U^(d)(D) <= U^(d+1)(D') for neighbours; the last entry is the global
  maximum (every histogram is within num_teachers), valid for every larger d.

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
  logq = np.minimum(log_p, _log1mexp(log_p))
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
  ``order`` within distance d of ``votes`` (PATE 2018, Appendix B; module docstring).

  Exact for integer votes; for ``shifted=True`` (real-valued thresholded histograms) the
  window bound of the module docstring.  Non-decreasing in d; the last entry is the global
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


# ------------------------------------------------------------------------------------------
# The accountant.


@dataclasses.dataclass(frozen=True)
class SanitizedEpsilon:
  """The smooth-sensitivity-sanitised privacy cost (every field publishable).

  Attributes:
    epsilon: nats; min of the sanitised value's conversion and the data-independent epsilon.
    delta: the delta it holds at.
    order: the Renyi order it was computed at (fixed in advance by the caller).
    beta, sigma_ss: the GNSS parameters (fixed in advance by the caller).
    sanitized_rdp: the GNSS release of the data-dependent RDP at ``order``, clamped at >= 0.
    release_rdp: the RDP of that release itself (Theorem 23), included in ``epsilon``.
  """
  epsilon: float
  delta: float
  order: float
  beta: float
  sigma_ss: float
  sanitized_rdp: float
  release_rdp: float


@dataclasses.dataclass(frozen=True)
class _Part:
  """One data-dependent part: a Theorem 6 component (s = sigma or sqrt(2) sigma1) or LNMax."""
  kind: str  # "gnmax", "threshold", "lnmax"
  scale: float  # sigma (gnmax), sigma1 (threshold), b (lnmax)
  logq: float
  votes: np.ndarray
  teachers: int  # the distance at which every histogram is in reach
  threshold: float = 0.0
  shifted: bool = False


@_secrecy.refuse_pickling(
    "every composed query's raw vote histogram (private data)", copies=True,
    instead="Publish its ledger or data_independent_epsilon() instead.")
class PateAccountant(_accountant.Accountant):
  """Composes PATE queries (GNMax, LNMax, Confident and Interactive GNMax) and reports epsilon.

  Each query's actual outcome is composed: the threshold check's cost always, the GNMax cost
  only when the query was answered (as PATE 2018 does: a refused query releases only the
  check).  Composition is the sum of per-query RDP at each order (RDP composition, Mironov 2017,
  Proposition 1, applied to the bounds at the actual data as in PATE 2018).
  Counting the GNMax cost only for answered queries follows the paper; it is the ex-post sum
  of a fully adaptive composition (validated by RDP filters, Feldman & Zrnic 2021, when the
  total is held to a budget fixed in advance).

  What may be published:

  * :attr:`ledger`, :meth:`get_epsilon` / :meth:`get_delta` (the generic
    :class:`analysis.accountant.Accountant` interface) and their explicit names
    :meth:`data_independent_epsilon`, :meth:`data_independent_delta`: only noise levels and how many checks and answers there were: the data-independent
    description (GNMax: ``GaussianEvent(sigma / sqrt(2))``; threshold check:
    ``GaussianEvent(sigma1)``; LNMax: ``LaplaceEvent(b / 2)``, L1 sensitivity 2).  The
    answered/refused outcomes it records are outputs of the private mechanism already released
    to the student.
  * :meth:`smooth_sensitivity_epsilon`: the GNSS-sanitised data-dependent epsilon, whose
    release is itself accounted (PATE 2018, Section 4.2).
  * :attr:`queries`, :attr:`answered`, :attr:`orders`.

  What must NOT be published (computed from the teachers' votes, i.e. from the private data):
  :meth:`private_data_dependent_epsilon`, :meth:`private_data_dependent_delta`, :meth:`rdp`
  (unless ``data_independent``) and :meth:`smooth_sensitivity`.  Those are the data-dependent
  quantities (upper bounds on the privacy loss at the actual data, never above the
  data-independent ones); publishing them leaks about the votes.  Code written against the
  generic interface therefore gets the publishable number from :meth:`get_epsilon`.  "pate" is
  not one of :func:`analysis.accountants.make_accountant`'s names.

  The accountant holds every composed histogram, so it cannot be pickled
  (:mod:`analysis._secrecy`); ``copy.deepcopy`` works (an in-process copy releases nothing).

  :meth:`compose` also takes plain events (``GaussianEvent``, ``LaplaceEvent`` and
  ``SelfComposedEvent`` / ``ComposedEvent`` of them), accounted data-independently; sampled
  and shuffled events are refused with :class:`analysis.events.UnsupportedEventError`.  All
  guarantees are for neighbouring data sets whose teachers' data differ in one teacher (one
  vote moved); with the position-based partition of ``tf_dpkit.pate`` that is replacing one
  record (:attr:`neighboring_relation`; module doc, "Neighbouring vote histograms").

  Args:
    orders: RDP orders for the grid, a non-empty sequence each in (1, 1e6]; default
      :data:`analysis.rdp_accountant.DEFAULT_ORDERS`.  Epsilon is minimised over the grid and
      then over real orders around the best grid order.
    num_teachers: integer >= 1 or None.  Used by the smooth sensitivity (the distance at which
      every histogram is in reach); None takes each query's number of votes.  When given, every
      histogram composed must have at most this many votes.
  """

  def __init__(self, orders=None, num_teachers: int | None = None):
    super().__init__()
    alphas, _ = _checks.check_orders(
        "orders", list(rdp_accountant.DEFAULT_ORDERS if orders is None else orders),
        max_finite=rdp_accountant.MAX_ORDER)
    if not np.all(np.isfinite(alphas)):
      raise ValueError("orders must be finite for the PATE accountant (the real-order search "
                       "needs a finite grid), got inf.")
    self._orders = tuple(sorted(set(float(a) for a in alphas)))
    self._num_teachers = (None if num_teachers is None else
                          _checks.check_integer("num_teachers", num_teachers, minimum=1))
    self._parts: list[_Part] = []
    self._plain: list[tuple[str, float, int]] = []  # ("gaussian"|"laplace", multiplier, count)
    self._queries = 0
    self._answered = 0
    self._cache: dict = {}

  # -- public counters -----------------------------------------------------------------------

  @property
  def orders(self) -> tuple:
    """The grid of orders."""
    return self._orders

  @property
  def queries(self) -> int:
    """PATE queries composed (each compose_* call)."""
    return self._queries

  @property
  def answered(self) -> int:
    """Queries answered (GNMax and LNMax queries always are)."""
    return self._answered

  # -- composing queries ---------------------------------------------------------------------

  def _votes(self, name: str, votes, shifted: bool = False) -> np.ndarray:
    votes = _check_votes(name, votes, shifted=shifted)
    if not shifted and self._num_teachers is not None and votes.sum() > self._num_teachers:
      raise ValueError(f"{name} must hold at most num_teachers = {self._num_teachers} votes, "
                       f"got {votes.sum():g}.")
    return votes

  def _record(self, parts, new_events, answered: bool) -> "PateAccountant":
    self._parts.extend(parts)
    self._events.extend(new_events)
    self._queries += 1
    self._answered += int(answered)
    self._cache.clear()
    return self

  def _teachers(self, votes: np.ndarray) -> int:
    return self._num_teachers or max(1, int(votes.sum()))

  def _gnmax_part(self, votes: np.ndarray, sigma: float) -> _Part:
    return _Part("gnmax", sigma, _log_q_gnmax(votes, sigma), votes, self._teachers(votes))

  def _threshold_part(self, votes: np.ndarray, checked: np.ndarray, threshold: float,
                      sigma1: float, shifted: bool) -> _Part:
    logq = _threshold_logq(_log_pr_answered(checked, threshold, sigma1))
    return _Part("threshold", sigma1, logq, checked, self._teachers(votes), threshold, shifted)

  def compose_gnmax(self, votes, sigma: float) -> "PateAccountant":
    """One GNMax answer on ``votes`` (noise std ``sigma`` > 0, finite); returns self."""
    votes = self._votes("votes", votes)
    sigma = _checks.check_finite_positive("sigma", sigma)
    return self._record([self._gnmax_part(votes, sigma)],
                        [events.GaussianEvent(sigma / _SQRT2)], True)

  def compose_lnmax(self, votes, laplace_scale: float) -> "PateAccountant":
    """One LNMax answer on ``votes`` (Laplace scale ``laplace_scale`` > 0, finite)."""
    votes = self._votes("votes", votes)
    scale = _checks.check_finite_positive("laplace_scale", laplace_scale)
    part = _Part("lnmax", scale, _log_q_lnmax(votes, scale), votes, self._teachers(votes))
    return self._record([part], [events.LaplaceEvent(scale / 2.0)], True)

  def compose_confident_gnmax(self, votes, threshold: float, sigma1: float, sigma2: float,
                              answered: bool) -> "PateAccountant":
    """One Confident GNMax query (PATE 2018, Algorithm 1) with its actual outcome.

    The check ``max votes + N(0, sigma1^2) >= threshold`` is always paid; the GNMax step
    (noise ``sigma2``) only when ``answered`` (a bool) is True.
    """
    votes = self._votes("votes", votes)
    return self._confident(votes, votes, False, threshold, sigma1, sigma2, answered)

  def compose_interactive_gnmax(self, votes, thresholded_votes, threshold: float,
                                sigma1: float, sigma2: float,
                                answered: bool) -> "PateAccountant":
    """One Interactive GNMax query (PATE 2018, Algorithm 2) with its actual outcome.

    The check runs on ``thresholded_votes`` (= votes - alpha * student probabilities: any
    finite reals, same length as ``votes``); GNMax (noise ``sigma2``) on ``votes`` only when
    ``answered`` is True (a query the student answers itself costs only the check).
    """
    votes = self._votes("votes", votes)
    checked = self._votes("thresholded_votes", thresholded_votes, shifted=True)
    if checked.size != votes.size:
      raise ValueError(f"thresholded_votes must have one entry per class ({votes.size}), got "
                       f"{checked.size}.")
    return self._confident(votes, checked, True, threshold, sigma1, sigma2, answered)

  def _confident(self, votes, checked, shifted, threshold, sigma1, sigma2, answered):
    threshold = _check_finite_real("threshold", threshold)
    sigma1 = _checks.check_finite_positive("sigma1", sigma1)
    sigma2 = _checks.check_finite_positive("sigma2", sigma2)
    if not isinstance(answered, (bool, np.bool_)):
      raise ValueError(f"answered must be a bool, got {answered!r}.")
    parts = [self._threshold_part(votes, checked, threshold, sigma1, shifted)]
    new_events = [events.GaussianEvent(sigma1)]
    if answered:
      parts.append(self._gnmax_part(votes, sigma2))
      new_events.append(events.GaussianEvent(sigma2 / _SQRT2))
    return self._record(parts, new_events, bool(answered))

  # -- the Accountant interface ----------------------------------------------------------------

  def compose(self, event: events.DpEvent, count: int = 1) -> "PateAccountant":
    """Adds ``count`` runs of a plain ``event``, accounted data-independently (class doc)."""
    if not isinstance(event, events.DpEvent):
      raise ValueError(f"event must be an analysis.events event, got {event!r:.80}.")
    count = _checks.check_steps("count", count)
    plain: list = []
    self._plain_parts(event, count, plain)
    self._plain.extend(plain)
    self._events.append(event if count == 1 else events.SelfComposedEvent(event, count))
    self._cache.clear()
    return self

  def _plain_parts(self, event, count: int, out: list) -> None:
    if isinstance(event, events.GaussianEvent):
      if count and not math.isinf(event.noise_multiplier):
        out.append(("gaussian", event.noise_multiplier, count))
    elif isinstance(event, events.LaplaceEvent):
      if count and not math.isinf(event.noise_multiplier):
        out.append(("laplace", event.noise_multiplier, count))
    elif isinstance(event, events.SelfComposedEvent):
      self._plain_parts(event.event, _checks.check_steps("count", count * event.count), out)
    elif isinstance(event, events.ComposedEvent):
      for part in event.events:
        self._plain_parts(part, count, out)
    else:
      raise events.UnsupportedEventError(
          f"PateAccountant composes PATE queries and plain GaussianEvent / LaplaceEvent "
          f"releases (and compositions of them), got {type(event).__name__}; account sampled "
          f"or shuffled releases with analysis.rdp_accountant.RdpAccountant.")

  @property
  def atoms(self) -> tuple:
    """The data-independent Gaussian parts as :class:`analysis.events.Atom` s.

    Raises:
      analysis.events.UnsupportedEventError: the ledger holds Laplace releases (LNMax), which
        are not Gaussian atoms.
    """
    return tuple(events.flatten(self.ledger))

  @property
  def num_teachers(self) -> int | None:
    """The number of teachers given at construction (None: taken from each histogram)."""
    return self._num_teachers

  @property
  def neighboring_relation(self) -> str:
    """``"replace_one"``: one record replaced, which changes one teacher's data under a
    position-based partition (module doc, "Neighbouring vote histograms")."""
    return events.REPLACE_ONE

  def _check_atoms(self, atoms) -> None:  # compose is overridden
    pass

  def get_epsilon(self, delta: float) -> float:
    """PUBLISHABLE epsilon (nats) at ``delta`` in (0, 1): :meth:`data_independent_epsilon`.

    The generic :class:`analysis.accountant.Accountant` interface reports a guarantee that
    holds for every data set; the data-dependent bound is :meth:`private_data_dependent_epsilon`.
    """
    return self.data_independent_epsilon(delta)

  def get_delta(self, epsilon: float) -> float:
    """PUBLISHABLE delta at ``epsilon`` >= 0: :meth:`data_independent_delta`."""
    return self.data_independent_delta(epsilon)

  def private_data_dependent_epsilon(self, delta: float) -> float:
    """PRIVATE data-dependent epsilon (nats) at ``delta`` in (0, 1): never publish it.

    min(the data-dependent RDP converted over the grid and over real orders near the best grid
    order (:func:`analysis.rdp_accountant.get_privacy_spent` at each order), the
    data-independent epsilon).  Computed from the votes, so it leaks about the private data
    (class docstring); publish :meth:`get_epsilon` or :meth:`smooth_sensitivity_epsilon`.
    """
    delta = _checks.check_delta("delta", delta)
    if not self._events:
      return 0.0
    eps = self._convert(self._rdp_curve, "dep", target_delta=delta)
    return min(eps, self.data_independent_epsilon(delta))

  def private_data_dependent_delta(self, epsilon: float) -> float:
    """PRIVATE data-dependent delta at ``epsilon`` >= 0 (as
    :meth:`private_data_dependent_epsilon`): never publish it."""
    epsilon = _checks.check_nonnegative("epsilon", epsilon)
    if not self._events:
      return 0.0
    delta = self._convert(self._rdp_curve, "dep", target_eps=epsilon)
    return min(delta, self.data_independent_delta(epsilon))

  def _epsilon(self, delta: float) -> float:  # pragma: no cover - get_epsilon is overridden
    return self.get_epsilon(delta)

  def _delta(self, epsilon: float) -> float:  # pragma: no cover - get_delta is overridden
    return self.get_delta(epsilon)

  def data_independent_epsilon(self, delta: float) -> float:
    """Epsilon (nats) at ``delta`` in (0, 1) that holds for every data set: publishable.

    With only Gaussian parts (no LNMax / Laplace) the ledger is composed exactly by
    :class:`analysis.rdp_accountant.RdpAccountant` (an exact Gaussian composition); otherwise
    the data-independent RDP curve is converted as in :meth:`private_data_dependent_epsilon`.
    """
    delta = _checks.check_delta("delta", delta)
    if not self._events:
      return 0.0
    if not self._has_laplace():
      return rdp_accountant.RdpAccountant(self._orders).compose(self.ledger).get_epsilon(delta)
    return self._convert(self._independent_curve, "indep", target_delta=delta)

  def data_independent_delta(self, epsilon: float) -> float:
    """Delta at ``epsilon`` >= 0 that holds for every data set: publishable."""
    epsilon = _checks.check_nonnegative("epsilon", epsilon)
    if not self._events:
      return 0.0
    if not self._has_laplace():
      return rdp_accountant.RdpAccountant(self._orders).compose(self.ledger).get_delta(epsilon)
    return self._convert(self._independent_curve, "indep", target_eps=epsilon)

  def rdp(self, orders=None, *, data_independent: bool = False):
    """The composed RDP at ``orders`` (default: the grid), nats.

    Data-dependent (PRIVATE) unless ``data_independent``.
    """
    alphas, scalar = _checks.check_orders(
        "orders", list(self._orders) if orders is None else orders)
    curve = self._independent_curve if data_independent else self._rdp_curve
    return _finish(curve(alphas), scalar)

  # -- RDP curves ------------------------------------------------------------------------------

  def _has_laplace(self) -> bool:
    return (any(p.kind == "lnmax" for p in self._parts)
            or any(kind == "laplace" for kind, _, _ in self._plain))

  def _plain_curve(self, alphas: np.ndarray) -> np.ndarray:
    total = np.zeros(alphas.shape)
    for kind, multiplier, count in self._plain:
      if kind == "gaussian":
        rdp = (np.full(alphas.shape, np.inf) if multiplier == 0.0
               else alphas / (2.0 * multiplier**2))
      else:
        rdp = _laplace_rdp(1.0 / multiplier, alphas)
      total += count * rdp
    return total

  def _groups(self):
    """Parts grouped by (kind, scale): (kind, scale, logq array, parts)."""
    groups: dict = {}
    for part in self._parts:
      groups.setdefault((part.kind, part.scale), []).append(part)
    return [(kind, scale, np.array([p.logq for p in parts]), parts)
            for (kind, scale), parts in groups.items()]

  def _rdp_curve(self, alphas) -> np.ndarray:
    alphas = np.asarray(alphas, dtype=np.float64)
    total = self._plain_curve(alphas)
    for kind, scale, logq, _ in self._groups():
      if kind == "gnmax":
        total += _theorem6(logq, scale, alphas).sum(axis=0)
      elif kind == "threshold":
        total += _theorem6(logq, _SQRT2 * scale, alphas).sum(axis=0)
      else:
        total += _lnmax_from_logq(logq, 2.0 / scale, alphas).sum(axis=0)
    return total

  def _independent_curve(self, alphas) -> np.ndarray:
    alphas = np.asarray(alphas, dtype=np.float64)
    total = self._plain_curve(alphas)
    for kind, scale, logq, _ in self._groups():
      if kind == "gnmax":
        total += logq.size * alphas / scale**2
      elif kind == "threshold":
        total += logq.size * alphas / (2.0 * scale**2)
      else:
        total += logq.size * _lnmax_independent(2.0 / scale, alphas)
    return total

  def _convert(self, curve, key: str, *, target_delta=None, target_eps=None) -> float:
    """Grid conversion by get_privacy_spent, then a bounded search over real orders."""
    cache_key = (key, target_delta, target_eps)
    if cache_key in self._cache:
      return self._cache[cache_key]
    grid = np.array(self._orders)
    want_eps = target_delta is not None

    def at(alphas, values):
      with warnings.catch_warnings():
        warnings.simplefilter("ignore", rdp_accountant.OrderAtBoundaryWarning)
        eps, delta, order = rdp_accountant.get_privacy_spent(
            alphas, values, target_eps=target_eps, target_delta=target_delta)
      return (eps if want_eps else delta), order

    best, order = at(grid, curve(grid))
    if order is not None and best > 0.0:
      i = int(np.searchsorted(grid, order))
      lo = grid[i - 1] if i > 0 else 1.0 + (grid[0] - 1.0) * 1e-3
      hi = grid[i + 1] if i + 1 < grid.size else max(_MAX_SEARCH_ORDER, 2.0 * grid[i])

      def objective(u: float) -> float:
        alpha = 1.0 + math.exp(u)
        value = at([alpha], curve(np.array([alpha])))[0]
        if not want_eps:
          value = math.log(value) if value > 0.0 else -1e300
        return value if math.isfinite(value) else 1e300

      result = optimize.minimize_scalar(
          objective, bounds=(math.log(lo - 1.0), math.log(hi - 1.0)), method="bounded",
          options={"xatol": 1e-4})
      alpha = 1.0 + math.exp(float(result.x))
      best = min(best, at([alpha], curve(np.array([alpha])))[0])
    self._cache[cache_key] = float(best)
    return float(best)

  # -- smooth sensitivity ----------------------------------------------------------------------

  def _ls_total(self, order: float) -> np.ndarray:
    """Sum of the data-dependent parts' U^(d) at ``order`` (LNMax and plain parts: 0)."""
    arrays = []
    for part in self._parts:
      if part.kind == "gnmax":
        arrays.append(_ls_gnmax(part.votes, part.teachers, part.scale, order))
      elif part.kind == "threshold":
        arrays.append(_ls_threshold(part.votes, part.teachers, part.threshold, part.scale,
                                    order, part.shifted))
    if not arrays:
      return np.zeros(1)
    length = max(a.size for a in arrays)
    total = np.zeros(length)
    for a in arrays:  # beyond its length an array's bound is its global maximum (last entry)
      total[:a.size] += a
      total[a.size:] += a[-1]
    return total

  def _sanitizable_rdp(self, order: float) -> float:
    """f(D) at ``order``: data-dependent GNMax and threshold parts, data-independent rest."""
    alphas = np.array([order])
    total = float(self._plain_curve(alphas)[0])
    for kind, scale, logq, _ in self._groups():
      if kind == "gnmax":
        total += float(_theorem6(logq, scale, alphas).sum())
      elif kind == "threshold":
        total += float(_theorem6(logq, _SQRT2 * scale, alphas).sum())
      else:
        total += logq.size * float(_lnmax_independent(2.0 / scale, alphas)[0])
    return total

  def smooth_sensitivity(self, beta: float, order: float) -> float:
    """PRIVATE: the beta-smooth sensitivity of the composed data-dependent RDP at ``order``.

    max_d e^(-beta d) sum_i U_i^(d) over the threshold checks and answered GNMax steps (a sum
    of local-sensitivity bounds bounds the local sensitivity of the sum, at every distance).
    LNMax and plain parts enter the sanitised value data-independently and contribute 0.
    """
    beta = _check_beta(beta)
    order = _check_order("order", order)
    return _discounted_max(beta, self._ls_total(order))

  def smooth_sensitivity_epsilon(self, delta: float, beta: float, sigma_ss: float,
                                 order: float, *, rng=None) -> SanitizedEpsilon:
    """The GNSS-sanitised epsilon: publishable (PATE 2018, Section 4.2 and Appendix C).

    Procedure, at an order, beta and sigma_ss the caller fixes WITHOUT looking at the votes
    (choosing them from the data makes the choice itself a leak; the paper tuned them on the
    data and says so):

    1. f = the data-dependent RDP at ``order`` of the threshold checks and answered GNMax steps
       plus the data-independent RDP of LNMax and plain parts;
    2. SS = :meth:`smooth_sensitivity` (beta, order);
    3. sanitized_rdp = max(0, f + SS * z), z ~ N(0, sigma_ss^2) drawn from ``rng`` (the GNSS
       mechanism; clamping is post-processing);
    4. release_rdp = :func:`rdp_smooth_sensitivity_release` (beta, sigma_ss, order): the cost
       of step 3 itself (Theorem 23);
    5. epsilon = the conversion (:func:`analysis.rdp_accountant.get_privacy_spent`) of
       sanitized_rdp + release_rdp at ``order`` and ``delta``, capped by the (public)
       data-independent epsilon.

    The result is a noisy estimate of the privacy cost (the noise is zero-mean; it is not a
    guaranteed upper bound on the data-dependent epsilon), whose publication is private.
    Each call draws fresh noise and is a new release: publish one.

    Args:
      delta: in (0, 1).
      beta: in [0, 1 / (2 order)).
      sigma_ss: finite, > 0.
      order: finite, in (1, 1e6].
      rng: a ``numpy.random.Generator``, an integer seed or None (fresh entropy).
    """
    delta = _checks.check_delta("delta", delta)
    release = rdp_smooth_sensitivity_release(beta, sigma_ss, order)
    order = float(order)
    beta = float(beta)
    sigma_ss = float(sigma_ss)
    if not isinstance(rng, np.random.Generator):
      if rng is not None:
        rng = _checks.check_integer("rng", rng, minimum=0)
      rng = np.random.default_rng(rng)
    smooth = self.smooth_sensitivity(beta, order)
    sanitized = max(0.0, self._sanitizable_rdp(order) + smooth * float(rng.normal(0.0, sigma_ss)))
    with warnings.catch_warnings():
      warnings.simplefilter("ignore", rdp_accountant.OrderAtBoundaryWarning)
      eps, _, _ = rdp_accountant.get_privacy_spent([order], [sanitized + release],
                                                   target_delta=delta)
    eps = min(float(eps), self.data_independent_epsilon(delta)) if self._events else float(eps)
    return SanitizedEpsilon(eps, delta, order, beta, sigma_ss, sanitized, release)
