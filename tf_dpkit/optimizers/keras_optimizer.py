"""DP versions of Keras 3 optimizers.

``make_keras_dp_class(Base)`` returns a subclass of ``Base`` whose gradients are computed from a
*vector* loss with per-microbatch clipping and Gaussian noise; the update rule of ``Base``
(momentum, Adam moments, weight decay, ...) then acts on the private gradient, which is
post-processing and costs no privacy.
"""
from __future__ import annotations

import keras
import tensorflow as tf

from tf_dpkit.clipping import clipped_sum_from_vector_loss
from tf_dpkit.optimizers.base import CONSTRUCTOR_ARGS_DOC, DPOptimizerBase

#: Rows x fields of the privacy ledger variable (format owned by ``tf_dpkit.budget``).
PRIVACY_LEDGER_SHAPE = (64, 8)


def make_keras_dp_class(base):
  """Builds the DP subclass of the Keras 3 optimizer class ``base`` (see the factory)."""

  class KerasDPOptimizer(DPOptimizerBase, base):
    __doc__ = f"""Differentially private {base.__name__} (DP-SGD gradient, {base.__name__} update).

    {CONSTRUCTOR_ARGS_DOC.format(base="keras.optimizers." + base.__name__)}

    One step: split the vector loss into M microbatches, clip each microbatch's gradient to
    C, sum, add N(0, (sigma C)^2 I), divide by M (or ``expected_batch_size``), apply the
    {base.__name__} update.  ``gradient_accumulation_steps`` is refused (noise per micro-step
    would change the privacy analysis).
    """

    _dp_base_class = base

    def __init__(self, l2_norm_clip, noise_multiplier, num_microbatches=None, *args,
                 seed=None, expected_batch_size=None, **kwargs):
      if kwargs.get("gradient_accumulation_steps"):
        raise ValueError(
            "gradient_accumulation_steps is not supported by DP optimizers: Keras would add "
            "noise on every micro-step, which changes the privacy analysis. Use a larger "
            "batch (or Poisson sampling with a larger expected_batch_size) instead.")
      settings = self._validated_settings(args, kwargs, l2_norm_clip, noise_multiplier,
                                          num_microbatches, expected_batch_size, seed)
      super().__init__(*args, **kwargs)
      self._attach_dp(settings)
      # The privacy ledger (tf_dpkit.budget): optimizer state, so it is saved and restored with
      # the model (.keras files, save_weights, ModelCheckpoint, BackupAndRestore).
      self._privacy_ledger = self.add_variable(
          shape=PRIVACY_LEDGER_SHAPE, initializer="zeros", dtype="float64",
          name="dp_privacy_ledger")

    @property
    def privacy_ledger(self):
      """float64 variable holding the record of the DP steps taken (see ``tf_dpkit.budget``)."""
      return self._privacy_ledger

    def get_config(self):
      config = super().get_config()
      config.update(self._dp.config())
      return config

    def _noise_step(self):
      return self.iterations

    def _loss_scale(self):
      return self.loss_scale_factor

    def compute_gradients(self, loss, var_list, tape=None):
      """Private gradients of a vector loss: ``[(grad, var), ...]``.

      Args:
        loss: float tensor [batch] recorded on ``tape``, or a zero-argument callable returning
          one (then a tape is opened here).
        var_list: the variables to train.
        tape: the ``tf.GradientTape`` that recorded ``loss`` (required for a tensor loss).
      """
      var_list = list(var_list)
      if callable(loss):
        with tf.GradientTape() as tape:
          loss = loss()
      elif tape is None:
        raise ValueError(
            f"{type(self).__name__}.compute_gradients needs `tape=` (the GradientTape that "
            "recorded the vector loss), or pass the loss as a zero-argument callable.")
      clipped = clipped_sum_from_vector_loss(
          loss, var_list, self._dp.l2_norm_clip, self.replica_num_microbatches(), tape=tape,
          loss_scale=self._loss_scale())
      return list(zip(self.privatize(clipped), var_list))

    def minimize(self, loss, var_list, tape=None):
      """``compute_gradients`` then ``apply_gradients``; returns ``iterations`` after the step."""
      grads_and_vars = self.compute_gradients(loss, var_list, tape=tape)
      self.apply_gradients(grads_and_vars)
      return self.iterations

    def apply(self, grads, trainable_variables=None):
      grads = list(grads)
      self._check_certified(grads)
      return super().apply(grads, trainable_variables)

  KerasDPOptimizer.__name__ = f"DP{base.__name__}"
  KerasDPOptimizer.__qualname__ = KerasDPOptimizer.__name__
  return keras.saving.register_keras_serializable(
      package="tf_dpkit", name=KerasDPOptimizer.__name__)(KerasDPOptimizer)
