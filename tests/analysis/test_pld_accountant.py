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

from analysis import pld_accountant as pld

dp_accounting = pytest.importorskip("dp_accounting")
from dp_accounting.pld import pld_privacy_accountant  # noqa: E402

MNIST_Q = 256 / 60000
MNIST_SIGMA = 1.1
MNIST_STEPS = math.ceil(60 * 60000 / 256)  # 14063
MNIST_DELTA = 1e-5


# ------------------------------------------------------------------------------------------
# References.


def _dp_accounting_accountant(phases, h=1e-4):
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
# Exact references: Gaussian closed form (q = 1), numerical integration (one step, q < 1).


@pytest.mark.parametrize("sigma, steps", [(1.0, 1), (2.0, 10), (5.0, 100), (0.8, 3),
                                          (20.0, 5), (3.0, 1000)])
def test_full_batch_is_the_gaussian_mechanism(sigma, steps):
  """q = 1 is the Gaussian mechanism with std sigma / sqrt(steps): an upper bound, tight."""
  s = sigma / math.sqrt(steps)
  accountant = pld.PLDAccountant().compose(1.0, sigma, steps)
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
  accountant = pld.PLDAccountant().compose(0.01, 1.2, 2000)
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
    accountant.compose(0.02, 1.1, 100)
  assert accountant.get_epsilon(1e-5) == pytest.approx(single, rel=1e-12)
  # Zero-step and q = 0 phases change nothing.
  padded = pld.compute_epsilon_heterogeneous([0.5, 0.02, 0.0], [0.1, 1.1, 0.0], [0, 1000, 50],
                                             1e-5)
  assert padded == pytest.approx(single, rel=1e-12)


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
    accountant.compose(1.01, 1.0, 1)
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
  accountant = pld.PLDAccountant(_H).compose(q, sigma, steps)
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
