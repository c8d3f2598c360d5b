"""PATE queries as events that :class:`analysis.pate.PateAccountant` composes.

Each aggregator's query, with its actual outcome, is one :class:`PateEvent`: it states its
data-dependent RDP (private), its data-independent RDP and ledger (publishable) and its
local-sensitivity bounds for the smooth-sensitivity release.  The accountant composes any
event through that interface, so adding an aggregator is one event class (and its
``tf_dpkit.pate.aggregators`` class).  Design: ``docs/design/pate.md`` ("PATE events").
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from analysis import _checks, _secrecy
from analysis import events
from analysis.pate._common import (_SQRT2, _check_finite_real, _check_votes, _lnmax_from_logq,
                                   _lnmax_independent, _theorem6)
from analysis.pate._mechanisms import (_log_pr_answered, _log_q_gnmax, _log_q_lnmax,
                                       _threshold_logq)
from analysis.pate._smooth import _ls_gnmax, _ls_threshold


@_secrecy.refuse_pickling("a private vote histogram", copies=True,
                          instead="Publish the accountant's ledger instead.")
class PateEvent:
  """One PATE query with its actual outcome, as :class:`PateAccountant` composes it.

  A subclass states what the query costs; every RDP value is in nats and ``orders`` is a 1-D
  float64 array of Renyi orders in (1, inf] already checked by the caller (the accountant):

  * :attr:`ledger`: tuple of :mod:`analysis.events` (``GaussianEvent`` / ``LaplaceEvent``)
    describing the query data-independently (publishable: noise levels only).  When every
    event in an accountant's ledger is Gaussian, the data-independent epsilon is the exact
    composition of the ledger, so a Gaussian ledger must have the RDP
    :meth:`data_independent_rdp` states.
  * :meth:`data_independent_rdp` (orders): RDP that holds for every vote histogram.
  * :meth:`data_dependent_rdp` (orders): PRIVATE upper bound on the RDP at the actual votes,
    at most :meth:`data_independent_rdp`.
  * :meth:`local_sensitivity` (order, num_teachers) and :attr:`has_local_sensitivity`: with
    ``has_local_sensitivity`` True, bounds U^(d), d = 0..D, on the local sensitivity of
    :meth:`data_dependent_rdp` at ``order`` within distance d of the votes (non-decreasing,
    the last entry holding at every larger distance), and the smooth-sensitivity release
    sanitises this event's data-dependent RDP; False (the default): the event enters the
    sanitised value with its data-independent RDP and contributes 0 to the smooth
    sensitivity.
  * :attr:`answered`: whether the query released the teachers' answer (default True).
  * :meth:`parts`: events accounted one by one (a query made of several mechanisms, e.g.
    Confident GNMax's check and answer); default ``(self,)``.
  * :meth:`check_num_teachers`: raise ``ValueError`` when the event cannot come from the
    accountant's ``num_teachers`` teachers (default: nothing to check).

  Vectorised evaluation (optional): events of one class with equal, non-None
  :attr:`batch_key` (which must then agree in :attr:`has_local_sensitivity`) are evaluated
  together by the class methods :meth:`batch_rdp` and
  :meth:`batch_data_independent_rdp` (default: the sum of the events' own values).

  Events hold the votes, so they cannot be pickled (:mod:`analysis._secrecy`) and their
  ``repr`` hides them.
  """

  has_local_sensitivity = False

  @property
  def ledger(self) -> tuple:
    raise NotImplementedError(f"{type(self).__name__} must define ledger.")

  def data_dependent_rdp(self, orders: np.ndarray) -> np.ndarray:
    raise NotImplementedError(f"{type(self).__name__} must define data_dependent_rdp.")

  def data_independent_rdp(self, orders: np.ndarray) -> np.ndarray:
    raise NotImplementedError(f"{type(self).__name__} must define data_independent_rdp.")

  def local_sensitivity(self, order: float,
                        num_teachers: Optional[int]) -> Optional[np.ndarray]:
    """U^(d) at ``order`` (see the class docstring); None without a local-sensitivity bound.

    ``num_teachers``: the accountant's (None: the event's own number of votes).
    """
    del order, num_teachers
    return None

  @property
  def answered(self) -> bool:
    return True

  def parts(self) -> tuple:
    return (self,)

  def check_num_teachers(self, num_teachers: Optional[int]) -> None:
    del num_teachers

  @property
  def batch_key(self):
    return None

  @classmethod
  def batch_rdp(cls, batch: Sequence["PateEvent"], orders: np.ndarray) -> np.ndarray:
    """Sum of the data-dependent RDP of ``batch`` (events of this class, equal batch_key)."""
    return sum((event.data_dependent_rdp(orders) for event in batch), np.zeros(orders.shape))

  @classmethod
  def batch_data_independent_rdp(cls, batch: Sequence["PateEvent"],
                                 orders: np.ndarray) -> np.ndarray:
    """Sum of the data-independent RDP of ``batch`` (events of this class, equal batch_key)."""
    return sum((event.data_independent_rdp(orders) for event in batch),
               np.zeros(orders.shape))

  def _params(self) -> str:
    return ""

  def __repr__(self):
    return f"{type(self).__name__}({self._params()})"


def _teachers(num_teachers: Optional[int], votes: np.ndarray) -> int:
  """The distance at which every histogram is in reach."""
  return num_teachers or max(1, int(votes.sum()))


def _check_votes_fit(votes: np.ndarray, num_teachers: Optional[int]) -> None:
  if num_teachers is not None and votes.sum() > num_teachers:
    raise ValueError(f"votes must hold at most num_teachers = {num_teachers} votes, "
                     f"got {votes.sum():g}.")


def _check_answered(answered) -> bool:
  if not isinstance(answered, (bool, np.bool_)):
    raise ValueError(f"answered must be a bool, got {answered!r}.")
  return bool(answered)


class _VotesEvent(PateEvent):
  """A built-in event on a vote histogram ``votes``, evaluated by its class's batch methods."""

  votes: np.ndarray

  def check_num_teachers(self, num_teachers):
    _check_votes_fit(self.votes, num_teachers)

  def data_dependent_rdp(self, orders):
    return self.batch_rdp([self], orders)

  def data_independent_rdp(self, orders):
    return self.batch_data_independent_rdp([self], orders)


class GNMaxEvent(_VotesEvent):
  """One GNMax answer ``argmax_j (votes_j + N(0, sigma^2))`` (PATE 2018).

  Data-independent: ``GaussianEvent(sigma / sqrt(2))``, RDP lambda / sigma^2; data-dependent:
  Theorem 6 with Proposition 7's q (:func:`analysis.pate.rdp_gnmax`).

  Args:
    votes: per-class vote counts (non-negative integers, at least one class).
    sigma: noise standard deviation in votes, finite and > 0.
  """

  has_local_sensitivity = True

  def __init__(self, votes, sigma: float):
    self.votes = _check_votes("votes", votes)
    self.sigma = _checks.check_finite_positive("sigma", sigma)
    self.logq = _log_q_gnmax(self.votes, self.sigma)

  @property
  def ledger(self) -> tuple:
    return (events.GaussianEvent(self.sigma / _SQRT2),)

  @property
  def batch_key(self):
    return self.sigma

  @classmethod
  def batch_rdp(cls, batch, orders):
    return _theorem6(np.array([e.logq for e in batch]), batch[0].sigma, orders).sum(axis=0)

  @classmethod
  def batch_data_independent_rdp(cls, batch, orders):
    return len(batch) * orders / batch[0].sigma**2

  def local_sensitivity(self, order, num_teachers):
    return _ls_gnmax(self.votes, _teachers(num_teachers, self.votes), self.sigma, order)

  def _params(self):
    return f"votes=<hidden>, sigma={self.sigma:g}"


class ThresholdCheckEvent(_VotesEvent):
  """The check ``max_j checked_j + N(0, sigma1^2) >= threshold`` of Confident / Interactive
  GNMax (PATE 2018, Algorithms 1 and 2); it releases only whether the check passed.

  Data-independent: ``GaussianEvent(sigma1)`` (sensitivity 1), RDP lambda / (2 sigma1^2);
  data-dependent: :func:`analysis.pate.rdp_threshold`.  Composed on its own it counts as one
  query, not answered.

  Args:
    votes: per-class vote counts (non-negative integers); their total is the number of
      teachers when the accountant has none.
    threshold: T in votes, a finite real.
    sigma1: noise standard deviation in votes, finite and > 0.
    thresholded_votes: None (the check runs on ``votes``) or Interactive GNMax's shifted
      histogram ``votes - alpha * p`` (any finite reals, one per class) that the check runs on.
  """

  has_local_sensitivity = True

  def __init__(self, votes, threshold: float, sigma1: float, thresholded_votes=None):
    self.votes = _check_votes("votes", votes)
    self.shifted = thresholded_votes is not None
    if self.shifted:
      checked = _check_votes("thresholded_votes", thresholded_votes, shifted=True)
      if checked.size != self.votes.size:
        raise ValueError(f"thresholded_votes must have one entry per class "
                         f"({self.votes.size}), got {checked.size}.")
    else:
      checked = self.votes
    self.checked = checked
    self.threshold = _check_finite_real("threshold", threshold)
    self.sigma1 = _checks.check_finite_positive("sigma1", sigma1)
    self.logq = _threshold_logq(_log_pr_answered(checked, self.threshold, self.sigma1))

  @property
  def ledger(self) -> tuple:
    return (events.GaussianEvent(self.sigma1),)

  @property
  def answered(self) -> bool:
    return False

  @property
  def batch_key(self):
    return self.sigma1

  @classmethod
  def batch_rdp(cls, batch, orders):
    return _theorem6(np.array([e.logq for e in batch]), _SQRT2 * batch[0].sigma1,
                     orders).sum(axis=0)

  @classmethod
  def batch_data_independent_rdp(cls, batch, orders):
    return len(batch) * orders / (2.0 * batch[0].sigma1**2)

  def local_sensitivity(self, order, num_teachers):
    return _ls_threshold(self.checked, _teachers(num_teachers, self.votes), self.threshold,
                         self.sigma1, order, self.shifted)

  def _params(self):
    return (f"votes=<hidden>, threshold={self.threshold:g}, sigma1={self.sigma1:g}"
            + (", thresholded_votes=<hidden>" if self.shifted else ""))


class LNMaxEvent(_VotesEvent):
  """One LNMax answer ``argmax_j (votes_j + Lap(laplace_scale))`` (PATE 2017).

  Data-independent: ``LaplaceEvent(b / 2)`` (L1 sensitivity 2), RDP
  :func:`analysis.pate.rdp_lnmax_data_independent`; data-dependent:
  :func:`analysis.pate.rdp_lnmax`.  No smooth-sensitivity bound: it enters the sanitised value
  data-independently.

  Args:
    votes: per-class vote counts (non-negative integers).
    laplace_scale: b in votes, finite and > 0.
  """

  def __init__(self, votes, laplace_scale: float):
    self.votes = _check_votes("votes", votes)
    self.laplace_scale = _checks.check_finite_positive("laplace_scale", laplace_scale)
    self.logq = _log_q_lnmax(self.votes, self.laplace_scale)

  @property
  def ledger(self) -> tuple:
    return (events.LaplaceEvent(self.laplace_scale / 2.0),)

  @property
  def batch_key(self):
    return self.laplace_scale

  @classmethod
  def batch_rdp(cls, batch, orders):
    return _lnmax_from_logq(np.array([e.logq for e in batch]), 2.0 / batch[0].laplace_scale,
                            orders).sum(axis=0)

  @classmethod
  def batch_data_independent_rdp(cls, batch, orders):
    return len(batch) * _lnmax_independent(2.0 / batch[0].laplace_scale, orders)

  def _params(self):
    return f"votes=<hidden>, laplace_scale={self.laplace_scale:g}"


class _CompositeEvent(PateEvent):
  """A query made of several events, accounted part by part (:meth:`parts`)."""

  _parts: tuple = ()
  _answered: bool = True

  def parts(self) -> tuple:
    return self._parts

  @property
  def answered(self) -> bool:
    return self._answered

  @property
  def ledger(self) -> tuple:
    return tuple(e for part in self._parts for e in part.ledger)

  def check_num_teachers(self, num_teachers):
    for part in self._parts:
      part.check_num_teachers(num_teachers)

  def data_dependent_rdp(self, orders):
    return sum((p.data_dependent_rdp(orders) for p in self._parts), np.zeros(orders.shape))

  def data_independent_rdp(self, orders):
    return sum((p.data_independent_rdp(orders) for p in self._parts), np.zeros(orders.shape))


class ConfidentGNMaxEvent(_CompositeEvent):
  """One Confident GNMax query (PATE 2018, Algorithm 1) with its actual outcome.

  The :class:`ThresholdCheckEvent` (noise ``sigma1``) is always paid, the :class:`GNMaxEvent`
  (noise ``sigma2``) only when ``answered`` (a bool) is True.

  Args:
    votes: per-class vote counts (non-negative integers).
    threshold: T in votes, a finite real.
    sigma1: the threshold check's noise standard deviation in votes, finite and > 0.
    sigma2: the GNMax answer's noise standard deviation in votes, finite and > 0.
    answered: bool, whether the check passed (the teachers answered).
  """

  def __init__(self, votes, threshold: float, sigma1: float, sigma2: float, answered: bool):
    self._build(ThresholdCheckEvent(votes, threshold, sigma1), sigma2, answered)

  def _build(self, check: ThresholdCheckEvent, sigma2: float, answered: bool) -> None:
    self.sigma2 = _checks.check_finite_positive("sigma2", sigma2)
    self._answered = _check_answered(answered)
    self._parts = ((check, GNMaxEvent(check.votes, self.sigma2)) if self._answered
                   else (check,))

  def _params(self):
    check = self._parts[0]
    return (f"votes=<hidden>, threshold={check.threshold:g}, sigma1={check.sigma1:g}, "
            f"sigma2={self.sigma2:g}, answered={self._answered}")


class InteractiveGNMaxEvent(ConfidentGNMaxEvent):
  """One Interactive GNMax query (PATE 2018, Algorithm 2) with its actual outcome.

  The check runs on ``thresholded_votes`` (= votes - alpha * student probabilities: any
  finite reals, one per class) and is always paid; GNMax (noise ``sigma2``) on ``votes`` only
  when ``answered`` is True (a query the student answers itself costs only the check).
  """

  def __init__(self, votes, thresholded_votes, threshold: float, sigma1: float, sigma2: float,
               answered: bool):  # pylint: disable=super-init-not-called
    if thresholded_votes is None:
      raise ValueError("thresholded_votes must be a 1-D array of real numbers (one per "
                       "class), got None.")
    self._build(ThresholdCheckEvent(votes, threshold, sigma1, thresholded_votes), sigma2,
                answered)


def _atomic_parts(event: PateEvent, out: list, depth: int = 0) -> None:
  """``event``'s parts, recursively, into ``out`` (an event whose parts are itself is atomic)."""
  parts = event.parts()
  if not isinstance(parts, tuple) or not all(isinstance(p, PateEvent) for p in parts):
    raise ValueError(f"{type(event).__name__}.parts() must return a tuple of PateEvent, got "
                     f"{parts!r:.80}.")
  if parts == (event,):
    out.append(event)
    return
  if depth > 32:
    raise ValueError(f"{type(event).__name__}.parts() nests deeper than 32 levels.")
  for part in parts:
    _atomic_parts(part, out, depth + 1)


def _ledger_is_gaussian(event: PateEvent) -> bool:
  """Checks ``event.ledger``; True when it holds Gaussian releases only, False with Laplace."""
  ledger = event.ledger
  if not isinstance(ledger, tuple):
    raise ValueError(f"{type(event).__name__}.ledger must be a tuple of analysis.events "
                     f"GaussianEvent / LaplaceEvent, got {type(ledger).__name__}.")
  return all([_leaves_gaussian(type(event).__name__, e) for e in ledger])


def _leaves_gaussian(name: str, event) -> bool:
  if isinstance(event, events.GaussianEvent):
    return True
  if isinstance(event, events.LaplaceEvent):
    return False
  if isinstance(event, events.SelfComposedEvent):
    return _leaves_gaussian(name, event.event)
  if isinstance(event, events.ComposedEvent):
    return all([_leaves_gaussian(name, e) for e in event.events])
  raise ValueError(f"{name}.ledger must hold GaussianEvent / LaplaceEvent releases (and "
                   f"compositions of them), got {type(event).__name__}.")


__all__ = ["PateEvent", "GNMaxEvent", "ThresholdCheckEvent", "LNMaxEvent",
           "ConfidentGNMaxEvent", "InteractiveGNMaxEvent"]
