"""Private selection of one candidate (a checkpoint, a hyper-parameter setting) on private
validation records: the Gaussian mechanism on per-candidate sums of bounded per-record scores.

Contract: ``record_scores[i, k]`` in [0, 1] is what validation record i contributes to candidate
k's score (e.g. 1 when the classifier of candidate k labels record i correctly).  Adding or
removing one record moves the vector of K sums by at most ``sqrt(K)`` in L2 norm, so adding
``N(0, (noise_multiplier * sqrt(K))^2)`` to each sum is one Gaussian mechanism with that
noise multiplier (``analysis.events.GaussianEvent``; the same bound holds when one record is
replaced), whatever the candidates are, provided each score reads only its own record and
the candidates were produced without reading the records, or by earlier DP mechanisms
(e.g. the training itself, on the same records) whose cost is composed with this one
(adaptive composition).  The noisy sums and their arg-max are released; nothing else about
the records is.  Design and the composition with training: docs/design/generative.md
("Choosing a checkpoint privately").
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import tensorflow as tf

from analysis import _checks
from analysis import events as _events
from tf_dpkit import noise

__all__ = ["Selection", "select_privately"]


@dataclasses.dataclass(frozen=True)
class Selection:
  """What :func:`select_privately` releases.

  Attributes:
    index: the chosen candidate, ``argmax_k noisy_scores[k]`` (the first on ties).
    noisy_scores: ``[K]`` float64, each candidate's sum of record scores plus its noise.
    noise_stddev: the noise standard deviation per sum, ``noise_multiplier * sqrt(K)``.
    event: the mechanism, ``analysis.events.GaussianEvent(noise_multiplier)``.
  """
  index: int
  noisy_scores: np.ndarray
  noise_stddev: float
  event: _events.GaussianEvent


def select_privately(record_scores, noise_multiplier, *, seed=None, ledger=None) -> Selection:
  """Chooses the candidate with the largest noisy sum of per-record scores.

  ``S_k = sum_i record_scores[i, k]``; released ``S_k + sqrt(K) * noise_multiplier * Z_k``,
  ``Z_k ~ N(0, 1)`` independent, and their arg-max.  With each row in ``[0, 1]^K`` one record
  moves ``S`` by at most ``sqrt(K)`` (L2; add-or-remove-one adjacency), so this is the
  Gaussian mechanism of noise multiplier ``noise_multiplier``: Renyi DP
  ``alpha / (2 noise_multiplier^2)`` at every order alpha > 1.

  Args:
    record_scores: ``[n, K]`` array, n >= 0 records, K >= 1 candidates, every value finite
      and in [0, 1] (values outside are refused, not clipped: a score outside the range would
      break the sensitivity bound).
    noise_multiplier: sigma, finite and > 0 (noise std / L2 sensitivity).
    seed: ``None`` (default: a secret key from the OS entropy source, as the guarantee needs)
      or an integer in [0, 2**62) for reproducible noise (tests only).
    ledger: optional :class:`tf_dpkit.budget.PrivacyLedger`; the mechanism is recorded in it
      as one step of sampling probability 1 (the Gaussian mechanism itself), so its epsilon
      composes with the training the ledger already holds.  Only this ledger is updated: a
      copy of the training's ledger held elsewhere (e.g. a DP optimizer's ``privacy_ledger``
      variable) does not include the choice.

  Returns:
    A :class:`Selection`.

  Raises:
    ValueError: an argument out of range (the message names it).
  """
  sigma = _checks.check_finite_positive("noise_multiplier", noise_multiplier)
  scores = np.asarray(record_scores, dtype=np.float64)
  if scores.ndim != 2 or scores.shape[1] < 1:
    raise ValueError(f"record_scores must be a 2-D array [n records, K >= 1 candidates], got "
                     f"shape {scores.shape}.")
  if not np.all(np.isfinite(scores)) or np.any(scores < 0.0) or np.any(scores > 1.0):
    raise ValueError("record_scores must hold finite values in [0, 1] (one record's "
                     "contribution to each candidate's score); got values outside that range.")
  num_candidates = scores.shape[1]
  stddev = sigma * math.sqrt(num_candidates)
  key = noise.fresh_key(seed)
  sums = tf.constant(scores.sum(axis=0), tf.float64)
  noisy = noise.add_gaussian_noise([sums], stddev, key, step=0)[0].numpy()
  if ledger is not None:
    ledger.record(1.0, sigma, 1)
  return Selection(index=int(np.argmax(noisy)), noisy_scores=noisy, noise_stddev=stddev,
                   event=_events.GaussianEvent(sigma))
