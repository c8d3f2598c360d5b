"""Noisy aggregation of teacher votes: LNMax, GNMax, Confident GNMax, Interactive GNMax.

Each aggregator holds the sealed :class:`~tf_dpkit.pate.votes.TeacherVotes` of the public
queries and answers queries by index; every answer records its actual outcome into a
:class:`analysis.pate.PateAccountant` (:attr:`Aggregator.accountant`):

* :class:`LNMax`: ``argmax_j n_j + Lap(b)`` (``compose_lnmax``);
* :class:`GNMax`: ``argmax_j n_j + N(0, sigma^2)`` (``compose_gnmax``);
* :class:`ConfidentGNMax` (PATE 2018, Algorithm 1): if ``max_j n_j + N(0, sigma1^2) >= T``
  the GNMax answer with ``sigma2``, else no answer (``compose_confident_gnmax``);
* :class:`InteractiveGNMax` (PATE 2018, Algorithm 2), with the student's probabilities ``p``:
  if ``max_j (n_j - alpha p_j) + N(0, sigma1^2) >= T`` the GNMax answer with ``sigma2``;
  elif ``max_j p_j > gamma`` the student's own ``argmax_j p_j``; else no answer
  (``compose_interactive_gnmax``).

Here ``n_j`` is the number of teachers voting for class ``j`` on the query.
All noise is on the vote scale (units: votes), independent per class and per query.

Noise is secret and keyed like the DP optimizers' (:mod:`tf_dpkit.noise`): the key comes from
:func:`tf_dpkit.noise.fresh_key` (OS entropy, or an explicit ``seed`` for reproducible
experiments); every call of :meth:`Aggregator.query` draws from the stateless stream
``fold_in((key, draw), stream)`` with ``draw`` a counter that grows by one per call, so two
queries never share noise and, with a seed, the same sequence of calls gives the same answers.
Gaussian noise is :func:`tf_dpkit.noise.stateless_standard_normal` (float64 uniforms, Box-
Muller); Laplace(b) noise is ``b (E1 - E2)`` with ``E = -log(1 - U)`` exponentials of stateless
float64 uniforms ``U`` in [0, 1).  The key lives only in this process: no ``repr``, config,
pickle or checkpoint holds it (aggregators cannot be pickled).
"""
from __future__ import annotations

import dataclasses
import warnings

import numpy as np

from analysis import _checks, _secrecy
from analysis import pate as pate_analysis
from tf_dpkit import noise as _noise
from tf_dpkit.pate.votes import TeacherVotes, as_votes

# Streams folded into each draw's seed.
_THRESHOLD, _ANSWER = 1, 2


@dataclasses.dataclass(frozen=True)
class Answers:
  """Released outcome of a batch of queries (all fields are public outputs).

  Attributes:
    indices: int64 ``[n]`` query indices, as asked.
    labels: int64 ``[n]``: the released label, or -1 where there is none.
    answered: bool ``[n]``: True where the teachers answered (a noisy-argmax label).
    student_labeled: bool ``[n]``: True where Interactive GNMax kept the student's own label
      (always False for the other aggregators).
  """
  indices: np.ndarray
  labels: np.ndarray
  answered: np.ndarray
  student_labeled: np.ndarray

  @property
  def labeled(self) -> np.ndarray:
    """bool ``[n]``: a label was released (by the teachers or, interactive, the student)."""
    return self.labels >= 0


@_secrecy.refuse_pickling("private votes and a secret noise key", copies=False)
class Aggregator:
  """Base class: holds the votes, the secret key, the draw counter and the accountant.

  Args:
    votes: a :class:`TeacherVotes` (or integer counts ``[num_queries, num_classes]``).
    seed: None (secret key from the OS entropy source: use this for real releases) or an
      integer in [0, 2**62) for reproducible experiments (a known seed reveals the noise).
    accountant: an ``analysis.pate.PateAccountant`` to record into; default a new one with
      ``num_teachers`` = the votes' row total.
  """

  def __init__(self, votes, *, seed: int | None = None, accountant=None):
    self._votes = as_votes(votes)
    self._key = _noise.fresh_key(seed)
    self._draws = 0
    if accountant is None:
      accountant = pate_analysis.PateAccountant(num_teachers=max(1, self._votes.num_teachers))
    elif not isinstance(accountant, pate_analysis.PateAccountant):
      raise ValueError(f"accountant must be an analysis.pate.PateAccountant, got "
                       f"{type(accountant).__name__}.")
    elif (accountant.num_teachers is not None
          and accountant.num_teachers < self._votes.num_teachers):
      # Checked here, before any noise is drawn or any query recorded.
      raise ValueError(f"accountant was made for num_teachers={accountant.num_teachers}, but "
                       f"the votes come from {self._votes.num_teachers} teachers; make it "
                       f"with num_teachers >= {self._votes.num_teachers}.")
    self.accountant = accountant

  # -- public description ----------------------------------------------------------------------
  @property
  def num_queries(self) -> int:
    """Number of public queries whose votes this aggregator holds."""
    return self._votes.num_queries

  @property
  def num_classes(self) -> int:
    return self._votes.num_classes

  @property
  def num_teachers(self) -> int:
    return self._votes.num_teachers

  @property
  def draws(self) -> int:
    """Calls of :meth:`query` so far (each used fresh noise)."""
    return self._draws

  def __repr__(self):
    return (f"{type(self).__name__}({self._params()}, num_queries={self.num_queries}, "
            f"num_classes={self.num_classes}, votes=<hidden>, key=<hidden>)")

  __str__ = __repr__

  def _params(self) -> str:
    raise NotImplementedError

  # -- noise -------------------------------------------------------------------------------------
  def _seeds(self):
    """Fresh stateless seeds for this call's two streams; advances the draw counter."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    base = tf.stack([self._key.tensor(), tf.constant(self._draws, tf.int64)])
    self._draws += 1
    return {s: tf.random.experimental.stateless_fold_in(base, tf.constant(s, tf.int64))
            for s in (_THRESHOLD, _ANSWER)}

  @staticmethod
  def _gaussian(shape, seed) -> np.ndarray:
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    return _noise.stateless_standard_normal(tf.TensorShape(shape), seed, tf.float64).numpy()

  @staticmethod
  def _laplace(shape, seed) -> np.ndarray:
    """Standard Laplace (scale 1) samples: E1 - E2 with E = -log(1 - U), U ~ U[0, 1)."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    u = tf.random.stateless_uniform([2, *shape], seed=seed, dtype=tf.float64)
    e = -tf.math.log1p(-u)  # finite: 1 - u in (0, 1]
    return (e[0] - e[1]).numpy()

  # -- queries -----------------------------------------------------------------------------------
  def _indices(self, indices) -> np.ndarray:
    if isinstance(indices, (int, np.integer)) and not isinstance(indices, bool):
      indices = [indices]
    array = np.asarray(indices)
    if array.ndim != 1 or not (array.size == 0 or np.issubdtype(array.dtype, np.integer)):
      raise ValueError(f"indices must be a 1-D sequence of integers, got {indices!r:.80}.")
    if array.size and (array.min() < 0 or array.max() >= self.num_queries):
      raise ValueError(f"indices must be in [0, {self.num_queries}) (the public queries), got "
                       f"values in [{array.min()}, {array.max()}].")
    return array.astype(np.int64)

  def query(self, indices, *args, **kwargs) -> Answers:
    """Answers the queries ``indices`` (public query numbers) with fresh noise and records each
    outcome in :attr:`accountant`; returns the released :class:`Answers`."""
    raise NotImplementedError


def _argmax(values: np.ndarray) -> np.ndarray:
  return np.argmax(values, axis=1).astype(np.int64)


class LNMax(Aggregator):
  """PATE 2017's Laplace noisy max: ``argmax_j (n_j + Lap(laplace_scale))``, always answers.

  Args:
    votes: see :class:`Aggregator`.
    seed: see :class:`Aggregator`.
    accountant: see :class:`Aggregator`.
    laplace_scale: b, the Laplace scale in votes, finite and > 0 (PATE 2017 used b = 20,
      i.e. gamma = 1/b = 0.05, for MNIST); each answer is (2/b)-DP data-independently.
  """

  def __init__(self, votes, laplace_scale: float, *, seed=None, accountant=None):
    self.laplace_scale = _checks.check_finite_positive("laplace_scale", laplace_scale)
    super().__init__(votes, seed=seed, accountant=accountant)

  def _params(self):
    return f"laplace_scale={self.laplace_scale:g}"

  def query(self, indices) -> Answers:
    idx = self._indices(indices)
    counts = self._votes._unsafe_votes(idx)  # pylint: disable=protected-access
    seeds = self._seeds()
    noisy = counts + self.laplace_scale * self._laplace(counts.shape, seeds[_ANSWER])
    labels = _argmax(noisy)
    for row in counts:
      self.accountant.compose_lnmax(row, self.laplace_scale)
    ones = np.ones(idx.size, bool)
    return Answers(idx, labels, ones, ~ones)


class GNMax(Aggregator):
  """PATE 2018's Gaussian noisy max: ``argmax_j (n_j + N(0, sigma^2))``, always answers.

  Args:
    votes: see :class:`Aggregator`.
    seed: see :class:`Aggregator`.
    accountant: see :class:`Aggregator`.
    sigma: noise standard deviation in votes, finite and > 0.
  """

  def __init__(self, votes, sigma: float, *, seed=None, accountant=None):
    self.sigma = _checks.check_finite_positive("sigma", sigma)
    super().__init__(votes, seed=seed, accountant=accountant)

  def _params(self):
    return f"sigma={self.sigma:g}"

  def query(self, indices) -> Answers:
    idx = self._indices(indices)
    counts = self._votes._unsafe_votes(idx)  # pylint: disable=protected-access
    seeds = self._seeds()
    labels = _argmax(counts + self.sigma * self._gaussian(counts.shape, seeds[_ANSWER]))
    for row in counts:
      self.accountant.compose_gnmax(row, self.sigma)
    ones = np.ones(idx.size, bool)
    return Answers(idx, labels, ones, ~ones)


class ConfidentGNMax(Aggregator):
  """PATE 2018, Algorithm 1: answer only when the teachers agree.

  For each query: if ``max_j n_j + N(0, sigma1^2) >= threshold`` release
  ``argmax_j (n_j + N(0, sigma2^2))``, else release nothing (label -1).  The check costs
  privacy for every query, the GNMax step only for answered ones (recorded by
  ``compose_confident_gnmax`` with the actual outcome).  The probability of an answer is
  ``Phi((max_j n_j - threshold) / sigma1)``.

  Args:
    votes: see :class:`Aggregator`.
    seed: see :class:`Aggregator`.
    accountant: see :class:`Aggregator`.
    threshold: T in votes, a finite real (PATE 2018's MNIST setting: 200 of 250 teachers).
    sigma1: std of the check's noise in votes, finite and > 0 (MNIST: 150).
    sigma2: std of the answer's noise in votes, finite and > 0 (MNIST: 40).
  """

  def __init__(self, votes, threshold: float = 200.0, sigma1: float = 150.0,
               sigma2: float = 40.0, *, seed=None, accountant=None):
    self.threshold = _checks.check_real("threshold", threshold)
    if not np.isfinite(self.threshold):
      raise ValueError(f"threshold must be a finite number of votes, got {threshold!r}.")
    self.sigma1 = _checks.check_finite_positive("sigma1", sigma1)
    self.sigma2 = _checks.check_finite_positive("sigma2", sigma2)
    super().__init__(votes, seed=seed, accountant=accountant)
    self._warn_if_not_scaled()

  def _warn_if_not_scaled(self):
    """Warns when the settings cannot suit this many teachers (PATE 2018's MNIST setting,
    200 / 150 / 40 for 250 teachers, scales with the number of teachers T)."""
    t = self._votes.num_teachers
    problems = []
    if self.threshold > t:
      problems.append(f"threshold={self.threshold:g} exceeds the {t} teachers' votes, so a "
                      "query passes only by noise")
    if self.sigma1 > t:
      problems.append(f"sigma1={self.sigma1:g} exceeds the number of teachers ({t})")
    if self.sigma2 > t / 2:
      problems.append(f"sigma2={self.sigma2:g} exceeds half the number of teachers ({t}), so "
                      "the noise swamps the votes")
    if problems:
      warnings.warn(
          f"ConfidentGNMax: {'; '.join(problems)}. PATE 2018's MNIST setting scaled to {t} "
          f"teachers is threshold={0.8 * t:g}, sigma1={0.6 * t:g}, sigma2={0.16 * t:g}.",
          UserWarning, stacklevel=3)

  def _params(self):
    return f"threshold={self.threshold:g}, sigma1={self.sigma1:g}, sigma2={self.sigma2:g}"

  def query(self, indices) -> Answers:
    idx = self._indices(indices)
    counts = self._votes._unsafe_votes(idx)  # pylint: disable=protected-access
    seeds = self._seeds()
    checked = counts.max(axis=1) + self.sigma1 * self._gaussian((idx.size,), seeds[_THRESHOLD])
    answered = checked >= self.threshold
    labels = _argmax(counts + self.sigma2 * self._gaussian(counts.shape, seeds[_ANSWER]))
    labels = np.where(answered, labels, -1)
    for row, ok in zip(counts, answered):
      self.accountant.compose_confident_gnmax(row, self.threshold, self.sigma1, self.sigma2,
                                              bool(ok))
    return Answers(idx, labels, answered, np.zeros(idx.size, bool))


class InteractiveGNMax(ConfidentGNMax):
  """PATE 2018, Algorithm 2 (interactive aggregator with a student baseline).

  For each query with the student's class probabilities ``p`` (a row summing to 1):

  * if ``max_j (n_j - alpha p_j) + N(0, sigma1^2) >= threshold`` (the teachers disagree with
    the student): release the GNMax answer ``argmax_j (n_j + N(0, sigma2^2))``;
  * elif ``max_j p_j > gamma`` (the student agrees and is confident): keep the student's label
    ``argmax_j p_j`` (costs only the check);
  * else: no label.

  ``alpha`` defaults to the number of teachers M (the paper's ``n - M p``).  The check costs
  privacy for every query (on the shifted histogram), GNMax only where the teachers answered
  (``compose_interactive_gnmax``).  The student's probabilities must come from a student
  trained on earlier answers only (post-processing), never from the private data.

  Args:
    votes: see :class:`ConfidentGNMax`.
    threshold: see :class:`ConfidentGNMax`.
    sigma1: see :class:`ConfidentGNMax`.
    sigma2: see :class:`ConfidentGNMax`.
    seed: see :class:`ConfidentGNMax`.
    accountant: see :class:`ConfidentGNMax`.
    alpha: weight of the student's probabilities in votes, finite and >= 0; None means the
      number of teachers.
    gamma: the student's confidence level in [0, 1].
  """

  def __init__(self, votes, threshold: float = 200.0, sigma1: float = 150.0,
               sigma2: float = 40.0, alpha: float | None = None, gamma: float = 0.9, *,
               seed=None, accountant=None):
    super().__init__(votes, threshold, sigma1, sigma2, seed=seed, accountant=accountant)
    self.alpha = (float(self.num_teachers) if alpha is None
                  else _checks.check_finite_nonnegative("alpha", alpha))
    self.gamma = _checks.check_probability("gamma", gamma)

  def _params(self):
    return f"{super()._params()}, alpha={self.alpha:g}, gamma={self.gamma:g}"

  def query(self, indices, student_probabilities) -> Answers:  # pylint: disable=arguments-differ
    """Args: ``indices`` as in :meth:`Aggregator.query`; ``student_probabilities``: float
    ``[len(indices), num_classes]``, each row in [0, 1] summing to 1 (within 1e-3)."""
    idx = self._indices(indices)
    p = np.asarray(student_probabilities, dtype=np.float64)
    if p.shape != (idx.size, self.num_classes):
      raise ValueError(f"student_probabilities must have shape [{idx.size}, "
                       f"{self.num_classes}] (one row per query), got {p.shape}.")
    if p.size and (not np.all(np.isfinite(p)) or p.min() < 0 or p.max() > 1 or
                   np.max(np.abs(p.sum(axis=1) - 1.0)) > 1e-3):
      raise ValueError("student_probabilities must be probabilities: entries in [0, 1], rows "
                       "summing to 1.")
    counts = self._votes._unsafe_votes(idx)  # pylint: disable=protected-access
    shifted = counts - self.alpha * p
    seeds = self._seeds()
    checked = shifted.max(axis=1) + self.sigma1 * self._gaussian((idx.size,), seeds[_THRESHOLD])
    answered = checked >= self.threshold
    teacher_labels = _argmax(counts + self.sigma2 * self._gaussian(counts.shape, seeds[_ANSWER]))
    student_kept = ~answered & (p.max(axis=1) > self.gamma) if p.size else ~answered
    labels = np.where(answered, teacher_labels, np.where(student_kept, _argmax(p), -1))
    for row, row_shifted, ok in zip(counts, shifted, answered):
      self.accountant.compose_interactive_gnmax(row, row_shifted, self.threshold, self.sigma1,
                                                self.sigma2, bool(ok))
    return Answers(idx, labels, answered, student_kept)


AGGREGATORS = {"lnmax": LNMax, "gnmax": GNMax, "confident_gnmax": ConfidentGNMax,
               "interactive_gnmax": InteractiveGNMax}
