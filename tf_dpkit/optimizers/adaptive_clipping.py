"""Adaptive clipping for the Keras DP optimizers (Andrew, Thakkar, McMahan, Ramaswamy 2021).

``adaptive_clipping=tf_dpkit.AdaptiveClipping(target_quantile, learning_rate)`` makes the clip
norm ``C_t`` an optimizer variable (saved, logged as ``l2_norm_clip``) that every clipping path
uses; each step releases the clipped sum and the count of unclipped examples as one Gaussian
mechanism of the optimizer's ``noise_multiplier``, so accounting is that of fixed-clip DP-SGD
(maths: ``analysis.adaptive_clipping``).  Refused: ``sigma_b <= z / 2``, ``tf.compat.v1``
optimizers, accumulation, per-layer clips, schedules.  The full contract:
docs/design/optimizers_adaptive_clipping.md.
"""
from __future__ import annotations


import keras
import tensorflow as tf

from analysis import adaptive_clipping as maths
from analysis import _checks
from tf_dpkit import distribute
from tf_dpkit import noise as noise_lib

__all__ = ["AdaptiveClipping", "AdaptiveClipState"]

#: The name of the clip norm in ``fit``'s logs.
LOG_NAME = "l2_norm_clip"


class AdaptiveClipping:
  """The settings of adaptive clipping (pass as ``adaptive_clipping=`` to a Keras DP optimizer).

  Args:
    target_quantile: ``gamma`` in (0, 1): the fraction of examples (microbatches) to leave
      unclipped; 0.5 (default) tracks the median gradient norm.
    learning_rate: ``eta_C``, a finite number > 0 (default 0.2, the paper's): the clip norm
      changes by a factor of at most ``exp(eta_C)`` per step.
    count_noise_stddev: ``sigma_b``, the std of the noise on the count of unclipped examples;
      must exceed ``noise_multiplier / 2`` (and, by default, at least ``noise_multiplier /
      sqrt(3)``).  Default None: ``expected_batch_size / 20`` (the paper's suggestion), which
      needs the optimizer's ``expected_batch_size``.
  """

  def __init__(self, target_quantile=0.5, learning_rate=0.2, count_noise_stddev=None):
    gamma = _checks.check_real("target_quantile", target_quantile, allow_nan=True)
    self.target_quantile, self.learning_rate, _ = maths.check_quantile_settings(
        gamma, learning_rate, 1.0)
    self.count_noise_stddev = (None if count_noise_stddev is None else
                               _checks.check_finite_nonnegative("count_noise_stddev",
                                                                count_noise_stddev))

  def __repr__(self):
    return (f"AdaptiveClipping(target_quantile={self.target_quantile!r}, learning_rate="
            f"{self.learning_rate!r}, count_noise_stddev={self.count_noise_stddev!r})")

  def get_config(self) -> dict:
    return {"target_quantile": self.target_quantile, "learning_rate": self.learning_rate,
            "count_noise_stddev": self.count_noise_stddev}

  @classmethod
  def coerce(cls, value) -> "AdaptiveClipping | None":
    """``value`` (None, an ``AdaptiveClipping``, ``True`` for the defaults, or its config dict)
    as an ``AdaptiveClipping`` or None."""
    if value is None or value is False:
      return None
    if value is True:
      return cls()
    if isinstance(value, cls):
      return value
    if isinstance(value, dict):
      unknown = sorted(set(value) - {"target_quantile", "learning_rate", "count_noise_stddev"})
      if unknown:
        raise ValueError(f"adaptive_clipping: unknown settings {unknown}; allowed: "
                         "target_quantile, learning_rate, count_noise_stddev.")
      return cls(**value)
    raise TypeError(f"adaptive_clipping must be None, True, a tf_dpkit.AdaptiveClipping or its "
                    f"config dict, got {value!r} of type {type(value).__name__}.")


def recentred_bits(norms, clip):
  """Each microbatch's recentred bit in the unclipped count: ``+1/2`` when ``0 < norm <= C_t``,
  ``-1/2`` when ``norm > C_t``, and ``0`` when its gradient is exactly zero (``norm == 0``).

  A zero gradient is what a weight-0 row has (the Poisson pipeline's empty-draw placeholder,
  padding rows) and what a zeroed non-finite example has: such a row contributes 0 to the
  count as it does to the clipped sum, so a batch holding only the placeholder releases the
  count of the empty batch (0 plus noise), and adding or removing any example still moves the
  count by at most 1/2 (``analysis.adaptive_clipping``).  ``norms``: float32 [M]; ``clip``: a
  float32 scalar.  Returns float32 [M].
  """
  half = tf.constant(0.5, tf.float32)
  return tf.where(norms > 0.0, tf.where(norms <= clip, half, -half), tf.zeros_like(norms))


class AdaptiveClipState:
  """The adaptive clip of one Keras DP optimizer: settings, noise split and the ``C_t`` variable.

  Made by :meth:`attach` in the optimizer's constructor, after ``DPSettings`` validated the
  other arguments; every check is done there, before any step.
  """

  def __init__(self, settings: AdaptiveClipping, dp_settings, variable):
    self.settings = settings
    self.noise_multiplier = dp_settings.noise_multiplier
    self.count_noise_stddev = settings.count_noise_stddev
    self.sum_noise_multiplier = maths.sum_noise_multiplier(
        self.noise_multiplier, self.count_noise_stddev)
    self.variable = variable

  @classmethod
  def attach(cls, optimizer, adaptive_clipping, dp_settings):
    """Validates ``adaptive_clipping`` against the optimizer's settings and makes ``C_t``.

    Returns None when ``adaptive_clipping`` is None.
    """
    settings = AdaptiveClipping.coerce(adaptive_clipping)
    if settings is None:
      return None
    if dp_settings.scheduled:
      raise ValueError("adaptive_clipping does not combine with an l2_norm_clip or "
                       "noise_multiplier schedule; use one of them.")
    if settings.count_noise_stddev is None:
      if dp_settings.expected_batch_size is None:
        raise ValueError(
            "adaptive_clipping needs count_noise_stddev (the std of the noise on the count of "
            "unclipped examples, e.g. batch size / 20) when the optimizer has no "
            "expected_batch_size to derive it from.")
      settings = AdaptiveClipping(
          settings.target_quantile, settings.learning_rate,
          maths.default_count_noise_stddev(dp_settings.expected_batch_size))
    # The split is checked before the variable exists (nothing is created for bad settings).
    maths.sum_noise_multiplier(dp_settings.noise_multiplier, settings.count_noise_stddev)
    variable = optimizer.add_variable(
        shape=(), initializer=keras.initializers.Constant(dp_settings.l2_norm_clip),
        dtype="float32", aggregation="only_first_replica", name="dp_adaptive_l2_norm_clip")
    return cls(settings, dp_settings, variable)

  def config(self) -> dict:
    return self.settings.get_config()

  def check_clipped_at_current_clip(self, clipped, owner: str):
    """Raises ``ValueError`` unless ``clipped`` was clipped at this optimizer's ``C_t``."""
    if clipped.l2_norm_clip is not self.variable:
      raise ValueError(
          f"{owner} uses adaptive clipping, but this clipped sum was clipped at "
          f"{clipped.l2_norm_clip!r}, not at the optimizer's current clip norm C_t: the noise "
          "would not match its sensitivity. Clip with `optimizer.l2_norm_clip_for_step()` "
          "(tf_dpkit.private_gradients, DP models' fit and optimizer.minimize do).")

  def logs(self) -> dict:
    """``{"l2_norm_clip": C_t}`` (the clip norm the next step uses) for ``fit``'s logs."""
    return {LOG_NAME: tf.convert_to_tensor(self.variable)}

  def private_average(self, dp_settings, clipped, clipped_grads, realised_microbatches, step,
                      owner: str):
    """The private average gradient of one step with adaptive clipping (module docstring).

    ``DPSettings.private_average`` with the sum's noise std ``z_Delta C_t``, then the noisy
    count and the update of ``C_t`` (:meth:`release_count_and_update`).  The variable is read
    (for the clipping, the noise and the count) before it is assigned: TensorFlow orders
    operations on one variable as written.
    """
    del owner
    grads = dp_settings.private_average(clipped_grads, realised_microbatches, step,
                                        noise_stddev=self.sum_noise_stddev())
    # Eager: assigned here.  Traced: the assignment is a stateful op, run after the reads of
    # C_t written before it (TensorFlow's automatic control dependencies).
    self.release_count_and_update(
        clipped, dp_settings, step, dp_settings.normalizer(realised_microbatches))
    return grads

  def sum_noise_stddev(self):
    """``z_Delta C_t``: the std of the noise on the clipped sum (a scalar tensor, or 0.0)."""
    if self.sum_noise_multiplier == 0.0:
      return 0.0
    return tf.constant(self.sum_noise_multiplier, tf.float32) * tf.cast(self.variable,
                                                                        tf.float32)

  def release_count_and_update(self, clipped, dp_settings, step, normalizer):
    """Releases the noisy recentred unclipped count and assigns ``C_{t+1}``.

    ``B~ = sum_i bit_i + N(0, sigma_b^2)`` (:func:`recentred_bits`); ``b~ = clamp(B~ / n + 1/2,
    0, 1)``; ``C_{t+1} = C_t exp(-eta_C (b~ - gamma))``.  ``normalizer`` is ``n`` (a float32 scalar
    tensor).  Returns ``C_{t+1}``.

    Under R replicas (``tf_dpkit.distribute.replica_noise``) each replica counts its own
    examples and adds its noise term (its replica id folded into the seed: the whole
    ``N(0, sigma_b^2)`` on one replica under MirroredStrategy, a share ``N(0, sigma_b^2 / R)``
    on each across workers); the terms are all-reduced, so every replica gets the one noisy
    count of the global batch, with noise ``N(0, sigma_b^2)``, and assigns the same ``C_{t+1}``.
    """
    clip = tf.cast(self.variable, tf.float32)
    norms = tf.cast(clipped.norms, tf.float32)
    recentred = tf.reduce_sum(recentred_bits(norms, clip))
    stddev, replica, part = distribute.replica_noise(float(self.count_noise_stddev or 0))
    noisy = noise_lib.add_gaussian_noise(
        [recentred], stddev, dp_settings.noise_key, step, dp_settings.next_noise_draw(),
        replica, stream=noise_lib.STREAM_UNCLIPPED_COUNT, part=part)[0]
    noisy = distribute.global_sum(noisy)  # the global batch's count, on every replica
    fraction = tf.clip_by_value(noisy / tf.cast(normalizer, tf.float32) + 0.5, 0.0, 1.0)
    new_clip = clip * tf.exp(-self.settings.learning_rate *
                             (fraction - self.settings.target_quantile))
    self.variable.assign(new_clip)
    return new_clip
