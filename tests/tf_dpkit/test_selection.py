"""tf_dpkit.selection: the private choice among candidates on validation records -- removal
bound, noise statistics against the stated scale, the recorded epsilon against the Gaussian
mechanism's exact curve, secrecy of the default key, and every refusal."""
import math

import numpy as np
import pytest
from scipy import optimize, stats

from analysis import dp_sgd, events, rdp_accountant
from tf_dpkit import selection
from tf_dpkit.budget import PrivacyLedger


def _scores(n=40, k=4, seed=0):
  rng = np.random.default_rng(seed)
  return rng.uniform(size=(n, k))


def test_one_record_moves_the_sums_by_at_most_sqrt_k():
  """The bound the noise is scaled to, checked by brute force over every record of a random
  matrix and the worst row (all ones): a statement about the contract, not the code; the code's
  part is refusing a row outside [0, 1] (which would break the bound) instead of clipping it,
  and scaling the noise by sqrt(K) (the next test)."""
  k = 5
  scores = np.vstack([_scores(30, k), np.ones((1, k)), np.zeros((1, k))])
  full = scores.sum(axis=0)
  moves = [np.linalg.norm(full - np.delete(scores, i, axis=0).sum(axis=0))
           for i in range(len(scores))]
  assert max(moves) == pytest.approx(math.sqrt(k))  # the all-ones row reaches the bound
  bad = scores.copy()
  bad[0, 0] = 2.0  # would move its sum by 2 > 1
  with pytest.raises(ValueError, match=r"record_scores must hold finite values in \[0, 1\]"):
    selection.select_privately(bad, 1.0, seed=0)


def test_noise_is_gaussian_with_std_sigma_sqrt_k():
  """noisy - exact sums over 400 seeded calls (K = 4, 1,600 draws) against N(0, (2 sigma)^2)
  by a Kolmogorov-Smirnov test; a mutant without the sqrt(K) factor (std sigma) fails it."""
  sigma, k = 3.0, 4
  scores = _scores(25, k)
  exact = scores.sum(axis=0)
  draws = np.concatenate([selection.select_privately(scores, sigma, seed=s).noisy_scores - exact
                          for s in range(400)])
  assert stats.kstest(draws, "norm", args=(0.0, sigma * math.sqrt(k))).pvalue > 0.01
  assert stats.kstest(draws, "norm", args=(0.0, sigma)).pvalue < 1e-6
  assert draws.std() == pytest.approx(sigma * math.sqrt(k), rel=0.07)


def test_index_is_the_argmax_of_the_released_scores_and_follows_a_clear_winner():
  scores = np.zeros((200, 3))
  scores[:, 1] = 1.0  # candidate 1 wins every record: 200 against 0
  for seed in range(20):
    chosen = selection.select_privately(scores, 2.0, seed=seed)
    assert chosen.index == int(np.argmax(chosen.noisy_scores)) == 1
    assert chosen.noise_stddev == pytest.approx(2.0 * math.sqrt(3))
    assert chosen.event == events.GaussianEvent(2.0)
  again = selection.select_privately(scores, 2.0, seed=7)
  np.testing.assert_array_equal(again.noisy_scores,
                                selection.select_privately(scores, 2.0, seed=7).noisy_scores)
  # Equal scores: which one is chosen is random, each candidate sometimes.
  picks = {selection.select_privately(np.full((10, 3), 0.5), 1.0, seed=s).index
           for s in range(60)}
  assert picks == {0, 1, 2}


def test_default_key_is_secret_and_fresh():
  scores = _scores(10, 3)
  a = selection.select_privately(scores, 1.0).noisy_scores
  b = selection.select_privately(scores, 1.0).noisy_scores
  assert not np.array_equal(a, b)


def _exact_gaussian_epsilon(sigma, delta):
  """The Gaussian mechanism's exact epsilon (Balle & Wang 2018, Theorem 8):
  delta(eps) = Phi(1/(2 sigma) - eps sigma) - e^eps Phi(-1/(2 sigma) - eps sigma)."""
  curve = lambda eps: (stats.norm.cdf(0.5 / sigma - eps * sigma)
                       - math.exp(eps) * stats.norm.cdf(-0.5 / sigma - eps * sigma) - delta)
  return optimize.brentq(curve, 0.0, 100.0)


@pytest.mark.parametrize("sigma", [1.0, 5.0, 20.0])
def test_recorded_epsilon_is_the_gaussian_mechanisms(sigma):
  """The ledger's epsilon of the choice alone is one Gaussian mechanism's exact epsilon (the
  ledger reports a composition without sampling exactly), below the RDP bound of alpha /
  (2 sigma^2) computed by hand; composed with training it is the epsilon of the composed
  events."""
  delta = 1e-5
  ledger = PrivacyLedger(delta)
  selection.select_privately(_scores(), sigma, seed=0, ledger=ledger)
  got = ledger.epsilon()
  orders = np.asarray(rdp_accountant.DEFAULT_ORDERS, float)
  rdp = orders / (2.0 * sigma**2)
  by_hand = float(np.min(rdp + np.log1p(-1.0 / orders)
                         - (np.log(delta) + np.log(orders)) / (orders - 1.0)))
  exact = _exact_gaussian_epsilon(sigma, delta)
  assert got == pytest.approx(exact, rel=1e-4)
  assert exact < by_hand < 1.35 * exact + 0.02
  trained = PrivacyLedger(delta)
  trained.record(0.01, 0.8, 500)
  selection.select_privately(_scores(), sigma, seed=0, ledger=trained)
  composed = events.ComposedEvent([dp_sgd.dp_sgd_event(0.8, 500, sampling_probability=0.01),
                                   events.GaussianEvent(sigma)])
  want = rdp_accountant.RdpAccountant().compose(composed).get_epsilon(delta)
  assert trained.epsilon() == pytest.approx(want, rel=1e-9)


@pytest.mark.parametrize("scores, sigma, match", [
    (np.zeros((3, 2)), 0.0, r"noise_multiplier must be a finite number in \(0, inf\)"),
    (np.zeros((3, 2)), -1.0, r"noise_multiplier must be a finite number in \(0, inf\)"),
    (np.zeros((3, 2)), math.inf, r"noise_multiplier must be a finite number in \(0, inf\)"),
    (np.zeros((3, 2)), math.nan, r"noise_multiplier must be a finite number in \(0, inf\)"),
    (np.zeros(3), 1.0, r"record_scores must be a 2-D array"),
    (np.zeros((3, 2, 1)), 1.0, r"record_scores must be a 2-D array"),
    (np.zeros((3, 0)), 1.0, r"record_scores must be a 2-D array"),
    (np.full((3, 2), -0.1), 1.0, r"record_scores must hold finite values in \[0, 1\]"),
    (np.full((3, 2), np.nan), 1.0, r"record_scores must hold finite values in \[0, 1\]"),
])
def test_refusals_name_the_argument(scores, sigma, match):
  ledger = PrivacyLedger(1e-5)
  with pytest.raises(ValueError, match=match):
    selection.select_privately(scores, sigma, seed=0, ledger=ledger)
  assert not ledger.steps  # nothing recorded, nothing released


def test_no_records_is_pure_noise_and_still_accounted():
  ledger = PrivacyLedger(1e-5)
  chosen = selection.select_privately(np.zeros((0, 3)), 1.0, seed=0, ledger=ledger)
  assert chosen.noisy_scores.shape == (3,) and ledger.steps == 1
