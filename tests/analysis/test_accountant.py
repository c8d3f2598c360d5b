"""Tests of analysis.accountant_base and of its two implementations (RDP, PLD) through it.

References, all independent of the code under test:
* the analytic Gaussian mechanism, delta(eps) = Phi(1/(2s) - eps s) - e^eps Phi(-1/(2s) - eps s)
  with s = (sum_i k_i / sigma_i^2)^(-1/2), evaluated in 50-digit mpmath (Balle & Wang 2018);
* dp_accounting's RdpAccountant on the same orders and its PLDAccountant (h = 1e-4), composing
  ``events.to_dp_accounting(event)``; dp_accounting's optimistic PLD as a lower bound;
* a brute-force search over the per-example delta for group privacy.

Tolerances: RDP equals dp_accounting to 1e-9 relative on integer orders (where both are exact
binomial sums); on fractional orders ours may only be smaller (dp_accounting's series is looser
there) and at most 1e-9 above.  PLD: ours <= dp_accounting's * (1 + 1e-3), and >= the exact
value where one exists.  Without replacement: ours <= dp_accounting's (REPLACE_ONE) * (1 + 1e-6).
"""
from __future__ import annotations

import functools
import math

import mpmath
import numpy as np
import pytest

from analysis import accountant_base, accountants, events, pld_accountant, rdp_accountant
from analysis.events import (ComposedEvent, GaussianEvent, PoissonSampledEvent,
                             SampledWithoutReplacementEvent, SelfComposedEvent, ShuffledEvent)
from dp_references import dp_accounting as _dp_accounting, dp_pld as _dp_pld, dp_rdp as _dp_rdp

G = GaussianEvent
P = PoissonSampledEvent
W = SampledWithoutReplacementEvent
S = ShuffledEvent
SC = SelfComposedEvent
C = ComposedEvent

DEFAULT_ORDERS = list(rdp_accountant.DEFAULT_ORDERS)
INT_ORDERS = [a for a in DEFAULT_ORDERS if a.is_integer()]

FACTORIES = {
    "rdp": rdp_accountant.RdpAccountant,
    "pld": pld_accountant.PLDAccountant,
    "pld_capped": lambda: pld_accountant.PLDAccountant(rdp_cap=True),
    "make_rdp": lambda: accountants.make_accountant("rdp"),
    "make_pld": lambda: accountants.make_accountant("pld"),
}


# ------------------------------------------------------------------------------------------
# Independent references.


@functools.lru_cache(maxsize=None)
def _mp_delta(s, eps):
  """delta(eps) of the Gaussian mechanism with noise multiplier s, 50 digits."""
  with mpmath.workdps(50):
    s, eps = mpmath.mpf(s), mpmath.mpf(eps)
    return (mpmath.ncdf(1 / (2 * s) - eps * s)
            - mpmath.exp(eps) * mpmath.ncdf(-1 / (2 * s) - eps * s))


@functools.lru_cache(maxsize=None)
def _mp_epsilon(s, delta):
  """The eps with delta(eps) = delta, by bisection in 50 digits."""
  with mpmath.workdps(50):
    if _mp_delta(s, 0) <= delta:
      return 0.0
    low, high = mpmath.mpf(0), mpmath.mpf(1)
    while _mp_delta(s, high) > delta:
      high *= 2
    for _ in range(200):
      mid = (low + high) / 2
      low, high = (mid, high) if _mp_delta(s, mid) > delta else (low, mid)
    return float(high)


def _mp_sigma(pairs):
  """(sum k / sigma^2)^(-1/2) for [(sigma, k)], in 50 digits."""
  with mpmath.workdps(50):
    return mpmath.mpf(1) / mpmath.sqrt(sum(mpmath.mpf(k) / mpmath.mpf(s)**2 for s, k in pairs))


def _dp_rdp_epsilon(event, delta, orders, replace_one=False):
  dpa, dp_rdp = _dp_accounting(), _dp_rdp()
  relation = (dpa.NeighboringRelation.REPLACE_ONE if replace_one else
              dpa.NeighboringRelation.ADD_OR_REMOVE_ONE)
  reference = dp_rdp.RdpAccountant(orders, relation)
  reference.compose(events.to_dp_accounting(event))
  return reference.get_epsilon(delta)


def _dp_pld_epsilon(event, delta):
  dp_pld = _dp_pld()
  reference = dp_pld.PLDAccountant(value_discretization_interval=1e-4)
  reference.compose(events.to_dp_accounting(event))
  return reference.get_epsilon(delta)


# ------------------------------------------------------------------------------------------
# make_accountant.


def test_make_accountant_names():
  assert accountants.ACCOUNTANTS == ("rdp", "pld")
  rdp = accountants.make_accountant("rdp")
  assert type(rdp) is rdp_accountant.RdpAccountant and list(rdp.orders) == DEFAULT_ORDERS
  assert type(accountants.make_accountant()) is rdp_accountant.RdpAccountant
  pld = accountants.make_accountant("pld")
  assert type(pld) is pld_accountant.PLDAccountant
  assert pld.value_discretization_interval == 1e-4
  assert accountants.make_accountant("rdp") is not accountants.make_accountant("rdp")


@pytest.mark.parametrize("name", ["RDP", "PLD", "moments", "", None, 1])
def test_make_accountant_refuses_other_names(name):
  with pytest.raises(ValueError) as info:
    accountants.make_accountant(name)
  assert str(info.value) == f"accountant must be one of ['pld', 'rdp'], got {name!r}."


def test_make_accountant_pld_is_capped_by_rdp():
  # q = 1e-3, sigma = 20: the one-step loss spread (~q / sigma = 5e-5) is below h = 1e-4, so
  # the PLD grid is loose and the RDP bound is the smaller; "pld" reports that one.
  event = SC(P(1e-3, G(20.0)), 1000)
  raw = pld_accountant.PLDAccountant().compose(event).get_epsilon(1e-5)
  capped = accountants.make_accountant("pld").compose(event).get_epsilon(1e-5)
  reference = _dp_rdp_epsilon(event, 1e-5, DEFAULT_ORDERS)
  assert capped < 0.9 * raw
  assert capped <= reference * (1 + 1e-9)
  assert raw <= _dp_pld_epsilon(event, 1e-5) * (1 + 1e-3)


# ------------------------------------------------------------------------------------------
# The interface.


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_empty_ledger(name):
  acc = FACTORIES[name]()
  assert isinstance(acc, accountant_base.Accountant)
  assert acc.get_epsilon(1e-5) == 0.0 and acc.get_delta(0.0) == 0.0
  assert acc.ledger == C(()) and acc.atoms == ()
  assert acc.neighboring_relation == events.ADD_OR_REMOVE_ONE
  # Events that release nothing leave the epsilon at 0 but are recorded.
  acc.compose(G(math.inf), 3).compose(P(0.0, G(1.0))).compose(S(G(1.0), 0, 1))
  assert acc.get_epsilon(1e-5) == 0.0 and acc.get_delta(0.0) == 0.0 and acc.atoms == ()
  assert acc.ledger == C((SC(G(math.inf), 3), P(0.0, G(1.0)), S(G(1.0), 0, 1)))


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_compose_records_the_ledger_and_returns_self(name):
  acc = FACTORIES[name]()
  poisson = P(0.01, G(1.0))
  assert acc.compose(poisson, 100) is acc
  assert acc.compose(S(G(2.0), 25, 10)).compose(G(3.0), 1).compose(poisson, 0) is acc
  assert acc.ledger == C((SC(poisson, 100), S(G(2.0), 25, 10), G(3.0), SC(poisson, 0)))
  assert isinstance(acc.ledger, ComposedEvent)
  assert acc.neighboring_relation == events.ZERO_OUT
  # The ledger's epsilon, composed afresh in one go, is the same number.
  again = FACTORIES[name]().compose(acc.ledger)
  assert again.get_epsilon(1e-5) == acc.get_epsilon(1e-5)
  # compose(e, k) is k compositions of e.
  one_by_one = FACTORIES[name]()
  for _ in range(3):
    one_by_one.compose(poisson)
  assert one_by_one.atoms == FACTORIES[name]().compose(poisson, 3).atoms
  assert (one_by_one.get_epsilon(1e-5) ==
          FACTORIES[name]().compose(poisson, 3).get_epsilon(1e-5))


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_interface_argument_errors(name):
  acc = FACTORIES[name]().compose(P(0.01, G(1.0)), 10)
  for delta, shown in [(0, "0.0"), (1, "1.0"), (-1e-5, "-1e-05"), (math.nan, "nan")]:
    with pytest.raises(ValueError) as info:
      acc.get_epsilon(delta)
    assert str(info.value) == f"delta must be in (0, 1), got {shown}."
  with pytest.raises(ValueError) as info:
    acc.get_delta(-0.5)
  assert str(info.value) == "epsilon must be >= 0, got -0.5."
  with pytest.raises(ValueError) as info:
    acc.get_delta("1")
  assert str(info.value) == "epsilon must be a real number, got '1'."
  before = (acc.ledger, acc.atoms, acc.get_epsilon(1e-5))
  with pytest.raises(ValueError) as info:
    acc.compose(G(1.0), -1)
  assert str(info.value) == "count must be an integer >= 0, got -1."
  with pytest.raises(ValueError) as info:
    acc.compose(G(1.0), 2.5)
  assert str(info.value) == "count must be an integer >= 0, got 2.5."
  with pytest.raises(ValueError) as info:
    acc.compose("gaussian")
  assert str(info.value).startswith("event must be an analysis.events event")
  with pytest.raises(events.UnsupportedEventError, match="PoissonSampledEvent must wrap a "):
    acc.compose(SC(P(0.1, C([G(1.0)])), 2))
  assert (acc.ledger, acc.atoms, acc.get_epsilon(1e-5)) == before


@pytest.mark.parametrize("name", ["rdp", "make_rdp"])
def test_incompatible_relations_are_refused_before_recording(name):
  acc = FACTORIES[name]().compose(SC(W(1000, 10, G(1.0)), 50))
  assert acc.neighboring_relation == events.REPLACE_ONE
  before = (acc.ledger, acc.atoms, acc.get_epsilon(1e-5))
  for other in [P(0.01, G(1.0)), G(2.0), S(G(1.0), 3, 1), C([W(1000, 10, G(1.0)), G(1.0)])]:
    with pytest.raises(events.IncompatibleEventsError, match="^Cannot compose sampling "):
      acc.compose(other, 5)
  assert (acc.ledger, acc.atoms, acc.get_epsilon(1e-5)) == before
  fresh = FACTORIES[name]().compose(P(0.01, G(1.0)), 5)
  with pytest.raises(events.IncompatibleEventsError, match="^Cannot compose sampling "):
    fresh.compose(W(1000, 10, G(1.0)))
  assert fresh.ledger == C((SC(P(0.01, G(1.0)), 5),))


@pytest.mark.parametrize("name", ["pld", "pld_capped", "make_pld"])
def test_pld_refuses_without_replacement_before_recording(name):
  message = ("The PLD accountant does not support sampling without replacement; use the RDP "
             "accountant (analysis.rdp_accountant.RdpAccountant, accountant='rdp').")
  empty = FACTORIES[name]()
  with pytest.raises(events.UnsupportedEventError) as info:
    empty.compose(SC(W(1000, 10, G(1.0)), 50))
  assert str(info.value) == message
  assert empty.ledger == C(()) and empty.atoms == () and empty.get_epsilon(1e-5) == 0.0
  acc = FACTORIES[name]().compose(P(0.01, G(1.0)), 100)
  before = (acc.ledger, acc.atoms, acc.get_epsilon(1e-5), acc.get_delta(1.0))
  # After Poisson events the relation check (replace-one against add-or-remove) comes first.
  for refused in (W(1000, 10, G(1.0)), C([P(0.01, G(1.0)), W(1000, 10, G(1.0))])):
    with pytest.raises((events.UnsupportedEventError, events.IncompatibleEventsError)):
      acc.compose(refused, 3)
  assert (acc.ledger, acc.atoms, acc.get_epsilon(1e-5), acc.get_delta(1.0)) == before


def test_pld_step_limit_is_checked_in_compose():
  acc = pld_accountant.PLDAccountant().compose(P(0.01, G(1.0)), 6 * 10**9)
  with pytest.raises(ValueError) as info:
    acc.compose(P(0.02, G(1.0)), 5 * 10**9)
  assert str(info.value) == (
      "steps must keep the accountant's total in [0, 10000000000] (the PLD accountant's "
      "supported range; use the RDP accountant beyond it); adding 5000000000 steps would make "
      "it 11000000000.")
  assert acc.ledger == C((SC(P(0.01, G(1.0)), 6 * 10**9),))


def test_pld_step_limit_counts_every_atom_of_one_compose():
  acc = pld_accountant.PLDAccountant()
  with pytest.raises(ValueError, match="steps must keep the accountant's total"):
    acc.compose(C([SC(P(0.01, G(1.0)), 6 * 10**9), SC(P(0.02, G(1.0)), 6 * 10**9)]))
  assert acc.ledger == C(())


# ------------------------------------------------------------------------------------------
# The exact pure-Gaussian rule.

_PURE = [
    # (ledger, [(sigma, count)] of the equivalent Gaussians)
    (G(1.0), [(1.0, 1)]),
    (SC(G(3.0), 7), [(3.0, 7)]),
    (C([SC(G(2.0), 4), G(3.0), S(G(1.5), 25, 10), SC(P(1.0, G(4.0)), 2)]),
     [(2.0, 4), (3.0, 1), (1.5, 3), (4.0, 2)]),
    (S(G(1.1), 14063, 235), [(1.1, 60)]),
    (SC(C([G(50.0), S(G(20.0), 5, 2)]), 1000), [(50.0, 1000), (20.0, 3000)]),
]


@pytest.mark.parametrize("name", sorted(FACTORIES))
@pytest.mark.parametrize("ledger,pairs", _PURE)
def test_pure_gaussian_ledgers_are_exact(name, ledger, pairs):
  acc = FACTORIES[name]().compose(ledger)
  s = _mp_sigma(pairs)
  for delta in (1e-5, 1e-10, 0.3):
    assert acc.get_epsilon(delta) == pytest.approx(_mp_epsilon(s, delta), rel=1e-9, abs=1e-12)
  for eps in (0.0, 0.5, 2.0, 8.0):
    exact = float(_mp_delta(s, eps))
    assert acc.get_delta(eps) == pytest.approx(exact, rel=1e-9, abs=1e-300), eps
  assert acc.get_delta(math.inf) == 0.0


def test_pure_gaussian_rule_beats_rdp_alone():
  # The exact number is what is reported: dp_accounting's RDP bound is strictly larger.
  ledger = C([SC(G(2.0), 4), G(3.0), S(G(1.5), 25, 10)])
  exact = _mp_epsilon(_mp_sigma([(2.0, 4), (3.0, 1), (1.5, 3)]), 1e-5)
  ref = _dp_rdp_epsilon(ledger, 1e-5, DEFAULT_ORDERS)
  for name in FACTORIES:
    ours = FACTORIES[name]().compose(ledger).get_epsilon(1e-5)
    assert ours == pytest.approx(exact, rel=1e-9) and ours < 0.95 * ref


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_noise_zero_releases_everything(name):
  acc = FACTORIES[name]().compose(C([G(2.0), G(0.0)]))
  assert acc.get_epsilon(1e-5) == math.inf and acc.get_delta(100.0) == 1.0


# ------------------------------------------------------------------------------------------
# RDP and PLD against dp_accounting, every event kind and mixed compositions.

_MIXED = {
    "poisson": SC(P(0.01, G(1.0)), 1000),
    "phases": C([SC(P(0.01, G(1.0)), 500), SC(P(0.02, G(1.5)), 300),
                 SC(P(0.005, G(0.8)), 200)]),
    "shuffled+poisson": C([S(G(2.0), 25, 10), SC(P(0.01, G(1.0)), 500)]),
    "gaussian+poisson": C([G(5.0), SC(P(0.01, G(1.0)), 500), G(3.0)]),
    "self_composed_of_composed": SC(C([SC(P(0.01, G(1.0)), 100),
                                       SC(P(0.03, G(2.0)), 50)]), 5),
    "shuffled_poisson": S(P(0.05, G(1.2)), 100, 10),
}


@pytest.mark.parametrize("key", sorted(_MIXED))
def test_rdp_equals_dp_accounting_on_the_same_orders(key):
  event = _MIXED[key]
  for delta in (1e-5, 1e-8):
    ours = rdp_accountant.RdpAccountant(INT_ORDERS).compose(event).get_epsilon(delta)
    assert ours == pytest.approx(_dp_rdp_epsilon(event, delta, INT_ORDERS), rel=1e-9)
  # Fractional orders: ours is never above dp_accounting's and the two are close.
  ours = rdp_accountant.RdpAccountant().compose(event).get_epsilon(1e-5)
  reference = _dp_rdp_epsilon(event, 1e-5, DEFAULT_ORDERS)
  assert reference * (1 - 1e-4) <= ours <= reference * (1 + 1e-9)
  assert accountants.make_accountant("rdp").compose(event).get_epsilon(1e-5) == ours


def test_rdp_get_delta_equals_dp_accounting():
  dp_rdp = _dp_rdp()
  for key in ("poisson", "phases"):
    event = _MIXED[key]
    reference = dp_rdp.RdpAccountant(INT_ORDERS)
    reference.compose(events.to_dp_accounting(event))
    ours = rdp_accountant.RdpAccountant(INT_ORDERS).compose(event)
    for eps in (0.5, 1.5, 3.0):
      assert ours.get_delta(eps) == pytest.approx(reference.get_delta(eps), rel=1e-8)


@pytest.mark.parametrize("key", sorted(_MIXED))
def test_pld_within_dp_accounting(key):
  event = _MIXED[key]
  reference = _dp_pld_epsilon(event, 1e-5)
  raw = pld_accountant.PLDAccountant().compose(event).get_epsilon(1e-5)
  capped = pld_accountant.PLDAccountant(rdp_cap=True).compose(event).get_epsilon(1e-5)
  assert raw <= reference * (1 + 1e-3) and capped <= reference * (1 + 1e-3)
  # Both are tight to ~1e-6 here: a much smaller value would be an unsound one.
  assert raw >= reference * (1 - 1e-3) and capped >= reference * (1 - 1e-3)
  assert capped <= raw


def test_pld_is_above_dp_accounting_optimistic_lower_bound():
  # dp_accounting's optimistic PLD (privacy buckets, rounding down) bounds the true curve
  # from below, so no sound bound may be under it.
  pld = pytest.importorskip("dp_accounting.pld.privacy_loss_distribution")
  lower = pld.from_gaussian_mechanism(
      1.0, sampling_prob=0.01, pessimistic_estimate=False, use_connect_dots=False,
      value_discretization_interval=1e-4).self_compose(1000).get_epsilon_for_delta(1e-5)
  ours = pld_accountant.PLDAccountant().compose(_MIXED["poisson"]).get_epsilon(1e-5)
  assert 1.7 < lower <= ours


@pytest.mark.parametrize("ledger,pairs", _PURE[1:3])
def test_pld_pure_gaussian_not_below_exact(ledger, pairs):
  exact = _mp_epsilon(_mp_sigma(pairs), 1e-5)
  reference = _dp_pld_epsilon(ledger, 1e-5)
  acc = pld_accountant.PLDAccountant().compose(ledger)
  assert exact * (1 - 1e-12) <= acc.get_epsilon(1e-5) <= reference * (1 + 1e-3)
  # The PLD grid on its own (no exact rule) is an upper bound too, and close.
  assert exact * (1 - 1e-9) <= acc.pld_epsilon(1e-5) <= exact * (1 + 1e-3)


@pytest.mark.parametrize("event", [
    SC(W(1000, 10, G(0.5)), 500),
    C([SC(W(1000, 10, G(0.5)), 300), SC(W(2000, 50, G(1.0)), 100)]),
    SC(C([W(60000, 256, G(0.55)), SC(W(60000, 512, G(0.7)), 2)]), 100),
], ids=["one", "two_phases", "self_composed_of_composed"])
def test_rdp_without_replacement_not_above_dp_accounting(event):
  for orders in (INT_ORDERS, DEFAULT_ORDERS):
    ours = rdp_accountant.RdpAccountant(orders).compose(event)
    assert ours.neighboring_relation == events.REPLACE_ONE
    reference = _dp_rdp_epsilon(event, 1e-5, orders, replace_one=True)
    assert 0.0 < ours.get_epsilon(1e-5) <= reference * (1 + 1e-6)


# ------------------------------------------------------------------------------------------
# Group privacy.


def _brute_force_group_epsilon(acc, k, delta, points=(700, 400)):
  """min over per-example d of k eps(d) s.t. k e^{(k-1) eps(d)} d <= delta: a grid of
  points[0] values of log d over [log 1e-300, log(delta / k)], then for each further entry a
  grid of that many points within one step of the previous best feasible point."""
  def best_on(grid):
    best, where = math.inf, None
    for log_d in grid:
      eps = acc.get_epsilon(math.exp(log_d))
      if math.log(k) + (k - 1) * eps + log_d <= math.log(delta) and k * eps < best:
        best, where = k * eps, log_d
    return best, where

  low, top = math.log(1e-300), math.log(delta / k)
  grid = np.linspace(low, top, points[0])
  best, where = best_on(grid)
  for n in points[1:]:
    if where is None:
      return math.inf
    step = grid[1] - grid[0]
    grid = np.linspace(max(where - step, low), min(where + step, top), n)
    value, at = best_on(grid)
    if value < best:
      best, where = value, at
  return best


def _check_sound(acc, k, delta, value):
  """value = k eps is sound iff some d with k e^{(k-1) eps} d <= delta has eps(d) <= eps; the
  largest such d is the one to check (eps(d) decreases in d)."""
  eps = value / k
  d = delta * math.exp(-(k - 1) * eps) / k
  assert acc.get_epsilon(d) <= eps * (1 + 1e-12)


@pytest.mark.parametrize("event,k", [
    (SC(P(0.01, G(1.0)), 1000), 2),
    (SC(P(0.01, G(1.0)), 1000), 5),
    (SC(P(256 / 60000, G(1.1)), 14063), 3),
    (SC(P(256 / 60000, G(1.1)), 14063), 10),
    (SC(G(5.0), 10), 4),
    (SC(G(0.5), 3), 5),
    (C([S(G(2.0), 25, 10), SC(P(0.1, G(0.7)), 100)]), 2),
])
def test_group_privacy_is_sound_and_near_the_brute_force_optimum(event, k):
  acc = rdp_accountant.RdpAccountant().compose(event)
  value = accountant_base.group_privacy_epsilon(acc, k, 1e-5)
  assert math.isfinite(value) and value > 0
  _check_sound(acc, k, 1e-5, value)
  brute = _brute_force_group_epsilon(acc, k, 1e-5)
  assert brute * (1 - 1e-3) <= value <= brute * (1 + 1e-3)
  # Never below k times the per-example epsilon at delta (group privacy cannot beat it).
  assert value >= k * acc.get_epsilon(1e-5)


def test_group_privacy_with_the_pld_accountant():
  acc = accountants.make_accountant("pld").compose(SC(P(0.01, G(1.0)), 300))
  value = accountant_base.group_privacy_epsilon(acc, 3, 1e-5)
  _check_sound(acc, 3, 1e-5, value)
  # Fewer points (each PLD query costs more), refined three times around the best one.
  brute = _brute_force_group_epsilon(acc, 3, 1e-5, points=(60, 13, 13, 13))
  assert brute * (1 - 1e-2) <= value <= brute * (1 + 1e-3)


def test_group_privacy_edge_cases_and_errors():
  acc = rdp_accountant.RdpAccountant().compose(SC(P(0.01, G(1.0)), 1000))
  assert accountant_base.group_privacy_epsilon(acc, 1, 1e-5) == acc.get_epsilon(1e-5)
  assert accountant_base.group_privacy_epsilon(rdp_accountant.RdpAccountant(), 5, 1e-5) == 0.0
  # No per-example delta above 1e-300 is feasible for groups of 10 here: inf, as brute force.
  assert accountant_base.group_privacy_epsilon(acc, 10, 1e-5) == math.inf
  assert _brute_force_group_epsilon(acc, 10, 1e-5) == math.inf
  for k, shown in [(0, "0"), (1.0, "1.0"), (True, "True"), (-3, "-3")]:
    with pytest.raises(ValueError) as info:
      accountant_base.group_privacy_epsilon(acc, k, 1e-5)
    assert str(info.value) == f"group_size must be an integer in [1, inf], got {shown}."
  with pytest.raises(ValueError) as info:
    accountant_base.group_privacy_epsilon(acc, 2, 1.0)
  assert str(info.value) == "delta must be in (0, 1), got 1.0."


def test_deprecated_module_name_is_an_alias_of_accountant_base():
  # analysis.accountant stays importable for one release as a thin alias of accountant_base.
  import analysis.accountant as old  # pylint: disable=g-import-not-at-top
  for name in old.__all__:
    assert getattr(old, name) is getattr(accountant_base, name), name
  assert set(old.__all__) == set(accountant_base.__all__)


def test_deprecated_module_is_an_attribute_of_the_package(monkeypatch):
  import sys  # pylint: disable=g-import-not-at-top
  import analysis  # pylint: disable=g-import-not-at-top
  monkeypatch.delitem(sys.modules, "analysis.accountant", raising=False)
  monkeypatch.delattr(analysis, "accountant", raising=False)
  assert analysis.accountant.Accountant is accountant_base.Accountant
  with pytest.raises(AttributeError, match="has no attribute 'no_such_module'"):
    getattr(analysis, "no_such_module")
