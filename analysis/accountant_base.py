"""One accountant interface: compose events, ask for epsilon or delta.

    accountant = analysis.accountants.make_accountant("rdp")
    accountant.compose(events.PoissonSampledEvent(q, events.GaussianEvent(sigma)), steps)
    accountant.get_epsilon(1e-5)

Contract: ``compose`` refuses an event it cannot analyse (``UnsupportedEventError``) or whose
neighbouring relation does not combine with the ledger's (``IncompatibleEventsError``) before
recording anything; ``get_epsilon(delta)`` / ``get_delta(epsilon)`` are upper bounds for
everything composed so far; pure Gaussian compositions are exact (the analytic Gaussian
mechanism), a rule that lives here and nowhere else.  Implementations import this module, never
the reverse, and are registered by name in :mod:`analysis.accountants`.  The full contract is in
docs/design/accountant.md.  No TensorFlow import.
"""
from __future__ import annotations

import abc
import math

from analysis import _checks, events, gaussian

__all__ = ["Accountant", "group_privacy_epsilon", "pure_gaussian_noise"]


class Accountant(abc.ABC):
  """Base class: the ledger, validation and the exact pure-Gaussian rule (design page)."""

  #: Whether :meth:`compose` accepts tuned releases (:class:`analysis.events.RepeatAndSelectAtom`).
  supports_repeat_and_select = False

  def __init__(self):
    self._events: list = []
    self._atoms: list[events.Atom] = []

  # -- interface ---------------------------------------------------------------------------

  def compose(self, event: events.DpEvent, count: int = 1) -> "Accountant":
    """Adds ``count`` (integer in [0, 2**53]) runs of ``event``; returns self."""
    atoms = events.flatten(event, count)  # validates both
    if not self.supports_repeat_and_select and any(
        isinstance(atom, events.RepeatAndSelectAtom) for atom in atoms):
      raise events.UnsupportedEventError(
          f"{type(self).__name__} cannot account a RepeatAndSelectEvent (the best of a random "
          "number of runs); use the RDP accountant (analysis.rdp_accountant.RdpAccountant, "
          "accountant='rdp'), which applies Papernot & Steinke's RDP theorems, or "
          "analysis.tuning.tuned_epsilon.")
    events.relation_of(self._atoms + atoms)
    self._check_atoms(atoms)
    self._events.append(event if count == 1 else events.SelfComposedEvent(event, count))
    self._atoms = events.merge_atoms(self._atoms + atoms)
    self._changed()
    return self

  def get_epsilon(self, delta: float) -> float:
    """Epsilon (nats, >= 0, possibly inf) at ``delta`` in (0, 1); an upper bound."""
    delta = _checks.check_delta("delta", delta)
    if not self._atoms:
      return 0.0
    sigma = self._pure_gaussian_noise()
    if sigma is not None:
      return math.inf if sigma == 0.0 else gaussian.epsilon_for_delta(sigma, delta)
    return float(self._epsilon(delta))

  def get_delta(self, epsilon: float) -> float:
    """Delta in [0, 1] at ``epsilon`` >= 0 (nats); an upper bound."""
    epsilon = _checks.check_nonnegative("epsilon", epsilon)
    if not self._atoms:
      return 0.0
    sigma = self._pure_gaussian_noise()
    if sigma is not None:
      if sigma == 0.0:
        return 1.0
      return 0.0 if math.isinf(epsilon) else gaussian.delta_for_epsilon(sigma, epsilon)
    return float(self._delta(epsilon))

  @property
  def ledger(self) -> events.ComposedEvent:
    """Everything composed so far, in order."""
    return events.ComposedEvent(tuple(self._events))

  @property
  def neighboring_relation(self) -> str:
    """The relation the guarantee holds under (:func:`analysis.events.neighboring_relation`)."""
    return events.relation_of(self._atoms)

  @property
  def atoms(self) -> tuple:
    """The ledger reduced to :class:`analysis.events.Atom` s (merged, order kept)."""
    return tuple(self._atoms)

  # -- for subclasses ----------------------------------------------------------------------

  @abc.abstractmethod
  def _check_atoms(self, atoms: list) -> None:
    """Raises UnsupportedEventError (or ValueError) when the atoms of one ``compose`` cannot
    be added to the ledger (nothing is recorded then)."""

  @abc.abstractmethod
  def _epsilon(self, delta: float) -> float:
    """Epsilon of ``self.atoms`` (not all plain Gaussian)."""

  @abc.abstractmethod
  def _delta(self, epsilon: float) -> float:
    """Delta of ``self.atoms`` (not all plain Gaussian)."""

  def _changed(self) -> None:
    """Called after every compose (drop caches)."""

  def _pure_gaussian_noise(self):
    """The one equivalent Gaussian's noise multiplier if no atom is subsampled, else None."""
    return pure_gaussian_noise(self._atoms)


def pure_gaussian_noise(atoms):
  """The noise multiplier of the one Gaussian equivalent to ``atoms``, or None.

  None when any atom is subsampled or is a tuned release
  (:class:`analysis.events.RepeatAndSelectAtom`); 0.0 when one has no noise; else
  ``(sum_i k_i / sigma_i^2)^(-1/2)`` (:func:`analysis.gaussian.composed_noise_multiplier`).
  ``atoms`` must be non-empty.
  """
  if any(not isinstance(atom, events.Atom) or atom.sampling is not None for atom in atoms):
    return None
  if any(atom.noise_multiplier == 0.0 for atom in atoms):
    return 0.0
  return gaussian.composed_noise_multiplier([a.noise_multiplier for a in atoms],
                                            [a.count for a in atoms])


def group_privacy_epsilon(accountant: Accountant, group_size: int, delta: float) -> float:
  """Epsilon at ``delta`` for neighbours that differ in up to ``group_size`` examples.

  Group privacy (e.g. Vadhan 2017, Lemma 2.2; Dwork & Roth 2014): an (eps, d)-DP mechanism is
  ``(k eps, k e^{(k-1) eps} d)``-DP for data sets differing in k examples.  The per-example
  ``d`` is searched (on a log grid, then bisection) for the smallest ``k eps(d)`` subject to
  ``k e^{(k-1) eps(d)} d <= delta``; the value returned was evaluated at a feasible ``d``, so
  it is a valid bound.

  Args:
    accountant: the per-example accountant (anything composed).
    group_size: k, integer >= 1 (1 gives ``accountant.get_epsilon(delta)``).
    delta: in (0, 1).

  Returns:
    Epsilon (nats) in [0, inf]; inf when no feasible per-example delta above 1e-300 exists.
  """
  k = _checks.check_integer("group_size", group_size, minimum=1)
  delta = _checks.check_delta("delta", delta)
  if k == 1:
    return accountant.get_epsilon(delta)

  def slack(log_d):
    """(feasible?, k eps) at per-example delta exp(log_d)."""
    eps = accountant.get_epsilon(math.exp(log_d))
    if math.isinf(eps):
      return False, math.inf
    return math.log(k) + (k - 1) * eps + log_d <= math.log(delta), k * eps

  log_high = math.log(delta / k)
  feasible, value = slack(log_high)
  if feasible:
    return value
  log_low = log_high
  while True:
    log_low -= 2.0
    if log_low < math.log(1e-300):
      return math.inf
    feasible, value = slack(log_low)
    if feasible:
      break
    log_high = log_low
  for _ in range(40):
    middle = 0.5 * (log_low + log_high)
    ok, candidate = slack(middle)
    if ok:
      log_low, value = middle, candidate
    else:
      log_high = middle
  return value
