"""Tests of analysis.calibration.

The budget check uses dp_accounting's RDP accountant (a test-only dependency) as an independent
epsilon: the returned noise must meet the budget there too, and a noise smaller by twice the
tolerance must not (minimality).
"""
from __future__ import annotations

import importlib
import math

import mpmath
import pytest

from analysis import calibration, events, rdp_accountant
from dp_references import dp_accounting as _dp_accounting, dp_rdp as _dp_rdp, dp_pld as _dp_pld

ORDERS = list(rdp_accountant.DEFAULT_ORDERS)


def _quad_rdp(q, sigma, alpha):
  """One-step RDP log(A_alpha)/(alpha-1) by mpmath quadrature of the defining integral."""
  with mpmath.workdps(30):
    q, s, a = mpmath.mpf(q), mpmath.mpf(sigma), mpmath.mpf(alpha)
    z0 = s * s * mpmath.log(1 / q - 1) + mpmath.mpf(1) / 2
    f = lambda z: ((1 - q) + q * mpmath.exp((2 * z - 1) / (2 * s * s))) ** a * mpmath.npdf(z, 0, s)
    points = sorted({-mpmath.inf, -12 * s, z0 - s, z0, z0 + s, 12 * s + a + abs(z0), mpmath.inf})
    return float(mpmath.log(mpmath.quad(f, points)) / (a - 1))


def _independent_epsilon_at_optimum(q, sigma, steps, delta):
  """Epsilon at our optimal order, with the RDP there from dp_accounting or quadrature."""
  _, _, order = rdp_accountant.get_privacy_spent(
      ORDERS, rdp_accountant.compute_rdp(q, sigma, steps, ORDERS), target_delta=delta)
  if float(order).is_integer():
    rdp = _dp_rdp()._compute_rdp_poisson_subsampled_gaussian(q, sigma, [order])[0] * steps
  else:
    rdp = _quad_rdp(q, sigma, order) * steps
  return rdp + math.log1p(-1 / order) - (math.log(delta) + math.log(order)) / (order - 1)


def _reference_epsilon(q, sigma, steps, delta, orders=ORDERS):
  dp_accounting, dp_rdp = _dp_accounting(), _dp_rdp()
  accountant = dp_rdp.RdpAccountant(orders=orders)
  accountant.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)),
                     steps)
  return accountant.get_epsilon(delta)


@pytest.mark.parametrize("eps,delta,q,steps", [
    (2.6, 1e-5, 256 / 60000, 14063), (1.0, 1e-5, 0.01, 1000), (8.0, 1e-5, 0.1, 100),
    (0.3, 1e-6, 0.001, 20000), (50.0, 1e-3, 0.5, 3)])
def test_noise_meets_the_budget_and_is_minimal(eps, delta, q, steps):
  tolerance = 1e-4
  sigma = calibration.compute_noise_multiplier(eps, delta, q, steps, tolerance=tolerance)
  # dp_accounting's reference on integer orders only: its fractional values are looser.
  int_orders = [a for a in ORDERS if float(a).is_integer()]
  assert _independent_epsilon_at_optimum(q, sigma, steps, delta) <= eps * (1 + 1e-9)
  below = sigma * (1 - 2 * tolerance)
  assert _reference_epsilon(q, below, steps, delta, int_orders) > eps
  eps_ours, _, _ = rdp_accountant.get_privacy_spent(
      ORDERS, rdp_accountant.compute_rdp(q, below, steps, ORDERS), target_delta=delta)
  assert eps_ours > eps


def test_for_training_uses_q_and_ceil_steps():
  sigma = calibration.compute_noise_multiplier_for_training(2.6, 1e-5, 60000, 256, 60)
  direct = calibration.compute_noise_multiplier(2.6, 1e-5, 256 / 60000, 14063)
  assert sigma == direct
  assert calibration.steps_for_training(60000, 256, 60) == math.ceil(60 * 60000 / 256) == 14063
  assert calibration.steps_for_training(100, 10, 0.25) == 3  # 2.5 steps -> 3
  assert calibration.steps_for_training(100, 30, 3) == 10  # exact rational ceil(300/30)


def test_no_noise_needed():
  assert calibration.compute_noise_multiplier(1.0, 1e-5, 0.0, 100) == 0.0
  assert calibration.compute_noise_multiplier(1.0, 1e-5, 0.5, 0) == 0.0
  assert calibration.compute_noise_multiplier(math.inf, 1e-5, 0.5, 10) == 0.0


def test_custom_orders():
  orders = [2, 4, 8, 16, 32]
  sigma = calibration.compute_noise_multiplier(2.0, 1e-5, 0.01, 1000, orders=orders)
  assert _reference_epsilon(0.01, sigma, 1000, 1e-5, orders) <= 2.0 * (1 + 1e-9)


def test_unreachable_budget_names_target_epsilon():
  with pytest.raises(ValueError, match="target_epsilon"):
    calibration.compute_noise_multiplier(1e-6, 1e-10, 1.0, 10**6)


def test_errors():
  with pytest.raises(ValueError, match="target_epsilon"):
    calibration.compute_noise_multiplier(0.0, 1e-5, 0.1, 10)
  with pytest.raises(ValueError, match="target_epsilon"):
    calibration.compute_noise_multiplier(-1.0, 1e-5, 0.1, 10)
  with pytest.raises(ValueError, match="target_delta"):
    calibration.compute_noise_multiplier(1.0, 1.0, 0.1, 10)
  with pytest.raises(ValueError, match="sampling_probability"):
    calibration.compute_noise_multiplier(1.0, 1e-5, 1.5, 10)
  with pytest.raises(ValueError, match="steps"):
    calibration.compute_noise_multiplier(1.0, 1e-5, 0.1, 2.5)
  with pytest.raises(ValueError, match="accountant"):
    calibration.compute_noise_multiplier(1.0, 1e-5, 0.1, 10, accountant="moments")
  with pytest.raises(ValueError, match="tolerance"):
    calibration.compute_noise_multiplier(1.0, 1e-5, 0.1, 10, tolerance=0.0)
  with pytest.raises(ValueError, match="orders"):
    calibration.compute_noise_multiplier(1.0, 1e-5, 0.1, 10, orders=[1.0, 2.0])
  with pytest.raises(ValueError, match="batch_size"):
    calibration.compute_noise_multiplier_for_training(1.0, 1e-5, 100, 200, 1)
  with pytest.raises(ValueError, match="dataset_size"):
    calibration.compute_noise_multiplier_for_training(1.0, 1e-5, 0, 1, 1)
  with pytest.raises(ValueError, match="epochs"):
    calibration.compute_noise_multiplier_for_training(1.0, 1e-5, 100, 10, -1)


def test_steps_range_and_orders_errors():
  # 1e8 steps work (and meet the budget by the independent reference) ...
  q, steps, delta = 1e-5, 10**8, 1e-5
  sigma = calibration.compute_noise_multiplier(2.0, delta, q, steps)
  assert _independent_epsilon_at_optimum(q, sigma, steps, delta) <= 2.0 * (1 + 1e-9)
  # ... too many steps are a clear error instead of an OverflowError.
  with pytest.raises(ValueError) as info:
    calibration.compute_noise_multiplier(1.0, 1e-5, 0.01, 10**400)
  assert str(info.value) == ("steps must be an integer in [0, 2**53 = 9007199254740992], got "
                             "1.000e+400 (an integer of 401 digits).")
  with pytest.raises(ValueError) as info:
    calibration.compute_noise_multiplier(1.0, 1e-5, 0.01, 10**10 + 1, accountant="pld")
  assert str(info.value) == ("steps must be an integer in [0, 10000000000] (the PLD "
                             "accountant's supported range), got 10000000001.")
  with pytest.raises(ValueError) as info:
    calibration.compute_noise_multiplier_for_training(1.0, 1e-5, 60000, 256, 1e300)
  assert str(info.value) == (
      "epochs=1e+300 with dataset_size=60000 and batch_size=256 gives 2.343e+302 (an integer "
      "of 303 digits) steps; steps must be in [0, 2**53 = 9007199254740992], so epochs must "
      "be at most 3.84307e+13.")
  assert calibration.steps_for_training(60000, 256, 3.84307e13) <= 2**53
  with pytest.raises(ValueError) as info:
    calibration.compute_noise_multiplier(1.0, 1e-5, 0.01, 100, orders=[])
  assert str(info.value) == "orders must not be empty: give at least one Renyi order in (1, inf]."
  # The PLD accountant has no orders: giving some is an error, not silently ignored.
  with pytest.raises(ValueError) as info:
    calibration.compute_noise_multiplier(1.0, 1e-5, 0.01, 100, accountant="pld", orders=[2, 3])
  assert str(info.value) == ("orders must be None with accountant='pld' (the PLD accountant "
                             "has no Renyi orders), got [2, 3].")


def _pld_compute_epsilon():
  module = pytest.importorskip("analysis.pld_accountant")
  if not hasattr(module, "compute_epsilon"):
    pytest.skip("analysis.pld_accountant.compute_epsilon not written yet")
  return module.compute_epsilon


def test_pld_branch_meets_the_budget_and_beats_rdp():
  compute_epsilon = _pld_compute_epsilon()
  q, steps, delta, eps = 0.01, 500, 1e-5, 1.5
  tolerance = 1e-3
  sigma = calibration.compute_noise_multiplier(eps, delta, q, steps, accountant="pld",
                                               tolerance=tolerance)
  assert compute_epsilon(q, sigma, steps, delta) <= eps
  assert compute_epsilon(q, sigma * (1 - 2 * tolerance), steps, delta) > eps
  # PLD accounting is tighter than RDP, so it needs no more noise.
  assert sigma <= calibration.compute_noise_multiplier(eps, delta, q, steps)


def test_pld_branch_calibrates_with_rdp_where_the_pld_grid_is_coarse():
  # 1e6 epochs of MNIST at batch 256 (issue 11): the PLD grid alone gives 23,722 at sigma 1.1,
  # RDP 3,451 (DEFAULT_ORDERS); the PLD accountant uses the smaller bound, so it needs less
  # noise than the RDP accountant, not (as before) 1.6 times as much (sigma 1.76).
  from analysis import pld_accountant  # pylint: disable=g-import-not-at-top
  q, steps, delta, eps, tolerance = 256 / 60000, 234_375_000, 1e-5, 3451.1, 1e-3
  sigma_rdp = calibration.compute_noise_multiplier(eps, delta, q, steps, tolerance=tolerance)
  sigma = calibration.compute_noise_multiplier(eps, delta, q, steps, accountant="pld",
                                               tolerance=tolerance)
  assert 1.1 <= sigma_rdp < 1.1 * (1 + tolerance)  # eps(1.1) = 3451.09 over DEFAULT_ORDERS
  assert 1.05 < sigma < 1.06  # 1.0554: the RDP bound with the order optimised over the reals
  capped = pld_accountant.compute_epsilon_with_rdp_cap
  assert capped([q], [sigma], [steps], delta).epsilon <= eps
  assert capped([q], [sigma * (1 - 2 * tolerance)], [steps], delta).epsilon > eps
  # Independently: dp_accounting's PLD (h = 1e-3, an upper bound too) puts it at 3431 <= eps.
  dp_accounting, pld_privacy_accountant = _dp_accounting(), _dp_pld()
  reference = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-3)
  reference.compose(dp_accounting.PoissonSampledDpEvent(
      q, dp_accounting.GaussianDpEvent(sigma)), steps)
  assert reference.get_epsilon(delta) <= eps


def test_pld_import_is_lazy():
  source = importlib.util.find_spec("analysis.calibration").origin
  text = open(source, encoding="utf-8").read()
  top_level = [line for line in text.splitlines() if line.startswith(("import ", "from "))]
  assert not any("pld_accountant" in line for line in top_level)


def test_windowed_order_search_equals_the_full_grid_after_jumps():
  # The calibration evaluates eps on a sliding window of orders around the last optimum; it
  # must equal the full-grid epsilon, also after large jumps in sigma (optimum far away).
  import warnings
  q, steps, delta = 256 / 60000, 14063, 1e-5
  eps_of = calibration._epsilon_function(  # pylint: disable=protected-access
      lambda sigma: events.SelfComposedEvent(
          events.PoissonSampledEvent(q, events.GaussianEvent(sigma)), steps), delta, "rdp", ORDERS)
  for sigma in [1.0, 5.0, 0.7, 3.0, 1.1, 40.0, 0.45, 1.0993, 200.0, 0.6]:
    with warnings.catch_warnings():
      warnings.simplefilter("ignore", rdp_accountant.OrderAtBoundaryWarning)
      full = rdp_accountant.get_privacy_spent(
          ORDERS, rdp_accountant.compute_rdp(q, sigma, steps, ORDERS), target_delta=delta)[0]
    assert eps_of(sigma) == full, sigma


@pytest.mark.parametrize("answer", [0, 1, 2, 3, 7, 8, 9, 1000, 123457])
@pytest.mark.parametrize("start", [0, 1])
def test_largest_count_that_fits_against_a_linear_scan(answer, start):
  calls = []

  def fits(n):
    calls.append(n)
    return n <= answer

  got = calibration.largest_count_that_fits(fits, start=start)
  assert got == max(answer, start - 1)
  assert len(calls) <= 2 * max(answer, 1).bit_length() + 3  # logarithmic, not a scan


def test_largest_count_that_fits_reports_unlimited_past_the_cap():
  assert calibration.largest_count_that_fits(lambda n: True, cap=1000) is None
  assert calibration.largest_count_that_fits(lambda n: n <= 1000, cap=1000) == 1000
  assert calibration.largest_count_that_fits(lambda n: False) == -1
