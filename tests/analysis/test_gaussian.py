"""The exact Gaussian mechanism against mpmath (50 digits) and dp_accounting's PLD."""
import math

import mpmath
import numpy as np
import pytest

from analysis import gaussian
from dp_references import dp_accounting, dp_pld

mpmath.mp.dps = 50


def _mp_delta(sigma, eps):
  """Balle & Wang (2018) Theorem 8, in 50-digit arithmetic."""
  sigma, eps = mpmath.mpf(sigma), mpmath.mpf(eps)
  return (mpmath.ncdf(1 / (2 * sigma) - eps * sigma)
          - mpmath.e**eps * mpmath.ncdf(-1 / (2 * sigma) - eps * sigma))


@pytest.mark.parametrize("sigma, eps", [(0.1, 3.0), (0.5, 0.2), (1.0, 1.0), (3.0, 0.05),
                                        (0.142, 50.0), (20.0, 0.001)])
def test_delta_matches_mpmath(sigma, eps):
  assert gaussian.delta_for_epsilon(sigma, eps) == pytest.approx(float(_mp_delta(sigma, eps)),
                                                                 rel=1e-10)


@pytest.mark.parametrize("sigma, delta", [(0.14200, 1e-5), (0.7778, 1e-5), (1.0, 1e-6),
                                          (5.0, 1e-3), (0.05, 1e-9)])
def test_epsilon_is_the_smallest_meeting_delta(sigma, delta):
  eps = gaussian.epsilon_for_delta(sigma, delta)
  assert float(_mp_delta(sigma, eps)) <= delta * (1 + 1e-9)
  assert float(_mp_delta(sigma, eps * (1 - 1e-9))) > delta


def test_the_issues_unamplified_examples():
  # 60 epochs and 2 epochs of sigma 1.1 at delta 1e-5: one Gaussian of sigma / sqrt(epochs).
  sixty = gaussian.composed_epsilon([1.1], [60], 1e-5)
  two = gaussian.composed_epsilon([1.1], [2], 1e-5)
  assert float(_mp_delta(1.1 / math.sqrt(60), sixty)) == pytest.approx(1e-5, rel=1e-9)
  assert round(sixty, 2) == 54.05 and round(two, 2) == 5.87


def test_composition_adds_inverse_variances():
  assert gaussian.composed_noise_multiplier([1.0, 2.0], [1, 4]) == pytest.approx(
      1 / math.sqrt(1 + 4 / 4), rel=1e-15)
  assert gaussian.composed_noise_multiplier([1.0, math.inf], [0, 3]) == math.inf
  assert gaussian.composed_epsilon([1.0], [0], 1e-5) == 0.0


def test_agrees_with_dp_accountings_pld_from_above():
  pld = dp_pld()
  dpa = dp_accounting()
  accountant = pld.PLDAccountant(value_discretization_interval=1e-4)
  accountant.compose(dpa.GaussianDpEvent(1.1), 60)
  reference = accountant.get_epsilon(1e-5)  # a pessimistic discretisation: >= the exact value
  exact = gaussian.composed_epsilon([1.1], [60], 1e-5)
  assert exact <= reference <= exact * (1 + 1e-3)


@pytest.mark.parametrize("target, delta, count", [(3.0, 1e-5, 60), (0.5, 1e-6, 1), (8.0, 1e-5, 2)])
def test_calibration_is_the_smallest_sigma_meeting_the_target(target, delta, count):
  sigma = gaussian.noise_multiplier_for_epsilon(target, delta, count)
  assert gaussian.composed_epsilon([sigma], [count], delta) <= target
  assert gaussian.composed_epsilon([sigma * (1 - 1e-9)], [count], delta) > target


@pytest.mark.parametrize("call, match", [
    (lambda: gaussian.delta_for_epsilon(0.0, 1.0), r"sigma must be a finite number in \(0, inf\)"),
    (lambda: gaussian.delta_for_epsilon(1.0, -1.0), r"epsilon must be >= 0"),
    (lambda: gaussian.epsilon_for_delta(1.0, 1.0), r"delta must be in \(0, 1\)"),
    (lambda: gaussian.composed_noise_multiplier([1.0], [1, 2]), r"same length|lengths"),
    (lambda: gaussian.composed_noise_multiplier([1.0], [-1]), r"counts\[0\] must be an integer"),
    (lambda: gaussian.noise_multiplier_for_epsilon(0.0, 1e-5), r"target_epsilon"),
])
def test_bad_arguments_are_named(call, match):
  with pytest.raises(ValueError, match=match):
    call()


def test_infinite_noise_and_epsilon_edges():
  assert gaussian.epsilon_for_delta(math.inf, 1e-5) == 0.0
  assert gaussian.delta_for_epsilon(1.0, math.inf) == 0.0
  assert np.isfinite(gaussian.epsilon_for_delta(1e-3, 1e-10))
