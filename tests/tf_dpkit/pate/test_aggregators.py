"""Aggregators: noise statistics, outcomes, accounting, key secrecy and argument checks.

Statistical checks use N independent queries in one call and a tolerance of about 5 binomial
(or sampling) standard deviations, so a correct implementation fails with probability < 1e-6;
each test also states the nearby wrong value it would catch.
"""
import copy
import math
import pickle
import warnings

import numpy as np
import pytest
from scipy import stats

from analysis import events
from analysis.pate import PateAccountant
from tf_dpkit import pate
from secret_search import files_holding, written_bytes

N = 20000
KEY = 0x2F3A5B7C9D1E4F61  # distinctive 62-bit key for the secrecy searches


def _two_class(n1, n2, rows=N):
  return np.tile([n1, n2], (rows, 1))


def _rate(answers, label=1):
  return float(np.mean(answers.labels == label))


def test_gnmax_answer_rate_matches_the_gaussian_tail():
  # Class 1 wins iff N(0, 2 sigma^2) > 10: Phi(-10 / (sqrt(2) 10)) = 0.2398 (0.2602 at sigma=11).
  agg = pate.GNMax(_two_class(55, 45), sigma=10.0, seed=1)
  expected = stats.norm.cdf(-10 / (math.sqrt(2) * 10))
  assert abs(_rate(agg.query(np.arange(N))) - expected) < 5 * math.sqrt(expected / N)


def test_gnmax_noise_std_is_sigma():
  agg = pate.GNMax(_two_class(5, 5, 2), sigma=7.0, seed=2)
  z = agg._gaussian((400000,), agg._seeds()[2])  # the sampler the aggregator uses
  assert abs(np.mean(z)) < 0.01  # 6 standard errors
  assert abs(np.std(z) - 1.0) < 0.01  # std error of the std: 1/sqrt(2N) = 0.0011


def test_laplace_noise_has_variance_two_b_squared_and_the_lnmax_tail():
  agg = pate.LNMax(_two_class(55, 45), laplace_scale=10.0, seed=3)
  z = agg._laplace((400000,), agg._seeds()[2])
  assert abs(np.var(z) - 2.0) < 0.04  # var of Lap(1) is 2; relative std error 0.35%
  assert abs(np.mean(np.abs(z)) - 1.0) < 0.01  # E|Lap(1)| = 1
  # Class 1 wins iff Lap - Lap > 10 (b = 10): (2 + 1) e^-1 / 4 = 0.2759 (0.2925 at b = 11).
  expected = 3 * math.exp(-1) / 4
  assert abs(_rate(agg.query(np.arange(N))) - expected) < 5 * math.sqrt(expected / N)


def test_confident_gnmax_answer_rate_is_the_gaussian_tail_probability():
  # Answered iff 190 + N(0, 20^2) >= 200: Phi(-0.5) = 0.3085, by math.erfc.
  agg = pate.ConfidentGNMax(_two_class(190, 10), threshold=200, sigma1=20, sigma2=5, seed=4)
  answers = agg.query(np.arange(N))
  expected = 0.5 * math.erfc(0.5 / math.sqrt(2))
  assert abs(np.mean(answers.answered) - expected) < 5 * math.sqrt(expected / N)
  assert np.all(answers.labels[answers.answered] == 0)  # gap 180, sigma2 5: always class 0
  assert np.all(answers.labels[~answers.answered] == -1)
  assert not answers.student_labeled.any()


def test_same_seed_same_answers_and_every_call_draws_fresh_noise():
  votes = _two_class(52, 48, 4000)
  a, b = pate.GNMax(votes, 10.0, seed=5), pate.GNMax(votes, 10.0, seed=5)
  first_a, first_b = a.query(np.arange(4000)), b.query(np.arange(4000))
  np.testing.assert_array_equal(first_a.labels, first_b.labels)
  second = a.query(np.arange(4000))
  assert a.draws == 2
  # Independent noise: both calls pick class 1 with probability p^2, not p.
  p = stats.norm.cdf(-4 / (math.sqrt(2) * 10))
  both = np.mean((first_a.labels == 1) & (second.labels == 1))
  assert abs(both - p * p) < 5 * math.sqrt(p * p / 4000)
  assert pate.GNMax(votes, 10.0, seed=6).query(np.arange(4000)).labels.tolist() != \
      first_a.labels.tolist()


def test_aggregators_without_a_seed_draw_different_secret_noise():
  votes = _two_class(50, 50, 2000)
  labels = [pate.GNMax(votes, 10.0).query(np.arange(2000)).labels for _ in range(2)]
  assert not np.array_equal(*labels)


class _Spy(PateAccountant):
  def __init__(self, num_teachers=200):
    super().__init__(num_teachers=num_teachers)
    self.calls = []

  def compose_confident_gnmax(self, votes, threshold, sigma1, sigma2, answered):
    self.calls.append(("confident", np.array(votes), answered))
    return super().compose_confident_gnmax(votes, threshold, sigma1, sigma2, answered)

  def compose_interactive_gnmax(self, votes, thresholded_votes, threshold, sigma1, sigma2,
                                answered):
    self.calls.append(("interactive", np.array(thresholded_votes), answered))
    return super().compose_interactive_gnmax(votes, thresholded_votes, threshold, sigma1,
                                             sigma2, answered)


def test_threshold_cost_for_every_query_and_gnmax_cost_only_when_answered():
  rng = np.random.default_rng(0)
  top = rng.integers(100, 200, 300)
  votes = np.stack([top, 200 - top], axis=1)
  spy = _Spy()
  agg = pate.ConfidentGNMax(votes, threshold=150, sigma1=30, sigma2=10, seed=7, accountant=spy)
  answers = [agg.query(np.arange(0, 150)), agg.query(np.arange(150, 300))]
  answered = np.concatenate([a.answered for a in answers])
  assert 50 < answered.sum() < 250  # both outcomes occur
  assert len(spy.calls) == 300 and spy.queries == 300 and spy.answered == answered.sum()
  assert [c[2] for c in spy.calls] == answered.tolist()
  np.testing.assert_array_equal(np.stack([c[1] for c in spy.calls]), votes)
  ledger = events.flatten(spy.ledger)
  sigmas = sorted(a.noise_multiplier for a in ledger for _ in range(a.count))
  assert sigmas.count(30.0) == 300  # the check: sensitivity 1, multiplier sigma1
  assert sigmas.count(10.0 / math.sqrt(2)) == answered.sum()  # GNMax: sensitivity sqrt(2)
  # The same outcomes composed by hand give the same epsilons.
  manual = PateAccountant(num_teachers=200)
  for row, ok in zip(votes, answered):
    manual.compose_confident_gnmax(row, 150, 30, 10, bool(ok))
  assert spy.private_data_dependent_epsilon(1e-5) == pytest.approx(
      manual.private_data_dependent_epsilon(1e-5), rel=1e-12)
  assert spy.data_independent_epsilon(1e-5) == pytest.approx(
      manual.data_independent_epsilon(1e-5), rel=1e-12)
  assert spy.private_data_dependent_epsilon(1e-5) <= spy.data_independent_epsilon(1e-5)


def test_interactive_gnmax_follows_algorithm_2():
  votes = _two_class(240, 10, 400)
  agree = np.tile([0.99, 0.01], (200, 1))  # student agrees, confident: check on ~ -7.6 votes
  disagree = np.tile([0.0, 1.0], (200, 1))  # student disagrees: check on 240 votes
  spy = _Spy(num_teachers=250)
  agg = pate.InteractiveGNMax(votes, threshold=150, sigma1=20, sigma2=5, seed=8, accountant=spy)
  assert agg.alpha == 250.0  # default alpha: the number of teachers
  kept = agg.query(np.arange(200), agree)
  assert not kept.answered.any() and kept.student_labeled.all()
  assert np.all(kept.labels == 0)
  unsure = agg.query(np.arange(200), np.tile([0.6, 0.4], (200, 1)))  # check on 90: rarely
  assert np.mean(unsure.answered) < 0.01 and not unsure.student_labeled.any()
  assert np.all(unsure.labels[~unsure.answered] == -1)
  asked = agg.query(np.arange(200, 400), disagree)
  assert asked.answered.all() and np.all(asked.labels == 0)
  assert [c[0] for c in spy.calls] == ["interactive"] * 600
  np.testing.assert_allclose(spy.calls[0][1], [240 - 250 * 0.99, 10 - 250 * 0.01])
  assert spy.answered == asked.answered.sum() + unsure.answered.sum()


def test_key_and_votes_reach_no_text_pickle_or_saved_file(tmp_path):
  import keras  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  agg = pate.ConfidentGNMax(_two_class(123457, 1, 50), threshold=1, sigma1=1, sigma2=1,
                            seed=KEY)
  answers = agg.query(np.arange(50))
  for text in (repr(agg), str(agg), repr(answers)):
    assert str(KEY) not in text and "123457" not in text
  for leak in (pickle.dumps, copy.copy, copy.deepcopy):
    with pytest.raises(TypeError, match="cannot be pickled"):
      leak(agg)
  # A student trained on the released labels, saved as .keras and as a checkpoint.
  model = pate.build_student_model((4, 4, 1), 2)
  model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  model.fit(np.zeros((50, 4, 4, 1)), answers.labels, epochs=1, verbose=0)
  model.save(tmp_path / "student.keras")
  tf.train.Checkpoint(model=model).save(str(tmp_path / "ckpt"))
  assert len(list(written_bytes(tmp_path))) >= 3
  assert files_holding(tmp_path, KEY) == []


@pytest.mark.parametrize("make, match", [
    (lambda v: pate.GNMax(v, sigma=0.0), r"sigma must be a finite number in \(0, inf\)"),
    (lambda v: pate.GNMax(v, sigma=float("inf")), "sigma must be a finite number"),
    (lambda v: pate.LNMax(v, laplace_scale=-1), "laplace_scale must be a finite number"),
    (lambda v: pate.ConfidentGNMax(v, threshold=float("nan")), "threshold"),
    (lambda v: pate.ConfidentGNMax(v, sigma1=0), "sigma1 must be a finite number"),
    (lambda v: pate.ConfidentGNMax(v, sigma2=-3), "sigma2 must be a finite number"),
    (lambda v: pate.InteractiveGNMax(v, gamma=1.5), r"gamma must be in \[0, 1\]"),
    (lambda v: pate.InteractiveGNMax(v, alpha=-1), "alpha must be a finite number"),
    (lambda v: pate.GNMax(v, 1.0, seed=-1), r"seed must be None or an integer in \[0, 2\*\*62\)"),
    (lambda v: pate.GNMax(v, 1.0, accountant=object()), "accountant must be"),
])
def test_bad_parameters_name_the_argument_and_range(make, match):
  with pytest.raises(ValueError, match=match):
    make(_two_class(5, 5, 3))


def test_bad_queries_are_refused():
  agg = pate.InteractiveGNMax(_two_class(5, 5, 3), seed=1)
  with pytest.raises(ValueError, match=r"indices must be in \[0, 3\)"):
    agg.query([3], np.array([[0.5, 0.5]]))
  with pytest.raises(ValueError, match=r"indices must be a 1-D sequence of integers"):
    agg.query([0.5], np.array([[0.5, 0.5]]))
  with pytest.raises(ValueError, match=r"student_probabilities must have shape \[1, 2\]"):
    agg.query([0], np.array([[0.2, 0.3, 0.5]]))
  with pytest.raises(ValueError, match="student_probabilities must be probabilities"):
    agg.query([0], np.array([[0.2, 0.3]]))
  assert agg.accountant.queries == 0  # refused before any noise or accounting


def test_an_accountant_for_fewer_teachers_is_refused_before_any_query():
  votes = pate.TeacherVotes(np.array([[3, 1, 0], [0, 2, 2]]))  # 4 teachers
  accountant = PateAccountant(num_teachers=3)
  with pytest.raises(ValueError, match=r"accountant was made for num_teachers=3, but the votes "
                     r"come from 4 teachers"):
    pate.GNMax(votes, 1.0, accountant=accountant)
  assert accountant.queries == 0


def test_settings_that_do_not_suit_the_number_of_teachers_are_warned_with_scaled_ones():
  # Issue 34: 25 teachers with the 250-teacher defaults answered 7 of 50 queries, silently.
  votes = np.zeros((50, 10), np.int64)
  votes[:, 3] = 25
  with pytest.warns(UserWarning, match=r"threshold=200 exceeds the 25 teachers' votes.*"
                    r"sigma1=150 exceeds.*sigma2=40 exceeds half.*threshold=20, sigma1=15, "
                    r"sigma2=4"):
    pate.ConfidentGNMax(votes, seed=0)
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    pate.ConfidentGNMax(votes, threshold=20, sigma1=15, sigma2=4, seed=0)  # scaled: no warning


def test_a_label_matrix_passed_as_votes_names_histograms_and_the_conversion():
  predictions = np.array([[1, 1, 2], [0, 1, 2]])  # [queries, teachers] of class ids
  with pytest.raises(ValueError, match=r"vote histograms \[num_queries, num_classes\].*"
                     r"TeacherVotes.from_predictions\(predictions, num_classes\)"):
    pate.ConfidentGNMax(predictions, seed=0)
