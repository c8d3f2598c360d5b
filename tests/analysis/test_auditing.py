"""Tests of analysis.auditing against closed forms, scipy references and simulated mechanisms
with known epsilon.  Every expected number is computed here independently (closed forms,
scipy.stats, brute force), never copied from the module's own output."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from analysis import auditing, gaussian


def _rr_accuracy(eps):
  """Probability that eps-randomized response reports the true bit: e^eps / (1 + e^eps)."""
  return math.exp(eps) / (1.0 + math.exp(eps))


def _paper_p_value(m, r, v, eps, delta):
  """Steinke, Nasr & Jagielski 2023, Theorem 3.1, written out directly:
  f(v) + 2 m delta max_{i=1..m} (f(v - i) - f(v)) / i, f(u) = P[Bin(r, p) >= u], capped at 1."""
  p = _rr_accuracy(eps)
  f = lambda u: np.where(u <= 0, 1.0, stats.binom.sf(u - 1, r, p))
  i = np.arange(1, m + 1)
  best = float(np.max((f(v - i) - f(v)) / i)) if m else 0.0
  return min(1.0, float(f(v)) + 2 * m * delta * best)


def _bonferroni_reference(tp, pos, fp, neg, delta, confidence):
  """Jagielski et al. 2020 with Clopper-Pearson bounds from scipy's beta quantiles: TPR's
  lower and FPR's upper bound, each failing w.p. alpha/2.  Returns (form 1, complement form)."""
  tail = (1.0 - confidence) / 2.0
  tpr_lo = stats.beta.ppf(tail, tp, pos - tp + 1) if tp > 0 else 0.0
  fpr_hi = stats.beta.ppf(1 - tail, fp + 1, neg - fp) if fp < neg else 1.0
  first = math.log((tpr_lo - delta) / fpr_hi) if tpr_lo > delta else 0.0
  # The complement: a lower bound on 1 - FPR over an upper bound on 1 - TPR.
  second = math.log((1 - fpr_hi - delta) / (1 - tpr_lo)) if 1 - fpr_hi > delta else 0.0
  return max(first, 0.0), max(second, 0.0)


# ------------------------------------------------------------------------------------------
# Clopper-Pearson.


@pytest.mark.parametrize("n", [1, 2, 7, 100, 5000])
@pytest.mark.parametrize("confidence", [0.5, 0.9, 0.95, 0.999])
def test_clopper_pearson_closed_forms_at_the_ends(n, confidence):
  alpha = 1.0 - confidence
  low, high = auditing.clopper_pearson(0, n, confidence)
  assert low == 0.0
  assert high == pytest.approx(1.0 - (alpha / 2) ** (1.0 / n), rel=1e-12)
  low, high = auditing.clopper_pearson(n, n, confidence)
  assert high == 1.0
  assert low == pytest.approx((alpha / 2) ** (1.0 / n), rel=1e-12)


@pytest.mark.parametrize("k,n", [(1, 1), (1, 2), (3, 10), (50, 100), (1, 1000), (999, 1000),
                                 (12345, 20000)])
@pytest.mark.parametrize("confidence", [0.8, 0.95, 0.99])
def test_clopper_pearson_matches_scipy_binomtest(k, n, confidence):
  expected = stats.binomtest(k, n).proportion_ci(confidence_level=confidence, method="exact")
  low, high = auditing.clopper_pearson(k, n, confidence)
  assert low == pytest.approx(expected.low, rel=1e-9, abs=1e-15)
  assert high == pytest.approx(expected.high, rel=1e-9, abs=1e-15)


@pytest.mark.parametrize("n,p", [(20, 0.05), (20, 0.5), (60, 0.9), (60, 0.31)])
def test_clopper_pearson_coverage_is_at_least_the_confidence(n, p):
  # Exact coverage: sum the binomial pmf over the k whose interval contains p.
  for confidence in (0.8, 0.95):
    covered = 0.0
    for k in range(n + 1):
      low, high = auditing.clopper_pearson(k, n, confidence)
      if low <= p <= high:
        covered += stats.binom.pmf(k, n, p)
    assert covered >= confidence - 1e-12


# ------------------------------------------------------------------------------------------
# One training run.


@pytest.mark.parametrize("m,r,v", [(1000, 100, 80), (1000, 100, 100), (50, 20, 17),
                                   (10**5, 2000, 1500), (10**5, 10**5, 60000)])
@pytest.mark.parametrize("confidence", [0.9, 0.95, 0.99])
def test_one_run_delta_zero_is_the_binomial_tail_crossing(m, r, v, confidence):
  eps = auditing.one_run_epsilon_lower_bound(m, r, v, confidence=confidence)
  assert eps > 0.0
  tail = lambda e: stats.binom.sf(v - 1, r, _rr_accuracy(e))
  alpha = 1.0 - confidence
  assert tail(eps) <= alpha * (1 + 1e-9)
  assert tail(eps * (1 + 1e-8)) >= alpha
  assert tail(eps * (1 - 1e-8)) < alpha


@pytest.mark.parametrize("r", [1, 5, 100, 1000])
@pytest.mark.parametrize("confidence", [0.9, 0.95])
def test_max_one_run_bound_closed_form(r, confidence):
  x = (1.0 - confidence) ** (1.0 / r)
  expected = math.log(x / (1.0 - x))  # p^r = 1 - confidence
  got = auditing.max_one_run_epsilon_lower_bound(10 * r, r, confidence=confidence)
  assert got == pytest.approx(max(expected, 0.0), rel=1e-9, abs=1e-12)
  assert got == auditing.one_run_epsilon_lower_bound(10 * r, r, r, confidence=confidence)


@pytest.mark.parametrize("delta", [1e-3, 1e-5])
def test_max_one_run_bound_with_delta_is_the_all_correct_bound(delta):
  assert (auditing.max_one_run_epsilon_lower_bound(1000, 300, delta=delta)
          == auditing.one_run_epsilon_lower_bound(1000, 300, 300, delta=delta))


@pytest.mark.parametrize("m,r,v,delta", [(100, 40, 36, 1e-3), (200, 60, 55, 4e-4),
                                         (1000, 100, 90, 1e-5), (1000, 100, 90, 5e-4),
                                         (500, 500, 400, 1e-3)])
def test_one_run_with_delta_matches_the_theorem_written_out(m, r, v, delta):
  assert 2 * m * delta <= 1  # the paper's p-value is used unchanged there
  eps = auditing.one_run_epsilon_lower_bound(m, r, v, delta=delta, confidence=0.95)
  assert eps > 0.0
  assert _paper_p_value(m, r, v, eps, delta) < 0.05
  assert _paper_p_value(m, r, v, eps * (1 + 1e-7), delta) >= 0.05
  for e in (0.0, 0.5 * eps, eps, 2 * eps):
    assert auditing.one_run_p_value(m, r, v, e, delta) == pytest.approx(
        _paper_p_value(m, r, v, e, delta), rel=1e-9, abs=1e-15)
  # delta only costs: the bound is below the delta = 0 one.
  assert eps < auditing.one_run_epsilon_lower_bound(m, r, v, confidence=0.95)


@pytest.mark.parametrize("m,r,v,delta", [(100, 40, 38, 0.02), (60, 30, 30, 0.05),
                                         (1000, 200, 190, 0.003)])
def test_one_run_large_delta_p_value_is_monotone_and_conservative(m, r, v, delta):
  assert 2 * m * delta > 1
  grid = np.linspace(0.0, 8.0, 161)
  ours = [auditing.one_run_p_value(m, r, v, e, delta) for e in grid]
  assert all(b >= a for a, b in zip(ours, ours[1:]))
  for e, p in zip(grid, ours):
    assert p >= _paper_p_value(m, r, v, e, delta) * (1 - 1e-12)
  eps = auditing.one_run_epsilon_lower_bound(m, r, v, delta=delta)
  if eps > 0:
    assert all(_paper_p_value(m, r, v, e, delta) < 0.05 for e in np.linspace(0, eps, 50))


def test_one_run_monotone_in_correct_guesses_confidence_and_delta():
  bounds = [auditing.one_run_epsilon_lower_bound(1000, 200, v, delta=1e-5)
            for v in range(0, 201, 5)]
  assert all(b >= a for a, b in zip(bounds, bounds[1:]))
  assert bounds[-1] > 2.0
  by_conf = [auditing.one_run_epsilon_lower_bound(1000, 200, 170, confidence=c)
             for c in (0.5, 0.8, 0.9, 0.95, 0.99, 0.999)]
  assert all(b < a for a, b in zip(by_conf, by_conf[1:]))
  by_delta = [auditing.one_run_epsilon_lower_bound(1000, 200, 170, delta=d)
              for d in (0.0, 1e-6, 1e-5, 1e-4, 4e-4)]
  assert all(b <= a for a, b in zip(by_delta, by_delta[1:]))


@pytest.mark.parametrize("m,r", [(1000, 100), (1000, 1000), (10, 1)])
def test_one_run_nothing_claimed_at_chance(m, r):
  assert auditing.one_run_epsilon_lower_bound(m, r, r // 2) == 0.0
  assert auditing.one_run_epsilon_lower_bound(m, r, 0) == 0.0
  assert auditing.one_run_epsilon_lower_bound(m, 0, 0) == 0.0
  assert auditing.one_run_p_value(m, r, r // 2, 0.0) >= 0.05


@pytest.mark.parametrize("eps_true,r", [(0.5, 200), (1.0, 1000), (2.0, 300)])
def test_one_run_exact_error_probability_for_randomized_response(eps_true, r):
  # Randomized response with eps_true is exactly eps_true-DP; each guess is right w.p. p.
  # P[bound > eps_true] = sum of Bin(r, p) pmf over the v whose bound exceeds eps_true.
  p = _rr_accuracy(eps_true)
  lo, hi = stats.binom.ppf([1e-9, 1 - 1e-13], r, p).astype(int)
  wrong = 0.0
  for v in range(lo, hi + 1):
    if auditing.one_run_epsilon_lower_bound(10 * r, r, v) > eps_true:
      wrong += stats.binom.pmf(v, r, p)
  assert wrong <= 0.05
  assert wrong > 0.025  # and the test is not vacuous: RR attains the tail bound


def _simulate_rr_bounds(eps_true, r, reps, rng, delta=0.0, confidence=0.95):
  wins = rng.binomial(r, _rr_accuracy(eps_true), size=reps)
  values, inverse = np.unique(wins, return_inverse=True)
  bounds = np.array([auditing.one_run_epsilon_lower_bound(2 * r, r, int(v), delta=delta,
                                                          confidence=confidence)
                     for v in values])
  return bounds[inverse]


def test_one_run_simulated_randomized_response_coverage_and_convergence():
  rng = np.random.default_rng(20240611)
  eps_true, reps, alpha = 1.0, 2000, 0.05
  tolerance = 3.0 * math.sqrt(alpha * (1 - alpha) / reps)  # 3 binomial standard deviations
  gaps = []
  for r in (100, 1000, 10000, 100000):
    bounds = _simulate_rr_bounds(eps_true, r, reps, rng)
    assert np.mean(bounds > eps_true) <= alpha + tolerance
    gaps.append(eps_true - float(np.mean(bounds)))
  assert all(b < a for a, b in zip(gaps, gaps[1:]))
  assert gaps[-1] < 0.03  # ~1.645 sd of the accuracy estimate, in eps: ~0.012


def test_one_run_simulated_gaussian_canaries_below_true_epsilon():
  # m canaries, each in w.p. 1/2; canary i's score is mu * S_i + N(0, 1): a Gaussian mechanism
  # with noise multiplier 1/mu for each inclusion bit, so (eps(1/mu, delta), delta)-DP in it.
  rng = np.random.default_rng(7)
  m, k, mu, delta, reps = 1000, 60, 3.0, 1e-5, 200
  eps_true = gaussian.epsilon_for_delta(1.0 / mu, delta)
  bounds = []
  for _ in range(reps):
    included = rng.random(m) < 0.5
    order = np.argsort(mu * included + rng.standard_normal(m))
    correct = int(np.sum(included[order[-k:]]) + np.sum(~included[order[:k]]))
    bounds.append(auditing.one_run_epsilon_lower_bound(m, 2 * k, correct, delta=delta))
  bounds = np.array(bounds)
  assert np.mean(bounds > eps_true) <= 0.05 + 3.0 * math.sqrt(0.05 * 0.95 / reps)
  assert np.mean(bounds) > 1.0  # the audit detects a lot of leakage


def test_one_run_simulated_randomized_response_with_delta_coverage():
  # With delta > 0, RR with eps_true is still (eps_true, delta)-DP; many repetitions.
  rng = np.random.default_rng(11)
  for eps_true, r in ((0.5, 500), (2.0, 2000)):
    bounds = _simulate_rr_bounds(eps_true, r, 20000, rng, delta=1e-4)
    assert np.mean(bounds > eps_true) <= 0.05 + 3.0 * math.sqrt(0.05 * 0.95 / 20000)


# ------------------------------------------------------------------------------------------
# One training run, f-DP (Mahloujifar, Melis & Chaudhuri 2024).


@pytest.mark.parametrize("mu", [0.0, 0.3, 1.0, 2.5])
def test_fdp_single_guess_is_the_best_test_accuracy_gaussian(mu):
  # One canary, one guess: the best accuracy of a test between N(0, 1) and N(mu, 1) with
  # prior 1/2 is Phi(mu / 2) (threshold at mu / 2).
  assert auditing.one_run_fdp_p_value(1, 1, 1, mu=mu) == pytest.approx(
      stats.norm.cdf(mu / 2), abs=1e-9)


@pytest.mark.parametrize("eps,delta", [(0.0, 0.0), (0.5, 0.0), (2.0, 1e-2), (6.0, 1e-5)])
def test_fdp_single_guess_is_the_best_test_accuracy_epsilon_delta(eps, delta):
  # (eps, delta)-DP with prior 1/2: the best accuracy is (e^eps + delta) / (1 + e^eps).
  expected = (math.exp(eps) + delta) / (1 + math.exp(eps))
  assert auditing.one_run_fdp_p_value(1, 1, 1, epsilon=eps, delta=delta) == pytest.approx(
      expected, abs=1e-9)


def _lp_max_probability(m, r, v, eps, delta):
  """max P[N >= v] over distributions p_0..p_r of the number N of correct guesses subject to
  the f-DP constraints of the design doc for the (eps, delta) curve, written out directly
  and solved as a linear program: for i = 1..r, with A_i = (1/m) sum_{n >= i} n p_n and
  B_i = (1/m) sum_{n >= i-1} (r - n) p_n, B_i >= max(0, (A_i - delta) e^-eps,
  1 - delta - e^eps (1 - A_i))."""
  optimize = pytest.importorskip("scipy.optimize")
  n = np.arange(r + 1)
  rows, bounds = [], []
  for i in range(1, r + 1):
    a = np.where(n >= i, n, 0) / m
    b = np.where(n >= i - 1, r - n, 0) / m
    rows.append(math.exp(-eps) * a - b)          # (A - delta) e^-eps <= B
    bounds.append(delta * math.exp(-eps))
    rows.append(-math.exp(eps) * a - b)          # 1 - delta - e^eps (1 - A) <= B
    bounds.append(-(1 - delta - math.exp(eps)))
  result = optimize.linprog(-(n >= v).astype(float), A_ub=np.array(rows), b_ub=bounds,
                            A_eq=np.ones((1, r + 1)), b_eq=[1.0], bounds=(0, 1),
                            method="highs")
  assert result.status == 0
  return -result.fun


@pytest.mark.parametrize("m,r,v,eps,delta", [(4, 4, 3, 0.7, 0.0), (6, 4, 4, 1.0, 0.01),
                                             (10, 6, 5, 1.5, 1e-3), (20, 8, 6, 0.4, 0.0),
                                             (30, 12, 11, 2.0, 1e-4)])
def test_fdp_recursion_is_the_optimum_of_the_constraints(m, r, v, eps, delta):
  # The paper's recursion solves max P[N >= v] under its constraints in closed form; a
  # linear program over all distributions of N (brute force) must find the same maximum.
  ours = auditing.one_run_fdp_p_value(m, r, v, epsilon=eps, delta=delta)
  assert ours == pytest.approx(_lp_max_probability(m, r, v, eps, delta), abs=1e-6)


def _convex_max_probability_gaussian(m, r, v, mu):
  """The same maximum for the mu-GDP curve, whose constraints B_i >= Phi(Phi^-1(A_i) - mu)
  are convex: solved by SLSQP from the uniform distribution (an independent optimiser)."""
  optimize = pytest.importorskip("scipy.optimize")
  n = np.arange(r + 1)
  def constraint(p, i):
    a = np.sum(np.where(n >= i, n, 0) * p) / m
    b = np.sum(np.where(n >= i - 1, r - n, 0) * p) / m
    return b - stats.norm.cdf(stats.norm.ppf(min(max(a, 1e-300), 1.0)) - mu)
  constraints = [{"type": "ineq", "fun": constraint, "args": (i,)} for i in range(1, r + 1)]
  constraints.append({"type": "eq", "fun": lambda p: np.sum(p) - 1.0})
  result = optimize.minimize(lambda p: -np.sum(p[v:]), np.full(r + 1, 1.0 / (r + 1)),
                             method="SLSQP", bounds=[(0, 1)] * (r + 1),
                             constraints=constraints, options={"ftol": 1e-12, "maxiter": 500})
  assert result.success
  return -result.fun


@pytest.mark.parametrize("m,r,v,mu", [(4, 4, 3, 0.7), (10, 6, 5, 1.5), (20, 8, 7, 0.5)])
def test_fdp_recursion_is_the_optimum_of_the_constraints_gaussian(m, r, v, mu):
  ours = auditing.one_run_fdp_p_value(m, r, v, mu=mu)
  assert ours == pytest.approx(_convex_max_probability_gaussian(m, r, v, mu), abs=1e-5)


@pytest.mark.parametrize("m,r,v,confidence", [(1000, 100, 92, 0.95), (5000, 400, 330, 0.9)])
def test_fdp_bounds_are_where_the_p_value_crosses_the_level(m, r, v, confidence):
  level = 1 - confidence
  mu = auditing.one_run_gdp_lower_bound(m, r, v, confidence)
  assert auditing.one_run_fdp_p_value(m, r, v, mu=mu * (1 - 1e-6)) < level
  assert auditing.one_run_fdp_p_value(m, r, v, mu=mu * (1 + 1e-6)) >= level
  delta = 1e-5
  assert auditing.one_run_fdp_epsilon_lower_bound(m, r, v, delta, confidence) == pytest.approx(
      gaussian.epsilon_for_delta(1 / mu, delta), rel=1e-9)
  eps = auditing.one_run_fdp_epsilon_lower_bound(m, r, v, delta, confidence,
                                                 family="epsilon_delta")
  assert auditing.one_run_fdp_p_value(m, r, v, epsilon=eps * (1 - 1e-6), delta=delta) < level
  assert auditing.one_run_fdp_p_value(m, r, v, epsilon=eps * (1 + 1e-6), delta=delta) >= level


@pytest.mark.parametrize("mu,r", [(0.5, 100), (1.5, 60)])
def test_fdp_exact_error_probability_gaussian(mu, r):
  # r canaries, all guessed, each by the Gaussian test "in iff score > mu / 2": mu-GDP in
  # each bit, each guess right independently w.p. Phi(mu / 2), so N ~ Bin(r, Phi(mu / 2))
  # and P[bound > mu] is an exact binomial sum.
  p = stats.norm.cdf(mu / 2)
  lo, hi = stats.binom.ppf([1e-9, 1 - 1e-13], r, p).astype(int)
  wrong = sum(stats.binom.pmf(v, r, p) for v in range(lo, hi + 1)
              if auditing.one_run_gdp_lower_bound(r, r, v) > mu)
  assert wrong <= 0.05


def _simulated_gaussian_audits(mu, m, k, reps, seed, delta=1e-5):
  """One-run audits of m Gaussian canaries (score mu * S_i + N(0, 1)), k guesses each way."""
  rng = np.random.default_rng(seed)
  steinke, fdp_eps, fdp_mu = [], [], []
  for _ in range(reps):
    included = rng.random(m) < 0.5
    order = np.argsort(mu * included + rng.standard_normal(m))
    correct = int(np.sum(included[order[-k:]]) + np.sum(~included[order[:k]]))
    steinke.append(auditing.one_run_epsilon_lower_bound(m, 2 * k, correct, delta=delta))
    fdp_mu.append(auditing.one_run_gdp_lower_bound(m, 2 * k, correct))
    fdp_eps.append(auditing.one_run_fdp_epsilon_lower_bound(m, 2 * k, correct, delta))
  return np.array(steinke), np.array(fdp_eps), np.array(fdp_mu)


@pytest.mark.parametrize("mu,m,k", [(gaussian_mu, 1000, 50) for gaussian_mu in (0.925, 2.0)])
def test_fdp_simulated_gaussian_canaries_sound_and_tighter_than_steinke(mu, m, k):
  # mu = 0.925 is the Gaussian mechanism with eps 4 at delta 1e-5.
  delta, reps = 1e-5, 200
  eps_true = gaussian.epsilon_for_delta(1.0 / mu, delta)
  steinke, fdp_eps, fdp_mu = _simulated_gaussian_audits(mu, m, k, reps, seed=38)
  tolerance = 3.0 * math.sqrt(0.05 * 0.95 / reps)
  assert np.mean(fdp_mu > mu) <= 0.05 + tolerance
  assert np.mean(fdp_eps > eps_true) <= 0.05 + tolerance
  # Tighter on the same guesses: the paper reports about 2x on DP-SGD's Gaussian scores.
  assert np.mean(fdp_eps) >= 1.3 * np.mean(steinke)
  assert np.mean(fdp_eps >= steinke) >= 0.95
  assert np.mean(fdp_mu) > 0.5 * mu  # not vacuous


def test_fdp_epsilon_delta_family_exact_error_probability_for_randomized_response():
  # RR with eps_true is (eps_true, 0)-DP; every guess right w.p. e^eps / (1 + e^eps).
  eps_true, r = 1.0, 200
  p = _rr_accuracy(eps_true)
  lo, hi = stats.binom.ppf([1e-9, 1 - 1e-13], r, p).astype(int)
  wrong = sum(stats.binom.pmf(v, r, p) for v in range(lo, hi + 1)
              if auditing.one_run_fdp_epsilon_lower_bound(r, r, v, 0.0,
                                                          family="epsilon_delta") > eps_true)
  assert wrong <= 0.05


def test_fdp_monotone_and_nothing_at_chance():
  assert auditing.one_run_gdp_lower_bound(1000, 100, 50) == 0.0
  assert auditing.one_run_fdp_p_value(1000, 100, 0, mu=1.0) == 1.0
  bounds = [auditing.one_run_gdp_lower_bound(1000, 100, v) for v in (70, 80, 90, 100)]
  assert all(a < b for a, b in zip(bounds, bounds[1:]))
  p_values = [auditing.one_run_fdp_p_value(1000, 100, 85, mu=mu) for mu in (0.2, 0.5, 1.0)]
  assert all(a < b for a, b in zip(p_values, p_values[1:]))
  assert (auditing.one_run_gdp_lower_bound(1000, 100, 90, confidence=0.99)
          < auditing.one_run_gdp_lower_bound(1000, 100, 90, confidence=0.9))


# ------------------------------------------------------------------------------------------
# Many training runs, read through mu-GDP.


@pytest.mark.parametrize("tp,pos,fp,neg,confidence", [(900, 1000, 100, 1000, 0.95),
                                                      (60, 100, 30, 100, 0.9),
                                                      (10, 10, 0, 10, 0.95)])
def test_gdp_many_run_matches_scipy_reference(tp, pos, fp, neg, confidence):
  tail = (1 - confidence) / 2
  tpr_lo = stats.beta.ppf(tail, tp, pos - tp + 1)
  fpr_hi = stats.beta.ppf(1 - tail, fp + 1, neg - fp)
  expected = max(0.0, stats.norm.ppf(tpr_lo) - stats.norm.ppf(fpr_hi))
  assert auditing.gdp_lower_bound(tp, pos, fp, neg, confidence) == pytest.approx(expected,
                                                                                 rel=1e-9)


def test_gdp_many_run_simulated_gaussian_coverage():
  rng = np.random.default_rng(4)
  mu, n, reps = 1.0, 500, 2000
  t = mu / 2
  tp = rng.binomial(n, stats.norm.sf(t - mu), reps)
  fp = rng.binomial(n, stats.norm.sf(t), reps)
  bounds = np.array([auditing.gdp_lower_bound(int(a), n, int(b), n) for a, b in zip(tp, fp)])
  assert np.mean(bounds > mu) <= 0.05 + 3.0 * math.sqrt(0.05 * 0.95 / reps)
  assert np.mean(bounds) > 0.6 * mu


# ------------------------------------------------------------------------------------------
# Many training runs.


@pytest.mark.parametrize("n", [10, 100, 1000])
@pytest.mark.parametrize("delta", [0.0, 1e-5])
def test_many_run_closed_form_for_perfect_test(n, delta):
  # tp = n of n, fp = 0 of n: TPR_lo = (alpha/2)^(1/n), FPR_hi = 1 - (alpha/2)^(1/n), and the
  # complement form gives the same number.
  x = (0.05 / 2) ** (1.0 / n)
  expected = math.log((x - delta) / (1.0 - x))
  assert auditing.epsilon_lower_bound(n, n, 0, n, delta=delta) == pytest.approx(
      expected, rel=1e-10)


@pytest.mark.parametrize("tp,pos,fp,neg", [(700, 1000, 100, 1000), (90, 100, 3, 100),
                                           (999, 1000, 500, 1000), (400, 500, 490, 500),
                                           (5, 10, 5, 10), (3000, 4000, 10, 2000)])
@pytest.mark.parametrize("delta,confidence", [(0.0, 0.95), (1e-3, 0.9), (1e-5, 0.99)])
def test_many_run_matches_scipy_reference(tp, pos, fp, neg, delta, confidence):
  first, second = _bonferroni_reference(tp, pos, fp, neg, delta, confidence)
  got = auditing.epsilon_lower_bound(tp, pos, fp, neg, delta=delta, confidence=confidence)
  assert got == pytest.approx(max(first, second), rel=1e-9, abs=1e-12)


def test_many_run_uses_the_complement_form_when_better():
  # A test that says "in" nearly always: misses are rare, so (1 - FPR) / (1 - TPR) is large.
  first, second = _bonferroni_reference(999, 1000, 500, 1000, 0.0, 0.95)
  assert second > first + 1.0
  assert auditing.epsilon_lower_bound(999, 1000, 500, 1000) == pytest.approx(second, rel=1e-9)
  # Swapping the roles of "in" and "out" swaps the two forms.
  assert auditing.epsilon_lower_bound(500, 1000, 1, 1000) == pytest.approx(second, rel=1e-9)


def test_many_run_nothing_claimed_without_signal():
  assert auditing.epsilon_lower_bound(50, 100, 50, 100) == 0.0
  assert auditing.epsilon_lower_bound(0, 100, 100, 100) == 0.0
  assert auditing.epsilon_lower_bound(1, 1, 0, 1) == 0.0


@pytest.mark.parametrize("eps_true,n", [(1.0, 40), (2.5, 60)])
def test_many_run_exact_error_probability_for_randomized_response(eps_true, n):
  # RR: TPR = p, FPR = 1 - p, exactly eps_true-DP; sum over all count pairs.
  p = _rr_accuracy(eps_true)
  tps = np.arange(n + 1)
  pmf_tp, pmf_fp = stats.binom.pmf(tps, n, p), stats.binom.pmf(tps, n, 1 - p)
  wrong = 0.0
  for tp in tps:
    for fp in tps:
      if auditing.epsilon_lower_bound(int(tp), n, int(fp), n) > eps_true:
        wrong += pmf_tp[tp] * pmf_fp[fp]
  assert wrong <= 0.05


@pytest.mark.slow
@pytest.mark.parametrize("eps_true,n", [(0.5, 150), (1.0, 200), (3.0, 120)])
def test_many_run_exact_error_probability_for_randomized_response_large(eps_true, n):
  test_many_run_exact_error_probability_for_randomized_response(eps_true, n)


@pytest.mark.slow
@pytest.mark.parametrize("eps_true,r,delta", [(0.3, 3000, 0.0), (1.0, 5000, 1e-5),
                                              (4.0, 800, 1e-4)])
def test_one_run_exact_error_probability_for_randomized_response_large(eps_true, r, delta):
  p = _rr_accuracy(eps_true)
  lo, hi = stats.binom.ppf([1e-9, 1 - 1e-13], r, p).astype(int)
  wrong = sum(stats.binom.pmf(v, r, p) for v in range(lo, hi + 1)
              if auditing.one_run_epsilon_lower_bound(r, r, v, delta=delta) > eps_true)
  assert wrong <= 0.05


def test_many_run_simulated_gaussian_mechanism():
  # Output N(1, sigma^2) with the canary, N(0, sigma^2) without; test "in" iff output > t.
  # The mechanism is (eps(sigma, delta), delta)-DP exactly (analysis.gaussian).
  rng = np.random.default_rng(3)
  sigma, delta, t = 0.5, 1e-5, 1.5
  eps_true = gaussian.epsilon_for_delta(sigma, delta)
  tpr, fpr = stats.norm.sf((t - 1) / sigma), stats.norm.sf(t / sigma)
  best = math.log((tpr - delta) / fpr)  # what this threshold could show with infinite runs
  assert best < eps_true
  means = []
  for n, reps in ((200, 300), (2000, 300), (20000, 50), (200000, 20)):
    bounds = []
    for _ in range(reps):
      tp = int(np.sum(1.0 + sigma * rng.standard_normal(n) > t))
      fp = int(np.sum(sigma * rng.standard_normal(n) > t))
      bounds.append(auditing.epsilon_lower_bound(tp, n, fp, n, delta=delta))
    bounds = np.array(bounds)
    assert np.mean(bounds <= eps_true) >= 0.95
    # The bound is a lower confidence bound on this threshold's own best.
    assert np.mean(bounds > best) <= 0.05 + 3.0 * math.sqrt(0.05 * 0.95 / bounds.size)
    means.append(float(np.mean(bounds)))
  assert means[0] < means[1] < means[2] < means[3] < best
  assert best - means[3] < 0.25


def test_many_run_simulated_randomized_response_coverage():
  rng = np.random.default_rng(5)
  eps_true, n, reps = 1.5, 500, 20000
  p = _rr_accuracy(eps_true)
  tp, fp = rng.binomial(n, p, reps), rng.binomial(n, 1 - p, reps)
  cache = {}
  wrong = 0
  for a, b in zip(tp, fp):
    key = (int(a), int(b))
    if key not in cache:
      cache[key] = auditing.epsilon_lower_bound(key[0], n, key[1], n)
    wrong += cache[key] > eps_true
  assert wrong / reps <= 0.05 + 3.0 * math.sqrt(0.05 * 0.95 / reps)


# ------------------------------------------------------------------------------------------
# ROC helpers.


def _brute_force_roc(members, nonmembers):
  thresholds = [math.inf] + sorted(set(members) | set(nonmembers), reverse=True)
  fpr = [sum(s >= t for s in nonmembers) / len(nonmembers) for t in thresholds]
  tpr = [sum(s >= t for s in members) / len(members) for t in thresholds]
  return np.array(fpr), np.array(tpr), np.array(thresholds)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_roc_curve_auc_and_tpr_at_fpr_against_brute_force(seed):
  rng = np.random.default_rng(seed)
  # Rounded scores: many ties, within and across the two groups.
  members = list(np.round(rng.normal(1.0, 1.0, 37), 1))
  nonmembers = list(np.round(rng.normal(0.0, 1.0, 53), 1)) + [-math.inf]
  fpr, tpr, thresholds = auditing.roc_curve(members, nonmembers)
  ref_fpr, ref_tpr, ref_thresholds = _brute_force_roc(members, nonmembers)
  np.testing.assert_array_equal(thresholds, ref_thresholds)
  np.testing.assert_allclose(fpr, ref_fpr, rtol=0, atol=1e-15)
  np.testing.assert_allclose(tpr, ref_tpr, rtol=0, atol=1e-15)
  pairs = [(1.0 if a > b else 0.5 if a == b else 0.0) for a in members for b in nonmembers]
  assert auditing.roc_auc(members, nonmembers) == pytest.approx(np.mean(pairs), rel=1e-12)
  u = stats.mannwhitneyu(members, nonmembers[:-1]).statistic / (len(members) * 53)
  assert auditing.roc_auc(members, nonmembers[:-1]) == pytest.approx(u, rel=1e-12)
  for target in (0.0, 0.01, 0.1, 0.37, 0.5, 1.0):
    step = max(t for f, t in zip(ref_fpr, ref_tpr) if f <= target)
    assert auditing.tpr_at_fpr(members, nonmembers, target) == step
    assert auditing.tpr_at_fpr(members, nonmembers, target, interpolation="linear") >= step


def test_tpr_at_fpr_rules_on_hand_computed_curves():
  # members [4, 2], non-members [3, 1]: points (0,0) (0,.5) (.5,.5) (.5,1) (1,1).
  assert auditing.tpr_at_fpr([4, 2], [3, 1], 0.25) == 0.5
  assert auditing.tpr_at_fpr([4, 2], [3, 1], 0.25, interpolation="linear") == 0.5
  assert auditing.tpr_at_fpr([4, 2], [3, 1], 0.5, interpolation="linear") == 1.0
  assert auditing.roc_auc([4, 2], [3, 1]) == 0.75
  # members [2, 1], non-members [1, 0]: (0,0) (0,.5) (.5,1) (1,1); a tie makes a diagonal.
  assert auditing.tpr_at_fpr([2, 1], [1, 0], 0.25) == 0.5
  assert auditing.tpr_at_fpr([2, 1], [1, 0], 0.25, interpolation="linear") == 0.75
  assert auditing.roc_auc([2, 1], [1, 0]) == 0.875
  # All tied: the diagonal.
  assert auditing.tpr_at_fpr([1.0], [1.0], 0.3) == 0.0
  assert auditing.tpr_at_fpr([1.0], [1.0], 0.3, interpolation="linear") == pytest.approx(0.3)
  assert auditing.roc_auc([1.0], [1.0]) == 0.5
  assert auditing.roc_auc(np.arange(5.0) + 10, np.arange(5.0)) == 1.0


def test_roc_against_sklearn_if_installed():
  metrics = pytest.importorskip("sklearn.metrics")
  rng = np.random.default_rng(4)
  members, nonmembers = rng.normal(0.7, 1, 200), rng.normal(0, 1, 300)
  labels = np.r_[np.ones(200), np.zeros(300)]
  scores = np.r_[members, nonmembers]
  assert auditing.roc_auc(members, nonmembers) == pytest.approx(
      metrics.roc_auc_score(labels, scores), rel=1e-12)
  fpr, tpr, _ = metrics.roc_curve(labels, scores, drop_intermediate=False)
  ours_fpr, ours_tpr, _ = auditing.roc_curve(members, nonmembers)
  np.testing.assert_allclose(ours_fpr, fpr)
  np.testing.assert_allclose(ours_tpr, tpr)


# ------------------------------------------------------------------------------------------
# Argument errors: each names the argument and its allowed range.


_ONE_RUN = dict(num_canaries=100, num_guesses=10, num_correct=8)
_MANY_RUN = dict(true_positives=8, positives=10, false_positives=1, negatives=10)
_ROC = dict(scores_members=[1.0, 2.0], scores_nonmembers=[0.0])


@pytest.mark.parametrize("func,kwargs,message", [
    (auditing.one_run_epsilon_lower_bound, dict(_ONE_RUN, num_canaries=-1),
     "num_canaries must be an integer >= 0"),
    (auditing.one_run_epsilon_lower_bound, dict(_ONE_RUN, num_canaries=2.5),
     "num_canaries must be an integer >= 0"),
    (auditing.one_run_epsilon_lower_bound, dict(_ONE_RUN, num_canaries=True),
     "num_canaries must be an integer"),
    (auditing.one_run_epsilon_lower_bound, dict(_ONE_RUN, num_guesses=101),
     r"num_guesses must be an integer in \[0, num_canaries\] = \[0, 100\]"),
    (auditing.one_run_epsilon_lower_bound, dict(_ONE_RUN, num_guesses=-2),
     "num_guesses must be an integer >= 0"),
    (auditing.one_run_epsilon_lower_bound, dict(_ONE_RUN, num_correct=11),
     r"num_correct must be an integer in \[0, num_guesses\] = \[0, 10\]"),
    (auditing.one_run_epsilon_lower_bound, dict(_ONE_RUN, num_correct="3"),
     "num_correct must be an integer"),
    (auditing.one_run_epsilon_lower_bound, dict(_ONE_RUN, delta=1.0),
     r"delta must be in \[0, 1\)"),
    (auditing.one_run_epsilon_lower_bound, dict(_ONE_RUN, delta=-1e-9),
     r"delta must be in \[0, 1\)"),
    (auditing.one_run_epsilon_lower_bound, dict(_ONE_RUN, delta=float("nan")),
     r"delta must be in \[0, 1\)"),
    (auditing.one_run_epsilon_lower_bound, dict(_ONE_RUN, confidence=1.0),
     r"confidence must be in \(0, 1\)"),
    (auditing.one_run_epsilon_lower_bound, dict(_ONE_RUN, confidence=0.0),
     r"confidence must be in \(0, 1\)"),
    (auditing.max_one_run_epsilon_lower_bound, dict(num_canaries=5, num_guesses=6),
     r"num_guesses must be an integer in \[0, num_canaries\]"),
    (auditing.max_one_run_epsilon_lower_bound, dict(num_canaries=5, num_guesses=5,
                                                    confidence=95), "confidence"),
    (auditing.one_run_p_value, dict(_ONE_RUN, epsilon=-0.1), "epsilon must be >= 0"),
    (auditing.one_run_p_value, dict(_ONE_RUN, epsilon=1.0, delta=2.0),
     r"delta must be in \[0, 1\)"),
    (auditing.clopper_pearson, dict(successes=3, trials=0), "trials must be an integer >= 1"),
    (auditing.clopper_pearson, dict(successes=4, trials=3),
     r"successes must be an integer in \[0, trials\] = \[0, 3\]"),
    (auditing.clopper_pearson, dict(successes=-1, trials=3), "successes must be an integer"),
    (auditing.clopper_pearson, dict(successes=1, trials=3, confidence=1.5),
     r"confidence must be in \(0, 1\)"),
    (auditing.epsilon_lower_bound, dict(_MANY_RUN, positives=0),
     "positives must be an integer >= 1"),
    (auditing.epsilon_lower_bound, dict(_MANY_RUN, true_positives=11),
     r"true_positives must be an integer in \[0, positives\] = \[0, 10\]"),
    (auditing.epsilon_lower_bound, dict(_MANY_RUN, negatives=0),
     "negatives must be an integer >= 1"),
    (auditing.epsilon_lower_bound, dict(_MANY_RUN, false_positives=-1),
     "false_positives must be an integer"),
    (auditing.epsilon_lower_bound, dict(_MANY_RUN, false_positives=12),
     r"false_positives must be an integer in \[0, negatives\] = \[0, 10\]"),
    (auditing.epsilon_lower_bound, dict(_MANY_RUN, delta=1.0), r"delta must be in \[0, 1\)"),
    (auditing.epsilon_lower_bound, dict(_MANY_RUN, confidence=-0.5),
     r"confidence must be in \(0, 1\)"),
    (auditing.roc_curve, dict(_ROC, scores_members=[]), "scores_members must hold at least one"),
    (auditing.roc_curve, dict(_ROC, scores_nonmembers=[0.0, float("nan")]),
     r"scores_nonmembers must hold real numbers in \[-inf, inf\)"),
    (auditing.roc_curve, dict(_ROC, scores_members=[math.inf]),
     r"scores_members must hold real numbers in \[-inf, inf\)"),
    (auditing.roc_curve, dict(_ROC, scores_members=np.zeros((2, 2))),
     "scores_members must be a 1-D sequence"),
    (auditing.roc_curve, dict(_ROC, scores_members=3.0),
     "scores_members must be a list, tuple or 1-D array"),
    (auditing.roc_curve, dict(_ROC, scores_members=["a"]), "scores_members must hold real"),
    (auditing.roc_auc, dict(_ROC, scores_nonmembers=()), "scores_nonmembers must hold at least"),
    (auditing.tpr_at_fpr, dict(_ROC, fpr=1.5), r"fpr must be in \[0, 1\]"),
    (auditing.tpr_at_fpr, dict(_ROC, fpr=0.1, interpolation="nearest"),
     "interpolation must be one of"),
    (auditing.one_run_fdp_p_value, dict(_ONE_RUN), "give exactly one of mu"),
    (auditing.one_run_fdp_p_value, dict(_ONE_RUN, mu=1.0, epsilon=1.0),
     "give exactly one of mu"),
    (auditing.one_run_fdp_p_value, dict(_ONE_RUN, mu=1.0, delta=1e-5),
     "delta goes with epsilon"),
    (auditing.one_run_fdp_p_value, dict(_ONE_RUN, mu=-1.0), "mu must be >= 0"),
    (auditing.one_run_fdp_p_value, dict(_ONE_RUN, epsilon=1.0, delta=1.0),
     r"delta must be in \[0, 1\)"),
    (auditing.one_run_fdp_p_value, dict(_ONE_RUN, num_canaries=0, mu=1.0),
     "num_canaries must be an integer >= 1"),
    (auditing.one_run_gdp_lower_bound, dict(_ONE_RUN, num_correct=11),
     r"num_correct must be an integer in \[0, num_guesses\] = \[0, 10\]"),
    (auditing.one_run_gdp_lower_bound, dict(_ONE_RUN, confidence=1.0),
     r"confidence must be in \(0, 1\)"),
    (auditing.one_run_fdp_epsilon_lower_bound, dict(_ONE_RUN, delta=0.0),
     r"delta must be in \(0, 1\)"),
    (auditing.one_run_fdp_epsilon_lower_bound, dict(_ONE_RUN, delta=1e-5, family="laplace"),
     "family must be one of"),
    (auditing.one_run_fdp_epsilon_lower_bound,
     dict(_ONE_RUN, delta=-1.0, family="epsilon_delta"), r"delta must be in \[0, 1\)"),
    (auditing.gdp_lower_bound, dict(_MANY_RUN, positives=0), "positives must be an integer >= 1"),
    (auditing.gdp_lower_bound, dict(_MANY_RUN, false_positives=11),
     r"false_positives must be an integer in \[0, negatives\] = \[0, 10\]"),
    (auditing.gdp_lower_bound, dict(_MANY_RUN, confidence=2.0), r"confidence must be in \(0, 1\)"),
])
def test_errors_name_the_argument_and_range(func, kwargs, message):
  with pytest.raises(ValueError, match=message):
    func(**kwargs)
