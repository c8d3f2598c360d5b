"""Adaptive clipping's maths (analysis.adaptive_clipping) against independent references.

The noise split is checked against Renyi divergences computed by numerical integration of the
two released Gaussians' densities (no closed form of the code under test is reused), and,
with Poisson subsampling, against ``compute_rdp`` of the one Gaussian of noise multiplier z
that the accountant composes; quantile tracking is checked by simulating the update on norms of
a known distribution.
"""
import math
import warnings

import numpy as np
import pytest
from scipy import integrate, special, stats

from analysis import adaptive_clipping as ac
from analysis import dp_sgd, events
from analysis.rdp_accountant import compute_rdp

ORDERS = [1.5, 2.0, 4.5, 16.0, 64.0]
# (z, sigma_b) pairs: the paper's regime (sigma_b = n / 20 >> z) and splits close to the limit.
SPLITS = [(1.1, 12.8), (0.8, 2.0), (2.0, 1.5), (0.5, 0.3)]


def _gaussian_rdp_by_quadrature(shift, std, alpha):
  """D_alpha(N(shift, std^2) || N(0, std^2)) by quadrature of p^alpha q^(1 - alpha) (its log
  taken out at the grid maximum, so large orders do not overflow)."""
  def exponent(x):
    return (alpha * stats.norm.logpdf(x, shift, std)
            + (1 - alpha) * stats.norm.logpdf(x, 0.0, std))
  low, high = -40 * std - abs(shift) * alpha, 40 * std + abs(shift) * alpha
  top = float(np.max(exponent(np.linspace(low, high, 20001))))
  value, _ = integrate.quad(lambda x: math.exp(exponent(x) - top), low, high,
                            points=[0.0, shift, alpha * shift], limit=400, epsabs=0,
                            epsrel=1e-11)
  return (math.log(value) + top) / (alpha - 1)


@pytest.mark.parametrize("z, sigma_b", [SPLITS[0]] + [
    pytest.param(*split, marks=pytest.mark.slow) for split in SPLITS[1:]])
def test_the_two_gaussians_rdp_add_up_to_the_rdp_of_noise_multiplier_z(z, sigma_b):
  # Sum: sensitivity C, noise z_Delta C (C = 0.37 here; the ratio is what counts).  Count:
  # sensitivity 1/2 (one recentred bit), noise sigma_b.  Independent noises: RDP adds.
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)
    z_delta = ac.sum_noise_multiplier(z, sigma_b, max_factor=math.inf)
  clip = 0.37
  for alpha in ORDERS:
    joint = (_gaussian_rdp_by_quadrature(clip, z_delta * clip, alpha)
             + _gaussian_rdp_by_quadrature(0.5, sigma_b, alpha))
    wanted = _gaussian_rdp_by_quadrature(1.0, z, alpha)  # the accountant's Gaussian of z
    assert joint == pytest.approx(wanted, rel=1e-8)


class _SampledPair:
  """The Poisson-subsampled pair on a 2-D grid in the released coordinates (sum along the
  example's clipped gradient, count): Q = N(0, diag(s1^2, s2^2)) (example absent),
  P = (1 - q) Q + q N((sum_shift, count_shift), same) (example present with probability q).
  The other gradient coordinates have equal noise and no displacement in either distribution,
  so they integrate out exactly.  Trapezoid sums of these smooth, rapidly decaying integrands
  over +-30 std converge faster than any power of the spacing (0.1 std or less here)."""

  def __init__(self, q, s1, s2, sum_shift, count_shift, max_alpha=8.0, points=401):
    reach = lambda s, shift: 30 * s + 2 * abs(shift) * max_alpha
    x = np.linspace(-reach(s1, sum_shift), reach(s1, sum_shift), points)
    y = np.linspace(-reach(s2, count_shift), reach(s2, count_shift), points)
    xx, yy = np.meshgrid(x, y, indexing="ij")
    self.log_q = stats.norm.logpdf(xx, 0, s1) + stats.norm.logpdf(yy, 0, s2)
    shifted = stats.norm.logpdf(xx, sum_shift, s1) + stats.norm.logpdf(yy, count_shift, s2)
    self.log_p = np.logaddexp(math.log1p(-q) + self.log_q, math.log(q) + shifted)
    self.log_cell = math.log((x[1] - x[0]) * (y[1] - y[0]))

  def rdp(self, alpha, reverse=False):
    """D_alpha(P || Q), or D_alpha(Q || P) with ``reverse``."""
    first, second = (self.log_q, self.log_p) if reverse else (self.log_p, self.log_q)
    log_integral = special.logsumexp(alpha * first + (1 - alpha) * second) + self.log_cell
    return log_integral / (alpha - 1)


@pytest.mark.parametrize("z, sigma_b, q", [
    (1.1, 12.8, 0.01), (0.9, 0.6, 0.1),
    pytest.param(0.8, 2.0, 0.05, marks=pytest.mark.slow),
    pytest.param(2.0, 1.5, 0.2, marks=pytest.mark.slow)])
def test_poisson_subsampled_pair_matches_compute_rdp_of_z(z, sigma_b, q):
  """Why compute_rdp(q, z) is the right reference: the accountant composes
  ``dp_sgd_event(z)`` = PoissonSampledEvent(q, Gaussian(z)), whose RDP ``compute_rdp`` gives.
  The step actually releases the pair (sum, count) on a Poisson sample; for add/remove
  neighbours the output law is the mixture P (example sampled with probability q) against Q
  (example absent), the example moving the sum by its clipped gradient (norm <= C; C is the
  worst case) and the count by +-1/2.  Integrating that 2-D mixture directly, in the released
  (not whitened) coordinates, gives the true RDP of one adaptive step, in both directions; it
  must equal (P||Q) or stay below (Q||P) the accountant's value at every order."""
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)
    z_delta = ac.sum_noise_multiplier(z, sigma_b, max_factor=math.inf)
  orders = [2.0, 3.0, 5.5, 8.0]
  accounted = compute_rdp(q, z, 1, orders)
  for clip in (0.5, 3.0):
    for shift in (0.5, -0.5):  # the example unclipped (+1/2) or clipped (-1/2)
      pair = _SampledPair(q, z_delta * clip, sigma_b, clip, shift)
      for alpha, wanted in zip(orders, accounted):
        assert pair.rdp(alpha) == pytest.approx(wanted, rel=1e-9, abs=1e-14)
        assert pair.rdp(alpha, reverse=True) <= wanted * (1 + 1e-9)
  # And the event the accountant builds for it is the fixed-clip one of z, unchanged.
  assert dp_sgd.dp_sgd_event(z, 3, sampling_probability=q) == events.SelfComposedEvent(
      events.PoissonSampledEvent(q, events.GaussianEvent(z)), 3)


def test_a_smaller_displacement_never_costs_more():
  # An unclipped example's gradient is shorter than C: it moves the sum less, and costs less.
  z, sigma_b, q, clip = 1.0, 2.0, 0.05, 1.0
  z_delta = ac.sum_noise_multiplier(z, sigma_b)
  full = _SampledPair(q, z_delta * clip, sigma_b, clip, 0.5).rdp(4.0)
  partial = _SampledPair(q, z_delta * clip, sigma_b, 0.6 * clip, 0.5).rdp(4.0)
  assert partial < full
  assert full == pytest.approx(compute_rdp(q, z, 1, 4.0), rel=1e-9)


def test_split_limits():
  assert ac.sum_noise_multiplier(0.0, 0.0) == 0.0  # no noise asked: none on the sum
  assert ac.sum_noise_multiplier(0.0, 5.0) == 0.0
  # Large count noise: z_Delta -> z from above, (z^-2 - (2 sigma_b)^-2)^-1/2 to first order.
  z = 1.3
  got = ac.sum_noise_multiplier(z, 1e4)
  assert z < got < z * (1 + (z / 2e4) ** 2)
  # z_Delta = 2z exactly at sigma_b = z / sqrt(3) (the count takes 3/4 of z^-2): allowed.
  with pytest.warns(UserWarning, match="raises the gradient sum's noise multiplier"):
    at_limit = ac.sum_noise_multiplier(z, z / math.sqrt(3.0) * (1 + 1e-12))
  assert at_limit == pytest.approx(2 * z, rel=1e-9)


def test_no_warning_in_the_papers_regime():
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    ac.sum_noise_multiplier(1.1, 256 / 20)
  assert ac.default_count_noise_stddev(256) == 12.8


@pytest.mark.parametrize("z, sigma_b", [(1.0, 0.5), (1.0, 0.4), (2.0, 0.0), (3.0, 1.5)])
def test_count_noise_at_most_half_the_noise_multiplier_is_refused(z, sigma_b):
  with pytest.raises(ValueError) as error:
    ac.sum_noise_multiplier(z, sigma_b)
  message = str(error.value)
  assert "count_noise_stddev" in message and "noise_multiplier" in message
  assert f"{z / 2:.6g}" in message  # the bound sigma_b > z / 2


def test_a_split_that_more_than_doubles_the_sum_noise_is_refused():
  z = 1.0
  sigma_b = 0.55  # > z / 2, but z_Delta = z / sqrt(1 - (1/1.1)^2) = 2.4 z
  with pytest.raises(ValueError, match=r"more than 2x the requested") as error:
    ac.sum_noise_multiplier(z, sigma_b)
  assert f"{z / math.sqrt(3.0):.6g}" in str(error.value)  # the smallest allowed sigma_b
  # A looser explicit factor allows it (with a warning).
  with pytest.warns(UserWarning):
    assert ac.sum_noise_multiplier(z, sigma_b, max_factor=3.0) == pytest.approx(
        1.0 / math.sqrt(1.0 - 1.0 / 1.21))


@pytest.mark.parametrize("kwargs, name", [
    (dict(noise_multiplier=-1.0, count_noise_stddev=1.0), "noise_multiplier"),
    (dict(noise_multiplier=math.nan, count_noise_stddev=1.0), "noise_multiplier"),
    (dict(noise_multiplier=math.inf, count_noise_stddev=1.0), "noise_multiplier"),
    (dict(noise_multiplier=1.0, count_noise_stddev=-2.0), "count_noise_stddev"),
    (dict(noise_multiplier=1.0, count_noise_stddev=math.inf), "count_noise_stddev"),
    (dict(noise_multiplier=1.0, count_noise_stddev="2"), "count_noise_stddev"),
    (dict(noise_multiplier=1.0, count_noise_stddev=5.0, max_factor=0.5), "max_factor"),
])
def test_bad_split_arguments_are_refused(kwargs, name):
  with pytest.raises(ValueError, match=name):
    ac.sum_noise_multiplier(**kwargs)


@pytest.mark.parametrize("gamma, eta, clip, name", [
    (0.0, 0.2, 1.0, "target_quantile"), (1.0, 0.2, 1.0, "target_quantile"),
    (math.nan, 0.2, 1.0, "target_quantile"), (-0.5, 0.2, 1.0, "target_quantile"),
    (0.5, 0.0, 1.0, "learning_rate"), (0.5, math.inf, 1.0, "learning_rate"),
    (0.5, 0.2, 0.0, "initial_l2_norm_clip"), (0.5, 0.2, -1.0, "initial_l2_norm_clip"),
])
def test_bad_quantile_settings_are_refused(gamma, eta, clip, name):
  with pytest.raises(ValueError, match=name):
    ac.check_quantile_settings(gamma, eta, clip)
  with pytest.raises(ValueError, match="expected_batch_size"):
    ac.default_count_noise_stddev(0)


def test_geometric_update_by_hand():
  # b~ = 3 / 10 + 1/2 = 0.8 > gamma 0.5: too many unclipped, C shrinks by exp(-0.2 * 0.3).
  assert ac.geometric_update(2.0, 3.0, 10.0, 0.5, 0.2) == pytest.approx(2.0 * math.exp(-0.06))
  # b~ = -1 / 4 + 1/2 = 0.25 < gamma 0.9: C grows by exp(0.5 * 0.65).
  assert ac.geometric_update(1.0, -1.0, 4.0, 0.9, 0.5) == pytest.approx(math.exp(0.325))
  # Noise can push B~ / n + 1/2 outside [0, 1]: clamped, so one step moves C by at most
  # exp(eta): here b~ = 1 (from 3.5) and b~ = 0 (from -2.5).
  assert ac.geometric_update(1.0, 30.0, 10.0, 0.5, 0.2) == pytest.approx(math.exp(-0.1))
  assert ac.geometric_update(1.0, -30.0, 10.0, 0.5, 0.2) == pytest.approx(math.exp(0.1))


@pytest.mark.parametrize("gamma", [0.1, 0.5, 0.9])
def test_quantile_tracking_on_lognormal_norms(gamma):
  """C_t tracks the gamma-quantile of norms ~ LogNormal(0, 1) (known CDF F), batches of
  n = 256, sigma_b = n / 20, eta = 0.2, from C_0 = 10 (the 99%-quantile).  Measured over 20
  seeds: F(geometric mean of C over steps 750..1500) - gamma has |bias| <= 0.001 and std 0.002;
  the tolerance 0.015 is over 6 such standard deviations.  The last C_t alone is within 0.03."""
  n, steps = 256, 1500
  rng = np.random.default_rng(7)
  clip, history = 10.0, []
  for _ in range(steps):
    norms = rng.lognormal(0.0, 1.0, n)
    noisy = np.sum(norms <= clip) - n / 2 + rng.normal(0.0, n / 20)
    clip = ac.geometric_update(clip, noisy, n, gamma, 0.2)
    history.append(clip)
  tracked = math.exp(np.mean(np.log(history[steps // 2:])))
  assert stats.lognorm.cdf(tracked, 1.0) == pytest.approx(gamma, abs=0.015)
  assert stats.lognorm.cdf(history[-1], 1.0) == pytest.approx(gamma, abs=0.03)
