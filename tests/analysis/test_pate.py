"""Tests of analysis.pate against computations independent of it.

References:
* the exact output distributions of GNMax and LNMax on small histograms, by numerical
  integration in mpmath (P[answer = j] = int density_j(x) prod_{i != j} cdf_i(x) dx), checked
  against the two-class closed forms; the exact Renyi divergence between them for every
  neighbouring histogram (one vote moved), which every bound must dominate;
* the threshold check's exact binary output distributions;
* the exact Renyi divergence between two Gaussians of different variances (GNSS);
* analysis.rdp_accountant (Gaussian RDP and exact Gaussian composition) and dp_accounting
  (Laplace RDP) for the data-independent parts;
* brute force over every histogram of a few teachers for the local and smooth sensitivities;
* Theorem 6 and Theorem 2 re-implemented here in 40-digit mpmath, and the RDP conversion
  re-implemented here, for the accountant's epsilon.
No expected number below was produced by the code under test.
"""
from __future__ import annotations

import functools
import itertools
import math

import mpmath
import numpy as np
import pytest

from analysis import events, pate, pld_accountant, rdp_accountant
from dp_references import dp_accounting as _dp_accounting, dp_rdp as _dp_rdp

_DPS = 24  # digits for the exact references (probabilities near 1e-13 need ~ 20)
ORDERS = [1.25, 1.5, 2.0, 2.5, 3.0, 4.5, 6.0, 9.0]


# ------------------------------------------------------------------------------------------
# Independent references.


@functools.lru_cache(maxsize=None)
def _gnmax_probs(votes: tuple, sigma: float) -> tuple:
  """Exact P[GNMax answers j], 40 digits."""
  with mpmath.workdps(_DPS):
    s = mpmath.mpf(sigma)
    out = []
    for j, nj in enumerate(votes):
      others = [n for i, n in enumerate(votes) if i != j]

      def integrand(t, nj=nj, others=others):  # x = nj + s t
        value = mpmath.npdf(t)
        for n in others:
          value *= mpmath.ncdf((nj - n) / s + t)
        return value

      points = sorted({-12.0, 0.0, 12.0} | {float((n - nj) / sigma) for n in others})
      out.append(mpmath.quad(integrand, [-mpmath.inf] + points + [mpmath.inf]))
    return tuple(out)


def _laplace_cdf(x, b):
  return mpmath.exp(x / b) / 2 if x < 0 else 1 - mpmath.exp(-x / b) / 2


@functools.lru_cache(maxsize=None)
def _lnmax_probs(votes: tuple, b: float) -> tuple:
  """Exact P[LNMax answers j] (Laplace(b) on each count), 40 digits."""
  with mpmath.workdps(_DPS):
    b = mpmath.mpf(b)
    out = []
    for j, nj in enumerate(votes):
      others = [n for i, n in enumerate(votes) if i != j]

      def integrand(x, nj=nj, others=others):
        value = mpmath.exp(-abs(x - nj) / b) / (2 * b)
        for n in others:
          value *= _laplace_cdf(x - n, b)
        return value

      points = sorted(set(float(n) for n in votes))
      out.append(mpmath.quad(integrand, [-mpmath.inf] + points + [mpmath.inf]))
    return tuple(out)


def _renyi(p, q, order) -> float:
  """D_order(p || q) of two finite distributions, in mpmath."""
  with mpmath.workdps(_DPS):
    a = mpmath.mpf(order)
    total = mpmath.fsum(mpmath.mpf(x)**a * mpmath.mpf(y)**(1 - a) for x, y in zip(p, q)
                        if x > 0)
    return float(mpmath.log(total) / (a - 1))


def _neighbours(votes):
  """Every histogram with one vote moved from class a to class b."""
  votes = tuple(votes)
  for a, b in itertools.permutations(range(len(votes)), 2):
    if votes[a] >= 1:
      moved = list(votes)
      moved[a] -= 1
      moved[b] += 1
      yield tuple(moved)


def _histograms(teachers: int, classes: int):
  for cut in itertools.combinations(range(teachers + classes - 1), classes - 1):
    edges = (-1,) + cut + (teachers + classes - 1,)
    yield tuple(edges[i + 1] - edges[i] - 1 for i in range(classes))


def _distance(u, v) -> int:
  return int(sum(abs(x - y) for x, y in zip(u, v)) // 2)


def _mp_theorem6(logq, s, order):
  """PATE 2018 Theorem 6 with Proposition 10's orders (None where not applicable), mpmath."""
  with mpmath.workdps(_DPS):
    q = mpmath.exp(mpmath.mpf(logq))
    s, lam = mpmath.mpf(s), mpmath.mpf(order)
    mu2 = s * mpmath.sqrt(-mpmath.log(q))
    mu1 = mu2 + 1
    e1, e2 = mu1 / s**2, mu2 / s**2
    if not (mu2 > 1 and lam <= mu1 and q * mpmath.exp(e2) < 1):
      return None
    if q > mpmath.exp((mu2 - 1) * e2) / (mu1 / (mu1 - 1) * mu2 / (mu2 - 1))**mu2:
      return None
    a = (1 - q) / (1 - (q * mpmath.exp(e2))**((mu2 - 1) / mu2))
    b = mpmath.exp(e1) / q**(1 / (mu1 - 1))
    return float(mpmath.log((1 - q) * a**(lam - 1) + q * b**(lam - 1)) / (lam - 1))


def _mp_gnmax_rdp(votes, sigma, order):
  """rdp_gnmax recomputed: Prop. 7 in mpmath (erfc form), Theorem 6, min with lambda/s^2."""
  with mpmath.workdps(_DPS):
    top = max(votes)
    terms = [mpmath.erfc(mpmath.mpf(top - n) / (2 * sigma)) / 2 for n in votes]
    q = mpmath.fsum(terms) - mpmath.erfc(0) / 2  # drop one top entry
    q = min(q, 1 - mpmath.mpf(1) / len(votes))
    indep = order / sigma**2
    dep = _mp_theorem6(float(mpmath.log(q)), sigma, order)
    return indep if dep is None else min(dep, indep)


def _tight_epsilon(orders, rdp, delta) -> float:
  """Balle et al. 2020 Thm 21 conversion, minimised over orders (re-implemented here)."""
  best = math.inf
  for a, r in zip(orders, rdp):
    best = min(best, r + math.log1p(-1 / a) - (math.log(delta) + math.log(a)) / (a - 1))
  return max(best, 0.0)


# ------------------------------------------------------------------------------------------
# The references themselves.


def test_integrators_match_two_class_closed_forms():
  # GNMax: P[lose] = Phi(-g / (sqrt(2) sigma)); LNMax: (2 + g/b) e^(-g/b) / 4.
  with mpmath.workdps(_DPS):
    for votes, sigma in [((7, 3), 1.3), ((4, 4), 2.0)]:
      g = votes[0] - votes[1]
      exact = mpmath.ncdf(-g / (mpmath.sqrt(2) * sigma))
      assert abs(_gnmax_probs(votes, sigma)[1] - exact) < 1e-20
    for votes, b in [((7, 3), 0.8), ((4, 4), 2.0)]:
      x = mpmath.mpf(votes[0] - votes[1]) / b
      exact = (2 + x) * mpmath.exp(-x) / 4
      assert abs(_lnmax_probs(votes, b)[1] - exact) < 1e-20
    assert abs(mpmath.fsum(_gnmax_probs((5, 2, 1), 1.5)) - 1) < 1e-20
    assert abs(mpmath.fsum(_lnmax_probs((5, 2, 1), 1.5)) - 1) < 1e-20


# ------------------------------------------------------------------------------------------
# GNMax.

GNMAX_CASES = [((10, 1, 0), 1.0), ((8, 0, 0), 1.0), ((5, 5, 0), 1.0), ((14, 3, 1), 2.0),
               ((12, 0), 1.5)]


@pytest.mark.parametrize("votes,sigma", GNMAX_CASES)
def test_gnmax_bound_dominates_the_exact_divergence(votes, sigma):
  bound = pate.rdp_gnmax(np.array(votes), sigma, ORDERS)
  indep = pate.rdp_gnmax_data_independent(sigma, ORDERS)
  assert np.all(bound <= indep)
  p = _gnmax_probs(votes, sigma)
  for other in _neighbours(votes):
    q = _gnmax_probs(other, sigma)
    for i, order in enumerate(ORDERS):
      exact = _renyi(p, q, order)
      assert exact <= bound[i] * (1 + 1e-9) + 1e-15, (votes, other, order, exact, bound[i])


def test_gnmax_bound_is_data_dependent_where_it_should_be():
  # Unanimous votes at small noise: far below lambda / sigma^2; ties: exactly lambda / sigma^2.
  orders = np.array([1.5, 2.0, 3.0])
  assert np.all(pate.rdp_gnmax([10, 1, 0], 1.0, orders) < 0.05 * orders)
  np.testing.assert_array_equal(pate.rdp_gnmax([5, 5, 0], 1.0, ORDERS),
                                np.array(ORDERS) / 1.0)


def test_gnmax_matches_an_independent_recomputation():
  for votes, sigma in GNMAX_CASES + [((200, 30, 10, 5, 5, 0, 0, 0, 0, 0), 40.0)]:
    for order in [1.5, 3.0, 6.0, 20.0, 50.0]:
      ours = pate.rdp_gnmax(votes, sigma, order)
      ref = _mp_gnmax_rdp(votes, sigma, order)
      assert ours == pytest.approx(ref, rel=1e-9, abs=1e-300), (votes, sigma, order)


def test_gnmax_data_independent_is_the_gaussian_with_multiplier_sigma_over_sqrt2():
  for sigma in [0.7, 3.0, 40.0]:
    ours = pate.rdp_gnmax_data_independent(sigma, ORDERS)
    ref = rdp_accountant.compute_rdp(1.0, sigma / math.sqrt(2), 1, ORDERS)
    np.testing.assert_allclose(ours, ref, rtol=1e-12)


def test_gnmax_monotone_in_the_vote_gap():
  orders = [1.5, 2.0, 4.0, 8.0, 20.0]
  for sigma in [1.0, 3.0, 10.0]:
    previous = None
    for runner_up in range(0, 31):
      rdp = pate.rdp_gnmax([60 - runner_up, runner_up, 0], sigma, orders)
      if previous is not None:
        assert np.all(rdp >= previous * (1 - 1e-12)), (sigma, runner_up)
      previous = rdp


def test_gnmax_sigma_dependence():
  # Data-independent: decreasing in sigma.  Data-dependent: not monotone, and rightly so: as
  # sigma -> 0 the answer becomes certain, and the exact divergence shrinks too.
  sigmas = [0.5, 1.0, 2.0, 4.0]
  indep = [pate.rdp_gnmax_data_independent(s, 2.0) for s in sigmas]
  assert indep == sorted(indep, reverse=True)
  votes = (10, 1, 0)
  exact = [max(_renyi(_gnmax_probs(votes, s), _gnmax_probs(o, s), 2.0) for o in _neighbours(votes))
           for s in (0.5, 2.0)]
  assert exact[0] < exact[1]
  assert pate.rdp_gnmax(votes, 0.5, 2.0) < pate.rdp_gnmax(votes, 2.0, 2.0)


def test_gnmax_one_class_is_free():
  assert pate.rdp_gnmax([7], 1.0, 2.0) == 0.0
  assert pate.log_q_gnmax([7], 1.0) == -math.inf
  np.testing.assert_array_equal(pate.local_sensitivity_gnmax([7], 7, 1.0, 2.0), np.zeros(8))


def test_gnmax_scalar_and_array_orders():
  assert isinstance(pate.rdp_gnmax([3, 1], 1.0, 2.0), float)
  assert pate.rdp_gnmax([3, 1], 1.0, [2.0]).shape == (1,)
  assert pate.rdp_gnmax([3, 1], 1.0, [2.0, math.inf])[1] == math.inf


# ------------------------------------------------------------------------------------------
# Threshold check.


def _binary(p):
  return (p, 1 - p)


@pytest.mark.parametrize("votes,threshold,sigma1,shifted", [
    ((10, 1, 0), 5.0, 1.0, False), ((10, 1, 0), 14.0, 1.5, False), ((3, 3, 3), 3.0, 1.0, False),
    ((9.3, -1.2, 0.4), 5.5, 1.2, True), ((0.0, -0.5), 6.0, 2.0, True)])
def test_threshold_bound_dominates_the_exact_divergence(votes, threshold, sigma1, shifted):
  bound = pate.rdp_threshold(votes, threshold, sigma1, ORDERS, shifted=shifted)
  assert np.all(bound <= pate.rdp_threshold_data_independent(sigma1, ORDERS))
  x = max(votes)
  with mpmath.workdps(_DPS):
    p = mpmath.ncdf((x - threshold) / mpmath.mpf(sigma1))
    assert abs(mpmath.exp(pate.log_pr_answered(votes, threshold, sigma1, shifted=shifted)) - p) < 1e-13
    # A neighbour's checked maximum is anywhere in [x - 1, x + 1].
    for y in np.linspace(x - 1, x + 1, 21):
      q = mpmath.ncdf((y - threshold) / mpmath.mpf(sigma1))
      for i, order in enumerate(ORDERS):
        exact = _renyi(_binary(p), _binary(q), order)
        assert exact <= bound[i] * (1 + 1e-9) + 1e-15, (y, order)


def test_threshold_data_independent_is_the_sensitivity_one_gaussian():
  ref = rdp_accountant.compute_rdp(1.0, 150.0, 1, ORDERS)
  np.testing.assert_allclose(pate.rdp_threshold_data_independent(150.0, ORDERS), ref, rtol=1e-12)


def test_threshold_matches_theorem6_with_sqrt2_sigma1():
  for votes, threshold, sigma1 in [((240, 5, 5), 200.0, 150.0), ((100, 90, 60), 200.0, 20.0),
                                   ((250, 0), 200.0, 10.0), ((10, 1, 0), 3.0, 1.0)]:
    with mpmath.workdps(_DPS):
      p = mpmath.ncdf((max(votes) - threshold) / mpmath.mpf(sigma1))
      logq = float(mpmath.log(min(p, 1 - p)))
    for order in [2.0, 5.0, 20.0, 80.0]:
      indep = order / (2 * sigma1**2)
      dep = _mp_theorem6(logq, math.sqrt(2) * sigma1, order)
      ref = indep if dep is None else min(dep, indep)
      assert pate.rdp_threshold(votes, threshold, sigma1, order) == pytest.approx(ref, rel=1e-9)


def test_threshold_shifted_uses_the_real_maximum():
  shifted = np.array([9.4, 2.0, -3.0])
  log_p = pate.log_pr_answered(shifted, 5.0, 2.0, shifted=True)
  assert log_p == pytest.approx(float(mpmath.log(mpmath.ncdf((9.4 - 5.0) / 2.0))), rel=1e-12)
  with pytest.raises(ValueError, match="votes must be non-negative"):
    pate.log_pr_answered(shifted, 5.0, 2.0)
  with pytest.raises(ValueError, match="votes must be integer-valued"):
    pate.log_pr_answered([9.4, 2.0], 5.0, 2.0)


# ------------------------------------------------------------------------------------------
# LNMax.

LNMAX_CASES = [((10, 1, 0), 1.0), ((8, 0, 0), 0.5), ((5, 5, 0), 1.0), ((9, 2, 1), 0.7),
               ((7, 0), 2.0)]


@pytest.mark.parametrize("votes,b", LNMAX_CASES)
def test_lnmax_bound_dominates_the_exact_divergence(votes, b):
  bound = pate.rdp_lnmax(votes, b, ORDERS)
  indep = pate.rdp_lnmax_data_independent(b, ORDERS)
  assert np.all(bound <= indep)
  p = _lnmax_probs(votes, b)
  for other in _neighbours(votes):
    q = _lnmax_probs(other, b)
    for i, order in enumerate(ORDERS):
      exact = _renyi(p, q, order)
      assert exact <= bound[i] * (1 + 1e-9) + 1e-15, (votes, other, order)


def test_lnmax_is_data_dependent_for_clear_majorities():
  orders = np.array([1.5, 2.0, 3.0])
  assert np.all(pate.rdp_lnmax([10, 1, 0], 1.0, orders)
                < 0.1 * pate.rdp_lnmax_data_independent(1.0, orders))


def test_lnmax_pure_epsilon_is_two_over_b():
  # A moved vote changes two counts: 1 / b (one count) is exceeded by LNMax's own answer
  # distribution on a tie, so the per-answer pure epsilon must be 2 / b.
  b = 1.0
  votes, other = (3, 3), (2, 4)
  worst = max(abs(float(mpmath.log(x / y))) for x, y in
              zip(_lnmax_probs(votes, b), _lnmax_probs(other, b)))
  assert worst > 1.0 / b
  assert pate.rdp_lnmax_data_independent(b, math.inf) == 2.0 / b
  assert pate.rdp_lnmax_data_independent(b, 1e5) <= 2.0 / b


def test_lnmax_data_independent_pieces():
  dp_accounting = _dp_accounting()
  rdp_module = _dp_rdp()
  for b in [0.5, 1.0, 4.0]:
    eps = 2.0 / b
    ours = pate.rdp_lnmax_data_independent(b, ORDERS)
    # (ii) twice the Laplace mechanism's RDP at noise multiplier b (dp_accounting).
    acc = rdp_module.RdpAccountant(ORDERS)
    acc.compose(dp_accounting.LaplaceDpEvent(b), 2)
    laplace_twice = np.asarray(acc._rdp)  # pylint: disable=protected-access
    # (i) randomized response at eps, exact divergence of the two binary distributions.
    p = mpmath.exp(eps) / (1 + mpmath.exp(eps))
    rr = np.array([_renyi((p, 1 - p), (1 - p, p), a) for a in ORDERS])
    np.testing.assert_allclose(ours, np.minimum(laplace_twice, rr), rtol=1e-9)
    assert np.all(ours <= np.minimum(eps, np.array(ORDERS) * eps**2 / 2) * (1 + 1e-12))


def test_lnmax_matches_theorem2_recomputed():
  for votes, b in LNMAX_CASES + [((150, 50, 30, 20), 20.0)]:
    eps = 2.0 / b
    with mpmath.workdps(_DPS):
      top = max(votes)
      rest = list(votes)
      rest.remove(top)
      q = mpmath.fsum((2 + mpmath.mpf(top - n) / b) / (4 * mpmath.exp(mpmath.mpf(top - n) / b))
                      for n in rest)
      q = min(q, 1 - mpmath.mpf(1) / len(votes))
      for order in [1.5, 3.0, 10.0]:
        indep = float(pate.rdp_lnmax_data_independent(b, order))
        ref = indep
        if q < 1 / (mpmath.exp(eps) + 1):
          lam = mpmath.mpf(order)
          dep = mpmath.log((1 - q) * ((1 - q) / (1 - mpmath.exp(eps) * q))**(lam - 1)
                           + q * mpmath.exp(eps * (lam - 1))) / (lam - 1)
          ref = min(float(dep), indep)
        assert pate.rdp_lnmax(votes, b, order) == pytest.approx(ref, rel=1e-9)


def test_lnmax_one_class_is_free():
  assert pate.rdp_lnmax([4], 1.0, 3.0) == 0.0


# ------------------------------------------------------------------------------------------
# Smooth sensitivity: brute force over every histogram of a few teachers.


def _brute_local(f, teachers, classes):
  """{histogram: [max LS within distance d, d = 0..teachers]} of f by enumeration."""
  hists = list(_histograms(teachers, classes))
  values = {h: f(h) for h in hists}
  ls = {h: max((abs(values[o] - values[h]) for o in _neighbours(h)), default=0.0)
        for h in hists}
  return {h: [max(ls[o] for o in hists if _distance(h, o) <= d) for d in range(teachers + 1)]
          for h in hists}, hists


@pytest.mark.parametrize("teachers,classes,sigma,order",
                         [(10, 3, 1.0, 2.0), (10, 3, 1.0, 5.0), (9, 3, 0.7, 3.0), (14, 2, 2.0, 4.0)])
def test_gnmax_local_sensitivity_dominates_brute_force(teachers, classes, sigma, order):
  assert pate._gnmax_table(sigma, order, classes)[2]  # C5 holds: no fallback  # pylint: disable=protected-access
  brute, hists = _brute_local(lambda h: pate.rdp_gnmax(h, sigma, order), teachers, classes)
  ours = {h: pate.local_sensitivity_gnmax(h, teachers, sigma, order) for h in hists}
  assert max(max(v) for v in brute.values()) > 0.1  # not vacuous
  for h in hists:
    assert np.all(ours[h] >= np.array(brute[h]) * (1 - 1e-9) - 1e-12), h
    assert np.all(np.diff(ours[h]) >= 0)
    for other in _neighbours(h):  # U^(d)(D) <= U^(d+1)(D'): the smoothness condition
      assert np.all(ours[h][:-1] <= ours[other][1:] * (1 + 1e-12) + 1e-15), (h, other)
    assert ours[h][-1] == ours[hists[0]][-1]  # the global maximum, the same for all
    assert ours[h][-1] <= order / sigma**2


@pytest.mark.parametrize("teachers,classes,threshold,sigma1,order",
                         [(10, 3, 6.0, 1.0, 2.0), (12, 2, 9.0, 1.5, 4.0), (8, 4, 4.0, 0.8, 3.0)])
def test_threshold_local_sensitivity_dominates_brute_force(teachers, classes, threshold, sigma1,
                                                           order):
  brute, hists = _brute_local(lambda h: pate.rdp_threshold(h, threshold, sigma1, order),
                              teachers, classes)
  assert max(max(v) for v in brute.values()) > 0.05
  for h in hists:
    ours = pate.local_sensitivity_threshold(h, teachers, threshold, sigma1, order)
    assert np.all(ours >= np.array(brute[h]) * (1 - 1e-9) - 1e-12), h
    for other in _neighbours(h):
      theirs = pate.local_sensitivity_threshold(other, teachers, threshold, sigma1, order)
      assert np.all(ours[:-1] <= theirs[1:] * (1 + 1e-12) + 1e-15)


def test_threshold_shifted_local_sensitivity_dominates_brute_force():
  teachers, classes, threshold, sigma1, order = 9, 3, 5.2, 1.0, 3.0
  shift = np.array([0.35, 1.7, 0.9])  # alpha * student probabilities

  def f(h):
    return pate.rdp_threshold(np.array(h) - shift, threshold, sigma1, order, shifted=True)

  assert pate._threshold_c5(math.sqrt(2) * sigma1, order)  # pylint: disable=protected-access
  brute, hists = _brute_local(f, teachers, classes)
  assert max(max(v) for v in brute.values()) > 0.05
  for h in hists:
    ours = pate.local_sensitivity_threshold(np.array(h) - shift, teachers, threshold, sigma1,
                                            order, shifted=True)
    assert np.all(ours >= np.array(brute[h]) * (1 - 1e-9) - 1e-12), h
    for other in _neighbours(h):
      theirs = pate.local_sensitivity_threshold(np.array(other) - shift, teachers, threshold,
                                                sigma1, order, shifted=True)
      assert np.all(ours[:-1] <= theirs[1:] * (1 + 1e-12) + 1e-15)


def test_smooth_sensitivity_is_the_discounted_maximum_and_beta_smooth():
  teachers, sigma, order, beta = 10, 1.0, 3.0, 0.2
  hists = list(_histograms(teachers, 3))
  ss = {h: pate.smooth_sensitivity_gnmax(beta, h, teachers, sigma, order) for h in hists}
  for h in hists:
    ls = pate.local_sensitivity_gnmax(h, teachers, sigma, order)
    assert ss[h] == max(ls[d] * math.exp(-beta * d) for d in range(teachers + 1))
    for other in _neighbours(h):
      assert ss[h] <= math.exp(beta) * ss[other] * (1 + 1e-12)
  ss_t = pate.smooth_sensitivity_threshold(beta, (7, 2, 1), teachers, 6.0, 1.0, order)
  ls_t = pate.local_sensitivity_threshold((7, 2, 1), teachers, 6.0, 1.0, order)
  assert ss_t == max(ls_t[d] * math.exp(-beta * d) for d in range(teachers + 1))


def test_gnss_rdp_dominates_the_exact_gaussian_divergences():
  # Worst neighbours of f + S N(0, sigma^2): means S apart, S' = S e^(+-beta).
  for beta, sigma_ss, order in [(0.01, 5.0, 20.0), (0.1, 2.0, 3.0), (0.2, 10.0, 2.4)]:
    bound = pate.rdp_smooth_sensitivity_release(beta, sigma_ss, order)
    with mpmath.workdps(_DPS):
      lam = mpmath.mpf(order)
      for ratio in (mpmath.exp(beta), mpmath.exp(-beta)):
        s1, s2 = mpmath.mpf(sigma_ss), sigma_ss * ratio
        for shift in (1, ratio):  # |f(D) - f(D')| <= S(D) or S(D')
          for v1, v2 in ((s1, s2), (s2, s1)):
            var = lam * v2**2 + (1 - lam) * v1**2
            assert var > 0
            exact = (lam * shift**2 / (2 * var)
                     - mpmath.log(var / (v1**(2 * (1 - lam)) * v2**(2 * lam))) / (2 * (lam - 1)))
            assert float(exact) <= bound
  assert pate.rdp_smooth_sensitivity_release(0.0, 3.0, 2.0) == pytest.approx(2.0 / 9.0)


# ------------------------------------------------------------------------------------------
# The accountant.


def _synthetic_votes(queries, teachers=250, classes=10, seed=0):
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(queries):
    p = rng.dirichlet(np.full(classes, 0.15))
    out.append(np.bincount(rng.choice(classes, size=teachers, p=p), minlength=classes))
  return out


def test_accountant_confident_gnmax_against_a_recomputation():
  # The MNIST setting of PATE 2018 (T = 200, sigma1 = 150, sigma2 = 40, delta = 1e-5) on
  # synthetic votes: the published 1.97 needs the real votes, so the same formula is recomputed
  # here independently (mpmath Theorem 6, tight conversion over a dense grid of real orders).
  votes = _synthetic_votes(60)
  rng = np.random.default_rng(1)
  threshold, sigma1, sigma2, delta = 200.0, 150.0, 40.0, 1e-5
  acc = pate.PateAccountant()
  answered = []
  for v in votes:
    ok = bool(v.max() + rng.normal(0, sigma1) >= threshold)
    answered.append(ok)
    acc.compose_confident_gnmax(v, threshold, sigma1, sigma2, ok)
  assert acc.queries == 60 and acc.answered == sum(answered) and 0 < sum(answered) < 60
  dense = np.geomspace(1.05, 600.0, 250)

  @functools.lru_cache(maxsize=None)
  def per_query(i, order):
    v = votes[i]
    with mpmath.workdps(_DPS):
      p = mpmath.ncdf((int(v.max()) - threshold) / mpmath.mpf(sigma1))
      logq = float(mpmath.log(min(p, 1 - p)))
    dep = _mp_theorem6(logq, math.sqrt(2) * sigma1, order)
    cost = order / (2 * sigma1**2) if dep is None else min(dep, order / (2 * sigma1**2))
    if answered[i]:
      cost += _mp_gnmax_rdp(tuple(int(x) for x in v), sigma2, order)
    return cost

  grid = [2.0, 8.0, 32.0, 128.0]
  ref_grid = [sum(per_query(i, a) for i in range(60)) for a in grid]
  np.testing.assert_allclose(acc.rdp(grid), ref_grid, rtol=1e-8)
  ref = _tight_epsilon(dense, acc.rdp(dense), delta)
  eps = acc.private_data_dependent_epsilon(delta)
  assert eps <= ref * (1 + 1e-9)
  assert eps >= ref * (1 - 2e-3)
  # Data-independent: exact Gaussian composition of the ledger, by hand.
  indep = rdp_accountant.RdpAccountant().compose(events.SelfComposedEvent(
      events.GaussianEvent(sigma1), 60)).compose(events.SelfComposedEvent(
          events.GaussianEvent(sigma2 / math.sqrt(2)), sum(answered)))
  assert acc.data_independent_epsilon(delta) == pytest.approx(indep.get_epsilon(delta),
                                                               rel=1e-12)
  assert eps < acc.data_independent_epsilon(delta)
  assert acc.private_data_dependent_delta(eps * 1.01) <= delta * 1.0001
  assert acc.private_data_dependent_delta(eps * 1.01) <= acc.data_independent_delta(eps * 1.01)


def test_accountant_gnmax_data_independent_equals_rdp_accountant():
  acc = pate.PateAccountant()
  for v in _synthetic_votes(5, teachers=50, classes=4):
    acc.compose_gnmax(v, 7.0)
  ref = rdp_accountant.RdpAccountant().compose(events.GaussianEvent(7.0 / math.sqrt(2)), 5)
  for delta in [1e-3, 1e-6]:
    assert acc.data_independent_epsilon(delta) == ref.get_epsilon(delta)
  np.testing.assert_allclose(acc.rdp(data_independent=True), ref.rdp(), rtol=1e-12)
  assert acc.ledger == events.ComposedEvent((events.GaussianEvent(7.0 / math.sqrt(2)),) * 5)
  assert acc.atoms == ref.atoms


def test_accountant_interactive_and_lnmax_and_plain_events():
  acc = pate.PateAccountant(num_teachers=20)
  votes = np.array([15, 3, 2])
  student = np.array([0.7, 0.2, 0.1])
  acc.compose_interactive_gnmax(votes, votes - 5.0 * student, 12.0, 3.0, 2.0, answered=False)
  acc.compose_interactive_gnmax(votes, votes - 5.0 * student, 12.0, 3.0, 2.0, answered=True)
  acc.compose_lnmax(votes, 4.0)
  acc.compose(events.GaussianEvent(5.0), 3)
  acc.compose(events.LaplaceEvent(10.0))
  assert (acc.queries, acc.answered) == (3, 2)
  orders = [1.5, 2.0, 5.0]
  thr = pate.rdp_threshold(votes - 5.0 * student, 12.0, 3.0, orders, shifted=True)
  expected = (2 * thr + pate.rdp_gnmax(votes, 2.0, orders) + pate.rdp_lnmax(votes, 4.0, orders)
              + 3 * np.array(orders) / 50.0
              + np.asarray(_laplace_rdp_reference(10.0, orders)))
  np.testing.assert_allclose(acc.rdp(orders), expected, rtol=1e-12)
  assert acc.private_data_dependent_epsilon(1e-5) <= acc.data_independent_epsilon(1e-5)
  with pytest.raises(events.UnsupportedEventError):
    _ = acc.atoms  # Laplace parts are not Gaussian atoms
  assert isinstance(acc.ledger.events[-1], events.LaplaceEvent)


def _laplace_rdp_reference(b, orders):
  acc = _dp_rdp().RdpAccountant(orders)
  acc.compose(_dp_accounting().LaplaceDpEvent(b))
  return acc._rdp  # pylint: disable=protected-access


def test_accountant_refuses_sampled_events_before_recording():
  acc = pate.PateAccountant()
  acc.compose_gnmax([5, 1], 2.0)
  before = acc.ledger
  with pytest.raises(events.UnsupportedEventError):
    acc.compose(events.PoissonSampledEvent(0.1, events.GaussianEvent(1.0)))
  assert acc.ledger == before and acc.queries == 1


def test_rdp_and_pld_accountants_refuse_laplace_events():
  for acc in (rdp_accountant.RdpAccountant(), pld_accountant.PLDAccountant()):
    with pytest.raises(events.UnsupportedEventError):
      acc.compose(events.LaplaceEvent(1.0))
    assert acc.ledger == events.ComposedEvent(())
  dp_accounting = _dp_accounting()
  assert events.to_dp_accounting(events.LaplaceEvent(2.5)) == dp_accounting.LaplaceDpEvent(2.5)
  with pytest.raises(ValueError, match="noise_multiplier"):
    events.LaplaceEvent(0.0)


def test_accountant_smooth_sensitivity_epsilon():
  votes = _synthetic_votes(12, teachers=40, classes=5, seed=3)
  acc = pate.PateAccountant()
  for i, v in enumerate(votes):
    acc.compose_confident_gnmax(v, 25.0, 6.0, 3.0, answered=(i % 3 != 0))
  order, beta, sigma_ss, delta = 8.0, 0.05, 3.0, 1e-5
  ls = np.zeros(41)
  for i, v in enumerate(votes):
    ls += pate.local_sensitivity_threshold(v, 40, 25.0, 6.0, order)
    if i % 3 != 0:
      ls += pate.local_sensitivity_gnmax(v, 40, 3.0, order)
  smooth = max(ls * np.exp(-beta * np.arange(41)))
  assert acc.smooth_sensitivity(beta, order) == pytest.approx(smooth, rel=1e-12)
  result = acc.smooth_sensitivity_epsilon(delta, beta, sigma_ss, order, rng=7)
  z = np.random.default_rng(7).normal(0.0, sigma_ss)
  assert result.sanitized_rdp == pytest.approx(max(0.0, acc.rdp(order) + smooth * z), rel=1e-12)
  assert result.release_rdp == pate.rdp_smooth_sensitivity_release(beta, sigma_ss, order)
  total = result.sanitized_rdp + result.release_rdp
  conv = total + math.log1p(-1 / order) - (math.log(delta) + math.log(order)) / (order - 1)
  assert result.epsilon == pytest.approx(min(conv, acc.data_independent_epsilon(delta)),
                                         rel=1e-12)
  assert (result.order, result.beta, result.sigma_ss, result.delta) == (order, beta, sigma_ss,
                                                                        delta)
  with pytest.raises(ValueError, match="beta"):
    acc.smooth_sensitivity_epsilon(delta, 1.0 / (2 * order), sigma_ss, order)


def test_empty_accountant():
  acc = pate.PateAccountant()
  assert acc.get_epsilon(1e-5) == 0.0 and acc.get_delta(1.0) == 0.0
  assert acc.private_data_dependent_epsilon(1e-5) == 0.0
  assert acc.private_data_dependent_delta(1.0) == 0.0
  assert acc.data_independent_epsilon(1e-5) == 0.0
  assert acc.queries == 0 and acc.answered == 0


# ------------------------------------------------------------------------------------------
# Argument checks: every error names its argument.

BAD = [
    (lambda: pate.rdp_gnmax([3, -1], 1.0, 2.0), "votes"),
    (lambda: pate.rdp_gnmax([3, 1.5], 1.0, 2.0), "votes"),
    (lambda: pate.rdp_gnmax([], 1.0, 2.0), "votes"),
    (lambda: pate.rdp_gnmax([[1, 2]], 1.0, 2.0), "votes"),
    (lambda: pate.rdp_gnmax([3, np.nan], 1.0, 2.0), "votes"),
    (lambda: pate.rdp_gnmax("12", 1.0, 2.0), "votes"),
    (lambda: pate.rdp_gnmax([3, 1], 0.0, 2.0), "sigma"),
    (lambda: pate.rdp_gnmax([3, 1], -1.0, 2.0), "sigma"),
    (lambda: pate.rdp_gnmax([3, 1], math.inf, 2.0), "sigma"),
    (lambda: pate.rdp_gnmax([3, 1], 1.0, 1.0), "orders"),
    (lambda: pate.rdp_gnmax([3, 1], 1.0, [2.0, 0.5]), r"orders\[1\]"),
    (lambda: pate.rdp_gnmax([3, 1], 1.0, []), "orders"),
    (lambda: pate.rdp_gnmax_data_independent(0.0, 2.0), "sigma"),
    (lambda: pate.rdp_gnmax_data_independent(1.0, 1.0), "orders"),
    (lambda: pate.log_q_gnmax([1, -2], 1.0), "votes"),
    (lambda: pate.log_pr_answered([3, 1], math.nan, 1.0), "threshold"),
    (lambda: pate.log_pr_answered([3, 1], math.inf, 1.0), "threshold"),
    (lambda: pate.log_pr_answered([3, 1], 2.0, 0.0), "sigma1"),
    (lambda: pate.rdp_threshold([3, 1], 2.0, 1.0, 0.9), "orders"),
    (lambda: pate.rdp_threshold([3, 1], 2.0, -1.0, 2.0), "sigma1"),
    (lambda: pate.rdp_threshold([3, np.inf], 2.0, 1.0, 2.0, shifted=True), "votes"),
    (lambda: pate.rdp_threshold_data_independent(0.0, 2.0), "sigma1"),
    (lambda: pate.rdp_lnmax([3, 1], 0.0, 2.0), "laplace_scale"),
    (lambda: pate.rdp_lnmax([3, 1.2], 1.0, 2.0), "votes"),
    (lambda: pate.rdp_lnmax([3, 1], 1.0, 1.0), "orders"),
    (lambda: pate.rdp_lnmax_data_independent(-2.0, 2.0), "laplace_scale"),
    (lambda: pate.log_q_lnmax([3, 1], math.nan), "laplace_scale"),
    (lambda: pate.local_sensitivity_gnmax([3, 1], 3, 1.0, 2.0), "num_teachers"),
    (lambda: pate.local_sensitivity_gnmax([3, 1], 0, 1.0, 2.0), "num_teachers"),
    (lambda: pate.local_sensitivity_gnmax([3, 1], 4.0, 1.0, 2.0), "num_teachers"),
    (lambda: pate.local_sensitivity_gnmax([3, 1], 4, 0.0, 2.0), "sigma"),
    (lambda: pate.local_sensitivity_gnmax([3, 1], 4, 1.0, 1.0), "order"),
    (lambda: pate.local_sensitivity_gnmax([3, 1], 4, 1.0, math.inf), "order"),
    (lambda: pate.smooth_sensitivity_gnmax(-0.1, [3, 1], 4, 1.0, 2.0), "beta"),
    (lambda: pate.smooth_sensitivity_gnmax(math.nan, [3, 1], 4, 1.0, 2.0), "beta"),
    (lambda: pate.local_sensitivity_threshold([3, 1], 4, math.nan, 1.0, 2.0), "threshold"),
    (lambda: pate.local_sensitivity_threshold([3, 1], 4, 2.0, 0.0, 2.0), "sigma1"),
    (lambda: pate.smooth_sensitivity_threshold(-1.0, [3, 1], 4, 2.0, 1.0, 2.0), "beta"),
    (lambda: pate.rdp_smooth_sensitivity_release(0.3, 1.0, 2.0), "beta"),
    (lambda: pate.rdp_smooth_sensitivity_release(-0.1, 1.0, 2.0), "beta"),
    (lambda: pate.rdp_smooth_sensitivity_release(0.1, 0.0, 2.0), "sigma_ss"),
    (lambda: pate.rdp_smooth_sensitivity_release(0.1, 1.0, 1.0), "order"),
    (lambda: pate.PateAccountant(orders=[2.0, 0.5]), r"orders\[1\]"),
    (lambda: pate.PateAccountant(num_teachers=0), "num_teachers"),
    (lambda: pate.PateAccountant(num_teachers=3).compose_gnmax([3, 1], 1.0), "votes"),
    (lambda: pate.PateAccountant().compose_gnmax([3, 1], 0.0), "sigma"),
    (lambda: pate.PateAccountant().compose_lnmax([3, 1], 0.0), "laplace_scale"),
    (lambda: pate.PateAccountant().compose_confident_gnmax([3, 1], 2.0, 1.0, 1.0, 1), "answered"),
    (lambda: pate.PateAccountant().compose_confident_gnmax([3, 1], 2.0, 0.0, 1.0, True), "sigma1"),
    (lambda: pate.PateAccountant().compose_confident_gnmax([3, 1], 2.0, 1.0, 0.0, True), "sigma2"),
    (lambda: pate.PateAccountant().compose_confident_gnmax([3, 1], None, 1.0, 1.0, True),
     "threshold"),
    (lambda: pate.PateAccountant().compose_interactive_gnmax([3, 1], [2.5], 2.0, 1.0, 1.0, True),
     "thresholded_votes"),
    (lambda: pate.PateAccountant().compose(3.0), "event"),
    (lambda: pate.PateAccountant().compose(events.GaussianEvent(1.0), -1), "count"),
    (lambda: pate.PateAccountant().get_epsilon(0.0), "delta"),
    (lambda: pate.PateAccountant().get_delta(-1.0), "epsilon"),
    (lambda: pate.PateAccountant().private_data_dependent_epsilon(0.0), "delta"),
    (lambda: pate.PateAccountant().private_data_dependent_delta(-1.0), "epsilon"),
    (lambda: pate.PateAccountant().data_independent_epsilon(1.0), "delta"),
    (lambda: pate.PateAccountant().smooth_sensitivity(0.1, 0.5), "order"),
    (lambda: pate.PateAccountant().smooth_sensitivity_epsilon(1e-5, 0.01, 1.0, 2.0, rng=-1),
     "rng"),
]


@pytest.mark.parametrize("call,name", BAD)
def test_errors_name_the_argument(call, name):
  with pytest.raises(ValueError, match=name):
    call()


def _consensus_accountant():
  """50 Confident GNMax answers on a strong consensus: the data-dependent epsilon is far below
  the data-independent one, so the two are told apart."""
  acc = pate.PateAccountant(num_teachers=250)
  for _ in range(50):
    acc.compose_confident_gnmax([245, 3, 2], 200.0, 150.0, 40.0, answered=True)
  return acc


def test_generic_interface_reports_the_publishable_data_independent_epsilon():
  # Was: get_epsilon / get_delta returned the PRIVATE data-dependent values, so code written
  # against analysis.accountant_base.Accountant printed a number computed from the votes.
  acc = _consensus_accountant()
  reference = rdp_accountant.RdpAccountant().compose(
      events.SelfComposedEvent(events.GaussianEvent(150.0), 50)).compose(
          events.SelfComposedEvent(events.GaussianEvent(40.0 / math.sqrt(2)), 50))
  # Independent reference: dp_accounting's PLD accountant on the same Gaussian releases.
  dpa_lib = _dp_accounting()
  dpa = dpa_lib.pld.PLDAccountant(value_discretization_interval=1e-4)
  dpa.compose(dpa_lib.GaussianDpEvent(150.0), 50)
  dpa.compose(dpa_lib.GaussianDpEvent(40.0 / math.sqrt(2)), 50)
  for delta in (1e-5, 1e-3):
    assert acc.get_epsilon(delta) == reference.get_epsilon(delta)
    assert acc.get_epsilon(delta) == pytest.approx(dpa.get_epsilon(delta), rel=2e-3)
    private = acc.private_data_dependent_epsilon(delta)
    assert 0 < private < 0.5 * acc.get_epsilon(delta)
  eps = acc.get_epsilon(1e-5)
  assert acc.get_delta(eps) == pytest.approx(reference.get_delta(eps), rel=1e-9)
  assert acc.private_data_dependent_delta(eps) < acc.get_delta(eps)


def test_accountant_holding_vote_histograms_refuses_pickle_but_copies():
  import copy  # pylint: disable=g-import-not-at-top
  import pickle  # pylint: disable=g-import-not-at-top
  acc = pate.PateAccountant(num_teachers=123457 + 5)
  acc.compose_gnmax([123457, 3, 2], 40.0)
  with pytest.raises(TypeError, match="PateAccountant holds .*vote histogram.*cannot be pickled"):
    pickle.dumps(acc)
  twin = copy.deepcopy(acc)  # an in-process copy releases nothing
  assert twin.private_data_dependent_epsilon(1e-5) == acc.private_data_dependent_epsilon(1e-5)
  twin.compose_gnmax([123457, 3, 2], 40.0)
  assert (twin.queries, acc.queries) == (2, 1)
  assert copy.copy(acc).queries == 1
  # What does serialise, the ledger, holds no vote count.
  ledger = pickle.dumps(acc.ledger)
  assert not any(p in ledger for p in (b"123457", (123457).to_bytes(4, "little"),
                                       (123457).to_bytes(8, "little")))
