"""Tests of analysis.dp_sgd: the DP-SGD configuration -> event rule, its errors, and the
epsilons of its events against dp_accounting computations of the equivalent events built by
hand (and mpmath for the exact Gaussian)."""
from __future__ import annotations

import math

import pytest

from analysis import accountants, dp_sgd, pld_accountant, rdp_accountant
from analysis.events import (GaussianEvent, PoissonSampledEvent, SampledWithoutReplacementEvent,
                             SelfComposedEvent, ShuffledEvent)
from dp_references import (dp_accounting as _dp_accounting, dp_pld as _dp_pld, dp_rdp as _dp_rdp,
                           exact_gaussian_epsilon)

G = GaussianEvent
P = PoissonSampledEvent
W = SampledWithoutReplacementEvent
S = ShuffledEvent
SC = SelfComposedEvent
INT_ORDERS = [a for a in rdp_accountant.DEFAULT_ORDERS if float(a).is_integer()]


# ------------------------------------------------------------------------------------------
# The events.


def test_poisson_events():
  assert dp_sgd.dp_sgd_event(1.1, 100, sampling_probability=0.01) == SC(P(0.01, G(1.1)), 100)
  # q derived from the expected batch size: b / N.
  assert dp_sgd.dp_sgd_event(1.1, 14063, dataset_size=60000, batch_size=256) == SC(
      P(256 / 60000, G(1.1)), 14063)
  # Both given and consistent is accepted.
  assert dp_sgd.dp_sgd_event(1.0, 5, sampling_probability=0.25, dataset_size=1000,
                             batch_size=250) == SC(P(0.25, G(1.0)), 5)
  assert dp_sgd.dp_sgd_event(1.0, 0, sampling_probability=1.0) == SC(P(1.0, G(1.0)), 0)
  assert dp_sgd.dp_sgd_event(1.0, 3, sampling="poisson",
                             sampling_probability=0.5) == SC(P(0.5, G(1.0)), 3)


def test_microbatches_halve_sigma():
  for m in (2, 4, 256):
    assert dp_sgd.dp_sgd_event(1.1, 100, sampling_probability=0.01, microbatch_size=m) == SC(
        P(0.01, G(0.55)), 100)
    assert dp_sgd.dp_sgd_event(1.1, 100, sampling="shuffle", steps_per_epoch=10,
                               microbatch_size=m) == S(G(0.55), 100, 10)
  assert dp_sgd.effective_noise_multiplier(1.1) == 1.1
  assert dp_sgd.effective_noise_multiplier(1.1, microbatch_size=1) == 1.1
  assert dp_sgd.effective_noise_multiplier(1.1, microbatch_size=2) == 0.55
  assert dp_sgd.effective_noise_multiplier(math.inf, microbatch_size=2) == math.inf


def test_without_replacement_halves_sigma_once():
  # Replace-one: one clipped gradient (or microbatch sum) replaced by another, 2C apart.
  assert dp_sgd.dp_sgd_event(1.0, 50, sampling="without_replacement", dataset_size=1000,
                             batch_size=10) == SC(W(1000, 10, G(0.5)), 50)
  assert dp_sgd.dp_sgd_event(1.0, 50, sampling="without_replacement", dataset_size=1000,
                             batch_size=10, microbatch_size=5) == SC(W(1000, 10, G(0.5)), 50)
  assert dp_sgd.effective_noise_multiplier(1.0, sampling="without_replacement") == 0.5
  assert dp_sgd.effective_noise_multiplier(1.0, sampling="without_replacement",
                                           microbatch_size=4) == 0.5


@pytest.mark.parametrize("n,b,steps_per_epoch", [
    (1000, 300, 3), (1000, 250, 4), (1000, 1000, 1), (60000, 256, 234), (5, 3, 1), (7, 1, 7),
])
def test_shuffle_steps_per_epoch_is_floor_n_over_b(n, b, steps_per_epoch):
  event = dp_sgd.dp_sgd_event(1.0, 10, sampling="shuffle", dataset_size=n, batch_size=b)
  assert event == S(G(1.0), 10, steps_per_epoch)
  assert steps_per_epoch == n // b  # the documented rule, floor(N / b)


def test_shuffle_events_and_examples_per_user():
  assert dp_sgd.dp_sgd_event(2.0, 25, sampling="shuffle", steps_per_epoch=10) == S(
      G(2.0), 25, 10)
  assert dp_sgd.dp_sgd_event(2.0, 25, sampling="shuffle", steps_per_epoch=10,
                             examples_per_user=4) == S(G(0.5), 25, 10)
  assert dp_sgd.dp_sgd_event(2.0, 25, sampling="shuffle", steps_per_epoch=10,
                             examples_per_user=4, microbatch_size=2) == S(G(0.25), 25, 10)
  assert dp_sgd.dp_sgd_event(2.0, 25, sampling="shuffle", steps_per_epoch=10,
                             examples_per_user=1) == S(G(2.0), 25, 10)
  # An explicit steps_per_epoch wins over N and b.
  assert dp_sgd.dp_sgd_event(2.0, 25, sampling="shuffle", steps_per_epoch=5, dataset_size=1000,
                             batch_size=10) == S(G(2.0), 25, 5)


# ------------------------------------------------------------------------------------------
# Errors: every path, with its message.

_ERRORS = [
    (dict(sampling="uniform"),
     "sampling must be one of ['poisson', 'shuffle', 'without_replacement'], got 'uniform'."),
    (dict(sampling="Poisson"),
     "sampling must be one of ['poisson', 'shuffle', 'without_replacement'], got 'Poisson'."),
    (dict(noise_multiplier=-1.0), "noise_multiplier must be >= 0, got -1.0."),
    (dict(noise_multiplier="1"), "noise_multiplier must be a real number, got '1'."),
    (dict(steps=-1), "steps must be an integer >= 0, got -1."),
    (dict(steps=1.5), "steps must be an integer >= 0, got 1.5."),
    (dict(steps=2**53 + 1),
     "steps must be an integer in [0, 2**53 = 9007199254740992], got 9007199254740993."),
    (dict(microbatch_size=0), "microbatch_size must be an integer in [1, inf], got 0."),
    (dict(microbatch_size=2.0), "microbatch_size must be an integer in [1, inf], got 2.0."),
    (dict(examples_per_user=0), "examples_per_user must be an integer in [1, inf], got 0."),
    (dict(sampling_probability=None),
     "sampling='poisson' needs sampling_probability (q in (0, 1]) or both dataset_size and "
     "batch_size (q = batch_size / dataset_size)."),
    (dict(sampling_probability=None, dataset_size=1000),
     "sampling='poisson' needs sampling_probability (q in (0, 1]) or both dataset_size and "
     "batch_size (q = batch_size / dataset_size)."),
    (dict(sampling_probability=None, batch_size=10),
     "sampling='poisson' needs sampling_probability (q in (0, 1]) or both dataset_size and "
     "batch_size (q = batch_size / dataset_size)."),
    (dict(sampling_probability=0.0), "sampling_probability must be in (0, 1], got 0.0."),
    (dict(sampling_probability=1.5), "sampling_probability must be in (0, 1], got 1.5."),
    (dict(sampling_probability=math.nan), "sampling_probability must be in (0, 1], got nan."),
    (dict(sampling_probability=0.5, dataset_size=1000, batch_size=10),
     "sampling_probability=0.5 disagrees with batch_size / dataset_size = 10/1000; give one "
     "of them."),
    (dict(sampling_probability=None, dataset_size=0, batch_size=1),
     "dataset_size must be an integer in [1, inf], got 0."),
    (dict(sampling_probability=None, dataset_size=1000, batch_size=1001),
     "batch_size must be an integer in [1, 1000], got 1001."),
    (dict(sampling_probability=None, dataset_size=1000, batch_size=0),
     "batch_size must be an integer in [1, 1000], got 0."),
    (dict(batch_size=0), "batch_size must be an integer in [1, inf], got 0."),
    (dict(dataset_size=10.0), "dataset_size must be an integer in [1, inf], got 10.0."),
    (dict(examples_per_user=2),
     "examples_per_user=2 is supported for sampling='shuffle' only; for Poisson sampling use "
     "group privacy (analysis.accountant_base.group_privacy_epsilon)."),
    (dict(sampling="without_replacement", examples_per_user=3, dataset_size=100, batch_size=10),
     "examples_per_user=3 is supported for sampling='shuffle' only; for Poisson sampling use "
     "group privacy (analysis.accountant_base.group_privacy_epsilon)."),
    (dict(sampling="shuffle"),
     "sampling='shuffle' needs steps_per_epoch (batches per epoch, an integer >= 1) or both "
     "dataset_size and batch_size."),
    (dict(sampling="shuffle", dataset_size=100),
     "sampling='shuffle' needs steps_per_epoch (batches per epoch, an integer >= 1) or both "
     "dataset_size and batch_size."),
    (dict(sampling="shuffle", steps_per_epoch=0),
     "steps_per_epoch must be an integer in [1, inf], got 0."),
    (dict(sampling="shuffle", steps_per_epoch=2.0),
     "steps_per_epoch must be an integer in [1, inf], got 2.0."),
    (dict(sampling="shuffle", dataset_size=10, batch_size=11),
     "batch_size must be an integer in [1, 10], got 11."),
    (dict(sampling="without_replacement"),
     "sampling='without_replacement' needs dataset_size and batch_size (the fixed batch "
     "size)."),
    (dict(sampling="without_replacement", dataset_size=100),
     "sampling='without_replacement' needs dataset_size and batch_size (the fixed batch "
     "size)."),
    (dict(sampling="without_replacement", batch_size=10),
     "sampling='without_replacement' needs dataset_size and batch_size (the fixed batch "
     "size)."),
    (dict(sampling="without_replacement", dataset_size=100, batch_size=101),
     "batch_size must be an integer in [1, 100], got 101."),
]


@pytest.mark.parametrize("change,message", _ERRORS)
def test_errors_name_the_argument_and_range(change, message):
  kwargs = dict(noise_multiplier=1.0, steps=10, sampling_probability=0.01)
  if change.get("sampling", "poisson") != "poisson":
    kwargs.pop("sampling_probability")
  kwargs.update(change)
  with pytest.raises(ValueError) as info:
    dp_sgd.dp_sgd_event(**kwargs)
  assert str(info.value) == message


def test_effective_noise_multiplier_errors():
  with pytest.raises(ValueError) as info:
    dp_sgd.effective_noise_multiplier(-0.5)
  assert str(info.value) == "noise_multiplier must be >= 0, got -0.5."
  with pytest.raises(ValueError) as info:
    dp_sgd.effective_noise_multiplier(1.0, sampling="fixed")
  assert str(info.value) == ("sampling must be one of ['poisson', 'shuffle', "
                             "'without_replacement'], got 'fixed'.")
  with pytest.raises(ValueError) as info:
    dp_sgd.effective_noise_multiplier(1.0, microbatch_size=0)
  assert str(info.value) == "microbatch_size must be an integer in [1, inf], got 0."


# ------------------------------------------------------------------------------------------
# Epsilons against dp_accounting on hand-built events.


def _dp_rdp_eps(dp_event, delta, orders, replace_one=False):
  dpa, dp_rdp = _dp_accounting(), _dp_rdp()
  relation = (dpa.NeighboringRelation.REPLACE_ONE if replace_one else
              dpa.NeighboringRelation.ADD_OR_REMOVE_ONE)
  reference = dp_rdp.RdpAccountant(orders, relation)
  reference.compose(dp_event)
  return reference.get_epsilon(delta)


def _dp_pld_eps(dp_event, delta):
  reference = _dp_pld().PLDAccountant(value_discretization_interval=1e-4)
  reference.compose(dp_event)
  return reference.get_epsilon(delta)


@pytest.mark.parametrize("sigma,microbatch_size,effective", [(1.1, 1, 1.1), (1.1, 4, 0.55),
                                                             (2.0, 2, 1.0)])
def test_poisson_epsilon_equals_dp_accounting(sigma, microbatch_size, effective):
  dpa = _dp_accounting()
  n, b, steps = 60000, 256, 1000
  hand = dpa.SelfComposedDpEvent(
      dpa.PoissonSampledDpEvent(b / n, dpa.GaussianDpEvent(effective)), steps)
  event = dp_sgd.dp_sgd_event(sigma, steps, dataset_size=n, batch_size=b,
                              microbatch_size=microbatch_size)
  ours = rdp_accountant.RdpAccountant(INT_ORDERS).compose(event).get_epsilon(1e-5)
  assert ours == pytest.approx(_dp_rdp_eps(hand, 1e-5, INT_ORDERS), rel=1e-9)
  pld = pld_accountant.PLDAccountant().compose(event).get_epsilon(1e-5)
  reference = _dp_pld_eps(hand, 1e-5)
  assert reference * (1 - 1e-3) <= pld <= reference * (1 + 1e-3)


@pytest.mark.parametrize("sigma,steps,steps_per_epoch,k,microbatch_size,epochs,effective", [
    (1.1, 1405, 234, 1, 1, 7, 1.1),  # 1405 / 234 = 6.004: 7 epochs started
    (2.0, 25, 10, 4, 1, 3, 0.5),
    (3.0, 100, 100, 3, 2, 1, 0.5),
])
def test_shuffle_epsilon_is_the_exact_gaussian(sigma, steps, steps_per_epoch, k,
                                               microbatch_size, epochs, effective):
  dpa = _dp_accounting()
  event = dp_sgd.dp_sgd_event(sigma, steps, sampling="shuffle", steps_per_epoch=steps_per_epoch,
                              microbatch_size=microbatch_size, examples_per_user=k)
  exact = exact_gaussian_epsilon(effective, epochs, 1e-5)
  hand = dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(effective), epochs)
  rdp_ref = _dp_rdp_eps(hand, 1e-5, list(rdp_accountant.DEFAULT_ORDERS))
  pld_ref = _dp_pld_eps(hand, 1e-5)
  for name in accountants.ACCOUNTANTS:
    ours = accountants.make_accountant(name).compose(event).get_epsilon(1e-5)
    assert ours == pytest.approx(exact, rel=1e-9)
    assert ours < rdp_ref and ours <= pld_ref * (1 + 1e-6)


@pytest.mark.parametrize("n,b,sigma,microbatch_size,steps", [
    (1000, 10, 1.0, 1, 500), (60000, 256, 1.1, 1, 2000), (1000, 20, 2.0, 4, 300),
])
def test_without_replacement_epsilon_not_above_dp_accounting(n, b, sigma, microbatch_size,
                                                             steps):
  dpa = _dp_accounting()
  hand = dpa.SelfComposedDpEvent(
      dpa.SampledWithoutReplacementDpEvent(n, b, dpa.GaussianDpEvent(sigma / 2)), steps)
  event = dp_sgd.dp_sgd_event(sigma, steps, sampling="without_replacement", dataset_size=n,
                              batch_size=b, microbatch_size=microbatch_size)
  for orders in (INT_ORDERS, list(rdp_accountant.DEFAULT_ORDERS)):
    ours = rdp_accountant.RdpAccountant(orders).compose(event).get_epsilon(1e-5)
    assert 0.0 < ours <= _dp_rdp_eps(hand, 1e-5, orders, replace_one=True) * (1 + 1e-6)
  # The PLD accountant refuses this event.
  from analysis import events  # pylint: disable=g-import-not-at-top
  with pytest.raises(events.UnsupportedEventError, match="does not support sampling without"):
    accountants.make_accountant("pld").compose(event)
