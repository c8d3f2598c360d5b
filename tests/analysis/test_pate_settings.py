"""analysis.pate.suggest_confident_gnmax: settings checked with the PATE accountant."""
from __future__ import annotations

import math

import numpy as np
import pytest

from analysis import gaussian, pate


def _data_independent_epsilon(num_teachers, num_queries, threshold, sigma1, sigma2, delta):
  """Every query answered, composed one by one in the accountant (votes do not matter)."""
  acc = pate.PateAccountant(num_teachers=num_teachers)
  votes = np.zeros(10)
  votes[0] = num_teachers
  for _ in range(num_queries):
    acc.compose_confident_gnmax(votes, threshold, sigma1, sigma2, True)
  return acc.data_independent_epsilon(delta)


@pytest.mark.parametrize("num_teachers", [25, 250, 1000])
def test_suggestion_meets_the_target_with_the_accountant(num_teachers):
  queries, target, delta = 300, 2.0, 1e-5
  s = pate.suggest_confident_gnmax(num_teachers, queries, target, delta)
  assert 0 < s.threshold < num_teachers
  assert s.threshold == pytest.approx(0.8 * num_teachers)
  assert s.sigma1 == pytest.approx(3.75 * s.sigma2)
  eps = _data_independent_epsilon(num_teachers, queries, s.threshold, s.sigma1, s.sigma2, delta)
  assert eps <= target
  assert s.epsilon == pytest.approx(eps, rel=1e-9)
  # Calibrated, not just safe: 1% less noise misses the target.
  assert _data_independent_epsilon(num_teachers, queries, s.threshold, 0.99 * s.sigma1,
                                   0.99 * s.sigma2, delta) > target
  # Independent bounds: the composition is one Gaussian mechanism with multiplier
  # (queries (1 / sigma1^2 + 2 / sigma2^2))^(-1/2); its exact epsilon (analytic Gaussian) is
  # below the RDP one, and the classic RDP conversion eps <= min_l (rdp(l) + log(1/delta)/(l-1))
  # is above it.
  mu2 = queries * (1.0 / s.sigma1**2 + 2.0 / s.sigma2**2)
  exact = gaussian.epsilon_for_delta(1.0 / math.sqrt(mu2), delta)
  classic = min(lam * mu2 / 2.0 + math.log(1.0 / delta) / (lam - 1.0)
                for lam in np.linspace(1.01, 200.0, 20000))
  assert exact <= s.epsilon <= classic


def test_the_paper_setting_is_recovered_at_its_own_epsilon():
  # PATE 2018's MNIST setting (T = 200, sigma1 = 150, sigma2 = 40, 250 teachers): at the
  # data-independent epsilon of 640 answered queries the suggestion is that setting.
  target = _data_independent_epsilon(250, 640, 200.0, 150.0, 40.0, 1e-5)
  s = pate.suggest_confident_gnmax(250, 640, target, 1e-5)
  assert (s.threshold, s.sigma1, s.sigma2) == pytest.approx((200.0, 150.0, 40.0), rel=2e-4)
  assert s.noise_per_teacher == pytest.approx(0.16, rel=2e-4)


def test_more_queries_or_a_smaller_budget_need_more_noise():
  base = pate.suggest_confident_gnmax(250, 640, 2.0, 1e-5).sigma2
  assert pate.suggest_confident_gnmax(250, 2000, 2.0, 1e-5).sigma2 > base
  assert pate.suggest_confident_gnmax(250, 640, 1.0, 1e-5).sigma2 > base
  assert pate.suggest_confident_gnmax(1000, 640, 2.0, 1e-5).sigma2 == base


@pytest.mark.parametrize("kwargs, name", [
    (dict(num_teachers=0), "num_teachers"),
    (dict(num_teachers=2.5), "num_teachers"),
    (dict(num_teachers=True), "num_teachers"),
    (dict(num_queries=0), "num_queries"),
    (dict(num_queries=1.0), "num_queries"),
    (dict(epsilon=0.0), "epsilon"),
    (dict(epsilon=-1.0), "epsilon"),
    (dict(epsilon=math.inf), "epsilon"),
    (dict(epsilon=math.nan), "epsilon"),
    (dict(delta=0.0), "delta"),
    (dict(delta=1.0), "delta"),
    (dict(epsilon=1e-4, num_queries=10**6), "epsilon"),
])
def test_bad_input_names_the_argument_and_its_range(kwargs, name):
  args = dict(num_teachers=250, num_queries=640, epsilon=2.0, delta=1e-5)
  args.update(kwargs)
  with pytest.raises(ValueError, match=name) as info:
    pate.suggest_confident_gnmax(**args)
  message = str(info.value)
  assert name + "=" in message or name + " must" in message
  assert any(word in message for word in ("[", "(", "raise", "range")), message
