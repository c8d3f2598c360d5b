"""analysis.calibration.calibrate, the one calibration entry point, against dp_accounting's own
calibration (dp_accounting.calibrate_dp_mechanism) and against its defining property: the
parameter returned meets the target and the parameter one tolerance step towards "more
private spending" does not."""
from __future__ import annotations

import math

import pytest

from analysis import calibration, events, rdp_accountant
from dp_references import dp_accounting as _dp_accounting, dp_rdp as _dp_rdp

# Integer orders: there both RDP accountants are exact (up to round-off), so the two
# calibrations search the same function of the parameter.
INT_ORDERS = [float(a) for a in range(2, 65)] + [128.0, 256.0]


def _ours(event, delta):
  return rdp_accountant.RdpAccountant(INT_ORDERS).compose(event).get_epsilon(delta)


def _poisson(q, count):
  def event_of(sigma):
    return events.SelfComposedEvent(events.PoissonSampledEvent(q, events.GaussianEvent(sigma)),
                                    count)

  def reference_of(sigma):
    dp = _dp_accounting()
    return dp.SelfComposedDpEvent(dp.PoissonSampledDpEvent(q, dp.GaussianDpEvent(sigma)), count)
  return event_of, reference_of


def _without_replacement(n, b, count):
  def event_of(sigma):
    return events.SelfComposedEvent(
        events.SampledWithoutReplacementEvent(n, b, events.GaussianEvent(sigma)), count)

  def reference_of(sigma):
    dp = _dp_accounting()
    return dp.SelfComposedDpEvent(
        dp.SampledWithoutReplacementDpEvent(n, b, dp.GaussianDpEvent(sigma)), count)
  return event_of, reference_of


@pytest.mark.parametrize("events_of, eps, delta", [
    (_poisson(0.01, 1000), 1.0, 1e-5),
    (_poisson(256 / 60000, 14063), 2.6, 1e-5),
    (_poisson(0.5, 3), 8.0, 1e-3),
    (_without_replacement(1000, 10, 200), 2.0, 1e-5),
])
def test_continuous_calibration_matches_dp_accounting(events_of, eps, delta):
  event_of, reference_of = events_of
  tolerance = 1e-6
  sigma = calibration.calibrate(event_of, eps, delta, orders=INT_ORDERS, tolerance=tolerance)
  dp, dp_rdp = _dp_accounting(), _dp_rdp()
  relation = (dp.NeighboringRelation.REPLACE_ONE
              if isinstance(event_of(1.0).event, events.SampledWithoutReplacementEvent)
              else dp.NeighboringRelation.ADD_OR_REMOVE_ONE)
  reference = dp.calibrate_dp_mechanism(
      lambda: dp_rdp.RdpAccountant(INT_ORDERS, relation), reference_of, eps, delta,
      bracket_interval=dp.ExplicitBracketInterval(1e-3, 1e4), tol=1e-9)
  assert sigma == pytest.approx(reference, rel=2 * tolerance)
  # Defining property: meets the target; one tolerance step less noise does not.
  assert _ours(event_of(sigma), delta) <= eps
  assert _ours(event_of(sigma * (1 - tolerance)), delta) > eps


@pytest.mark.parametrize("q, sigma, eps", [(0.01, 1.0, 2.0), (0.1, 2.0, 1.5), (0.5, 20.0, 3.0)])
def test_integer_calibration_matches_dp_accounting(q, sigma, eps):
  delta = 1e-5

  def event_of(n):
    return events.SelfComposedEvent(events.PoissonSampledEvent(q, events.GaussianEvent(sigma)), n)

  count = calibration.calibrate(event_of, eps, delta, integer=True, lower=1, upper=10**6,
                                orders=INT_ORDERS)
  dp = _dp_accounting()
  reference = dp.calibrate_dp_mechanism(
      lambda: _dp_rdp().RdpAccountant(INT_ORDERS),
      lambda n: dp.SelfComposedDpEvent(dp.PoissonSampledDpEvent(q, dp.GaussianDpEvent(sigma)),
                                       n),
      eps, delta, discrete=True, bracket_interval=dp.ExplicitBracketInterval(1, 10**6))
  assert isinstance(count, int) and count == reference
  assert _ours(event_of(count), delta) <= eps < _ours(event_of(count + 1), delta)


def test_integer_calibration_edges_and_range():
  calls = []

  def event_of(n):
    calls.append(n)
    return events.SelfComposedEvent(events.GaussianEvent(1.0), n)

  # Nothing fits: lower - 1.
  assert calibration.calibrate(event_of, 0.01, 1e-5, integer=True, lower=1, upper=100) == 0
  # Everything up to upper fits: upper, and no count outside [lower, upper] is evaluated.
  calls.clear()
  assert calibration.calibrate(lambda n: event_of(n * 0), 1.0, 1e-5, integer=True, lower=3,
                               upper=1000) == 1000
  assert calls and min(calls) == 0  # (n * 0: the counts themselves were 3 .. 1000)
  seen = []
  calibration.calibrate(lambda n: seen.append(n) or event_of(1), 5.0, 1e-5, integer=True,
                        lower=3, upper=1000)
  assert seen and 3 <= min(seen) and max(seen) <= 1000
  assert calibration.calibrate(event_of, math.inf, 1e-5, integer=True, upper=7) == 7


def test_continuous_calibration_edges():
  event_of = lambda s: events.SelfComposedEvent(events.GaussianEvent(s), 0)  # noqa: E731
  assert calibration.calibrate(event_of, 1.0, 1e-5) == 0.0  # nothing released
  gaussian = lambda s: events.GaussianEvent(s)  # noqa: E731
  assert calibration.calibrate(gaussian, math.inf, 1e-5) == 0.0
  # A range of its own: the search starts inside it and returns a value inside it.
  sigma = calibration.calibrate(gaussian, 1.0, 1e-5, lower=2.0, upper=50.0)
  assert 2.0 <= sigma <= 50.0 and sigma == pytest.approx(
      calibration.calibrate(gaussian, 1.0, 1e-5), rel=2e-4)


def test_calibrate_errors_name_the_argument():
  gaussian = lambda s: events.GaussianEvent(s)  # noqa: E731
  with pytest.raises(ValueError, match=r"target_epsilon=0\.001 cannot be met at delta=1e-05 "
                                       r"for one release even with noise_multiplier=10;"):
    calibration.calibrate(gaussian, 1e-3, 1e-5, upper=10.0, context="for one release")
  with pytest.raises(ValueError, match="target_epsilon"):
    calibration.calibrate(gaussian, 0.0, 1e-5)
  with pytest.raises(ValueError, match="delta"):
    calibration.calibrate(gaussian, 1.0, 0.0)
  with pytest.raises(ValueError, match="accountant"):
    calibration.calibrate(gaussian, 1.0, 1e-5, accountant="moments")
  with pytest.raises(ValueError, match="upper must be > lower"):
    calibration.calibrate(gaussian, 1.0, 1e-5, lower=2.0, upper=1.0)
  with pytest.raises(ValueError, match="lower"):
    calibration.calibrate(gaussian, 1.0, 1e-5, lower=-1.0)
  with pytest.raises(ValueError, match="upper"):
    calibration.calibrate(gaussian, 1.0, 1e-5, integer=True, lower=5, upper=4)
  with pytest.raises(ValueError, match="tolerance"):
    calibration.calibrate(gaussian, 1.0, 1e-5, tolerance=1.0)


def test_wrappers_are_calibrate():
  q, steps, delta, eps = 0.01, 1000, 1e-5, 1.0
  event_of = lambda s: events.SelfComposedEvent(  # noqa: E731
      events.PoissonSampledEvent(q, events.GaussianEvent(s)), steps)
  direct = calibration.calibrate(event_of, eps, delta)
  assert calibration.compute_noise_multiplier(eps, delta, q, steps) == direct
  assert calibration.noise_multiplier_for_event(event_of, eps, delta) == direct
  training, steps_run = calibration.training_event_of(60000, 256, 15)
  assert steps_run == math.ceil(15 * 60000 / 256)
  assert (calibration.calibrate(training, 2.0, 1e-5)
          == calibration.compute_noise_multiplier_for_training(2.0, 1e-5, 60000, 256, 15))


def test_largest_count_never_probes_past_its_range():
  seen = []

  def fits(n):
    seen.append(n)
    return n <= 700

  assert calibration.largest_count_that_fits(fits, start=1, cap=1000) == 700
  assert max(seen) <= 1001


@pytest.mark.parametrize("target, delta, count", [(3.0, 1e-5, 60), (0.5, 1e-6, 1)])
def test_gaussian_closed_form_inverse_agrees_with_calibrate(target, delta, count):
  from analysis import gaussian  # pylint: disable=g-import-not-at-top
  tolerance = 1e-9
  sigma = calibration.calibrate(
      lambda s: events.SelfComposedEvent(events.GaussianEvent(s), count), target, delta,
      tolerance=tolerance)
  exact = gaussian.noise_multiplier_for_epsilon(target, delta, count)
  assert exact <= sigma <= exact * (1 + 2 * tolerance)


def _exact_gaussian_mu(target, delta):
  """mu with exact epsilon ``target`` at ``delta`` (Balle & Wang 2018, Theorem 8), by brentq on
  delta(eps; mu) = Phi(mu/2 - eps/mu) - e^eps Phi(-mu/2 - eps/mu), increasing in mu."""
  from scipy import optimize, stats  # pylint: disable=g-import-not-at-top
  curve = lambda mu: (stats.norm.cdf(mu / 2 - target / mu)
                      - math.exp(target) * stats.norm.cdf(-mu / 2 - target / mu) - delta)
  return optimize.brentq(curve, 1e-3, 50.0, xtol=1e-14)


@pytest.mark.parametrize("target, delta, other", [(3.0, 1e-5, 8.0), (1.0, 1e-5, 4.0)])
def test_also_events_are_composed_into_the_calibration(target, delta, other):
  """A Gaussian calibrated beside another Gaussian of multiplier ``other``: the pair is one
  Gaussian with mu^2 = 1/sigma^2 + 1/other^2, so the exact answer is
  sigma = 1 / sqrt(mu*^2 - 1/other^2) with mu* from the closed-form curve."""
  tolerance = 1e-9
  also = iter([events.GaussianEvent(other)])  # a one-shot iterable is read once
  sigma = calibration.calibrate(events.GaussianEvent, target, delta, tolerance=tolerance,
                                also=also)
  mu = _exact_gaussian_mu(target, delta)
  exact = 1.0 / math.sqrt(mu**2 - 1.0 / other**2)
  assert exact * (1 - 1e-6) <= sigma <= exact * (1 + 1e-6)
  alone = calibration.calibrate(events.GaussianEvent, target, delta, tolerance=tolerance)
  assert sigma > alone * 1.001  # the other mechanism's share costs noise


def test_also_events_that_spend_the_budget_are_refused():
  with pytest.raises(ValueError, match=r"target_epsilon=1.0 is already spent by the also= "
                                       r"events alone \(epsilon [\d.]+ at delta=1e-05\)"):
    calibration.calibrate(events.GaussianEvent, 1.0, 1e-5, also=[events.GaussianEvent(0.5)])
  with pytest.raises(TypeError, match="also must hold analysis.events events, got float"):
    calibration.calibrate(events.GaussianEvent, 1.0, 1e-5, also=[0.5])


def test_also_takes_a_lone_event_and_counts_in_integer_mode():
  lone = calibration.calibrate(events.GaussianEvent, 3.0, 1e-5, also=events.GaussianEvent(8.0))
  listed = calibration.calibrate(events.GaussianEvent, 3.0, 1e-5, also=[events.GaussianEvent(8.0)])
  assert lone == listed
  # Integer mode: the most releases of a Gaussian of multiplier 4 beside one of multiplier 2;
  # k releases and the other compose to mu^2 = k / 16 + 1 / 4, so by the closed form the
  # largest k is the one whose mu stays below the mu of the target.
  count = calibration.calibrate(lambda k: events.SelfComposedEvent(events.GaussianEvent(4.0), k),
                                3.0, 1e-5, integer=True, also=[events.GaussianEvent(2.0)])
  mu = _exact_gaussian_mu(3.0, 1e-5)
  assert count == math.floor((mu**2 - 0.25) * 16)
  # Nothing released by the calibrated mechanism (0 steps): no noise is needed for it.
  assert calibration.calibrate(lambda s: events.SelfComposedEvent(events.GaussianEvent(s), 0),
                               3.0, 1e-5, also=[events.GaussianEvent(8.0)]) == 0.0


def test_also_errors_name_the_argument():
  with pytest.raises(TypeError, match="also must be an analysis.events event or an iterable of "
                                      "them, got None"):
    calibration.calibrate(events.GaussianEvent, 1.0, 1e-5, also=None)
