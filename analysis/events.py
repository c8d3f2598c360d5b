"""Immutable descriptions of private mechanisms ("events"), the input of every accountant.

An event says what was released, not how to account it: :class:`GaussianEvent`,
:class:`LaplaceEvent`, :class:`PoissonSampledEvent`, :class:`SampledWithoutReplacementEvent`,
:class:`ShuffledEvent`, :class:`SelfComposedEvent`, :class:`ComposedEvent` and
:class:`RepeatAndSelectEvent` (tuning).  Fields are validated on construction (``ValueError``
naming the field and its range); events are frozen, hashable and comparable.  :func:`flatten`
reduces any event to its :class:`Atom` list, the one place that says what a composition is made
of, and :func:`neighboring_relation` the relation under which it holds
(``"add_or_remove_one"``, ``"zero_out"``, ``"replace_one"``).  Each event's meaning and the
relations: docs/design/events.md.  No TensorFlow import.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Union

from analysis import _checks

__all__ = [
    "ADD_OR_REMOVE_ONE", "REPLACE_ONE", "ZERO_OUT", "Atom", "ComposedEvent", "DpEvent",
    "GaussianEvent", "IncompatibleEventsError", "LaplaceEvent", "PoissonSampledEvent",
    "RepeatAndSelectAtom", "RepeatAndSelectEvent", "SampledWithoutReplacementEvent",
    "SelfComposedEvent", "ShuffledEvent", "UnsupportedEventError", "check_repeat_mean",
    "check_repeat_shape", "flatten", "merge_atoms", "neighboring_relation", "relation_of",
    "to_dp_accounting",
]

ADD_OR_REMOVE_ONE = "add_or_remove_one"
ZERO_OUT = "zero_out"
REPLACE_ONE = "replace_one"


class UnsupportedEventError(ValueError):
  """An event (or nesting of events) that an accountant cannot account."""


class IncompatibleEventsError(ValueError):
  """Events composed under neighbouring relations that do not combine."""


class DpEvent:
  """Base class of the events in this module (frozen dataclasses)."""

  __slots__ = ()


@dataclasses.dataclass(frozen=True)
class GaussianEvent(DpEvent):
  """One Gaussian release; ``noise_multiplier`` = noise std / L2 sensitivity, in [0, inf]."""
  noise_multiplier: float

  def __post_init__(self):
    object.__setattr__(self, "noise_multiplier",
                       _checks.check_nonnegative("noise_multiplier", self.noise_multiplier))


@dataclasses.dataclass(frozen=True)
class LaplaceEvent(DpEvent):
  """One Laplace release; ``noise_multiplier`` = Laplace scale / L1 sensitivity, in (0, inf].

  Pure ``1 / noise_multiplier``-DP.  Not an :class:`Atom` (atoms are Gaussian): only
  :class:`analysis.pate.PateAccountant` composes it.
  """
  noise_multiplier: float

  def __post_init__(self):
    value = _checks.check_nonnegative("noise_multiplier", self.noise_multiplier)
    if value == 0.0:
      raise ValueError("noise_multiplier must be > 0 (a Laplace release without noise is not "
                       "private), got 0.0.")
    object.__setattr__(self, "noise_multiplier", value)


@dataclasses.dataclass(frozen=True)
class PoissonSampledEvent(DpEvent):
  """``event`` on a Poisson sample: each example joins with probability q in [0, 1]."""
  sampling_probability: float
  event: DpEvent

  def __post_init__(self):
    object.__setattr__(self, "sampling_probability", _checks.check_probability(
        "sampling_probability", self.sampling_probability))
    _check_event("event", self.event)


@dataclasses.dataclass(frozen=True)
class SampledWithoutReplacementEvent(DpEvent):
  """``event`` on ``sample_size`` examples drawn without replacement from ``source_size``.

  ``source_size`` an integer >= 1; ``sample_size`` an integer in [0, source_size].
  """
  source_size: int
  sample_size: int
  event: DpEvent

  def __post_init__(self):
    n = _checks.check_integer("source_size", self.source_size, minimum=1)
    b = _checks.check_integer("sample_size", self.sample_size, minimum=0, maximum=n)
    object.__setattr__(self, "source_size", n)
    object.__setattr__(self, "sample_size", b)
    _check_event("event", self.event)


@dataclasses.dataclass(frozen=True)
class ShuffledEvent(DpEvent):
  """``steps`` runs of ``event`` on shuffle-and-batch batches, ``steps_per_epoch`` per epoch.

  ``steps`` an integer >= 0, ``steps_per_epoch`` an integer >= 1.  Accounted as ``event``
  composed :attr:`epochs` ``= ceil(steps / steps_per_epoch)`` times, under ``"zero_out"``.
  """
  event: DpEvent
  steps: int
  steps_per_epoch: int

  def __post_init__(self):
    _check_event("event", self.event)
    object.__setattr__(self, "steps", _checks.check_steps("steps", self.steps))
    object.__setattr__(self, "steps_per_epoch", _checks.check_integer(
        "steps_per_epoch", self.steps_per_epoch, minimum=1))

  @property
  def epochs(self) -> int:
    """Epochs started: ``ceil(steps / steps_per_epoch)``."""
    return -(-self.steps // self.steps_per_epoch)


@dataclasses.dataclass(frozen=True)
class SelfComposedEvent(DpEvent):
  """``event`` run ``count`` (an integer in [0, 2**53]) times."""
  event: DpEvent
  count: int

  def __post_init__(self):
    _check_event("event", self.event)
    object.__setattr__(self, "count", _checks.check_steps("count", self.count))


@dataclasses.dataclass(frozen=True)
class ComposedEvent(DpEvent):
  """Each of ``events`` (a sequence of events, possibly empty) run once, in order."""
  events: tuple

  def __post_init__(self):
    if isinstance(self.events, (DpEvent, str, bytes)) or not hasattr(self.events, "__iter__"):
      raise ValueError(f"events must be a sequence of events, got {_checks._describe(self.events)}.")  # pylint: disable=protected-access
    events = tuple(self.events)
    for i, event in enumerate(events):
      _check_event(f"events[{i}]", event)
    object.__setattr__(self, "events", events)


@dataclasses.dataclass(frozen=True)
class RepeatAndSelectEvent(DpEvent):
  """The best of K independent runs of ``event``, K random; only the best output released.

  Papernot & Steinke (2022), arXiv 2110.03620 (dp_accounting's ``RepeatAndSelectDpEvent``,
  same fields and meaning).  Each run is ``event`` on the same data, with its own independent
  randomness, including its randomly drawn hyper-parameters (random search: every run draws
  its candidate from one fixed distribution); the outputs must be totally ordered (e.g. by
  a score computed inside the run, whose privacy cost is part of ``event``) and only the best
  run's output is released.  K is drawn, independently of the data, from:

  * ``shape = inf``: Poisson with mean ``mean`` (K = 0 possible: then nothing is released);
  * ``shape = eta`` in (-1, inf): the truncated negative binomial D_{eta, gamma} on
    {1, 2, ...}, P[K = k] = (1 - gamma)^k / (gamma^(-eta) - 1) * prod_{l=0}^{k-1} (l + eta) /
    (l + 1), whose mean eta (1 - gamma) / (gamma (1 - gamma^eta)) is ``mean`` (this fixes
    gamma in (0, 1); :func:`analysis.rdp_accountant.truncated_negative_binomial_gamma`).
    ``eta = 1`` is the geometric distribution P[K = k] = gamma (1 - gamma)^(k - 1), ``eta = 0``
    the logarithmic distribution P[K = k] = (1 - gamma)^k / (k log(1 / gamma)).

  ``mean`` is a finite real >= 1 (for the truncated negative binomial ``mean = 1`` means K = 1
  surely, and the event is accounted as ``event`` itself; Poisson needs >= 1 too, see
  :func:`analysis.rdp_accountant.compute_rdp_repeat_and_select`); ``shape`` a real in
  (-1, inf) or inf.  A FIXED number of runs is not this event: ``SelfComposedEvent(event, k)``.
  """
  event: DpEvent
  mean: float
  shape: float

  def __post_init__(self):
    _check_event("event", self.event)
    object.__setattr__(self, "mean", check_repeat_mean("mean", self.mean))
    object.__setattr__(self, "shape", check_repeat_shape("shape", self.shape))


def check_repeat_mean(name: str, value) -> float:
  """Returns ``value`` as float; requires E[K] of a :class:`RepeatAndSelectEvent`: finite, >= 1."""
  value = _checks.check_real(name, value, allow_nan=True)
  if not 1.0 <= value < math.inf:
    raise ValueError(f"{name} must be a finite number >= 1 (the expected number of runs), got "
                     f"{_checks._describe(value)}.")  # pylint: disable=protected-access
  return value


def check_repeat_shape(name: str, value) -> float:
  """Returns ``value`` as float; requires the shape of a :class:`RepeatAndSelectEvent`:
  in (-1, inf] (inf: Poisson, 1: geometric, 0: logarithmic)."""
  value = _checks.check_real(name, value, allow_nan=True)
  if not value > -1.0:
    raise ValueError(f"{name} must be in (-1, inf] (inf: Poisson, 1: geometric, 0: "
                     f"logarithmic, else truncated negative binomial), got "
                     f"{_checks._describe(value)}.")  # pylint: disable=protected-access
  return value


def _check_event(name: str, event: Any) -> None:
  if not isinstance(event, DpEvent):
    raise ValueError(f"{name} must be an analysis.events event (e.g. GaussianEvent), got "
                     f"{type(event).__name__} {event!r:.80}.")


# ------------------------------------------------------------------------------------------
# Reduction to atoms.


@dataclasses.dataclass(frozen=True)
class Atom:
  """``count`` compositions of a Gaussian release, subsampled or not.

  ``sampling`` is ``None`` (the plain Gaussian), a ``float`` q (Poisson sampling with rate q)
  or a pair ``(source_size, sample_size)`` (sampling without replacement);
  ``relation`` is the neighbouring relation the atom's guarantee holds under.
  """
  noise_multiplier: float
  sampling: Union[None, float, tuple]
  count: int
  relation: str

  @property
  def key(self):
    """What identifies the mechanism (all but the count)."""
    return (self.noise_multiplier, self.sampling, self.relation)


@dataclasses.dataclass(frozen=True)
class RepeatAndSelectAtom:
  """``count`` independent tuned releases: each the best of K runs of the mechanism ``atoms``.

  ``atoms`` is :func:`flatten` of the repeated event (non-empty), ``mean`` and ``shape`` those
  of the :class:`RepeatAndSelectEvent`, ``relation`` the common relation of ``atoms``.
  ``event`` is the repeated event itself (not compared: ``atoms`` say what it is made of).
  Not a composition of its atoms: its RDP comes from theirs by Papernot & Steinke's theorems
  (:func:`analysis.rdp_accountant.compute_rdp_repeat_and_select`).
  """
  atoms: tuple
  mean: float
  shape: float
  count: int
  relation: str
  event: DpEvent = dataclasses.field(compare=False)

  @property
  def key(self):
    """What identifies the mechanism (all but the count)."""
    return (self.atoms, self.mean, self.shape, self.relation)


def flatten(event: DpEvent, count: int = 1) -> list[Atom]:
  """The atoms of ``count`` runs of ``event``, in order; equal neighbours merged.

  Atoms with count 0, sampling probability 0, sample size 0 or infinite noise release nothing
  and are dropped.  A :class:`RepeatAndSelectEvent` becomes one :class:`RepeatAndSelectAtom`
  (not a composition of its runs), or nothing if its event releases nothing, or its event's
  atoms if K = 1 surely (truncated negative binomial with mean 1).

  Raises:
    UnsupportedEventError: a nesting no accountant here handles (sampling of anything but a
      Gaussian release, e.g. Poisson sampling of a composition; shuffled batches of a tuned
      release).
  """
  _check_event("event", event)
  count = _checks.check_steps("count", count)
  atoms: list[Atom] = []
  _flatten_into(event, count, atoms)
  return merge_atoms(atoms)


def merge_atoms(atoms) -> list[Atom]:
  """``atoms`` with neighbours of the same mechanism (:attr:`Atom.key`) merged, order kept."""
  merged: list[Atom] = []
  for atom in atoms:
    if merged and merged[-1].key == atom.key:
      merged[-1] = dataclasses.replace(merged[-1], count=merged[-1].count + atom.count)
    else:
      merged.append(atom)
  return merged


def _flatten_into(event: DpEvent, count: int, atoms: list) -> None:
  if count == 0:
    return
  if isinstance(event, SelfComposedEvent):
    _flatten_into(event.event, _checks.check_steps("count", count * event.count), atoms)
  elif isinstance(event, ComposedEvent):
    inner: list[Atom] = []
    for part in event.events:
      _flatten_into(part, 1, inner)
    for atom in inner:
      atoms.append(dataclasses.replace(
          atom, count=_checks.check_steps("count", atom.count * count)))
  elif isinstance(event, ShuffledEvent):
    inner = []
    _flatten_into(event.event, _checks.check_steps("count", count * event.epochs), inner)
    for atom in inner:
      if not isinstance(atom, Atom):
        raise UnsupportedEventError(
            "ShuffledEvent of a RepeatAndSelectEvent is not supported: shuffled batches are "
            "runs of one release per batch; put the ShuffledEvent inside the "
            "RepeatAndSelectEvent (each tuning run is a shuffled training run).")
      if atom.relation == REPLACE_ONE:
        raise UnsupportedEventError(
            "ShuffledEvent of a sampled-without-replacement event is not supported: shuffled "
            "batches are accounted under zero-out adjacency, sampling without replacement "
            "under replace-one.")
      atoms.append(dataclasses.replace(atom, relation=ZERO_OUT))
  elif isinstance(event, GaussianEvent):
    if not math.isinf(event.noise_multiplier):
      atoms.append(Atom(event.noise_multiplier, None, count, ADD_OR_REMOVE_ONE))
  elif isinstance(event, PoissonSampledEvent):
    sigma = _sampled_gaussian(event, "PoissonSampledEvent")
    q = event.sampling_probability
    if q == 1.0:
      _flatten_into(event.event, count, atoms)
    elif q > 0.0 and not math.isinf(sigma):
      atoms.append(Atom(sigma, q, count, ADD_OR_REMOVE_ONE))
  elif isinstance(event, SampledWithoutReplacementEvent):
    sigma = _sampled_gaussian(event, "SampledWithoutReplacementEvent")
    if event.sample_size > 0 and not math.isinf(sigma):
      atoms.append(Atom(sigma, (event.source_size, event.sample_size), count, REPLACE_ONE))
  elif isinstance(event, RepeatAndSelectEvent):
    inner = flatten(event.event)
    if not inner:
      return  # every run releases nothing, so does the best of them
    if event.mean == 1.0 and not math.isinf(event.shape):
      atoms.extend(flatten(event.event, count))  # K = 1 surely: one run, released
      return
    atoms.append(RepeatAndSelectAtom(tuple(inner), event.mean, event.shape, count,
                                     relation_of(inner), event.event))
  else:
    raise UnsupportedEventError(f"Unsupported event {event!r}.")


def _sampled_gaussian(event, kind: str) -> float:
  if not isinstance(event.event, GaussianEvent):
    raise UnsupportedEventError(
        f"{kind} must wrap a GaussianEvent (the subsampled Gaussian is what the accountants "
        f"analyse), got {type(event.event).__name__}; compose sampled Gaussian events instead.")
  return event.event.noise_multiplier


def neighboring_relation(event: DpEvent) -> str:
  """The neighbouring relation under which every part of ``event`` holds (docs/design/events.md).

  Returns ``"add_or_remove_one"`` (nothing released also gives this), ``"zero_out"`` or
  ``"replace_one"``.

  Raises:
    IncompatibleEventsError: ``event`` mixes replace-one parts with the others.
  """
  return relation_of(flatten(event))


def relation_of(atoms) -> str:
  """The common neighbouring relation of ``atoms`` (see :func:`neighboring_relation`)."""
  relations = {atom.relation for atom in atoms}
  if REPLACE_ONE in relations and len(relations) > 1:
    raise IncompatibleEventsError(
        "Cannot compose sampling without replacement (replace-one adjacency) with Poisson or "
        "shuffled batches (add-or-remove / zero-out adjacency): no single neighbouring relation "
        "covers both. Account them separately.")
  if REPLACE_ONE in relations:
    return REPLACE_ONE
  if ZERO_OUT in relations:
    return ZERO_OUT
  return ADD_OR_REMOVE_ONE


# ------------------------------------------------------------------------------------------
# Export.


def to_dp_accounting(event: DpEvent):
  """The equivalent ``dp_accounting`` event (optional dependency ``dp-accounting``).

  Each event maps to its namesake (``RepeatAndSelectEvent`` to ``RepeatAndSelectDpEvent``;
  dp_accounting accepts shape >= 0 only); a :class:`ShuffledEvent` becomes
  ``SelfComposedDpEvent(inner, epochs)``, which is how it is accounted.  Mind the neighbouring
  relation when composing the result: build dp_accounting's accountant with
  ``NeighboringRelation.REPLACE_ONE`` for without-replacement events, ``ADD_OR_REMOVE_ONE``
  otherwise (dp_accounting has no zero-out relation; its add-or-remove accounting of these
  events gives the same numbers).

  Raises:
    ImportError: ``dp_accounting`` is not installed (the message says how to install it).
  """
  try:
    import dp_accounting  # pylint: disable=g-import-not-at-top
  except ImportError as error:
    raise ImportError("to_dp_accounting needs the optional package dp-accounting: "
                      "pip install dp-accounting") from error
  _check_event("event", event)
  return _export(event, dp_accounting)


def _export(event, dpa):
  if isinstance(event, GaussianEvent):
    return dpa.GaussianDpEvent(event.noise_multiplier)
  if isinstance(event, PoissonSampledEvent):
    return dpa.PoissonSampledDpEvent(event.sampling_probability, _export(event.event, dpa))
  if isinstance(event, SampledWithoutReplacementEvent):
    return dpa.SampledWithoutReplacementDpEvent(event.source_size, event.sample_size,
                                                _export(event.event, dpa))
  if isinstance(event, ShuffledEvent):
    return dpa.SelfComposedDpEvent(_export(event.event, dpa), event.epochs)
  if isinstance(event, SelfComposedEvent):
    return dpa.SelfComposedDpEvent(_export(event.event, dpa), event.count)
  if isinstance(event, ComposedEvent):
    return dpa.ComposedDpEvent([_export(e, dpa) for e in event.events])
  if isinstance(event, LaplaceEvent):
    return dpa.LaplaceDpEvent(event.noise_multiplier)
  if isinstance(event, RepeatAndSelectEvent):
    return dpa.dp_event.RepeatAndSelectDpEvent(_export(event.event, dpa), event.mean,
                                               event.shape)
  raise UnsupportedEventError(f"Unsupported event {event!r}.")  # pragma: no cover
