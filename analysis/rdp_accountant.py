"""Renyi-DP accounting for DP-SGD: the (sub)sampled Gaussian mechanism and RDP -> (eps, delta).

Units and conventions
---------------------
* ``noise_multiplier`` (sigma) is the standard deviation of the Gaussian noise divided by the
  L2 sensitivity of the noised sum (for DP-SGD with per-example clipping norm C and
  add-or-remove-one adjacency the sensitivity is C).  Allowed range [0, inf]; 0 means no noise.
* ``q`` is the sampling probability (Poisson: each example independently with probability q;
  without replacement: batch size / dataset size).  Range [0, 1].
* ``steps`` is an integer in [0, 2**53] (:data:`analysis._checks.MAX_STEPS`; larger counts are
  rejected with a ValueError naming ``steps``); RDP composes additively over steps.
* Noise multipliers below 1e-100 are accounted as 0 (RDP inf; the exact value, at least
  alpha / (2 s^2) + alpha log(q) / (alpha - 1), is astronomically large) and those above 1e100
  as 1e100 (RDP < 1e-199): float64 cannot hold 1 / (2 s^2) or s^2 beyond these.  Both are
  sound, since the noisier Gaussian mechanism is a post-processing of the less noisy one.  A
  positive RDP that would underflow to 0 is reported as the smallest positive float instead.
* Orders alpha are reals in (1, 1e6] or inf (:data:`MAX_ORDER`), given as one number or a
  non-empty sequence.  RDP values (and epsilon) are in nats.

Poisson-subsampled Gaussian (add-or-remove-one adjacency)
---------------------------------------------------------
With mu0 = N(0, s^2), mu1 = N(1, s^2) and mu = (1 - q) mu0 + q mu1, the RDP of one step at order
alpha is D_alpha(mu || mu0) = log(A_alpha) / (alpha - 1) with

    A_alpha = E_{z ~ mu0}[((1 - q) + q exp((2z - 1) / (2 s^2)))^alpha]             (A)

(Mironov, Talwar & Zhang 2019, "Renyi Differential Privacy of the Sampled Gaussian Mechanism",
who show this direction dominates the reverse one; it is the quantity TF Privacy and
dp_accounting compute).

* Integer alpha: the binomial expansion is exact and has only non-negative terms,

    A_alpha - 1 = sum_{k=2}^{alpha} C(alpha, k) (1 - q)^(alpha - k) q^k (exp((k^2 - k) / (2 s^2)) - 1),

  summed in log space (so A_alpha - 1 keeps full relative precision even when it is 1e-12).
* Fractional alpha: split (A) at z0 = s^2 log(1/q - 1) + 1/2, where the two summands are equal,
  and expand the binomial in the smaller/larger ratio on each side (same paper, Sec. 3.3):

    A_alpha = sum_{k>=0} [a_k M0_k + b_k M1_j],   j = alpha - k,
    a_k = C(alpha, k) (1-q)^(alpha-k) q^k,   b_k = C(alpha, k) q^(alpha-k) (1-q)^k,
    M0_k = E_{mu0}[L^k; z < z0] = exp((k^2 - k) / (2s^2)) Phi((z0 - k) / s),
    M1_j = E_{mu0}[L^j; z > z0] = exp((j^2 - j) / (2s^2)) Phi((j - z0) / s),

  L = e^{(2z-1)/(2s^2)} the likelihood ratio.  For k >= ceil(alpha) the generalized binomial
  coefficients alternate in sign, sign C(alpha, k) = (-1)^(k - ceil(alpha)), and both kinds of
  term decrease in magnitude (|C(alpha, k+1) / C(alpha, k)| = (k - alpha) / (k + 1) < 1, and
  the integrals are of u^k phi with 0 <= u <= 1).  By the alternating-series bound, stopping
  the sum just before a negative term leaves a remainder in [that term, 0]: the partial sum is
  an UPPER bound on A_alpha, off by at most the first omitted term.

  The terms are of size ~1 and A_alpha is often 1 + 1e-12, so A_alpha itself cannot be summed
  to the precision wanted (1e-9 relative on the RDP, i.e. on A_alpha - 1).  A_alpha - 1 is
  computed instead, without cancellation against 1:

  - q < 1/2 - 0.02: 1 = ((1 - q) + q)^alpha = sum_k a_k (binomial series, ratio q/(1-q) < 1), so
    A_alpha - 1 = sum_k [a_k (M0_k - 1) + b_k M1_j], with M0_k - 1 = expm1(log M0_k) accurate
    where M0_k ~ 1.  The tail of sum_k a_k after the stopping index K also alternates and
    decreases: it lies in [a_K, 0], so |a_K| is added to the partial sum.
  - q > 1/2 + 0.02: the same with 1 = sum_k b_k (ratio (1-q)/q < 1) and b_k (M1_j - 1).
  - |q - 1/2| < 0.02 (neither binomial series converges fast, and both halves of (A) carry
    mass): for m = 1/(2 s^2) <= 0.02 the expansion in u = L - 1, A_alpha - 1 =
    E[g(q u)] with g(x) = (1 + x)^alpha - 1 - alpha x = sum_{n>=2} C(alpha, n) x^n on |x| < 1.
    On G = {|q u| <= rho} (rho = 0.9) the series is summed to n = N (N + 1 even, > alpha) with
    remainder <= |C(alpha, N+1)| q^(N+1) E[u^(N+1)] / (1 - rho); E[u^n] = Delta^n, the n-th
    forward difference of exp(m l (l - 1)) at 0 (computed as for sampling without replacement,
    below, each term bounded from the side that makes the sum an upper bound).  On the
    complement, whose probability is Gaussian-small, E[u^n; .] and g are bounded by closed
    forms (|u| <= 1 below, |u| <= L above; g(x) <= (1 + x)^alpha <= L^alpha above, g <= alpha
    below).  Where that does not converge (smaller noise) A_alpha - 1 >~ 1e-5 and the plain sum
    of A_alpha is used.

  Every sum stops at the first admissible index where the first omitted term is below 1e-10 of
  the partial sum (plain sum: of the partial sum minus 1, floored at 1e-15 of the partial sum),
  or at ``_MAX_FRAC_TERMS`` terms (still an upper bound, only looser).  A first-order bound on
  the floating-point error of the terms and of the sum is added on top.
* Every fractional result is also capped by the log-convex interpolation between the
  neighbouring integer orders: alpha -> log A_alpha is convex (Lyapunov/Hoelder) and
  log A_1 = 0, so log A_alpha <= (c - alpha) log A_f + (alpha - f) log A_c with f, c the floor
  and ceiling.  Both are upper bounds, so their minimum is one; the series wins whenever it
  converged, the interpolation only where the series had to stop early.
* Measured against mpmath (A_alpha - 1 by quadrature of its non-negative integrand, or the
  exact binomial sum): on DEFAULT_ORDERS for q in {1e-6, 1e-4, 0.01, 0.1, 0.5, 0.99} and sigma
  in {0.3, 0.7, 1, 2, 5, 20, 1000} at most 1e-10 relative above and never below; on a wider
  grid (q from 1e-8 to 0.999, sigma from 0.15 to 1e6, orders 1.01 to 63.7) at most 3.1e-10.

Sampling without replacement (replace-one adjacency)
----------------------------------------------------
Fixed-size batches, q = batch size / dataset size; Wang, Balle & Kasiviswanathan (2019),
"Subsampled Renyi Differential Privacy and Analytical Moments Accountant" (WBK19).  Here
``noise_multiplier`` is relative to the replace-one sensitivity (2C for DP-SGD with clipping
norm C); eps(j) = j / (2 s^2) is the Gaussian's RDP.  For integer alpha >= 2:

    (alpha - 1) eps_S(alpha) <= log(1 + q^2 C(alpha, 2) min(4 (e^{eps(2)} - 1), 2 e^{eps(2)})
                                    + sum_{j=3}^{alpha} q^j C(alpha, j) T_j),

with T_j = 2 e^{(j - 1) eps(j)} (Theorem 9) or, for the Gaussian, min(that, 4 Xi_j) (Theorem
27, the forward-difference bound; used for alpha <= 256, as dp_accounting does):
Xi_j = Delta^j for even j and sqrt(Delta^(j-1) Delta^(j+1)) for odd j, where

    Delta^n = sum_{l=0}^{n} C(n, l) (-1)^(n-l) e^{(l - 1) eps(l)} = E_{z~N(0,s^2)}[(L(z) - 1)^n],
    e^{(l - 1) eps(l)} = exp(m l (l - 1)),  m = 1 / (2 s^2).

Delta^n > 0, but the alternating sum loses ~log10(2^n / Delta^n) digits to cancellation
(hundreds for large s).  Expanding exp(m l (l - 1)) = sum_i m^i (l (l - 1))^i / i! and
(l (l - 1))^i = sum_k c_{i,k} l (l - 1) ... (l - k + 1), with c_{i,k} >= 0 from the recurrence
c_{i+1,k} = c_{i,k-2} + 2 (k - 1) c_{i,k-1} + k (k - 1) c_{i,k}, gives a series of non-negative
terms, Delta^n = n! sum_i m^i c_{i,n} / i!, summed (scaled) while x_n = m n (n - 1) is at most
about twice the point where the alternating sum's condition number falls below 1e4, with the
tail bounded by x_n^(i+1) / (i+1)! / (1 - x_n / (i+2)) (as n! c_{i,n} <= (n (n-1))^i); beyond
it the alternating sum is used with a bound on its round-off.  Both are bounded from above (and
from below, for the expansion in u above), so the bound stays sound.  The result is also capped
by the unsampled Gaussian's alpha / (2 s^2) (subsampling never hurts: joint convexity).
Fractional alpha: (alpha - 1) eps(alpha) is convex in alpha, so the linear interpolation of the
integer-order bounds on (alpha - 1) eps at floor(alpha) and ceil(alpha) is an upper bound (WBK19
Corollary 10; at floor 1 the value is 0).  dp_accounting computes the same bound with forward
differences in float log space, which can lose all precision (for large sigma it then falls back
to Theorem 9) or, where the cancellation is milder, come out a few 1e-9 below the exact value.

RDP of the best of a random number of runs (hyper-parameter tuning)
-------------------------------------------------------------------
Papernot & Steinke (2022), "Hyperparameter Tuning with Renyi Differential Privacy" (ICLR;
arXiv 2110.03620v2): a mechanism Q is run K times independently (K independent of the data)
and only the best output is released (:class:`analysis.events.RepeatAndSelectEvent`).  With
eps(a) the RDP of Q at order a, the result at order lambda > 1 is

* Theorem 2, K ~ truncated negative binomial D_{eta, gamma}, eta in (-1, inf), gamma in (0, 1):

    eps'(lambda) = eps(lambda) + (1 + eta) (1 - 1/lh) eps(lh) + (1 + eta) log(1/gamma) / lh
                   + log(E[K]) / (lambda - 1),

  for any second order lh >= 1; minimised here over the orders given (lh = inf included, as
  the limit: its term is (1 + eta) eps(inf), Corollary 3's pure-DP form).  gamma is fixed by
  E[K] = mean (:func:`truncated_negative_binomial_gamma`, rounded down, which only raises
  log(1/gamma) and E[K]: the bound stays valid for the distribution sampled).
* Theorem 6, K ~ Poisson(mu):  eps'(lambda) = eps(lambda) + mu delta_hat + log(mu) / (lambda - 1)
  where Q is (eps_hat, delta_hat)-DP with e^eps_hat <= 1 + 1/(lambda - 1); eps_hat is taken
  at that limit, log(lambda / (lambda - 1)), and delta_hat from Q's RDP by the conversion
  below (or, in :class:`RdpAccountant`, exactly when Q is a pure Gaussian composition).
  mu >= 1 is required: for mu < 1 the formula falls below 0 for a Q that ignores its data
  (eps = delta_hat = 0), which no divergence can, so it cannot hold there.

Finally, RDP is non-decreasing in the order, so each order takes the smallest bound found at
any order >= it.  These are the formulas of dp_accounting's ``_compute_rdp_repeat_and_select``
(which takes delta_hat from the RDP conversion always and supports eta >= 0 only).

RDP -> (eps, delta)
-------------------
Tight conversion (Balle, Barthe, Gaboardi, Hsu & Sato 2020, Thm 21; Asoodeh et al. 2020):

    eps(alpha)   = rdp + log1p(-1/alpha) - (log(delta) + log(alpha)) / (alpha - 1),
    delta(alpha) = exp((alpha - 1) (rdp - eps + log1p(-1/alpha)) - log(alpha)),

minimised over the given orders; together with the KL bound delta(0) <= sqrt(1 - exp(-rdp))
(Bretagnolle-Huber; KL <= D_alpha) as dp_accounting does.  eps is clamped to >= 0, delta to <= 1.

No TensorFlow import; numpy and scipy only.
"""
from __future__ import annotations

import functools
import math
import warnings
from typing import Sequence

import numpy as np
from scipy import optimize, special

from analysis import accountant as _accountant
from analysis import events as _events
from analysis._numerics import (RDP_NOISE_CEILING, RDP_NOISE_FLOOR, clamp_noise, finish,
                                log_expm1, logsumexp)
from analysis._checks import (MAX_STEPS, check_delta, check_nonnegative, check_orders,
                              check_probability, check_real, check_same_length, check_steps)

__all__ = [
    "DEFAULT_ORDERS",
    "MAX_ORDER",
    "MAX_STEPS",
    "OrderAtBoundaryWarning",
    "RdpAccountant",
    "compute_rdp",
    "compute_rdp_sample_without_replacement",
    "compute_heterogeneous_rdp",
    "compute_rdp_repeat_and_select",
    "get_privacy_spent",
    "get_privacy_spent_optimal_order",
    "truncated_negative_binomial_gamma",
    "truncated_negative_binomial_log_mean",
]

#: Orders used when none are given: 1.25, 1.5, ..., 10.5; 11, 12, ..., 64; 128, 256, 512, 1024.
DEFAULT_ORDERS: tuple[float, ...] = tuple(
    [1.0 + x / 4.0 for x in range(1, 39)] + [float(a) for a in range(11, 65)]
    + [128.0, 256.0, 512.0, 1024.0])

_EPS = np.finfo(np.float64).eps
_MAX_FRAC_TERMS = 1 << 16  # cap on the series length per fractional order (then interpolation)
_FRAC_REL_TOL = 1e-10      # series truncation target, relative to A_alpha - 1
_MAX_SEARCH_ORDER = 1e4    # upper end of the continuous order search
#: Noise multipliers in (0, 1e-100) are accounted as 0 (RDP inf) and those in (1e100, inf) as
#: 1e100 (:func:`analysis._numerics.clamp_noise`; beyond these 1/(2 s^2) and s^2 leave
#: float64's range).
_TINY = math.ulp(0.0)  # a positive RDP that underflows is reported as this, not 0

#: Largest finite order accepted by the functions that compute RDP (the integer-order sums and
#: the fractional-order series allocate O(alpha) terms: 1e6 takes about a second).
MAX_ORDER = 1e6


class OrderAtBoundaryWarning(UserWarning):
  """The optimal Renyi order is the first or last order given: widen the list of orders."""


# ------------------------------------------------------------------------------------------
# Poisson-subsampled Gaussian: log A_alpha.


@functools.lru_cache(maxsize=4096)
def _log_a_int(q: float, s: float, alpha: int) -> float:
  """Upper bound (exact up to a ~1e-13 round-off allowance) on log A_alpha, integer alpha >= 2."""
  k = np.arange(2, alpha + 1, dtype=np.float64)
  log_q, log_1mq = math.log(q), math.log1p(-q)
  log_binom = special.gammaln(alpha + 1.0) - special.gammaln(k + 1.0) - special.gammaln(
      alpha - k + 1.0)
  expo = (k * k - k) / (2.0 * s * s)
  pieces = log_binom + (alpha - k) * log_1mq + k * log_q
  log_terms = pieces + log_expm1(expo)
  log_am1 = logsumexp(log_terms)
  # Round-off: each log term has absolute error <~ eps * (sum of magnitudes of its parts).
  scale = (special.gammaln(alpha + 1.0) + np.abs(pieces) + expo).max() + alpha
  log_am1 += 8.0 * _EPS * scale
  return float(np.logaddexp(0.0, log_am1))


def _frac_terms(q: float, s: float, alpha: float, k: np.ndarray, subtract: int | None) -> dict:
  """Log-magnitudes and signs (per series) of the terms at indices ``k``, and their parts.

  Series 0 is sum_k a_k M0_k and series 1 sum_k b_k M1_(alpha-k) (module docstring).  With
  ``subtract`` = 0 (or 1) the terms of series 0 (or 1) are a_k (M0_k - 1) (or b_k (M1 - 1)):
  the binomial expansion of 1 is subtracted term by term, so the sum is A_alpha - 1; "one" is
  then the log-magnitude of the terms of that expansion.  Arrays keyed by name (suffix 0 / 1
  for the series), so that chunks can be concatenated.
  """
  log_q, log_1mq = math.log(q), math.log1p(-q)
  z0 = s * s * (log_1mq - log_q) + 0.5
  inv_2s2 = 1.0 / (2.0 * s * s)
  j = alpha - k
  log_abs_binom = (special.gammaln(alpha + 1.0) - special.gammaln(k + 1.0)
                   - special.gammaln(j + 1.0))  # gammaln is log|Gamma|
  n = math.ceil(alpha)
  sign = np.where((k > n) & ((k - n) % 2 == 1), -1.0, 1.0)
  out = {"common": special.gammaln(alpha + 1.0) + np.abs(log_abs_binom) + 16.0}
  parts = [((k * k - k) * inv_2s2, j * log_1mq + k * log_q, special.log_ndtr((z0 - k) / s)),
           ((j * j - j) * inv_2s2, j * log_q + k * log_1mq, special.log_ndtr((j - z0) / s))]
  for i, (e, p, c) in enumerate(parts):
    log_coef = log_abs_binom + p
    x = e + c  # log of M_i (a truncated moment of the likelihood ratio)
    if subtract == i:
      # log|expm1(x)| = max(x, 0) + log(-expm1(-|x|)), and its sign (log 0 = -inf at x = 0).
      with np.errstate(divide="ignore"):
        log_mag = np.maximum(x, 0.0) + np.log(-np.expm1(-np.abs(x)))
      out[f"log{i}"], out[f"sign{i}"] = log_coef + log_mag, sign * np.sign(x)
      out["one"] = log_coef
    else:
      out[f"log{i}"], out[f"sign{i}"] = log_coef + x, sign
    out[f"coef{i}"], out[f"x{i}"], out[f"e{i}"], out[f"p{i}"], out[f"c{i}"] = (
        log_coef, x, e, p, c)
  return out


def _frac_log_errors(t: dict, i: int, subtracted: bool) -> np.ndarray:
  """Log of a first-order bound on the floating-point error of each term of series ``i``."""
  log_t, e, p, c = t[f"log{i}"], np.abs(t[f"e{i}"]), np.abs(t[f"p{i}"]), np.abs(t[f"c{i}"])
  if subtracted:
    # The coefficient's relative error (eps |parts|) on the term; x = e + c carries an
    # absolute error <~ 4 eps (|e| + |c|) (log_ndtr is accurate to a few ulps), which moves
    # M - 1 = expm1(x) by at most max(1, M) times that; expm1 adds an ulp of the term.
    with np.errstate(divide="ignore"):
      err = np.logaddexp(log_t + np.log(t["common"] + p + 2.0),
                         t[f"coef{i}"] + np.maximum(t[f"x{i}"], 0.0) + np.log(4.0 * (e + c)))
  else:  # the term's log is a sum of parts of this total magnitude (eps each); exp adds ulps
    err = log_t + np.log(t["common"] + p + e + c)
  return err + math.log(4.0 * _EPS)


def _log_frac_series(q: float, s: float, alpha: float, rel_tol: float,
                     subtract: int | None) -> float:
  """Upper bound on log A_alpha (subtract None) or log(A_alpha - 1) by the two-series expansion.

  Sums terms k = 0 .. K-1 where K - ceil(alpha) is odd (so the first omitted terms are
  negative and the partial sums bound the series from above) and the first omitted terms have
  magnitude below ``rel_tol`` times the partial sum (with subtract None: times the partial sum
  minus 1, but not below 1e-15 of the partial sum, where round-off dominates anyway), or K is
  the largest such index below ``_MAX_FRAC_TERMS``.  With ``subtract`` set, the binomial
  expansion of 1 in the ratio q / (1 - q) (subtract = 0, q < 1/2) or (1 - q) / q
  (subtract = 1, q > 1/2) is subtracted term by term; its tail after K terms lies in
  [its term K, 0], so the magnitude of that term is added.  Adds a first-order bound on the
  floating-point error of the terms and of their sum.
  """
  n = math.ceil(alpha)
  size, done = n + 64, 0
  chunks, t = [], None
  keys = ("log0", "log1", "sign0", "sign1") + (("one",) if subtract is not None else ())
  while True:
    # Terms done .. size - 1, appended to those already computed (the keys the stopping rule
    # reads are joined at every step, the others once at the end).
    chunks.append(_frac_terms(q, s, alpha, np.arange(done, size, dtype=np.float64), subtract))
    t = ({key: chunks[0][key] for key in keys} if t is None else
         {key: np.concatenate([t[key], chunks[-1][key]]) for key in keys})
    done = size
    mag = np.logaddexp(t["log0"], t["log1"])  # log(|t0_k| + |t1_k|)
    if subtract is not None:
      mag = np.logaddexp(mag, t["one"])
    # Partial sums S_K (terms 0 .. K-1), scaled by exp(-shift), to place the stopping index.
    shift = float(max(t["log0"].max(), t["log1"].max()))
    if shift == -math.inf:
      return -math.inf
    partial = np.concatenate([[0.0], np.cumsum(t["sign0"] * np.exp(t["log0"] - shift)
                                               + t["sign1"] * np.exp(t["log1"] - shift))])
    cand = np.arange(n + 1, size, 2)  # stopping indices: K >= n + 1 with K - n odd
    target = partial[cand]
    if subtract is None:
      target = np.maximum(np.abs(target - math.exp(-shift)) * rel_tol, 1e-15 * target)
    else:
      target = np.abs(target) * rel_tol
    with np.errstate(divide="ignore", invalid="ignore"):
      ok = cand[mag[cand] - shift <= np.log(target)]
    if ok.size or size >= _MAX_FRAC_TERMS:
      stop = int(ok[0]) if ok.size else int(cand[-1])
      break
    size = min(4 * size, _MAX_FRAC_TERMS)
  head = ({key: value[:stop] for key, value in chunks[0].items()} if len(chunks) == 1 else
          {key: np.concatenate([chunk[key] for chunk in chunks])[:stop] for key in chunks[0]})
  log_t = np.concatenate([head["log0"], head["log1"]])
  sgn = np.concatenate([head["sign0"], head["sign1"]])
  log_e = np.concatenate([_frac_log_errors(head, 0, subtract == 0),
                          _frac_log_errors(head, 1, subtract == 1)])
  if subtract is not None:  # the tail of the subtracted expansion of 1, at most |its term K|
    log_t = np.append(log_t, t["one"][stop])
    sgn = np.append(sgn, 1.0)
    log_e = np.append(log_e, t["one"][stop] + math.log(4.0 * _EPS * (alpha + 64.0)))
  shift = float(log_t.max())
  weights = np.exp(log_t - shift)
  total = math.fsum(sgn * weights)  # correctly rounded sum of the computed terms
  # Round-off: the per-term bounds above, and fsum adds half an ulp of the total.
  allowance = float(np.sum(np.exp(log_e - shift))) + _EPS * abs(total)
  upper = total + allowance
  if not upper > 0.0:
    return math.inf
  return shift + math.log(upper)


#: q within this distance of 1/2 (where neither binomial expansion of 1 converges fast) uses
#: the centred expansion when the noise is large enough (m = 1 / (2 s^2) <= _CENTRED_MAX_M),
#: else the uncentred two-series sum (there A_alpha - 1 is large enough for its round-off).
_CENTRED_Q_BAND = 0.02
_CENTRED_MAX_M = 0.02
_CENTRED_RHO = 0.9


def _log_am1_centred(q: float, s: float, alpha: float, rel_tol: float) -> float | None:
  """Upper bound on log(A_alpha - 1) by the expansion in u = L - 1 (module docstring).

  None when the bound does not reach ``rel_tol`` (large alpha or small noise).
  """
  m = 1.0 / (2.0 * s * s)
  log_fd_hi, log_fd_lo = _log_gauss_forward_differences(s)
  log_q = math.log(q)
  rho = _CENTRED_RHO
  # Region B = {|q u| > rho}: z > zu (u > rho / q), or z < zl (u < -rho / q, only if q > rho).
  zu = s * s * math.log1p(rho / q) + 0.5
  log_p_low = float(special.log_ndtr((s * s * math.log1p(-rho / q) + 0.5) / s)) if q > rho \
      else -math.inf
  gl_alpha = float(special.gammaln(alpha + 1.0))
  first = max(3, 2 * math.ceil((alpha + 1.0) / 2.0) - 1)  # N odd: N + 1 even and > alpha
  for big_n in range(first, len(log_fd_hi) - 1, 2):
    nn = np.arange(2, big_n + 1, dtype=np.float64)
    log_abs_c = gl_alpha - special.gammaln(nn + 1.0) - special.gammaln(alpha - nn + 1.0)
    c_sign = np.sign(special.binom(alpha, nn))
    idx = nn.astype(int)
    log_fd = np.where(c_sign > 0, log_fd_hi[idx], log_fd_lo[idx])  # bound each term above
    log_terms = log_abs_c + nn * log_q + log_fd
    shift = float(log_terms.max())
    weights = np.exp(log_terms - shift)
    total = math.fsum(c_sign * weights)
    if not total > 0.0:
      return None
    log_total = shift + math.log(total)
    # Remainder on G: |C(alpha, N+1)| q^(N+1) Delta^(N+1) / (1 - rho) (N + 1 even).
    nr = big_n + 1.0
    log_rem = (gl_alpha - special.gammaln(nr + 1.0) - special.gammaln(alpha - nr + 1.0)
               + nr * log_q + log_fd_hi[big_n + 1] - math.log1p(-rho))
    # Region B: sum_n |C| q^n (P(low) + E[L^n; z > zu]) + E[L^alpha; z > zu] + alpha P(low).
    log_upper_n = m * nn * (nn - 1.0) + special.log_ndtr((nn - zu) / s)
    log_b = float(np.logaddexp.reduce(np.concatenate([
        log_abs_c + nn * log_q + np.logaddexp(log_p_low, log_upper_n),
        [m * alpha * (alpha - 1.0) + float(special.log_ndtr((alpha - zu) / s)),
         math.log(alpha) + log_p_low]])))
    if max(log_rem, log_b) > math.log(rel_tol) + log_total:
      if log_rem > log_terms[0]:  # the terms do not decrease: not converging
        return None
      continue
    # Round-off: each term's log is a sum of parts of magnitude <= scale (eps each).
    scale = gl_alpha + np.abs(log_abs_c) + nn * abs(log_q) + np.abs(log_fd)
    allowance = 4.0 * _EPS * (float(np.sum(weights * (scale + 8.0))) + abs(total))
    return float(np.logaddexp(shift + math.log(total + allowance),
                              np.logaddexp(log_rem, log_b)))
  return None


def _log_a(q: float, s: float, alpha: float) -> float:
  """log A_alpha (an upper bound, see module doc) for 0 < q < 1, 0 < s < inf, 1 < alpha < inf."""
  if float(alpha).is_integer():
    return _log_a_int(q, s, int(alpha))
  f, c = math.floor(alpha), math.ceil(alpha)
  log_f = 0.0 if f == 1 else _log_a_int(q, s, f)
  log_c = _log_a_int(q, s, c)
  interp = (c - alpha) * log_f + (alpha - f) * log_c
  if abs(q - 0.5) >= _CENTRED_Q_BAND:
    # A_alpha - 1 directly (no cancellation against 1): series 0 or 1 minus the expansion of 1.
    log_am1 = _log_frac_series(q, s, alpha, _FRAC_REL_TOL, 0 if q < 0.5 else 1)
    series = float(np.logaddexp(0.0, log_am1))
  else:
    log_am1 = None
    if 1.0 / (2.0 * s * s) <= _CENTRED_MAX_M:
      log_am1 = _log_am1_centred(q, s, alpha, _FRAC_REL_TOL)
    if log_am1 is not None:
      series = float(np.logaddexp(0.0, log_am1))
    else:  # A_alpha - 1 >~ 1e-5 here: the plain sum's round-off (~1e-15 of A) is small
      series = _log_frac_series(q, s, alpha, _FRAC_REL_TOL, None)
  return min(series, interp)


def _accounted_noise_rdp(s: float) -> float:
  return clamp_noise(s, RDP_NOISE_FLOOR, RDP_NOISE_CEILING)


def _edge_case_rdp(q: float, s: float, alpha: float) -> float | None:
  """RDP of one step in the closed-form cases (q in {0, 1}, s in {0, inf}, alpha = inf)."""
  if q == 0.0 or s == math.inf:
    return 0.0
  if s == 0.0 or alpha == math.inf:
    return math.inf
  if q == 1.0:
    return alpha / (2.0 * s * s)
  return None


def _rdp_one_step(q: float, s: float, alpha: float) -> float:
  s = _accounted_noise_rdp(s)
  edge = _edge_case_rdp(q, s, alpha)
  if edge is not None:
    return max(edge, _TINY) if 0.0 < edge else edge
  return max(_log_a(q, s, alpha) / (alpha - 1.0), _TINY)


def _scale_by_steps(rdp: float, steps: int) -> float:
  if steps == 0 or rdp == 0.0:
    return 0.0
  return rdp * steps


def compute_rdp(q: float, noise_multiplier: float, steps: int, orders):
  """RDP of ``steps`` compositions of the Poisson-subsampled Gaussian mechanism.

  Add-or-remove-one adjacency.  For each order alpha returns
  ``steps * log(A_alpha) / (alpha - 1)`` (nats) with A_alpha as in the module docstring:
  exact at integer orders up to a ~1e-13 relative round-off allowance (binomial expansion,
  log space); at fractional orders an upper bound on A_alpha - 1 (computed directly, without
  cancellation against 1) from series with their truncation remainders bounded and a round-off
  allowance added, never below the true RDP.  Measured excess over mpmath: <= 1e-10 relative
  on :data:`DEFAULT_ORDERS` for q from 1e-6 to 0.99 and sigma from 0.3 to 1000, also where the
  RDP is tiny (e.g. 6.25e-15 at q = 1e-4, sigma = 1000, alpha = 1.25; an earlier version,
  which summed A_alpha itself, was 60% high there and ~1e-5 relative high at alpha = 1.0001,
  q = 256/60000, sigma = 1.1).

  Monotonicity in the order: the true RDP is non-decreasing in alpha; the returned values are
  upper bounds at most ~1e-9 relative above it, so they are non-decreasing up to that (no
  decrease at all was found for q in [1e-5, 1], sigma in [0.1, 1e3], orders in [1.01, 300]).

  Args:
    q: Poisson sampling probability, in [0, 1].
    noise_multiplier: noise std / L2 sensitivity, in [0, inf].
    steps: number of steps, an integer in [0, 2**53] (10**8 takes no longer than 1).
    orders: one order or a non-empty list/tuple/1-D array of orders, each in (1, 1e6] or inf.

  Returns:
    A float for a scalar ``orders``, else an ``np.ndarray`` of the same length, with values in
    [0, inf]: 0 for q = 0 or steps = 0 or noise_multiplier = inf; ``steps * alpha / (2 s^2)``
    for q = 1; inf for noise_multiplier = 0 (q > 0) and for alpha = inf.

  Raises:
    ValueError: q outside [0, 1], negative or NaN noise_multiplier, ``steps`` not an integer
      in [0, 2**53], an empty ``orders``, or an order <= 1, NaN, or finite above 1e6.
  """
  q = check_probability("q", q)
  s = check_nonnegative("noise_multiplier", noise_multiplier)
  steps = check_steps("steps", steps)
  alphas, scalar = check_orders("orders", orders, max_finite=MAX_ORDER)
  return finish([_scale_by_steps(_rdp_one_step(q, s, float(a)), steps) for a in alphas], scalar)


# ------------------------------------------------------------------------------------------
# Sampling without replacement.


#: Forward differences of the Gaussian moments (WBK19 Thm 27) are used up to this order, as
#: dp_accounting does; above it the Theorem 9 terms alone.
_WOR_FD_MAX_ORDER = 256
def _fd_series_max_x(n: np.ndarray) -> np.ndarray:
  """Largest x_n = m n (n - 1) at which Delta^n is summed as a positive series.

  n (ln(n) / 2 + 1) + 20: about twice the x at which the alternating binomial sum's condition
  number falls below 1e4 (measured with mpmath for n <= 1025); beyond it that sum is used, with
  its round-off bound.
  """
  return n * (0.5 * np.log(np.maximum(n, 1.0)) + 1.0) + 20.0


@functools.lru_cache(maxsize=256)
def _log_gauss_forward_differences(s: float):
  """(upper, lower) bounds on log Delta^n, n = 0 .. _WOR_FD_MAX_ORDER + 1 (module docstring).

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
    # Delta^n > 0 (module docstring), so a non-positive bound means no information.
    out[rest] = np.where(upper > 0.0, log_upper, math.inf)
    low[rest] = np.where(lower > 0.0, log_lower, -math.inf)
  return out, low


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


def _wor_one_step(q: float, s: float, alpha: float) -> float:
  s = _accounted_noise_rdp(s)
  edge = _edge_case_rdp(q, s, alpha)
  if edge is not None:
    return max(edge, _TINY) if 0.0 < edge else edge
  if float(alpha).is_integer():
    return max(_wor_log_moment_int(q, s, int(alpha)) / (alpha - 1.0), _TINY)
  f, c = math.floor(alpha), math.ceil(alpha)
  t = alpha - f
  moment = (1.0 - t) * _wor_log_moment_int(q, s, f) + t * _wor_log_moment_int(q, s, c)
  return max(moment / (alpha - 1.0), _TINY)


def compute_rdp_sample_without_replacement(q: float, noise_multiplier: float, steps: int,
                                           orders):
  """RDP upper bound of ``steps`` Gaussian steps on fixed-size batches sampled without replacement.

  Replace-one adjacency; Wang, Balle & Kasiviswanathan (2019) Theorem 9 at integer orders
  >= 2, with the Gaussian-specific forward-difference terms of their Theorem 27 (orders up to
  256, as dp_accounting; module docstring), capped by the unsampled Gaussian's
  alpha / (2 s^2); at fractional orders the linear interpolation of (alpha - 1) * eps between
  floor(alpha) and ceil(alpha), which is an upper bound because (alpha - 1) * eps(alpha) is
  convex in alpha (at floor 1 it is 0).  The forward differences are evaluated without
  cancellation, so the values are the exact bound up to ~1e-12 relative: never above
  dp_accounting's by more than that, and below it where its float forward differences lose
  precision (e.g. 3.2e-5 against 0.415 at q = 0.9, sigma = 1000, alpha = 64, where the Gaussian
  cap binds).  Examples (issue 12): q = 0.01, sigma = 2.5, 50 steps, alpha = 50: 0.0985
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
  q = check_probability("q", q)
  s = check_nonnegative("noise_multiplier", noise_multiplier)
  steps = check_steps("steps", steps)
  alphas, scalar = check_orders("orders", orders, max_finite=MAX_ORDER)
  return finish([_scale_by_steps(_wor_one_step(q, s, float(a)), steps) for a in alphas], scalar)


def compute_heterogeneous_rdp(sampling_probabilities: Sequence[float],
                              noise_multipliers: Sequence[float], steps_list: Sequence[int],
                              orders):
  """RDP of consecutive Poisson-subsampled Gaussian phases: the sum of their compute_rdp.

  Phase i runs ``steps_list[i]`` steps (an integer in [0, 2**53]) with
  ``sampling_probabilities[i]`` in [0, 1] and ``noise_multipliers[i]`` in [0, inf].  RDP
  composes additively, so the result at each order is sum_i compute_rdp(q_i, s_i, T_i, alpha)
  (nats).  Empty phase lists give 0; ``orders`` must be non-empty, as in :func:`compute_rdp`.

  Returns:
    Float for a scalar order, else ``np.ndarray``.

  Raises:
    ValueError: sequences of different lengths (or not sequences), or any per-phase argument
      out of range (the message names e.g. ``noise_multipliers[2]``), or a bad order.
  """
  count = check_same_length(sampling_probabilities=sampling_probabilities,
                            noise_multipliers=noise_multipliers, steps_list=steps_list)
  alphas, scalar = check_orders("orders", orders, max_finite=MAX_ORDER)
  total = np.zeros(alphas.shape, dtype=np.float64)
  for i in range(count):
    q = check_probability(f"sampling_probabilities[{i}]", sampling_probabilities[i])
    s = check_nonnegative(f"noise_multipliers[{i}]", noise_multipliers[i])
    steps = check_steps(f"steps_list[{i}]", steps_list[i])
    total += np.array([_scale_by_steps(_rdp_one_step(q, s, float(a)), steps) for a in alphas])
  return finish(list(total), scalar)


# ------------------------------------------------------------------------------------------
# Conversion to (eps, delta).


def _eps_tight(alpha: float, rdp: float, log_delta: float) -> float:
  """The tight conversion alone (no KL route) at one order; inf where rdp is inf."""
  if rdp == math.inf or alpha == math.inf:
    return math.inf
  return rdp + math.log1p(-1.0 / alpha) - (log_delta + math.log(alpha)) / (alpha - 1.0)


def _log_delta_tight(alpha: float, rdp: float, eps: float) -> float:
  """The tight conversion alone (log delta, no KL route) at one order; inf where rdp is inf."""
  if rdp == math.inf or alpha == math.inf:
    return math.inf
  return (alpha - 1.0) * (rdp - eps + math.log1p(-1.0 / alpha)) - math.log(alpha)


def _eps_at(alpha: float, rdp: float, log_delta: float) -> float:
  """Tight conversion at one order; inf where rdp is inf.  Not clamped."""
  eps = _eps_tight(alpha, rdp, log_delta)
  if eps == math.inf:
    return eps
  # KL route: delta(0) <= sqrt(1 - exp(-KL)) <= sqrt(1 - exp(-rdp)), so eps = 0 suffices.
  if rdp == 0.0 or 0.5 * math.log(-math.expm1(-rdp)) <= log_delta:
    eps = min(eps, 0.0)
  return eps


def _log_delta_at(alpha: float, rdp: float, eps: float) -> float:
  """Tight conversion at one order (log delta, not clamped); inf where rdp is inf."""
  log_delta = _log_delta_tight(alpha, rdp, eps)
  if log_delta == math.inf:
    return log_delta
  kl = 0.5 * math.log(-math.expm1(-rdp)) if rdp > 0 else -math.inf
  return min(log_delta, kl)


def _check_targets(target_eps, target_delta):
  if (target_eps is None) == (target_delta is None):
    raise ValueError("Exactly one of target_eps and target_delta must be given "
                     f"(got target_eps={target_eps!r}, target_delta={target_delta!r}).")
  if target_delta is not None:
    return None, check_delta("target_delta", target_delta)
  eps = check_nonnegative("target_eps", target_eps)
  return eps, None


def _best(orders: np.ndarray, rdp: np.ndarray, target_eps, target_delta):
  """(eps, delta, optimal order, index) over the orders, or index None if all are inf."""
  if target_delta is not None:
    log_delta = math.log(target_delta)
    values = [_eps_at(float(a), float(r), log_delta) for a, r in zip(orders, rdp)]
  else:
    values = [_log_delta_at(float(a), float(r), target_eps) for a, r in zip(orders, rdp)]
  finite = [i for i, v in enumerate(values) if v != math.inf]
  if not finite:
    if target_delta is not None:
      return math.inf, target_delta, None, None
    return target_eps, 1.0, None, None
  best = min(finite, key=lambda i: values[i])
  if target_delta is not None:
    return max(values[best], 0.0), target_delta, float(orders[best]), best
  return target_eps, min(math.exp(values[best]), 1.0), float(orders[best]), best


def _checked_rdp_curve(orders, rdp):
  """``(alphas, values)``: an RDP curve given as ``orders`` (each in (1, inf], scalars allowed)
  and ``rdp`` (nats, each in [0, inf], same length) as float64 arrays; ValueError naming the
  argument otherwise."""
  if isinstance(orders, (int, float, np.floating, np.integer)):
    orders = [orders]
  if isinstance(rdp, (int, float, np.floating, np.integer)):
    rdp = [rdp]
  check_same_length(orders=orders, rdp=rdp)
  alphas, _ = check_orders("orders", list(orders))
  values = np.empty(len(rdp), dtype=np.float64)
  for i, r in enumerate(rdp):
    r = check_real(f"rdp[{i}]", r)
    if r < 0.0:
      raise ValueError(f"rdp[{i}] must be in [0, inf], got {r!r}.")
    values[i] = r
  return alphas, values


def get_privacy_spent(orders, rdp, target_eps: float | None = None,
                      target_delta: float | None = None):
  """Converts RDP at several orders to (eps, delta)-DP, choosing the best order.

  Uses the tight conversion (Balle et al. 2020, Thm 21; Asoodeh et al. 2020): at order alpha,

    eps   = rdp + log1p(-1/alpha) - (log(delta) + log(alpha)) / (alpha - 1),
    delta = exp((alpha - 1) (rdp - eps + log1p(-1/alpha)) - log(alpha)),

  and the KL bound delta <= sqrt(1 - exp(-rdp)) valid at every eps >= 0; the minimum over the
  orders is returned.  Orders whose RDP is inf are skipped.

  Args:
    orders: non-empty sequence of orders, each in (1, inf].
    rdp: sequence of RDP values (nats, in [0, inf]), same length as ``orders``.
    target_eps: give this (>= 0) to get the smallest delta, or
    target_delta: give this (in (0, 1)) to get the smallest eps.  Exactly one of the two.

  Returns:
    ``(eps, delta, optimal_order)``.  eps >= 0 (inf if every rdp is inf); delta in [0, 1];
    optimal_order is the order attaining the optimum, or None if every rdp is inf.  The
    given target is returned unchanged in its slot.

  Warns:
    OrderAtBoundaryWarning: when the optimum is at the first or last order of a list of two or
      more (and the result is not already eps = 0 / delta = 0): a wider list may do better.

  Raises:
    ValueError: both or neither target, target_delta outside (0, 1), target_eps < 0 or NaN,
      mismatched lengths, empty ``orders``, an order <= 1, or an rdp value that is negative or
      NaN.
  """
  target_eps, target_delta = _check_targets(target_eps, target_delta)
  alphas, values = _checked_rdp_curve(orders, rdp)
  eps, delta, order, index = _best(alphas, values, target_eps, target_delta)
  trivial = (eps == 0.0) if target_delta is not None else (delta == 0.0)
  if (index is not None and alphas.size > 1 and not trivial
      and index in (0, alphas.size - 1)):
    where = "first" if index == 0 else "last"
    warnings.warn(
        f"The optimal Renyi order {order:g} is the {where} of the orders given; a wider range "
        "of orders may give a smaller bound.", OrderAtBoundaryWarning, stacklevel=2)
  return eps, delta, order


# ------------------------------------------------------------------------------------------
# Continuous order search.


def get_privacy_spent_optimal_order(q: float, noise_multiplier: float, steps: int, *,
                                    target_eps: float | None = None,
                                    target_delta: float | None = None, orders=None):
  """(eps, delta, order) for the Poisson-subsampled Gaussian with the order optimised over reals.

  First evaluates the grid ``orders`` (default :data:`DEFAULT_ORDERS`) as
  :func:`get_privacy_spent` does.  The per-order bound is the minimum of two functions of
  alpha: the tight conversion, which is unimodal in alpha, and the KL route
  (delta <= sqrt(1 - exp(-rdp))), which is non-decreasing in alpha because the RDP is.  So
  the real-order optimum is the better of (a) a bounded scalar search, in u = log(alpha - 1),
  of the tight conversion over the bracket around its best grid order (extended down towards
  1, to 1 + (orders[0] - 1) * 1e-3, or up to 1e4, when that order is at an end of the grid),
  and (b) the KL route at the lowest order of that domain.  (Searching the minimum of the two
  directly is wrong: it has two basins, and the search can stall in the KL one.)  Each
  candidate is re-evaluated with the sound :func:`compute_rdp` at its order, and the best of
  the grid answer and the candidates is returned, so the result is never worse than the
  grid's and is a valid (eps, delta)-DP guarantee.

  Args:
    q: sampling probability in [0, 1]; noise_multiplier: in [0, inf]; steps: integer in
      [0, 2**53].
    target_eps: eps >= 0 for which to minimise delta, or target_delta in (0, 1) for which to
      minimise eps.  Exactly one.
    orders: non-empty grid of orders (each in (1, 1e6] or inf); default DEFAULT_ORDERS.

  Returns:
    ``(eps, delta, optimal_order)`` as in :func:`get_privacy_spent` (order None if every
    order gives inf).

  Raises:
    ValueError: as :func:`compute_rdp` and :func:`get_privacy_spent`.
  """
  q = check_probability("q", q)
  s = check_nonnegative("noise_multiplier", noise_multiplier)
  steps = check_steps("steps", steps)
  target_eps, target_delta = _check_targets(target_eps, target_delta)
  grid, _ = check_orders("orders", list(DEFAULT_ORDERS if orders is None else orders),
                         max_finite=MAX_ORDER)
  grid = np.sort(grid)
  rdp = compute_rdp(q, s, steps, grid)
  eps, delta, order, index = _best(grid, rdp, target_eps, target_delta)
  if index is None or (eps == 0.0 if target_delta is not None else delta == 0.0):
    return eps, delta, order
  if target_delta is not None:
    log_delta = math.log(target_delta)
    tight = lambda a, r: _eps_tight(a, r, log_delta)  # noqa: E731
    full = lambda a, r: _eps_at(a, r, log_delta)  # noqa: E731
  else:
    tight = lambda a, r: _log_delta_tight(a, r, target_eps)  # noqa: E731
    full = lambda a, r: _log_delta_at(a, r, target_eps)  # noqa: E731

  finite_grid = grid[np.isfinite(grid)]
  bottom = 1.0 + (grid[0] - 1.0) * 1e-3  # lowest order searched
  candidates = [bottom]  # the KL route is best at the lowest order
  tight_values = [tight(float(a), float(r)) for a, r in zip(grid, rdp)]
  finite = [i for i, v in enumerate(tight_values) if v != math.inf]
  if finite:
    i = min(finite, key=lambda j: tight_values[j])
    lo = grid[i - 1] if i > 0 else bottom
    hi = grid[i + 1] if i + 1 < grid.size else max(_MAX_SEARCH_ORDER, grid[i])
    if not math.isfinite(hi):
      hi = max(_MAX_SEARCH_ORDER, float(finite_grid.max(initial=2.0)))
    if math.isfinite(lo) and hi > lo:

      def objective(u: float) -> float:
        alpha = 1.0 + math.exp(u)
        value = tight(alpha, compute_rdp(q, s, steps, alpha))
        return value if math.isfinite(value) else 1e300

      result = optimize.minimize_scalar(
          objective, bounds=(math.log(lo - 1.0), math.log(hi - 1.0)), method="bounded",
          options={"xatol": 1e-4})
      candidates.append(1.0 + math.exp(float(result.x)))

  best_value, best_alpha = None, None
  for alpha in candidates:
    value = full(alpha, compute_rdp(q, s, steps, alpha))  # sound value at this order
    if best_value is None or value < best_value:
      best_value, best_alpha = value, alpha
  if target_delta is not None:
    cont = max(best_value, 0.0)
    if cont < eps:
      return cont, delta, best_alpha
  else:
    cont = min(math.exp(min(best_value, 0.0)), 1.0)
    if cont < delta:
      return eps, cont, best_alpha
  return eps, delta, order


# ------------------------------------------------------------------------------------------
# The best of a random number of runs (Papernot & Steinke 2022; module docstring).


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
  formulas in the module docstring.  The second order of Theorem 2 ranges over ``orders``;
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


# ------------------------------------------------------------------------------------------
# The accountant interface (analysis.accountant).


class RdpAccountant(_accountant.Accountant):
  """Renyi-DP accountant implementing :class:`analysis.accountant.Accountant`.

  Supports every atom of :func:`analysis.events.flatten`: plain Gaussian releases (RDP
  ``alpha / (2 sigma^2)``), the Poisson-subsampled Gaussian (:func:`compute_rdp`), the
  Gaussian sampled without replacement (:func:`compute_rdp_sample_without_replacement`) and
  tuned releases (:class:`analysis.events.RepeatAndSelectAtom`: the repeated event's RDP at
  ``orders``, by this accountant, then :func:`compute_rdp_repeat_and_select`, whose Poisson
  delta_hat is this accountant's ``get_delta`` of the repeated event, exact for pure
  Gaussian compositions).  RDP adds over the composition and is converted by
  :func:`get_privacy_spent` over ``orders``.

  Args:
    orders: RDP orders, a non-empty sequence each in (1, 1e6] or inf; default
      :data:`DEFAULT_ORDERS`.
  """

  #: How this accountant's bound is described in a privacy statement.
  method = ("Renyi-DP accounting (Mironov et al. 2019) with the conversion of Balle et al. "
            "(2020)")

  def __init__(self, orders=None):
    super().__init__()
    alphas, _ = check_orders("orders", list(DEFAULT_ORDERS if orders is None else orders),
                             max_finite=MAX_ORDER)
    self._orders = tuple(float(a) for a in alphas)
    self._rdp_cache = None

  @property
  def orders(self) -> tuple:
    """The orders searched."""
    return self._orders

  supports_repeat_and_select = True

  def _check_atoms(self, atoms) -> None:
    pass  # every atom kind has an RDP bound here

  def _changed(self) -> None:
    self._rdp_cache = None

  def rdp(self) -> np.ndarray:
    """The composed RDP at each of :attr:`orders` (nats)."""
    if self._rdp_cache is None:
      total = np.zeros(len(self._orders))
      for atom in self.atoms:
        if isinstance(atom, _events.RepeatAndSelectAtom):
          inner = RdpAccountant(self._orders).compose(atom.event)
          total += atom.count * compute_rdp_repeat_and_select(
              self._orders, inner.rdp(), atom.mean, atom.shape,
              delta_of_epsilon=inner.get_delta)
        elif atom.sampling is None:
          total += compute_rdp(1.0, atom.noise_multiplier, atom.count, self._orders)
        elif isinstance(atom.sampling, tuple):
          n, b = atom.sampling
          total += compute_rdp_sample_without_replacement(b / n, atom.noise_multiplier,
                                                          atom.count, self._orders)
        else:
          total += compute_rdp(atom.sampling, atom.noise_multiplier, atom.count, self._orders)
      self._rdp_cache = total
    return self._rdp_cache

  def epsilon_and_order(self, delta: float):
    """``(epsilon, optimal order, at_boundary)`` by RDP at ``delta`` in (0, 1).

    ``optimal order`` is None when epsilon is inf, nothing was composed, or nothing is
    subsampled (then epsilon is the exact one of ``get_epsilon``);
    ``at_boundary`` is True when it is the first or last of :attr:`orders`.
    """
    delta = check_delta("delta", delta)
    if not self.atoms or self._pure_gaussian_noise() is not None:
      return self.get_epsilon(delta), None, False  # exact, no order involved
    with warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter("always", OrderAtBoundaryWarning)
      eps, _, order = get_privacy_spent(self._orders, self.rdp(), target_delta=delta)
    boundary = any(issubclass(w.category, OrderAtBoundaryWarning) for w in caught)
    return float(eps), order, boundary

  def _epsilon(self, delta: float) -> float:
    return self.epsilon_and_order(delta)[0]

  def _delta(self, epsilon: float) -> float:
    with warnings.catch_warnings():
      warnings.simplefilter("ignore", OrderAtBoundaryWarning)
      _, delta, _ = get_privacy_spent(self._orders, self.rdp(), target_eps=epsilon)
    return float(delta)
