"""PATE queries as events: PateAccountant composes any PateEvent, including one defined here."""
import copy
import math
import pickle

import numpy as np
import pytest
from scipy import optimize, special

from analysis import events, pate

ORDERS = [1.25, 2.0, 3.5, 8.0, 32.0, 256.0]


class PureGaussianQuery(pate.PateEvent):
  """A toy aggregator's query: one Gaussian release of sensitivity 1 with noise ``sigma``.

  Its RDP is alpha / (2 sigma^2) whatever the votes; with ``dependent_fraction`` < 1 it claims
  that fraction of it as its data-dependent RDP, and ``local`` is its (constant) U^(d).
  """

  def __init__(self, sigma, dependent_fraction=1.0, local=None, answered=True):
    self.sigma = sigma
    self.fraction = dependent_fraction
    self.local = local
    self.has_local_sensitivity = local is not None
    self._answered = answered

  @property
  def ledger(self):
    return (events.GaussianEvent(self.sigma),)

  @property
  def answered(self):
    return self._answered

  def data_independent_rdp(self, orders):
    return orders / (2.0 * self.sigma**2)

  def data_dependent_rdp(self, orders):
    return self.fraction * orders / (2.0 * self.sigma**2)

  def local_sensitivity(self, order, num_teachers):
    return np.full(3, self.local) if np.isscalar(self.local) else self.local


def _best_conversion(rdp_per_order, delta):
  """min over a dense grid of real orders of the conversion get_privacy_spent uses (Canonne,
  Kamath & Steinke 2020): rdp + log1p(-1/a) - (log delta + log a) / (a - 1)."""
  alphas = 1.0 + np.geomspace(1e-4, 1e4, 400_000)
  eps = rdp_per_order(alphas) + np.log1p(-1.0 / alphas) - (
      math.log(delta) + np.log(alphas)) / (alphas - 1.0)
  return float(eps.min())


def test_a_new_event_is_composed_without_changing_the_accountant():
  sigma, n, delta = 3.0, 7, 1e-5
  acc = pate.PateAccountant()
  for i in range(n):
    acc.compose(PureGaussianQuery(sigma, answered=i % 2 == 0))
  assert (acc.queries, acc.answered) == (n, 4)
  orders = np.array(ORDERS)
  closed = n * orders / (2.0 * sigma**2)
  np.testing.assert_allclose(acc.rdp(ORDERS), closed, rtol=1e-14)
  np.testing.assert_allclose(acc.rdp(ORDERS, data_independent=True), closed, rtol=1e-14)
  assert acc.ledger == events.ComposedEvent((events.GaussianEvent(sigma),) * n)
  # The sum of n Gaussians of noise sigma is one Gaussian of noise s = sigma / sqrt(n), whose
  # exact epsilon solves Phi(1/(2s) - eps s) - e^eps Phi(-1/(2s) - eps s) = delta (Balle &
  # Wang 2018, Theorem 8): the exact composition of the Gaussian ledger.
  s = sigma / math.sqrt(n)
  exact = optimize.brentq(
      lambda e: (special.ndtr(1 / (2 * s) - e * s)
                 - math.exp(e) * special.ndtr(-1 / (2 * s) - e * s) - delta), 0.0, 50.0,
      xtol=1e-14)
  assert acc.get_epsilon(delta) == pytest.approx(exact, rel=1e-9)
  assert acc.private_data_dependent_epsilon(delta) == pytest.approx(exact, rel=1e-9)
  # A data-dependent claim of a quarter of the RDP is converted (no exact Gaussian route).
  cheaper = pate.PateAccountant()
  cheaper.compose(PureGaussianQuery(sigma, dependent_fraction=0.25), count=n)
  reference = _best_conversion(lambda a: 0.25 * n * a / (2.0 * sigma**2), delta)
  eps = cheaper.private_data_dependent_epsilon(delta)
  assert eps == pytest.approx(reference, rel=1e-6) and eps < exact
  assert cheaper.get_epsilon(delta) == pytest.approx(exact, rel=1e-9)
  # ... and below the classical closed form rho + 2 sqrt(rho log(1/delta)), rho = n / (8 s^2).
  rho = 0.25 * n / (2.0 * sigma**2)
  assert eps < rho + 2.0 * math.sqrt(rho * math.log(1.0 / delta))


def test_a_new_event_mixes_with_the_built_in_ones():
  votes = np.array([40, 6, 4])
  acc = pate.PateAccountant(num_teachers=50)
  acc.compose_gnmax(votes, 4.0)
  acc.compose(PureGaussianQuery(2.0, dependent_fraction=0.25), count=3)
  acc.compose_confident_gnmax(votes, 30.0, 6.0, 4.0, answered=True)
  orders = np.array(ORDERS)
  expected = (2 * pate.rdp_gnmax(votes, 4.0, ORDERS)
              + pate.rdp_threshold(votes, 30.0, 6.0, ORDERS)
              + 3 * 0.25 * orders / 8.0)
  np.testing.assert_allclose(acc.rdp(ORDERS), expected, rtol=1e-12)
  independent = 2 * orders / 16.0 + orders / 72.0 + 3 * orders / 8.0
  np.testing.assert_allclose(acc.rdp(ORDERS, data_independent=True), independent, rtol=1e-12)
  assert (acc.queries, acc.answered) == (5, 5)


def test_a_new_event_enters_the_smooth_sensitivity():
  order, beta, sigma_ss, delta = 8.0, 0.05, 2.0, 1e-5
  acc = pate.PateAccountant()
  acc.compose(PureGaussianQuery(3.0, dependent_fraction=0.5, local=0.125), count=4)
  acc.compose(PureGaussianQuery(5.0, dependent_fraction=0.5))  # no bound: enters data-independently
  # U^(d) = 4 * 0.125 at every d, so the smooth sensitivity is its value at d = 0.
  assert acc.smooth_sensitivity(beta, order) == 0.5
  result = acc.smooth_sensitivity_epsilon(delta, beta, sigma_ss, order, rng=11)
  f = 4 * 0.5 * order / 18.0 + order / 50.0
  z = np.random.default_rng(11).normal(0.0, sigma_ss)
  assert result.sanitized_rdp == pytest.approx(max(0.0, f + 0.5 * z), rel=1e-12)


def test_built_in_events_state_the_published_formulas():
  votes = np.array([15, 3, 2])
  shifted = votes - 5.0 * np.array([0.7, 0.2, 0.1])
  orders = np.array(ORDERS)
  gnmax = pate.GNMaxEvent(votes, 2.0)
  np.testing.assert_allclose(gnmax.data_dependent_rdp(orders),
                             pate.rdp_gnmax(votes, 2.0, ORDERS), rtol=1e-14)
  np.testing.assert_allclose(gnmax.data_independent_rdp(orders), orders / 4.0, rtol=1e-14)
  assert gnmax.ledger == (events.GaussianEvent(2.0 / math.sqrt(2.0)),)
  lnmax = pate.LNMaxEvent(votes, 4.0)
  np.testing.assert_allclose(lnmax.data_dependent_rdp(orders),
                             pate.rdp_lnmax(votes, 4.0, ORDERS), rtol=1e-14)
  assert lnmax.ledger == (events.LaplaceEvent(2.0),) and not lnmax.has_local_sensitivity
  check = pate.ThresholdCheckEvent(votes, 12.0, 3.0, thresholded_votes=shifted)
  np.testing.assert_allclose(check.data_dependent_rdp(orders),
                             pate.rdp_threshold(shifted, 12.0, 3.0, ORDERS, shifted=True),
                             rtol=1e-14)
  np.testing.assert_allclose(check.local_sensitivity(8.0, 20),
                             pate.local_sensitivity_threshold(shifted, 20, 12.0, 3.0, 8.0,
                                                              shifted=True), rtol=1e-14)
  interactive = pate.InteractiveGNMaxEvent(votes, shifted, 12.0, 3.0, 2.0, answered=True)
  assert [type(p) for p in interactive.parts()] == [pate.ThresholdCheckEvent, pate.GNMaxEvent]
  np.testing.assert_allclose(interactive.data_dependent_rdp(orders),
                             check.data_dependent_rdp(orders) + gnmax.data_dependent_rdp(orders),
                             rtol=1e-14)
  refused = pate.ConfidentGNMaxEvent(votes, 12.0, 3.0, 2.0, answered=False)
  assert len(refused.parts()) == 1 and not refused.answered
  assert refused.ledger == (events.GaussianEvent(3.0),)
  np.testing.assert_allclose(gnmax.local_sensitivity(8.0, 20),
                             pate.local_sensitivity_gnmax(votes, 20, 2.0, 8.0), rtol=1e-14)


def test_events_hide_and_keep_the_votes():
  event = pate.ConfidentGNMaxEvent([7, 1], 5.0, 2.0, 1.0, answered=True)
  assert "7" not in repr(event) and "hidden" in repr(event)
  with pytest.raises(TypeError, match="pickled"):
    pickle.dumps(event)
  acc = pate.PateAccountant().compose(event)
  assert copy.deepcopy(acc).rdp(2.0) == acc.rdp(2.0)


class _BadLedger(PureGaussianQuery):

  def __init__(self, ledger):
    super().__init__(1.0)
    self._ledger = ledger

  @property
  def ledger(self):
    return self._ledger


class _BadParts(PureGaussianQuery):

  def parts(self):
    return [self]


BAD = [
    (lambda: pate.GNMaxEvent([3, -1], 1.0), "votes"),
    (lambda: pate.GNMaxEvent([3, 1], 0.0), "sigma"),
    (lambda: pate.LNMaxEvent([3, 1], math.inf), "laplace_scale"),
    (lambda: pate.ThresholdCheckEvent([3, 1], math.nan, 1.0), "threshold"),
    (lambda: pate.ThresholdCheckEvent([3, 1], 2.0, 1.0, thresholded_votes=[1.0]),
     "thresholded_votes"),
    (lambda: pate.ConfidentGNMaxEvent([3, 1], 2.0, 1.0, -1.0, True), "sigma2"),
    (lambda: pate.ConfidentGNMaxEvent([3, 1], 2.0, 1.0, 1.0, "yes"), "answered"),
    (lambda: pate.InteractiveGNMaxEvent([3, 1], None, 2.0, 1.0, 1.0, True), "thresholded_votes"),
    (lambda: pate.PateAccountant(num_teachers=3).compose(pate.GNMaxEvent([3, 1], 1.0)),
     "num_teachers"),
    (lambda: pate.PateAccountant().compose(pate.GNMaxEvent([3, 1], 1.0), count=-1), "count"),
    (lambda: pate.PateAccountant().compose(_BadLedger([events.GaussianEvent(1.0)])), "ledger"),
    (lambda: pate.PateAccountant().compose(_BadLedger(
        (events.PoissonSampledEvent(0.1, events.GaussianEvent(1.0)),))), "ledger"),
    (lambda: pate.PateAccountant().compose(_BadParts(1.0)), "parts"),
    (lambda: pate.PateAccountant().compose(PureGaussianQuery(1.0, local=[[1.0]]))
     .smooth_sensitivity(0.1, 2.0), "local_sensitivity"),
]


@pytest.mark.parametrize("call, name", BAD)
def test_bad_events_are_refused_naming_the_argument(call, name):
  with pytest.raises(ValueError, match=name):
    call()


def test_a_refused_event_records_nothing():
  acc = pate.PateAccountant().compose_gnmax([5, 1], 2.0)
  before = acc.ledger
  for event in (_BadLedger([]), _BadParts(1.0)):
    with pytest.raises(ValueError):
      acc.compose(event)
  assert acc.ledger == before and acc.queries == 1
