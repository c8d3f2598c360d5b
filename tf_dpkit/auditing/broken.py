"""Deliberately BROKEN DP-SGD variants, to show that an audit catches them.  Never train with
these for privacy.

Each reproduces a bug that leaves the accountant's epsilon unchanged but breaks the guarantee:

* ``"noise_off"``: the DP optimizer with noise multiplier 0 (the accountant is told sigma).
* ``"same_noise_every_step"``: the DP optimizer drawing the same noise at every step (a noise
  key reused with a frozen step and draw counter): the noise no longer averages out, and the
  difference of two steps' updates holds no noise at all.
* ``"averaged_clipping"``: clip the batch's *average* gradient to C and add noise of std
  ``sigma C / n`` to it, instead of clipping every example's gradient: one example can move the
  average by far more than ``C / n`` (the seed documents' formula; Abadi et al. 2016 clip per
  example).

:func:`broken_training` builds the optimizer and model class for a kind; the model class is a
``tf_dpkit.DPModel`` except for ``"averaged_clipping"``, a plain Keras model whose
``train_step`` does the broken step with a non-private SGD optimizer (a DP optimizer would
refuse gradients that did not come from its own private step).
"""
from __future__ import annotations

import keras
import tensorflow as tf

from analysis import _checks
from tf_dpkit import noise as noise_lib

KINDS = ("noise_off", "same_noise_every_step", "averaged_clipping")


class _AveragedClippingModel(keras.Model):
  """BROKEN: clips the batch's average gradient (module doc)."""

  dp_l2_norm_clip = 1.0
  dp_noise_multiplier = 1.0
  dp_expected_batch_size = 1.0
  dp_key = None

  def train_step(self, data):
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    with tf.GradientTape() as tape:
      y_pred = self(x, training=True)
      losses = self.loss(y, y_pred) if callable(self.loss) else None
      if sample_weight is not None:
        losses = losses * tf.cast(sample_weight, losses.dtype)
      mean_loss = tf.reduce_sum(losses) / self.dp_expected_batch_size
    grads = tape.gradient(mean_loss, self.trainable_variables)
    grads, _ = tf.clip_by_global_norm(grads, self.dp_l2_norm_clip)
    grads = noise_lib.add_gaussian_noise(
        grads, self.dp_noise_multiplier * self.dp_l2_norm_clip / self.dp_expected_batch_size,
        self.dp_key, self.optimizer.iterations)
    self.optimizer.apply(grads, self.trainable_variables)
    return {"loss": mean_loss}


def broken_training(kind: str, *, l2_norm_clip: float, noise_multiplier: float,
                    expected_batch_size: float, learning_rate: float, seed: int | None = None):
  """Returns ``(optimizer, model_class)`` for a BROKEN variant ``kind`` of Poisson DP-SGD.

  Args:
    kind: one of ``"noise_off"``, ``"same_noise_every_step"``, ``"averaged_clipping"``.
    l2_norm_clip, noise_multiplier, expected_batch_size: the settings the run claims
      (C > 0, sigma >= 0, qN > 0).
    learning_rate: SGD learning rate > 0.
    seed: noise seed (None: secret).

  Build the model as ``model_class(inputs, outputs)`` and compile it with ``optimizer`` and a
  per-example loss (for ``"averaged_clipping"`` a callable ``loss(y_true, y_pred) -> [batch]``).
  """
  from tf_dpkit.dp_models import DPModel  # pylint: disable=g-import-not-at-top
  from tf_dpkit.optimizers import DPGradientDescentGaussianOptimizer  # pylint: disable=g-import-not-at-top
  kind = _checks.check_choice("kind", kind, KINDS)
  clip = _checks.check_finite_positive("l2_norm_clip", l2_norm_clip)
  sigma = _checks.check_finite_nonnegative("noise_multiplier", noise_multiplier)
  expected = _checks.check_finite_positive("expected_batch_size", expected_batch_size)
  learning_rate = _checks.check_finite_positive("learning_rate", learning_rate)
  if kind == "averaged_clipping":
    model_class = type("AveragedClippingModel", (_AveragedClippingModel,), {
        "dp_l2_norm_clip": clip, "dp_noise_multiplier": sigma,
        "dp_expected_batch_size": expected, "dp_key": noise_lib.fresh_key(seed)})
    return keras.optimizers.SGD(learning_rate), model_class
  optimizer = DPGradientDescentGaussianOptimizer(
      clip, 0.0 if kind == "noise_off" else sigma, learning_rate=learning_rate, seed=seed,
      expected_batch_size=expected)
  if kind == "same_noise_every_step":
    # The bug: every step keyed by the same (step, draw).
    optimizer._noise_step = lambda: tf.constant(0, tf.int64)  # pylint: disable=protected-access
    optimizer.dp_settings.next_noise_draw = lambda: tf.constant(0, tf.int64)
  return optimizer, DPModel
