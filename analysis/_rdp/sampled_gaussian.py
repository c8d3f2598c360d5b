"""RDP of the Poisson-subsampled Gaussian mechanism (docs/design/rdp_accountant.md,
"Poisson-subsampled Gaussian").
"""
from __future__ import annotations

import functools
import math
from typing import Sequence

import numpy as np
from scipy import special

from analysis._checks import (check_nonnegative, check_orders, check_probability,
                              check_same_length, check_steps)
from analysis._numerics import finish, log_expm1, logsumexp
from analysis._rdp.common import _EPS, MAX_ORDER, _one_step, _rdp_curve, _scale_by_steps
from analysis._rdp.forward_differences import _log_gauss_forward_differences

_MAX_FRAC_TERMS = 1 << 16  # cap on the series length per fractional order (then interpolation)
_FRAC_REL_TOL = 1e-10      # series truncation target, relative to A_alpha - 1


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

  Series 0 is sum_k a_k M0_k and series 1 sum_k b_k M1_(alpha-k) (design page).  With
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
  """Upper bound on log(A_alpha - 1) by the expansion in u = L - 1 (design page).

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
  """log A_alpha (an upper bound, design page) for 0 < q < 1, 0 < s < inf, 1 < alpha < inf."""
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


def _rdp_one_step(q: float, s: float, alpha: float) -> float:
  return _one_step(q, s, alpha, lambda q, s, alpha: _log_a(q, s, alpha) / (alpha - 1.0))


def compute_rdp(q: float, noise_multiplier: float, steps: int, orders):
  """RDP of ``steps`` compositions of the Poisson-subsampled Gaussian mechanism.

  Add-or-remove-one adjacency.  For each order alpha returns
  ``steps * log(A_alpha) / (alpha - 1)`` (nats) with A_alpha as in
  docs/design/rdp_accountant.md:
  exact at integer orders up to a ~1e-13 relative round-off allowance (binomial expansion,
  log space); at fractional orders an upper bound on A_alpha - 1 (computed directly, without
  cancellation against 1) from series with their truncation remainders bounded and a round-off
  allowance added, never below the true RDP.  Measured excess over mpmath: <= 1e-10 relative
  on :data:`DEFAULT_ORDERS` for q from 1e-6 to 0.99 and sigma from 0.3 to 1000, also where the
  RDP is tiny (e.g. 6.25e-15 at q = 1e-4, sigma = 1000, alpha = 1.25), because A_alpha - 1 is
  summed rather than A_alpha (whose round-off would swamp an RDP that small).

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
  return _rdp_curve(_rdp_one_step, q, noise_multiplier, steps, orders)


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
