"""Public randomisation of generated rows: what a generator's release may add without cost.

Every function here reads generated examples and PUBLIC randomness only (a seed or a public
random generator), never real data, so applying it to a differentially private generator's
output is post-processing: the released table keeps the generator's epsilon.

* :func:`scale_about_mean`: ``x -> m + (x - m) f`` per example (``m`` the example's mean):
  the one rescaling rule, used by PATE-GAN's query rescaling
  (``PATEGAN(query_scale_noise=...)``) and by :func:`randomize_rows`.
* :func:`randomize_rows`: for rows that are sequences (a window cut at an arbitrary time from
  a longer signal), a uniform cyclic shift per row and a log-normal rescaling of its deviation
  from its mean.  A GAN whose discriminators read per-row summaries (PATE-GAN with
  :class:`~tf_dpkit.generative.RowStatistics` teachers) cannot see that every row has the same
  waveform or the same amplitude -- each teacher labels one row at a time -- and collapses to
  one; the shift restores the diversity of phase, the rescaling that of amplitude
  (docs/design/generative.md, "Tables").
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from analysis import _checks

__all__ = ["randomize_rows", "scale_about_mean"]


def scale_about_mean(x, factor):
  """``m + (x - m) * factor`` with ``m`` the mean of each example over all its entries.

  Args:
    x: ``[B, ...]`` float tensor or array of examples, rank >= 2.
    factor: ``[B]`` finite factors > 0, one per example (``1``: unchanged).  Checked when
      its values are known (eager); inside a traced function the caller guarantees them (the
      PATE-GAN query rescaling draws ``exp(s e)``, always finite and > 0 for finite ``s``).

  Returns:
    A float32 tensor of ``x``'s shape, not clipped; each example keeps its mean, and its
    deviation from it (hence its standard deviation and those of its differences) is
    multiplied by ``factor``.
  """
  x = tf.convert_to_tensor(x, tf.float32)
  factor = tf.cast(tf.convert_to_tensor(factor), tf.float32)
  if x.shape.rank is None or x.shape.rank < 2:
    raise ValueError(f"x must be a [B, ...] batch of examples (rank >= 2), got shape {x.shape}.")
  if factor.shape.rank != 1:
    raise ValueError(f"factor must be a [B] vector (one per example), got shape {factor.shape}.")
  if x.shape[0] is not None and factor.shape[0] is not None and x.shape[0] != factor.shape[0]:
    raise ValueError(f"factor must hold one value per example: {x.shape[0]} examples, "
                     f"{factor.shape[0]} factors.")
  if tf.executing_eagerly():
    values = factor.numpy()
    if not (np.isfinite(values).all() and (values > 0).all()):
      raise ValueError(f"factor must be finite and > 0, got min {values.min()!r}, "
                       f"max {values.max()!r}.")
  return _rescaled(x, factor)


def _rescaled(x, factor):
  """:func:`scale_about_mean` without its checks, for callers whose ``factor`` is ``exp`` of
  a finite draw (PATE-GAN's queries, every training step): float32 ``x [B, ...]``, ``[B]``."""
  axes = list(range(1, x.shape.rank))
  mean = tf.reduce_mean(x, axis=axes, keepdims=True)
  return mean + (x - mean) * tf.reshape(factor, [-1] + [1] * len(axes))


def randomize_rows(rows, *, shift=True, log_scale_std=0.0, seed=0, low=0.0, high=1.0):
  """Public randomisation of generated rows ``[n, L]``: cyclic shift, then rescaling.

  Row ``i`` becomes ``clip(m_i + (roll(r_i, s_i) - m_i) exp(log_scale_std e_i), low, high)``
  with ``s_i`` uniform on ``{0, ..., L-1}`` (when ``shift``), ``e_i ~ N(0, 1)`` and ``m_i`` the
  row's mean, all drawn from ``numpy.random.default_rng(seed)`` (public).  The shift keeps a
  row's values (its level and spread; its differences change at the one wrap-around point);
  the rescaling multiplies its spread by a log-normal factor of median 1.

  Args:
    rows: ``[n, L]`` finite generated rows (never real data: this is a release step).
    shift: bool, draw a cyclic shift per row.
    log_scale_std: finite, >= 0: the std of ``log`` of the rescaling factor (0: none).
    seed: integer in [0, 2**63): the public randomness.
    low: finite lower bound of the value range (the unit scale's 0 by default).
    high: finite upper bound, > low.

  Returns:
    float32 ``[n, L]`` array.
  """
  rows = np.asarray(rows, np.float32)
  if rows.ndim != 2 or rows.shape[1] < 1 or not np.isfinite(rows).all():
    raise ValueError(f"rows must be a finite [n, L] array, got shape {rows.shape}.")
  if not isinstance(shift, bool):
    raise ValueError(f"shift must be True or False, got {shift!r}.")
  log_scale_std = _checks.check_finite_nonnegative("log_scale_std", log_scale_std)
  seed = _checks.check_integer("seed", seed, minimum=0, maximum=2**63 - 1)
  low = _checks.check_real("low", low)
  high = _checks.check_real("high", high)
  if not (np.isfinite(low) and np.isfinite(high) and low < high):
    raise ValueError(f"low and high must be finite with low < high, got {low!r}, {high!r}.")
  rng = np.random.default_rng(seed)
  n, length = rows.shape
  if shift:
    offsets = rng.integers(0, length, n)
    index = (np.arange(length)[None, :] - offsets[:, None]) % length
    rows = np.take_along_axis(rows, index, axis=1)  # row i rolled right by offsets[i]
  if log_scale_std:
    factor = np.exp(log_scale_std * rng.standard_normal(n)).astype(np.float32)
    rows = _rescaled(tf.constant(rows), tf.constant(factor)).numpy()
  return np.clip(rows, low, high).astype(np.float32)
