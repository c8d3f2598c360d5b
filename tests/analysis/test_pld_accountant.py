"""Tests of analysis.pld_accountant against independent references.

References: dp_accounting's PLD accountant (a test-only dependency), the closed-form privacy
curve of the Gaussian mechanism (Balle & Wang 2018) for q = 1, and direct high-precision
numerical integration of the hockey-stick divergence (mpmath) for one subsampled step.
"""
from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import optimize, special

from analysis import events
from analysis import pld_accountant as pld
from analysis import rdp_accountant
from dp_references import dp_accounting as _dp_accounting, dp_rdp as _dp_rdp, dp_pld as _dp_pld

def _poisson(q, sigma):
  return events.PoissonSampledEvent(q, events.GaussianEvent(sigma))


MNIST_Q = 256 / 60000
MNIST_SIGMA = 1.1
MNIST_STEPS = math.ceil(60 * 60000 / 256)  # 14063
MNIST_DELTA = 1e-5


# ------------------------------------------------------------------------------------------
# References.


def _dp_accounting_accountant(phases, h=1e-4):
  dp_accounting, pld_privacy_accountant = _dp_accounting(), _dp_pld()
  accountant = pld_privacy_accountant.PLDAccountant(value_discretization_interval=h)
  for q, sigma, steps in phases:
    event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma))
    accountant.compose(event, steps)
  return accountant


def _gaussian_delta(epsilon, s):
  """Exact delta(eps) of the Gaussian mechanism, sensitivity 1, std s (Balle & Wang 2018)."""
  # Phi(-eps s + 1/(2s)) - e^eps Phi(-eps s - 1/(2s)); second term in log space (no overflow).
  first = special.ndtr(-epsilon * s + 1.0 / (2.0 * s))
  second = math.exp(epsilon + special.log_ndtr(-epsilon * s - 1.0 / (2.0 * s)))
  return first - second


def _gaussian_epsilon(delta, s):
  if _gaussian_delta(0.0, s) <= delta:
    return 0.0
  upper = 1.0
  while _gaussian_delta(upper, s) > delta:
    upper *= 2.0
  return optimize.brentq(lambda e: _gaussian_delta(e, s) - delta, 0.0, upper, xtol=1e-14,
                         rtol=1e-15)


def _one_step_delta_mpmath(q, sigma, epsilon):
  """max over add/remove of  integral (p(x) - e^eps r(x))_+ dx  for one subsampled step.

  p and r are the two densities of each direction; the crossing point where the integrand
  changes sign is found by root finding on log p - log r - eps, then the positive part is
  integrated by quadrature, all at 40 significant digits.
  """
  mpmath.mp.dps = 40
  q, sigma, eps = mpmath.mpf(q), mpmath.mpf(sigma), mpmath.mpf(epsilon)

  def n0(x):
    return mpmath.npdf(x, 0, sigma)

  def mix(x):
    return (1 - q) * n0(x) + q * mpmath.npdf(x, 1, sigma)

  def crossing(upper_density, lower_density):
    gap = lambda x: mpmath.log(upper_density(x)) - mpmath.log(lower_density(x)) - eps
    return mpmath.findroot(gap, (mpmath.mpf(-60), mpmath.mpf(60)), solver="illinois")

  # remove: p = mix, r = N(0, sigma); the loss increases in x.
  x_star = crossing(mix, n0)
  remove = mpmath.quad(lambda x: mix(x) - mpmath.exp(eps) * n0(x),
                       [x_star, x_star + sigma, x_star + 5 * sigma, mpmath.inf])
  # add: p = N(0, sigma), r = mix; the loss decreases in x and is bounded by -log(1 - q).
  if q < 1 and eps < -mpmath.log(1 - q):
    x_star = crossing(n0, mix)
    add = mpmath.quad(lambda x: n0(x) - mpmath.exp(eps) * mix(x),
                      [-mpmath.inf, x_star - 5 * sigma, x_star - sigma, x_star])
  else:
    add = mpmath.mpf(0)
  return float(max(remove, add))


def _one_step_delta_closed_form(q, sigma, epsilon, dps=80):
  """max over add/remove of the exact one-step hockey-stick divergence, in closed form.

  The loss of the remove pair, log(1 - q + q exp((2x - 1) / (2 sigma^2))), is increasing in x,
  so delta is P(X > x*) - e^eps Q(X > x*) at the x* where it equals eps (and similarly for the
  add pair below its crossing); mpmath at ``dps`` digits keeps this exact for any sigma.
  """
  with mpmath.workdps(dps):
    q, s, e = mpmath.mpf(q), mpmath.mpf(sigma), mpmath.mpf(epsilon)
    half, ee, em = mpmath.mpf(1) / 2, mpmath.exp(e), mpmath.exp(-e)
    if q == 1:
      x = half + s * s * e
      remove = mpmath.ncdf(-(x - 1) / s) - ee * mpmath.ncdf(-x / s)
      x = half - s * s * e
      add = mpmath.ncdf(x / s) - ee * mpmath.ncdf((x - 1) / s)
    else:
      x = half + s * s * mpmath.log((ee - 1 + q) / q)
      remove = q * mpmath.ncdf(-(x - 1) / s) - (ee - 1 + q) * mpmath.ncdf(-x / s)
      add = mpmath.mpf(0)
      if em > 1 - q:
        x = half + s * s * mpmath.log((em - 1 + q) / q)
        add = (1 - ee * (1 - q)) * mpmath.ncdf(x / s) - ee * q * mpmath.ncdf((x - 1) / s)
    return float(max(remove, add, 0))


def _gaussian_delta_mp(mu, epsilon, dps=60):
  """Exact delta(eps) of the Gaussian mechanism with sensitivity / std = mu, in mpmath."""
  with mpmath.workdps(dps):
    mu, e = mpmath.mpf(mu), mpmath.mpf(epsilon)
    return float(mpmath.ncdf(-e / mu + mu / 2) - mpmath.exp(e) * mpmath.ncdf(-e / mu - mu / 2))


# ------------------------------------------------------------------------------------------
# Agreement with dp_accounting.


def test_mnist_setting_agrees_with_dp_accounting():
  ours = pld.compute_epsilon(MNIST_Q, MNIST_SIGMA, MNIST_STEPS, MNIST_DELTA)
  ref = _dp_accounting_accountant([(MNIST_Q, MNIST_SIGMA, MNIST_STEPS)]).get_epsilon(
      MNIST_DELTA)
  assert 2.37 < ours < 2.39
  assert abs(ours / ref - 1.0) < 3e-3
  # Both are connect-the-dots upper bounds on the same grid: they agree far more closely.
  assert abs(ours / ref - 1.0) < 1e-6


@pytest.mark.parametrize("q, sigma, steps, delta", [
    (0.01, 1.0, 1, 1e-5),
    (0.01, 1.0, 10, 1e-5),
    (0.99, 2.0, 5, 1e-6),
    (0.5, 3.0, 50, 1e-5),
    (0.001, 0.6, 1000, 1e-5),
    (0.1, 0.8, 200, 1e-7),
])
def test_epsilon_and_delta_agree_with_dp_accounting(q, sigma, steps, delta):
  ref = _dp_accounting_accountant([(q, sigma, steps)])
  ref_eps = ref.get_epsilon(delta)
  ours = pld.compute_epsilon(q, sigma, steps, delta)
  assert ours == pytest.approx(ref_eps, rel=1e-6)
  ours_delta = pld.compute_delta(q, sigma, steps, ref_eps)
  assert ours_delta == pytest.approx(ref.get_delta(ref_eps), rel=1e-4)


def test_heterogeneous_agrees_with_dp_accounting():
  phases = [(0.01, 1.0, 1000), (0.02, 1.5, 500), (0.005, 0.9, 300)]
  ref = _dp_accounting_accountant(phases).get_epsilon(1e-5)
  qs, sigmas, steps = zip(*phases)
  ours = pld.compute_epsilon_heterogeneous(list(qs), list(sigmas), list(steps), 1e-5)
  assert ours == pytest.approx(ref, rel=1e-6)


# ------------------------------------------------------------------------------------------
# min(PLD, RDP): the number reported for the accountant "pld".

MILLION_EPOCH_STEPS = 234_375_000  # ceil(1e6 * 60000 / 256)


def _dp_accounting_rdp_epsilon(phases, delta, orders=None):
  """dp_accounting's RDP epsilon (its own default orders unless ``orders`` is given)."""
  dp_accounting, rdp_module = _dp_accounting(), _dp_rdp()
  accountant = (rdp_module.RdpAccountant() if orders is None else
                rdp_module.RdpAccountant(orders=list(orders)))
  for q, sigma, steps in phases:
    accountant.compose(dp_accounting.PoissonSampledDpEvent(
        q, dp_accounting.GaussianDpEvent(sigma)), steps)
  return accountant.get_epsilon(delta)


def test_capped_epsilon_is_the_pld_bound_where_pld_is_tighter():
  phase = (MNIST_Q, MNIST_SIGMA, MNIST_STEPS)  # 60 epochs
  capped = pld.compute_epsilon_with_rdp_cap(*([x] for x in phase), MNIST_DELTA)
  ref_pld = _dp_accounting_accountant([phase]).get_epsilon(MNIST_DELTA)  # 2.38178
  ref_rdp = _dp_accounting_rdp_epsilon([phase], MNIST_DELTA)  # 2.59666 (order 8.1)
  assert not capped.from_rdp and capped.rdp_order is not None
  assert capped.epsilon == capped.pld_epsilon == pld.compute_epsilon(*phase, MNIST_DELTA)
  assert 2.38 < capped.epsilon < 2.385 and abs(capped.epsilon / ref_pld - 1.0) < 1e-6
  # Strictly below RDP, by 8%: our RDP (2.59664, order optimised over the reals) and
  # dp_accounting's (2.59666 over its orders) agree to 1e-5.
  assert capped.epsilon < 0.92 * min(capped.rdp_epsilon, ref_rdp)
  assert capped.rdp_epsilon <= ref_rdp and abs(capped.rdp_epsilon / ref_rdp - 1.0) < 1e-4


def test_capped_epsilon_at_a_million_epochs_is_no_larger_than_rdp():
  # MNIST, batch 256, sigma 1.1, 1e6 epochs: the PLD grid has to be coarsened (h = 0.065), and
  # alone it gives 23,722 against RDP's 3,451 (DEFAULT_ORDERS) or 3,072.5 (order optimised).
  phase = (MNIST_Q, MNIST_SIGMA, MILLION_EPOCH_STEPS)
  capped = pld.compute_epsilon_with_rdp_cap(*([x] for x in phase), MNIST_DELTA)
  ref_rdp = _dp_accounting_rdp_epsilon([phase], MNIST_DELTA)  # 3179.4 (order 1.1)
  ref_rdp_default_orders = _dp_accounting_rdp_epsilon(  # 3519.6 (order 1.25)
      [phase], MNIST_DELTA, orders=rdp_accountant.DEFAULT_ORDERS)
  # dp_accounting's PLD, which sizes its grid differently, at h = 1e-3: 3057.5 (1 s).
  ref_pld = _dp_accounting_accountant([phase], h=1e-3).get_epsilon(MNIST_DELTA)
  with pytest.warns(rdp_accountant.OrderAtBoundaryWarning):  # optimum at order 1.25
    ours_rdp_grid = rdp_accountant.get_privacy_spent(
        rdp_accountant.DEFAULT_ORDERS,
        rdp_accountant.compute_rdp(*phase, rdp_accountant.DEFAULT_ORDERS),
        target_delta=MNIST_DELTA)[0]  # 3451.1, what --accountant=rdp reports
  assert capped.epsilon == min(capped.pld_epsilon, capped.rdp_epsilon)
  assert capped.pld_epsilon == pld.compute_epsilon(*phase, MNIST_DELTA)
  assert capped.epsilon <= capped.rdp_epsilon <= ref_rdp < ref_rdp_default_orders
  assert capped.epsilon <= ours_rdp_grid
  assert 3000.0 < capped.epsilon < 3073.0
  # Within 1% of an independent PLD computation (the PLD grid alone is 7.8x off).
  assert abs(capped.epsilon / ref_pld - 1.0) < 0.01


def test_capped_epsilon_of_several_phases_and_edge_cases():
  phases = [(0.01, 1.1, 300), (0.02, 0.9, 100), (0.01, 1.1, 200)]
  qs, sigmas, steps = (list(c) for c in zip(*phases))
  capped = pld.compute_epsilon_with_rdp_cap(qs, sigmas, steps, 1e-5)
  assert capped.epsilon == capped.pld_epsilon == pld.compute_epsilon_heterogeneous(
      qs, sigmas, steps, 1e-5)
  ref_rdp = _dp_accounting_rdp_epsilon(phases, 1e-5, orders=rdp_accountant.DEFAULT_ORDERS)
  assert capped.rdp_epsilon == pytest.approx(ref_rdp, rel=1e-3)  # 2.607, DEFAULT_ORDERS
  assert capped.epsilon < 0.85 * capped.rdp_epsilon  # 2.103
  assert pld.compute_epsilon_with_rdp_cap([], [], [], 1e-5) == (0.0, 0.0, 0.0, None, False)
  # No noise: RDP is inf, PLD the exact 1 - (1 - q)^T <= delta answer 0.
  assert pld.compute_epsilon_with_rdp_cap([0.001], [0.0], [1], 1e-2).epsilon == 0.0
  assert pld.compute_epsilon_with_rdp_cap([0.01], [0.0], [10], 1e-5).epsilon == math.inf
  with pytest.raises(ValueError, match=r"steps_list\[0\] must be an integer"):
    pld.compute_epsilon_with_rdp_cap([0.01], [1.0], [10**10 + 1], 1e-5)


# ------------------------------------------------------------------------------------------
# Exact references: Gaussian closed form (q = 1), numerical integration (one step, q < 1).


@pytest.mark.parametrize("sigma, steps", [(1.0, 1), (2.0, 10), (5.0, 100), (0.8, 3),
                                          (20.0, 5), (3.0, 1000)])
def test_full_batch_is_the_gaussian_mechanism(sigma, steps):
  """q = 1 is the Gaussian mechanism with std sigma / sqrt(steps): an upper bound, tight."""
  s = sigma / math.sqrt(steps)
  accountant = pld.PLDAccountant().compose(_poisson(1.0, sigma), steps)
  for epsilon in (0.3, 1.0, 2.5):
    exact = _gaussian_delta(epsilon, s)
    ours = accountant.get_delta(epsilon)
    # Upper bound (1e-12 relative allowance for float64 round-off at grid points) ...
    assert ours >= exact * (1.0 - 1e-12)
    # ... and tight.
    assert ours <= exact * (1.0 + 1e-5) + 1e-15
  # Small deltas rely on the exponentially tilted FFT (plain FFT round-off is ~1e-17).
  for delta in (1e-3, 1e-6, 1e-9, 1e-12):
    exact = _gaussian_epsilon(delta, s)
    ours = accountant.get_epsilon(delta)
    assert ours >= exact * (1.0 - 1e-12)
    assert ours <= exact * (1.0 + 1e-5) + 1e-6


@pytest.mark.parametrize("q, sigma, epsilon", [(0.01, 1.0, 0.05), (0.3, 0.8, 1.0),
                                               (0.9, 2.0, 0.3), (0.05, 0.5, 0.5)])
def test_one_step_delta_matches_numerical_integration(q, sigma, epsilon):
  exact = _one_step_delta_mpmath(q, sigma, epsilon)
  ours = pld.compute_delta(q, sigma, 1, epsilon)
  assert ours >= exact * (1.0 - 1e-12)
  assert ours <= exact * (1.0 + 1e-6)


@pytest.mark.parametrize("q, sigma, delta", [(0.01, 1.0, 1e-5), (0.3, 0.8, 1e-3)])
def test_one_step_epsilon_is_valid_and_tight_by_numerical_integration(q, sigma, delta):
  ours = pld.compute_epsilon(q, sigma, 1, delta)
  # Valid: the exact curve is below delta at our epsilon.  Tight: not much below it.
  assert _one_step_delta_mpmath(q, sigma, ours) <= delta * (1.0 + 1e-12)
  assert _one_step_delta_mpmath(q, sigma, ours * (1.0 - 1e-5)) > delta


def test_coarser_nested_grid_is_more_pessimistic():
  # Connect-the-dots on a subset of grid points interpolates a convex curve on fewer knots,
  # so a coarser nested grid can only give a larger epsilon.
  args = (0.02, 0.9, 300, 1e-6)
  fine = pld.compute_epsilon(*args, value_discretization_interval=1e-4)
  mid = pld.compute_epsilon(*args, value_discretization_interval=1e-3)
  coarse = pld.compute_epsilon(*args, value_discretization_interval=1e-2)
  assert fine <= mid * (1 + 1e-12) and mid <= coarse * (1 + 1e-12)
  assert coarse / fine - 1.0 < 5e-3


def test_delta_and_epsilon_are_inverse():
  accountant = pld.PLDAccountant().compose(_poisson(0.01, 1.2), 2000)
  for delta in (1e-4, 1e-6, 1e-8):
    epsilon = accountant.get_epsilon(delta)
    assert accountant.get_delta(epsilon) == pytest.approx(delta, rel=1e-9)


# ------------------------------------------------------------------------------------------
# Edge cases.


def test_edge_cases():
  assert pld.compute_epsilon(0.0, 1.0, 100, 1e-5) == 0.0
  assert pld.compute_epsilon(0.0, 0.0, 100, 1e-5) == 0.0
  assert pld.compute_epsilon(0.1, 1.0, 0, 1e-5) == 0.0
  assert pld.compute_epsilon(0.1, math.inf, 100, 1e-5) == 0.0
  assert pld.compute_delta(0.1, 1.0, 0, 0.0) == 0.0
  assert pld.compute_epsilon(0.1, 0.0, 100, 1e-5) == math.inf
  assert pld.compute_epsilon(1.0, 0.0, 1, 1e-5) == math.inf
  assert pld.compute_delta(1.0, 0.0, 1, 5.0) == 1.0
  # Without noise the "remove" direction releases a sampled record w.p. q each step.
  assert pld.compute_delta(0.01, 0.0, 10, 1.0) == pytest.approx(1 - 0.99**10, rel=1e-12)
  # ... so if that probability is below delta, the exact epsilon is 0, not inf.
  assert pld.compute_epsilon(1e-9, 0.0, 1, 1e-5) == 0.0
  assert pld.compute_epsilon_heterogeneous([], [], [], 1e-5) == 0.0
  # Infinite privacy loss mass is reported at epsilon = inf.
  assert pld.compute_delta(0.01, 0.0, 10, math.inf) == pytest.approx(1 - 0.99**10)
  assert pld.compute_delta(0.01, 1.0, 10, math.inf) < 1e-17


def test_epsilon_on_a_point_mass_below_the_window_start():
  # A single atom at loss 5h: delta(eps) = 1 - exp(eps - 5h), so eps(delta) = 5h + log(1-delta).
  h = 1e-2
  point = pld._DiscretePLD(5, np.array([1.0]), 0.0, h)
  assert point.epsilon(0.01) == pytest.approx(5 * h + math.log(0.99), rel=1e-12)
  assert point.epsilon(0.5) == 0.0
  assert point.delta(0.0) == pytest.approx(-math.expm1(-5 * h), rel=1e-12)


def test_heterogeneous_and_accountant_match_homogeneous():
  single = pld.compute_epsilon(0.02, 1.1, 1000, 1e-5)
  split = pld.compute_epsilon_heterogeneous([0.02, 0.02], [1.1, 1.1], [400, 600], 1e-5)
  assert split == pytest.approx(single, rel=1e-12)
  arrays = pld.compute_epsilon_heterogeneous(np.array([0.02]), (1.1,), [1000], 1e-5)
  assert arrays == pytest.approx(single, rel=1e-12)
  accountant = pld.PLDAccountant()
  for _ in range(10):
    accountant.compose(_poisson(0.02, 1.1), 100)
  assert accountant.get_epsilon(1e-5) == pytest.approx(single, rel=1e-12)
  # Zero-step and q = 0 phases change nothing.
  padded = pld.compute_epsilon_heterogeneous([0.5, 0.02, 0.0], [0.1, 1.1, 0.0], [0, 1000, 50],
                                             1e-5)
  assert padded == pytest.approx(single, rel=1e-12)


# ------------------------------------------------------------------------------------------
# Extreme inputs: supported ranges, sound answers outside them, clear errors, no crashes.

# Float64 round-off floor of delta documented in the module (measured up to 4e-17).
_ROUND_OFF = 1e-16


@pytest.mark.parametrize("q", [1.0, 0.5, 0.01, 1e-6])
def test_largest_discretised_noise_is_sound(q):
  # One step against the exact closed form at sigma = 1e12 (losses of order 1e-12 nats).
  sigma = pld.MAX_NOISE_MULTIPLIER
  for epsilon in (0.0, 1e-13, 1e-9, 0.5):
    ours = pld.compute_delta(q, sigma, 1, epsilon)
    assert ours >= _one_step_delta_closed_form(q, sigma, epsilon) - _ROUND_OFF
  for delta in (1e-3, 1e-5, 1e-10, 1e-13):
    ours = pld.compute_epsilon(q, sigma, 1, delta)
    assert _one_step_delta_closed_form(q, sigma, ours) <= delta * (1 + 1e-9) + _ROUND_OFF


@pytest.mark.parametrize("q", [1.0, 0.01])
def test_smallest_discretised_noise_is_sound(q):
  # One step at sigma = 1e-3 (losses up to ~5e5 nats; the grid interval is enlarged).
  sigma = pld.MIN_NOISE_MULTIPLIER
  for epsilon in (0.0, 0.5):
    ours = pld.compute_delta(q, sigma, 1, epsilon)
    assert ours >= _one_step_delta_closed_form(q, sigma, epsilon) - _ROUND_OFF
  ours = pld.compute_epsilon(q, sigma, 1, 1e-5)
  assert _one_step_delta_closed_form(q, sigma, ours) <= 1e-5 * (1 + 1e-9)
  assert ours > 4e5  # ~ 1 / (2 sigma^2): vacuous, as the module docstring says


@pytest.mark.parametrize("sigma", [9.99e-4, 1e-10, 1e-100, 1e-160, 5e-324])
def test_tiny_noise_is_accounted_as_no_noise(sigma):
  # sigma = 1e-100 used to crash ("zero-size array to reduction operation").  Below 1e-3 the
  # run is accounted as noise-free, a sound upper bound by post-processing.
  for q, steps in [(0.01, 10), (1.0, 1), (1e-9, 100)]:
    no_noise = 1 - (1 - q)**steps
    assert pld.compute_delta(q, sigma, steps, 1.0) == pytest.approx(no_noise, rel=1e-9)
    assert pld.compute_delta(q, sigma, steps, 1.0) == pld.compute_delta(q, 0.0, steps, 1.0)
  # Sampled at least once with probability 0.0956 > delta: epsilon inf (the exact value is
  # above 4e5 nats already at sigma = 1e-3, see test_smallest_discretised_noise_is_sound).
  assert pld.compute_epsilon(0.01, sigma, 10, 1e-5) == math.inf
  # Sampled with probability 1e-7 < delta: the exact epsilon of the noise-free run, 0.
  assert pld.compute_epsilon(1e-9, sigma, 100, 1e-5) == 0.0
  assert pld.compute_epsilon(1e-9, 0.0, 100, 1e-5) == 0.0


@pytest.mark.parametrize("sigma", [1.0001e12, 1e14, 1e100, 1e155, 1e300, 1.7e308])
def test_huge_noise_is_accounted_as_1e12(sigma):
  # sigma = 1e155 used to crash and sigma = 1e22 .. 1e150 returned inf.
  for q, steps in [(0.01, 10), (1.0, 10**8), (0.5, 1)]:
    at_max = pld.compute_epsilon(q, pld.MAX_NOISE_MULTIPLIER, steps, 1e-5)
    assert pld.compute_epsilon(q, sigma, steps, 1e-5) == at_max
    assert pld.compute_delta(q, sigma, steps, 0.0) == pld.compute_delta(
        q, pld.MAX_NOISE_MULTIPLIER, steps, 0.0)
  # Sound: above the exact one-step curve at the true sigma (which is below the one at 1e12).
  for q in (1.0, 0.5, 0.01):
    assert pld.compute_delta(q, sigma, 1, 0.0) >= _one_step_delta_closed_form(q, sigma, 0.0)
  # q = 1, 1e8 steps: the Gaussian mechanism with mu = 1e4 / 1e12, whose exact delta at 0 is
  # 4e-9 < 1e-5, so eps is 0 at the true sigma; at 1e12 the (pessimistic) grid gives 7.9e-5.
  assert _gaussian_delta_mp(1e4 / 1e12, 0.0) < 1e-5
  assert 0.0 <= pld.compute_epsilon(1.0, sigma, 10**8, 1e-5) < 1e-4


def test_step_counts_up_to_1e10_work_and_larger_ones_are_clear_errors():
  # q = 1: T Gaussian steps are one Gaussian with mu = sqrt(T) / sigma.  With one-step losses
  # of std 1e-5 nats a grid of h = 1e-4 is loose (15.4 instead of 4.38 at 1e10 steps), so the
  # interval is chosen below the loss scale.
  for steps, sigma, h in [(10**8, 1e4, 1e-5), (10**10, 1e5, 1e-6)]:
    eps = pld.compute_epsilon(1.0, sigma, steps, 1e-5, value_discretization_interval=h)
    mu = math.sqrt(steps) / sigma
    assert _gaussian_delta_mp(mu, eps) <= 1e-5  # valid ...
    assert _gaussian_delta_mp(mu, 0.8 * eps) > 1e-5  # ... and not vacuous
  eps = pld.compute_epsilon(MNIST_Q, MNIST_SIGMA, 10**8, 1e-5)
  assert math.isfinite(eps) and eps > pld.compute_epsilon(MNIST_Q, MNIST_SIGMA, 10**6, 1e-5)
  why = "(the PLD accountant's supported range; use the RDP accountant beyond it)"
  cases = {
      10**10 + 1: f"steps must be an integer in [0, 10000000000] {why}, got 10000000001.",
      10**400: f"steps must be an integer in [0, 10000000000] {why}, got 1.000e+400 (an "
               "integer of 401 digits).",
  }
  for steps, message in cases.items():
    for call in (lambda: pld.compute_epsilon(0.01, 1.0, steps, 1e-5),
                 lambda: pld.compute_delta(0.01, 1.0, steps, 1.0)):
      with pytest.raises(ValueError) as info:
        call()  # 10**400 used to raise OverflowError
      assert str(info.value) == message
    with pytest.raises(ValueError) as info:
      pld.compute_epsilon_heterogeneous([0.01], [1.0], [steps], 1e-5)
    assert str(info.value) == message.replace("steps", "steps_list[0]", 1)
  # The accountant interface names its own argument, count.
  with pytest.raises(ValueError) as info:
    pld.PLDAccountant().compose(_poisson(0.01, 1.0), 10**10 + 1)
  assert str(info.value) == (f"steps must keep the accountant's total in [0, 10000000000] {why}; "
                             "adding 10000000001 steps would make it 10000000001.")
  with pytest.raises(ValueError) as info:
    pld.PLDAccountant().compose(_poisson(0.01, 1.0), 10**400)
  assert str(info.value) == ("count must be an integer in [0, 2**53 = 9007199254740992], got 1.000e+400 "
                             "(an integer of 401 digits).")
  total = ("steps must keep the accountant's total in [0, 10000000000] (the PLD accountant's "
           "supported range; use the RDP accountant beyond it); adding 6000000000 steps would "
           "make it 12000000000.")
  with pytest.raises(ValueError) as info:
    pld.PLDAccountant().compose(_poisson(0.01, 1.0), 6 * 10**9).compose(
        _poisson(0.02, 1.0), 6 * 10**9)
  assert str(info.value) == total
  with pytest.raises(ValueError) as info:
    pld.compute_epsilon_heterogeneous([0.01, 0.02], [1.0, 1.0], [6 * 10**9] * 2, 1e-5)
  assert str(info.value) == total


def test_many_steps_do_not_lose_mass_to_round_off():
  # Found by a random search: the one-step pmf's float64 sum was 1 - 1.1e-16, and raised to
  # 1.9e9 steps the composed mass was 1 - 2e-7, so delta came out as 0.99999989 where the
  # exact value (Gaussian, mu = sqrt(T) / sigma = 4.3e5, at eps = 1) is 1 - 1e-(10^10).
  q, sigma, steps, h = 1.0, 0.10230712097688355, 1901490030, 0.00014060056494524876
  assert _gaussian_delta_mp(math.sqrt(steps) / sigma, 1.0) == 1.0
  assert pld.compute_delta(q, sigma, steps, 1.0, value_discretization_interval=h) == 1.0


@pytest.mark.parametrize("h", [1.0000001, 10.0, 1e10, 1e300])
def test_coarse_discretisation_is_rejected(h):
  # h = 1e300 used to crash; h = 1e10 returned epsilon = 2e10 for a run with epsilon 0.38.
  message = ("value_discretization_interval must be in (0, 1] nats (coarser grids give vacuous "
             f"bounds), got {h!r}.")
  for call in (lambda: pld.compute_epsilon(0.01, 1.0, 10, 1e-5, value_discretization_interval=h),
               lambda: pld.compute_delta(0.01, 1.0, 10, 1.0, value_discretization_interval=h),
               lambda: pld.compute_epsilon_heterogeneous([0.01], [1.0], [10], 1e-5,
                                                         value_discretization_interval=h),
               lambda: pld.PLDAccountant(h)):
    with pytest.raises(ValueError) as info:
      call()
    assert str(info.value) == message


@pytest.mark.parametrize("h", [1.0, 0.1, 1e-8, 1e-300, 5e-324])
def test_any_discretisation_in_range_is_sound(h):
  # q = 1, sigma = 2, 10 steps: the Gaussian mechanism with mu = sqrt(10) / 2.  Tiny h is
  # enlarged to fit the grid; every h in (0, 1] gives a valid bound, tight for h <= 0.1.
  mu = math.sqrt(10) / 2
  eps = pld.compute_epsilon(1.0, 2.0, 10, 1e-5, value_discretization_interval=h)
  assert _gaussian_delta_mp(mu, eps) <= 1e-5 * (1 + 1e-9)
  if h <= 0.1:
    assert _gaussian_delta_mp(mu, eps * (1 - 1e-2)) > 1e-5
  delta = pld.compute_delta(1.0, 2.0, 10, 1.0, value_discretization_interval=h)
  assert delta >= _gaussian_delta_mp(mu, 1.0)


# ------------------------------------------------------------------------------------------
# Argument errors: each names the argument.


@pytest.mark.parametrize("kwargs, match", [
    (dict(sampling_probability=-0.1), "sampling_probability"),
    (dict(sampling_probability=1.5), "sampling_probability"),
    (dict(sampling_probability=math.nan), "sampling_probability"),
    (dict(sampling_probability="0.1"), "sampling_probability"),
    (dict(noise_multiplier=-1.0), "noise_multiplier"),
    (dict(noise_multiplier=math.nan), "noise_multiplier"),
    (dict(steps=-1), "steps"),
    (dict(steps=1.5), "steps"),
    (dict(steps=True), "steps"),
    (dict(delta=0.0), "delta"),
    (dict(delta=1.0), "delta"),
    (dict(delta=-1e-5), "delta"),
    (dict(delta=math.nan), "delta"),
    (dict(value_discretization_interval=0.0), "value_discretization_interval"),
    (dict(value_discretization_interval=-1e-4), "value_discretization_interval"),
    (dict(value_discretization_interval=math.inf), "value_discretization_interval"),
    (dict(value_discretization_interval=1.5), r"value_discretization_interval must be in \(0, 1\]"),
    (dict(steps=10**10 + 1), r"steps must be an integer in \[0, 10000000000\]"),
])
def test_compute_epsilon_rejects_bad_arguments(kwargs, match):
  args = dict(sampling_probability=0.01, noise_multiplier=1.0, steps=10, delta=1e-5)
  args.update(kwargs)
  vdi = args.pop("value_discretization_interval", 1e-4)
  with pytest.raises(ValueError, match=match):
    pld.compute_epsilon(**args, value_discretization_interval=vdi)


@pytest.mark.parametrize("epsilon", [-0.1, math.nan, "1"])
def test_compute_delta_rejects_bad_epsilon(epsilon):
  with pytest.raises(ValueError, match="epsilon"):
    pld.compute_delta(0.01, 1.0, 10, epsilon)


def test_compute_delta_rejects_bad_phase_arguments():
  with pytest.raises(ValueError, match="sampling_probability"):
    pld.compute_delta(2.0, 1.0, 10, 1.0)
  with pytest.raises(ValueError, match="noise_multiplier"):
    pld.compute_delta(0.1, -1.0, 10, 1.0)
  with pytest.raises(ValueError, match="steps"):
    pld.compute_delta(0.1, 1.0, 2.5, 1.0)


@pytest.mark.parametrize("qs, sigmas, steps, delta, match", [
    ([0.1, 0.2], [1.0], [10, 10], 1e-5, "same length"),
    ([0.1], [1.0], [10, 10], 1e-5, "same length"),
    (0.1, [1.0], [10], 1e-5, "sampling_probabilities"),
    ([0.1], "1.0", [10], 1e-5, "noise_multipliers"),
    ([0.1], [1.0], np.array([[10]]), 1e-5, "steps_list"),
    ([0.1, 1.2], [1.0, 1.0], [10, 10], 1e-5, r"sampling_probabilities\[1\]"),
    ([0.1], [-1.0], [10], 1e-5, r"noise_multipliers\[0\]"),
    ([0.1], [1.0], [-3], 1e-5, r"steps_list\[0\]"),
    ([0.1], [1.0], [10], 2.0, "delta"),
])
def test_heterogeneous_rejects_bad_arguments(qs, sigmas, steps, delta, match):
  with pytest.raises(ValueError, match=match):
    pld.compute_epsilon_heterogeneous(qs, sigmas, steps, delta)


def test_accountant_rejects_bad_arguments():
  with pytest.raises(ValueError, match="value_discretization_interval"):
    pld.PLDAccountant(value_discretization_interval=0.0)
  accountant = pld.PLDAccountant()
  with pytest.raises(ValueError, match="sampling_probability"):
    accountant.compose(_poisson(1.01, 1.0), 1)
  with pytest.raises(ValueError, match="delta"):
    accountant.get_epsilon(1.0)
  with pytest.raises(ValueError, match="epsilon"):
    accountant.get_delta(-1.0)


# ------------------------------------------------------------------------------------------
# Monotonicity (property-based, coarse grid to keep it fast).  The discrete PLDs are exact
# dominating pairs, so these orderings hold mathematically; the 1e-9 relative allowance is for
# float64 round-off and for the (<= 1e-18) truncation mass, which depends on the step count.

_H = 1e-3
_TOL = 1e-9
_q = st.floats(0.001, 1.0)
_sigma = st.floats(0.5, 5.0)
_steps = st.integers(1, 2000)
_SETTINGS = settings(max_examples=8, deadline=None, derandomize=True)


@_SETTINGS
@given(_q, _sigma, _steps, st.floats(1e-10, 0.5), st.floats(1e-10, 0.5))
def test_epsilon_non_increasing_in_delta(q, sigma, steps, d1, d2):
  accountant = pld.PLDAccountant(_H).compose(_poisson(q, sigma), steps)
  lo, hi = sorted((d1, d2))
  assert accountant.get_epsilon(lo) >= accountant.get_epsilon(hi)


@_SETTINGS
@given(_q, _sigma, _sigma, _steps)
def test_epsilon_non_increasing_in_noise(q, s1, s2, steps):
  lo, hi = sorted((s1, s2))
  e_lo = pld.compute_epsilon(q, lo, steps, 1e-5, value_discretization_interval=_H)
  e_hi = pld.compute_epsilon(q, hi, steps, 1e-5, value_discretization_interval=_H)
  assert e_hi <= e_lo * (1 + _TOL)


@_SETTINGS
@given(_q, _sigma, _steps, _steps)
def test_epsilon_non_decreasing_in_steps(q, sigma, t1, t2):
  lo, hi = sorted((t1, t2))
  e_lo = pld.compute_epsilon(q, sigma, lo, 1e-5, value_discretization_interval=_H)
  e_hi = pld.compute_epsilon(q, sigma, hi, 1e-5, value_discretization_interval=_H)
  assert e_lo <= e_hi * (1 + _TOL)


@_SETTINGS
@given(_q, _q, _sigma, _steps)
def test_epsilon_non_decreasing_in_sampling_probability(q1, q2, sigma, steps):
  lo, hi = sorted((q1, q2))
  e_lo = pld.compute_epsilon(lo, sigma, steps, 1e-5, value_discretization_interval=_H)
  e_hi = pld.compute_epsilon(hi, sigma, steps, 1e-5, value_discretization_interval=_H)
  assert e_lo <= e_hi * (1 + _TOL)
