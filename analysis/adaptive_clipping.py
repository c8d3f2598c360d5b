"""Adaptive clipping (Andrew, Thakkar, McMahan, Ramaswamy, NeurIPS 2021): the noise split and
the quantile update, as pure maths.

Each step releases the noisy clipped sum (noise multiplier ``z_Delta``) and the noisy
recentred count of unclipped examples (std ``sigma_b``); together they are the Gaussian
mechanism with noise multiplier ``z``, ``z^-2 = z_Delta^-2 + (2 sigma_b)^-2``
(:func:`sum_noise_multiplier`), so the accounting is that of fixed-clip DP-SGD at ``z``.  The
clip norm follows ``C_{t+1} = C_t exp(-eta_C (b~ - gamma))`` (:func:`geometric_update`), a
post-processing of earlier noisy releases.  Derivation: docs/design/adaptive_clipping.md.  No
TensorFlow import.
"""
from __future__ import annotations

import math
import warnings

from analysis import _checks

__all__ = ["MAX_SUM_NOISE_FACTOR", "WARN_SUM_NOISE_FACTOR", "sum_noise_multiplier",
           "check_quantile_settings", "geometric_update", "default_count_noise_stddev"]

#: The split is refused when the sum's noise multiplier would exceed this multiple of the
#: requested one (``z_Delta > 2 z``, i.e. the count would take more than 3/4 of the privacy
#: "budget" ``z^-2``): the clipped sum would be noisier than the user asked for by a factor
#: they almost certainly did not intend.  Raise ``count_noise_stddev`` instead.
MAX_SUM_NOISE_FACTOR = 2.0
#: A ``UserWarning`` is given when ``z_Delta`` exceeds this multiple of ``z`` (the count takes
#: more than 17% of ``z^-2``).
WARN_SUM_NOISE_FACTOR = 1.1


def sum_noise_multiplier(noise_multiplier: float, count_noise_stddev: float, *,
                         max_factor: float = MAX_SUM_NOISE_FACTOR) -> float:
  """The clipped sum's noise multiplier ``z_Delta = (z^-2 - (2 sigma_b)^-2)^(-1/2)``.

  With it, the clipped sum (sensitivity ``C_t``, noise std ``z_Delta C_t``) and the recentred
  unclipped count (sensitivity 1/2, noise std ``sigma_b``) released together are exactly the
  Gaussian mechanism with noise multiplier ``z`` (docs/design/adaptive_clipping.md), so the
  accountant of fixed-clip DP-SGD with ``noise_multiplier=z`` applies unchanged.

  Args:
    noise_multiplier: ``z``, the noise multiplier the user asks for (and the accountant uses),
      a finite number >= 0.  ``z = 0`` (no privacy) gives ``z_Delta = 0``.
    count_noise_stddev: ``sigma_b``, the std of the noise on the count of unclipped examples
      (in examples), a finite number; it must exceed ``z / 2``.  0 is allowed only with
      ``z = 0``.
    max_factor: refuse a split with ``z_Delta > max_factor * z`` (default
      :data:`MAX_SUM_NOISE_FACTOR` = 2, i.e. ``sigma_b`` below ``z / sqrt(3)``); a number >= 1.

  Returns:
    ``z_Delta`` >= ``z`` (equal when ``sigma_b`` is infinite, which is not allowed here: the
    count would be useless).

  Raises:
    ValueError: an argument out of range, ``sigma_b <= z / 2`` (the count alone would spend
      at least the whole budget), or ``z_Delta > max_factor * z``; the message names
      ``noise_multiplier``, ``count_noise_stddev`` and the bound.
  """
  z = _checks.check_finite_nonnegative("noise_multiplier", noise_multiplier)
  sigma_b = _checks.check_finite_nonnegative("count_noise_stddev", count_noise_stddev)
  max_factor = _checks.check_real("max_factor", max_factor)
  if not max_factor >= 1.0:
    raise ValueError(f"max_factor must be >= 1, got {max_factor!r}.")
  if z == 0.0:
    return 0.0
  if not sigma_b > z / 2.0:
    raise ValueError(
        f"Adaptive clipping needs count_noise_stddev > noise_multiplier / 2 = {z / 2.0:.6g}, got "
        f"count_noise_stddev={sigma_b!r} with noise_multiplier={z!r}: the noisy count alone "
        "would spend the whole privacy budget of noise_multiplier, leaving none for the "
        f"gradient sum. Use count_noise_stddev >= {_smallest_count_noise(z, max_factor):.6g} "
        f"(the sum's noise then grows at most {max_factor:g}x) or, better, about the expected "
        "batch size / 20 (the paper's suggestion).")
  # z_Delta^-2 = z^-2 - (2 sigma_b)^-2 = z^-2 (1 - (z / (2 sigma_b))^2): no cancellation issue
  # as (z / (2 sigma_b))^2 < 1 here.
  share = (z / (2.0 * sigma_b)) ** 2
  z_delta = z / math.sqrt(1.0 - share)
  if z_delta > max_factor * z:
    raise ValueError(
        f"count_noise_stddev={sigma_b!r} with noise_multiplier={z!r} leaves the gradient sum a "
        f"noise multiplier of {z_delta:.6g}, more than {max_factor:g}x the requested {z!r} (the "
        f"count takes {share:.0%} of the privacy budget). Use count_noise_stddev >= "
        f"{_smallest_count_noise(z, max_factor):.6g}, e.g. the expected batch size / 20.")
  if z_delta > WARN_SUM_NOISE_FACTOR * z:
    warnings.warn(
        f"Adaptive clipping: count_noise_stddev={sigma_b!r} raises the gradient sum's noise "
        f"multiplier from {z!r} to {z_delta:.6g} (the count takes {share:.0%} of the privacy "
        "budget); a larger count_noise_stddev (e.g. expected batch size / 20) costs less.",
        UserWarning, stacklevel=2)
  return z_delta


def _smallest_count_noise(z, max_factor):
  """The sigma_b with z_Delta = max_factor * z: (z / (2 sigma_b))^2 = 1 - max_factor^-2."""
  if max_factor == 1.0:
    return math.inf
  return z / (2.0 * math.sqrt(1.0 - 1.0 / max_factor**2))


def default_count_noise_stddev(expected_batch_size: float) -> float:
  """``n / 20``, the count noise the paper suggests for an expected ``n`` examples per step
  (a finite number > 0): the noisy fraction ``b~`` then has std 1/20."""
  return _checks.check_finite_positive("expected_batch_size", expected_batch_size) / 20.0


def check_quantile_settings(target_quantile, learning_rate, initial_l2_norm_clip):
  """Validates the quantile-tracking settings; returns them as floats.

  Args:
    target_quantile: ``gamma`` in (0, 1): the fraction of examples to leave unclipped
      (0.5: the median norm; the paper's default).
    learning_rate: ``eta_C``, a finite number > 0: the clip norm changes by a factor of at most
      ``exp(eta_C)`` per step (the paper suggests 0.2).
    initial_l2_norm_clip: ``C_0``, a finite number > 0 (gradient-norm units).
  """
  gamma = _checks.check_real("target_quantile", target_quantile, allow_nan=True)
  if not 0.0 < gamma < 1.0:
    raise ValueError(f"target_quantile must be in (0, 1) (the fraction of examples left "
                     f"unclipped; 0.5 is the median), got {target_quantile!r}.")
  eta = _checks.check_finite_positive("learning_rate", learning_rate)
  clip = _checks.check_finite_positive("initial_l2_norm_clip", initial_l2_norm_clip)
  return gamma, eta, clip


def geometric_update(clip, noisy_count, normalizer, target_quantile, learning_rate):
  """One quantile step: ``C exp(-eta_C (b~ - gamma))`` with ``b~ = clamp(B~ / n + 1/2, 0, 1)``.

  The reference (NumPy / Python floats) of what ``tf_dpkit`` does in the graph.

  Args:
    clip: ``C_t`` > 0.
    noisy_count: ``B~ = sum_i (b_i - 1/2) + noise`` (recentred, in examples).
    normalizer: ``n`` > 0, the expected batch size (or the fixed number of microbatches).
    target_quantile: ``gamma`` in (0, 1); learning_rate: ``eta_C`` > 0.
  """
  fraction = min(1.0, max(0.0, noisy_count / normalizer + 0.5))
  return clip * math.exp(-learning_rate * (fraction - target_quantile))
