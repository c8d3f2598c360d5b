"""A sealed container for teacher vote histograms.

Votes are computed from the private data without noise, so they are as sensitive as the data:
releasing even one raw histogram is not differentially private.  :class:`TeacherVotes` keeps
them out of every ordinary output path: ``repr``/``str`` show only the shape, the object
cannot be pickled, copied, iterated, indexed or turned into an array, and the only way to the
counts is the explicitly named :meth:`TeacherVotes._unsafe_votes` (for tests and for the
privacy accountant, which needs the true counts for its data-dependent bound and whose own
results must then be sanitised -- see ``analysis.pate``).
"""
from __future__ import annotations

import numpy as np

from analysis import _checks, _secrecy


@_secrecy.refuse_pickling(
    "private, noiseless vote counts", copies=False,
    instead="Release them through an aggregator (tf_dpkit.pate.GNMax, ConfidentGNMax, ...).")
class TeacherVotes:
  """Integer vote histograms ``votes[q, c]`` = number of teachers that predict class ``c`` on
  public query ``q``, for ``q < num_queries`` and ``c < num_classes``.

  Every row sums to ``num_teachers``.  The counts never leave this object except through
  :meth:`_unsafe_votes`; aggregators (:mod:`tf_dpkit.pate.aggregators`) read them to release
  noisy answers only.
  """

  __slots__ = ("_votes", "num_teachers")

  def __init__(self, votes):
    """Args:
      votes: integer array-like of shape [num_queries, num_classes], entries >= 0, every row
        with the same sum (the number of teachers, >= 1); num_classes >= 2.
    """
    array = np.asarray(votes)
    if array.ndim != 2 or array.shape[1] < 2:
      raise ValueError(f"votes must be a 2-D array [num_queries, num_classes >= 2], got shape "
                       f"{array.shape}.")
    if not (np.issubdtype(array.dtype, np.integer) or
            (np.issubdtype(array.dtype, np.floating) and np.all(np.isfinite(array)) and
             np.all(array == np.round(array)))):
      raise ValueError(f"votes must hold integer counts, got dtype {array.dtype}.")
    array = array.astype(np.int64)
    if array.size and array.min() < 0:
      raise ValueError("votes must be counts >= 0; some are negative.")
    sums = array.sum(axis=1)
    if array.shape[0] and (sums.min() != sums.max() or sums[0] < 1):
      raise ValueError(
          "votes must be vote histograms [num_queries, num_classes] (entry [q, j]: how many "
          "teachers chose class j on query q) with the same total >= 1 (the number of teachers) "
          "in every row; the rows' totals differ or are 0. A [num_queries, num_teachers] matrix "
          "of the teachers' predicted classes converts with "
          "TeacherVotes.from_predictions(predictions, num_classes).")
    array.setflags(write=False)
    self._votes = array
    self.num_teachers = int(sums[0]) if array.shape[0] else 0

  @classmethod
  def from_predictions(cls, predictions, num_classes: int) -> TeacherVotes:
    """Counts teacher predictions: ``predictions[q, t]`` is teacher ``t``'s class in
    [0, num_classes) on query ``q``; returns the histograms ``[num_queries, num_classes]``."""
    num_classes = _checks.check_integer("num_classes", num_classes, minimum=2)
    predictions = np.asarray(predictions)
    if predictions.ndim != 2 or predictions.shape[1] < 1:
      raise ValueError(f"predictions must be a 2-D array [num_queries, num_teachers >= 1], got "
                       f"shape {predictions.shape}.")
    if predictions.size and (predictions.min() < 0 or predictions.max() >= num_classes):
      raise ValueError(f"predictions must be classes in [0, {num_classes}), got values in "
                       f"[{predictions.min()}, {predictions.max()}].")
    rows = np.repeat(np.arange(predictions.shape[0]), predictions.shape[1])
    counts = np.zeros((predictions.shape[0], num_classes), np.int64)
    np.add.at(counts, (rows, predictions.reshape(-1).astype(np.int64)), 1)
    return cls(counts)

  @property
  def num_queries(self) -> int:
    return int(self._votes.shape[0])

  @property
  def num_classes(self) -> int:
    return int(self._votes.shape[1])

  @property
  def shape(self) -> tuple[int, int]:
    return (self.num_queries, self.num_classes)

  def __len__(self):
    return self.num_queries

  def _unsafe_votes(self, indices=None) -> np.ndarray:
    """UNSAFE: returns a copy of the raw, noiseless counts (rows ``indices``, default all).

    Releasing them is not differentially private.  Only for tests, for noise-free diagnostics
    that are never published, and for the privacy accountant's data-dependent analysis.
    """
    if indices is None:
      return self._votes.copy()
    return self._votes[np.asarray(indices, dtype=np.int64)].copy()

  def __repr__(self):
    return (f"TeacherVotes(<hidden>, num_queries={self.num_queries}, "
            f"num_classes={self.num_classes}, num_teachers={self.num_teachers})")

  __str__ = __repr__

  def _refuse(self, *args, **kwargs):
    raise TypeError("TeacherVotes holds private, noiseless counts: it cannot be pickled, copied, "
                    "iterated or converted to an array. Release them through an aggregator "
                    "(tf_dpkit.pate.GNMax, ConfidentGNMax, ...); tests may call _unsafe_votes().")

  __iter__ = __getitem__ = __array__ = _refuse

  def __format__(self, spec):
    return repr(self)


def as_votes(votes) -> TeacherVotes:
  """``votes`` as a :class:`TeacherVotes` (wrapping an array-like of counts)."""
  return votes if isinstance(votes, TeacherVotes) else TeacherVotes(votes)
