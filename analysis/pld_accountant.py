"""Privacy-loss-distribution (PLD) accounting for DP-SGD by FFT composition.

One step is the Poisson-subsampled Gaussian; its "remove" and "add" privacy-loss
distributions are discretised pessimistically ("connect the dots") on a grid of
``value_discretization_interval`` nats, composed by one real FFT per direction, and every
truncation, wrap-around and round-off is bounded and added to delta, so ``delta(eps)`` (and the
epsilon searched from it) is an upper bound.  Supported: ``noise_multiplier`` in [0, inf]
(discretised inside [1e-3, 1e12], soundly clamped outside), ``steps`` in [0, 1e10]
(:data:`MAX_STEPS`), ``value_discretization_interval`` in (0, 1].  Where the grid must be
coarsened (very many steps) the bound loosens; :func:`compute_epsilon_with_rdp_cap` (the
``"pld"`` accountant name) returns the smaller of the PLD and the RDP bound.  The method, its
error bounds and measured ranges: docs/design/pld_accountant.md.  No TensorFlow import; numpy
and scipy only.
"""
from __future__ import annotations

import math
import warnings
from typing import NamedTuple, Sequence

from analysis import accountant_base as _accountant
from analysis import events as _events
from analysis import _numerics, rdp_accountant
from analysis._checks import (check_delta, check_finite_positive, check_nonnegative,
                              check_probability, check_same_length, check_steps)
from analysis._pld.composition import (_MAX_GRID_SIZE, _TAIL_MASS, _compose_direction,
                                       _DiscretePLD)
from analysis._pld.discretization import _ADD, _REMOVE, _discretize_step, _step_loss_range

__all__ = [
    "MAX_NOISE_MULTIPLIER",
    "MAX_STEPS",
    "MAX_VALUE_DISCRETIZATION_INTERVAL",
    "MIN_NOISE_MULTIPLIER",
    "CappedEpsilon",
    "PLDAccountant",
    "compute_delta",
    "compute_epsilon",
    "compute_epsilon_heterogeneous",
    "compute_epsilon_with_rdp_cap",
]

#: The composed discrete PLD of :mod:`analysis._pld.composition`, named here for the tests that
#: build one directly.
_PIECES = (_DiscretePLD,)

#: Largest number of steps (per phase and in total) that the PLD accountant accepts.
MAX_STEPS = 10**10
#: Noise multipliers in (0, MIN_NOISE_MULTIPLIER) are accounted as 0 (sound, design page).
MIN_NOISE_MULTIPLIER = _numerics.PLD_NOISE_FLOOR
#: Noise multipliers in (MAX_NOISE_MULTIPLIER, inf) are accounted as MAX_NOISE_MULTIPLIER.
MAX_NOISE_MULTIPLIER = _numerics.PLD_NOISE_CEILING
#: Largest value_discretization_interval accepted (nats).
MAX_VALUE_DISCRETIZATION_INTERVAL = 1.0
_STEPS_WHY = "the PLD accountant's supported range; use the RDP accountant beyond it"


# ------------------------------------------------------------------------------------------
# Argument validation.


def _check_value_discretization_interval(value) -> float:
  h = check_finite_positive("value_discretization_interval", value)
  if h > MAX_VALUE_DISCRETIZATION_INTERVAL:
    raise ValueError(
        f"value_discretization_interval must be in (0, {MAX_VALUE_DISCRETIZATION_INTERVAL:g}] "
        f"nats (coarser grids give vacuous bounds), got {value!r}.")
  return h


def _check_phase(sampling_probability, noise_multiplier, steps,
                 names=("sampling_probability", "noise_multiplier", "steps")):
  q = check_probability(names[0], sampling_probability)
  sigma = check_nonnegative(names[1], noise_multiplier)
  count = check_steps(names[2], steps, maximum=MAX_STEPS, why=_STEPS_WHY)
  return q, sigma, count


class PLDAccountant(_accountant.Accountant):
  """PLD accountant implementing :class:`analysis.accountant_base.Accountant`.

  Supports plain Gaussian releases and the Poisson-subsampled Gaussian (``q`` in [0, 1],
  add-or-remove-one or zero-out adjacency), i.e. the atoms of :func:`analysis.events.flatten`
  except sampling without replacement (use the RDP accountant for those).  Atoms with the same
  (q, sigma) are merged (composition commutes).  The composed PLDs are built lazily on the
  first query and cached until the next ``compose``.  Noise multipliers below 1e-3 are
  accounted as 0 and above 1e12 as 1e12 (sound; docs/design/pld_accountant.md).  At most 1e10
  steps in total.

  Args:
    value_discretization_interval: grid spacing ``h`` of privacy losses, in nats, in (0, 1].
      Smaller is tighter and slower (cost ~ 1/h); the excess of the bound shrinks ~h^2.
    rdp_cap: if True, :meth:`get_epsilon` / :meth:`get_delta` report the smaller of the PLD
      and the RDP bound (both valid; see :func:`compute_epsilon_with_rdp_cap`); this is what
      the public accountant name ``"pld"`` means.  Default False: the PLD bound alone.

  Raises:
    ValueError: h outside (0, 1]; in :meth:`compose`, an argument out of range or a total
      number of steps above :data:`MAX_STEPS` (1e10).
    analysis.events.UnsupportedEventError: in :meth:`compose`, sampling without replacement.
  """

  #: The most steps this accountant composes (:data:`MAX_STEPS`).
  max_steps = MAX_STEPS

  #: How this accountant's bound is described in a privacy statement.
  method = "privacy-loss-distribution (PLD) accounting"

  def __init__(self, value_discretization_interval: float = 1e-4, *, rdp_cap: bool = False):
    super().__init__()
    self._h = _check_value_discretization_interval(value_discretization_interval)
    if not isinstance(rdp_cap, bool):
      raise ValueError(f"rdp_cap must be True or False, got {rdp_cap!r}.")
    self._rdp_cap = rdp_cap
    self._composed = None
    self._h_used = self._h
    #: Whether the last epsilon query with ``rdp_cap`` returned the RDP bound, and its order.
    self.last_from_rdp = False
    self.last_rdp_order = None
    self.last_rdp_order = None

  @property
  def value_discretization_interval(self) -> float:
    """The requested grid spacing h (nats)."""
    return self._h

  @property
  def value_discretization_interval_used(self) -> float:
    """The spacing actually used by the last query (larger than requested only if the grid
    would otherwise exceed 2**22 points)."""
    return self._h_used

  @property
  def _phases(self) -> dict:
    """{(q, accounted sigma): steps} of the ledger (q = 1 for plain Gaussian releases)."""
    phases: dict[tuple[float, float], int] = {}
    for atom in self.atoms:
      key = (1.0 if atom.sampling is None else atom.sampling,
             _numerics.clamp_noise(atom.noise_multiplier, MIN_NOISE_MULTIPLIER,
                                  MAX_NOISE_MULTIPLIER))
      phases[key] = phases.get(key, 0) + atom.count
    return phases

  def _check_atoms(self, atoms) -> None:
    for atom in atoms:
      if isinstance(atom.sampling, tuple):
        raise _events.UnsupportedEventError(
            "The PLD accountant does not support sampling without replacement; use the RDP "
            "accountant (analysis.rdp_accountant.RdpAccountant, accountant='rdp').")
    total = sum(a.count for a in self.atoms)
    for atom in atoms:
      total += atom.count
      if total > MAX_STEPS:
        raise ValueError(
            f"steps must keep the accountant's total in [0, {MAX_STEPS}] ({_STEPS_WHY}); "
            f"adding {atom.count} steps would make it {total}.")

  def _changed(self) -> None:
    self._composed = None

  def _build(self):
    if self._composed is not None:
      return self._composed
    if not self._phases:
      self._composed = []
      return self._composed
    total_steps = sum(self._phases.values())
    step_tail = _TAIL_MASS / 4.0 / total_steps
    h = self._h
    widest = max(_step_loss_range(q, s, d, step_tail)
                 for (q, s) in self._phases for d in (_REMOVE, _ADD))
    if widest / h > _MAX_GRID_SIZE - 2:
      h = widest / (_MAX_GRID_SIZE - 2) * 1.01
    for _ in range(8):
      composed = []
      too_big = 0
      for direction in (_REMOVE, _ADD):
        steps_pmfs = []
        for (q, sigma), count in self._phases.items():
          i_lo, pmf, p_inf = _discretize_step(q, sigma, h, direction, step_tail)
          steps_pmfs.append((i_lo, pmf, p_inf, count))
        pld, size = _compose_direction(steps_pmfs, h)
        if pld is None:
          too_big = max(too_big, size)
          break
        composed.append(pld)
      if not too_big:
        self._h_used = h
        self._composed = composed
        return composed
      h *= too_big / _MAX_GRID_SIZE * 1.05
    raise RuntimeError("PLD grid could not be sized; this is a bug.")  # pragma: no cover

  def pld_epsilon(self, delta: float) -> float:
    """The PLD bound on epsilon alone (no exact-Gaussian rule, no RDP cap); delta in (0, 1)."""
    delta = check_delta("delta", delta)
    composed = self._build()
    return max(pld.epsilon(delta) for pld in composed) if composed else 0.0

  def pld_delta(self, epsilon: float) -> float:
    """The PLD bound on delta alone (no exact-Gaussian rule, no RDP cap); epsilon >= 0."""
    epsilon = check_nonnegative("epsilon", epsilon)
    composed = self._build()
    return max(pld.delta(epsilon) for pld in composed) if composed else 0.0

  def _epsilon(self, delta: float) -> float:
    pld_eps = self.pld_epsilon(delta)
    self.last_from_rdp, self.last_rdp_order = False, None
    if self._rdp_cap:
      rdp_eps, order = _rdp_epsilon([(q, s, c) for (q, s), c in self._phases.items()], delta)
      if rdp_eps < pld_eps:
        self.last_from_rdp, self.last_rdp_order = True, order
        return rdp_eps
    return pld_eps

  def _delta(self, epsilon: float) -> float:
    pld_delta = self.pld_delta(epsilon)
    if self._rdp_cap:
      pld_delta = min(pld_delta, _rdp_accountant_for(self._phases).get_delta(epsilon))
    return pld_delta


# ------------------------------------------------------------------------------------------
# Functional API.


def compute_epsilon(sampling_probability: float, noise_multiplier: float, steps: int,
                    delta: float, *, value_discretization_interval: float = 1e-4) -> float:
  """Epsilon (nats, >= 0, possibly inf) of ``steps`` DP-SGD steps; an upper bound.

  Args:
    sampling_probability: Poisson sampling probability q in [0, 1] (batch size / dataset size).
    noise_multiplier: noise std over the clipping norm, in [0, inf]; values below 1e-3 are
      accounted as 0 and values above 1e12 as 1e12 (sound upper bounds; design page).
    steps: number of steps, integer in [0, 1e10].
    delta: target delta in (0, 1).
    value_discretization_interval: loss grid spacing h (nats), in (0, 1].

  q = 0, steps = 0 or noise = inf give 0.  Noise 0 (or below 1e-3) with q > 0 gives inf
  unless 1 - (1 - q)^steps <= delta (then the exact, finite answer of the discrete PLD).

  Raises:
    ValueError: an argument out of the ranges above; the message names it.
  """
  q, sigma, count = _check_phase(sampling_probability, noise_multiplier, steps)
  delta = check_delta("delta", delta)
  accountant = PLDAccountant(value_discretization_interval)
  return accountant.compose(_poisson(q, sigma), count).pld_epsilon(delta)


def compute_delta(sampling_probability: float, noise_multiplier: float, steps: int,
                  epsilon: float, *, value_discretization_interval: float = 1e-4) -> float:
  """Delta in [0, 1] of ``steps`` DP-SGD steps at ``epsilon`` (nats, >= 0); an upper bound.

  Arguments (and their ranges) as in :func:`compute_epsilon`.  Noise 0 (or below 1e-3) with
  q > 0 gives 1 - (1 - q)^steps (up to the discretisation of the add direction, which cannot
  exceed that value).
  """
  q, sigma, count = _check_phase(sampling_probability, noise_multiplier, steps)
  epsilon = check_nonnegative("epsilon", epsilon)
  accountant = PLDAccountant(value_discretization_interval)
  return accountant.compose(_poisson(q, sigma), count).pld_delta(epsilon)


def compute_epsilon_heterogeneous(sampling_probabilities: Sequence[float],
                                  noise_multipliers: Sequence[float],
                                  steps_list: Sequence[int], delta: float, *,
                                  value_discretization_interval: float = 1e-4) -> float:
  """Epsilon (nats) of consecutive DP-SGD phases with their own q, sigma and step count.

  Phase i runs ``steps_list[i]`` steps with ``sampling_probabilities[i]`` and
  ``noise_multipliers[i]`` (ranges as in :func:`compute_epsilon`; at most 1e10 steps in
  total); all three sequences must have the same length (0 allowed, giving 0).  Each phase's
  one-step PLD is raised to its step count in the Fourier domain and the phases are multiplied
  there, all on one common grid; add and remove directions are composed
  separately and the larger epsilon is returned.  An upper bound, like compute_epsilon.
  """
  lengths = check_same_length(sampling_probabilities=sampling_probabilities,
                              noise_multipliers=noise_multipliers, steps_list=steps_list)
  delta = check_delta("delta", delta)
  accountant = PLDAccountant(value_discretization_interval)
  for i in range(lengths):
    q, sigma, count = _check_phase(
        sampling_probabilities[i], noise_multipliers[i], steps_list[i],
        names=(f"sampling_probabilities[{i}]", f"noise_multipliers[{i}]", f"steps_list[{i}]"))
    accountant.compose(_poisson(q, sigma), count)
  return accountant.pld_epsilon(delta)


class CappedEpsilon(NamedTuple):
  """Result of :func:`compute_epsilon_with_rdp_cap` (all epsilons in nats, in [0, inf]).

  Attributes:
    epsilon: min(pld_epsilon, rdp_epsilon), a valid epsilon at the given delta.
    pld_epsilon: the PLD bound (:func:`compute_epsilon_heterogeneous`).
    rdp_epsilon: the RDP bound (see :func:`compute_epsilon_with_rdp_cap`).
    rdp_order: the Renyi order attaining ``rdp_epsilon`` (None if it is inf or 0 without one).
    from_rdp: True when ``rdp_epsilon < pld_epsilon``, i.e. ``epsilon`` is the RDP bound.
  """
  epsilon: float
  pld_epsilon: float
  rdp_epsilon: float
  rdp_order: float | None
  from_rdp: bool


def _poisson(q: float, sigma: float) -> _events.DpEvent:
  return _events.PoissonSampledEvent(q, _events.GaussianEvent(sigma))


def _rdp_accountant_for(phases: dict) -> rdp_accountant.RdpAccountant:
  """An RDP accountant holding {(q, sigma): steps} phases."""
  rdp = rdp_accountant.RdpAccountant()
  for (q, sigma), count in phases.items():
    rdp.compose(_poisson(q, sigma), count)
  return rdp


def _rdp_epsilon(phases, delta: float):
  """(eps, order) of the RDP accountant for [(q, sigma, steps)] phases (steps > 0, q > 0).

  One phase: order optimised over the reals (``get_privacy_spent_optimal_order``, never worse
  than DEFAULT_ORDERS).  Several: sum of the phases' RDP on DEFAULT_ORDERS, best order.
  """
  if not phases:
    return 0.0, None
  if len(phases) == 1:
    (q, sigma, count), = phases
    eps, _, order = rdp_accountant.get_privacy_spent_optimal_order(q, sigma, count,
                                                                   target_delta=delta)
    return float(eps), order
  orders = rdp_accountant.DEFAULT_ORDERS
  qs, sigmas, counts = (list(column) for column in zip(*phases))
  rdp = rdp_accountant.compute_heterogeneous_rdp(qs, sigmas, counts, orders)
  with warnings.catch_warnings():
    # An optimum at the end of the orders is still a valid (if looser) bound.
    warnings.simplefilter("ignore", rdp_accountant.OrderAtBoundaryWarning)
    eps, _, order = rdp_accountant.get_privacy_spent(orders, rdp, target_delta=delta)
  return float(eps), order


def compute_epsilon_with_rdp_cap(sampling_probabilities: Sequence[float],
                                 noise_multipliers: Sequence[float],
                                 steps_list: Sequence[int], delta: float, *,
                                 value_discretization_interval: float = 1e-4) -> CappedEpsilon:
  """The smaller of the PLD and the RDP epsilon of consecutive DP-SGD phases.

  Phases and ranges as in :func:`compute_epsilon_heterogeneous` (Poisson sampling, add-or-
  remove-one adjacency, at most 1e10 steps in total, delta in (0, 1)).  Both bounds are valid
  upper bounds on the same epsilon, so their minimum is one too.  PLD is the tighter one while
  the grid spacing actually used stays below about half the one-step loss spread (see "Range of
  validity against RDP" in docs/design/pld_accountant.md: e.g. up to ~35,000 epochs of
  MNIST, batch 256 and sigma 1.1); past that the RDP bound takes over.  The RDP bound is
  ``rdp_accountant.get_privacy_spent_optimal_order`` (order optimised over the reals) for a
  single (q, sigma) phase, else the summed RDP of the phases over
  ``rdp_accountant.DEFAULT_ORDERS``.

  Returns:
    A :class:`CappedEpsilon`; its ``epsilon`` is the number to report.

  Raises:
    ValueError: an argument out of range, as :func:`compute_epsilon_heterogeneous`.
  """
  pld_eps = compute_epsilon_heterogeneous(
      sampling_probabilities, noise_multipliers, steps_list, delta,
      value_discretization_interval=value_discretization_interval)  # validates everything
  merged: dict[tuple[float, float], int] = {}
  for q, sigma, count in zip(sampling_probabilities, noise_multipliers, steps_list):
    q, sigma, count = float(q), float(sigma), int(count)
    if count and q > 0.0 and not math.isinf(sigma):
      merged[(q, sigma)] = merged.get((q, sigma), 0) + count
  rdp_eps, order = _rdp_epsilon([(q, s, c) for (q, s), c in merged.items()], float(delta))
  from_rdp = rdp_eps < pld_eps
  return CappedEpsilon(epsilon=min(pld_eps, rdp_eps), pld_epsilon=float(pld_eps),
                       rdp_epsilon=rdp_eps, rdp_order=order, from_rdp=from_rdp)
