"""Private per-channel normalisation statistics of features (the Gaussian mechanism, accounted).

Contract: :func:`private_channel_normalization` releases each channel's mean and variance over
all records and positions through one Gaussian mechanism on clipped per-record sums, whose
event it returns and, given a ledger, records; nothing else about the records is released.
Standardising training and test features with the released statistics is post-processing.
Design, the sensitivity argument and the composition with DP-SGD: docs/design/features.md.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import tensorflow as tf

from analysis import _checks
from analysis import events as _events
from tf_dpkit import noise

__all__ = ["ChannelNormalization", "private_channel_normalization"]

_CHUNK = 4096  # records per chunk when forming the per-record statistics


def _channel_axis(channel_axis, ndim: int) -> int:
  """``channel_axis`` as a non-negative axis of an ``ndim``-dimensional array, not the records'."""
  axis = _checks.check_integer("channel_axis", channel_axis, minimum=-ndim, maximum=ndim - 1)
  axis %= ndim
  if axis == 0:
    raise ValueError("channel_axis must not be 0 (the record axis).")
  return axis


@dataclasses.dataclass(frozen=True)
class ChannelNormalization:
  """What :func:`private_channel_normalization` releases, and how to apply it.

  Attributes:
    mean: ``[K]`` float64, the noisy per-channel mean.
    variance: ``[K]`` float64, ``max(noisy second moment - mean^2, 0)``.
    noise_multiplier: sigma of each of the two noisy sums (noise std / clip norm).
    event: the mechanism, ``GaussianEvent(sigma / sqrt(2))`` (the two sums together).
  """
  mean: np.ndarray
  variance: np.ndarray
  noise_multiplier: float
  event: _events.GaussianEvent

  def apply(self, features, channel_axis: int = 1, epsilon: float = 1e-5) -> np.ndarray:
    """``(features - mean) / sqrt(variance + epsilon)`` per channel; channels whose released
    variance is 0 become 0 (no scale is known for them).  Post-processing: no privacy cost.

    Args:
      features: array whose ``channel_axis`` has K entries.
      channel_axis: the channel axis of ``features``.
      epsilon: > 0, added to the variance (the units of the variance).
    """
    _checks.check_finite_positive("epsilon", epsilon)
    x = np.asarray(features)
    if x.ndim < 1:
      raise ValueError(f"features must have a record axis and a channel axis, got shape "
                       f"{x.shape}.")
    axis = _channel_axis(channel_axis, x.ndim)
    if x.shape[axis] != len(self.mean):
      raise ValueError(f"features have {x.shape[axis]} channels on axis {channel_axis}, the "
                       f"statistics {len(self.mean)}.")
    shape = [1] * x.ndim
    shape[axis] = -1
    mean, var = self.mean.reshape(shape), self.variance.reshape(shape)
    out = (x - mean) / np.sqrt(var + epsilon) * (var > 0)
    return out.astype(x.dtype if np.issubdtype(x.dtype, np.floating) else np.float64)


def private_channel_normalization(features, *, mean_clip: float, second_moment_clip: float,
                                  noise_multiplier: float, dataset_size: int | None = None,
                                  channel_axis: int = 1, seed: int | None = None,
                                  ledger=None) -> ChannelNormalization:
  """Per-channel mean and variance of ``features`` by the Gaussian mechanism.

  For record i let ``a_i[k]`` be channel k's mean over the record's positions and ``b_i[k]``
  the mean of its squares.  Each is clipped in L2 norm over the K channels,
  ``a_i <- a_i min(1, C_a / ||a_i||)`` and ``b_i <- b_i min(1, C_b / ||b_i||)``, and released as

      mean = (sum_i a_i + C_a sigma Z_a) / n,   m2 = (sum_i b_i + C_b sigma Z_b) / n,
      variance = max(m2 - mean^2, 0),

  ``Z ~ N(0, I_K)`` independent, ``n = dataset_size`` (a public constant: the same divisor for
  every neighbouring data set).  Adding or removing one record moves ``(sum a / C_a, sum b /
  C_b)`` by at most ``sqrt(2)`` in L2 norm, so the release is one Gaussian mechanism of noise
  multiplier ``sigma / sqrt(2)`` (Renyi DP ``alpha / sigma^2`` at every order alpha > 1; the
  same as two Gaussian mechanisms of multiplier sigma).  The noise std of each released mean is
  ``C_a sigma / n``.

  Args:
    features: ``[n, ...]`` finite real array, n >= 1 records; ``channel_axis`` (not 0) holds the
      K channels, the other non-record axes are positions.
    mean_clip: C_a, finite and > 0 (units of the features).
    second_moment_clip: C_b, finite and > 0 (units of the features squared).
    noise_multiplier: sigma, finite and > 0.
    dataset_size: the public divisor n, integer >= 1 (default: the number of records, which is
      then taken to be public).
    channel_axis: the channel axis of ``features``.
    seed: ``None`` (a secret key from the OS entropy source, as the guarantee needs) or an
      integer in [0, 2**62) for reproducible noise (tests only).
    ledger: optional :class:`tf_dpkit.budget.PrivacyLedger`; the mechanism is recorded in it as
      two steps of sampling probability 1 and noise multiplier sigma, so a DP-SGD run accounted
      in the same ledger composes with it.

  Returns:
    A :class:`ChannelNormalization`.

  Raises:
    ValueError: an argument out of range (the message names it).
  """
  c_a = _checks.check_finite_positive("mean_clip", mean_clip)
  c_b = _checks.check_finite_positive("second_moment_clip", second_moment_clip)
  sigma = _checks.check_finite_positive("noise_multiplier", noise_multiplier)
  x = np.asarray(features)
  if x.ndim < 2 or len(x) < 1:
    raise ValueError(f"features must have shape [n >= 1 records, ...] with a channel axis, got "
                     f"{np.shape(features)}.")
  axis = _channel_axis(channel_axis, x.ndim)
  if not np.issubdtype(x.dtype, np.number) or np.iscomplexobj(x):
    raise ValueError("features must hold finite real values.")
  n = len(x) if dataset_size is None else _checks.check_integer("dataset_size", dataset_size,
                                                                minimum=1)
  # Per-record channel means and mean squares, in chunks of records (no full float64 copy).
  a, b = [], []
  for start in range(0, len(x), _CHUNK):
    chunk = np.moveaxis(x[start:start + _CHUNK], axis, -1).astype(np.float64)
    chunk = chunk.reshape(len(chunk), -1, chunk.shape[-1])  # [records, positions, K]
    if not np.all(np.isfinite(chunk)):
      raise ValueError("features must hold finite real values.")
    a.append(chunk.mean(axis=1))
    b.append((chunk * chunk).mean(axis=1))
  sums = []
  for values, clip in ((np.concatenate(a), c_a), (np.concatenate(b), c_b)):
    norms = np.linalg.norm(values, axis=1, keepdims=True)
    scale = np.minimum(1.0, clip / np.maximum(norms, np.finfo(np.float64).tiny))
    sums.append(tf.constant((values * scale).sum(axis=0), tf.float64))
  key = noise.fresh_key(seed)
  noisy_mean = noise.add_gaussian_noise([sums[0]], c_a * sigma, key, step=0, draw=0)[0].numpy() / n
  noisy_m2 = noise.add_gaussian_noise([sums[1]], c_b * sigma, key, step=0, draw=1)[0].numpy() / n
  if ledger is not None:
    ledger.record(1.0, sigma, 2)
  return ChannelNormalization(mean=noisy_mean, variance=np.maximum(noisy_m2 - noisy_mean**2, 0.0),
                              noise_multiplier=sigma,
                              event=_events.GaussianEvent(sigma / math.sqrt(2.0)))
