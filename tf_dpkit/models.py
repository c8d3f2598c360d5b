"""Private ``model.fit``: Keras models whose ``train_step`` runs DP-SGD.

Keras computes the batch-summed gradient inside ``Model.train_step``, so an optimizer alone
cannot make ``fit`` private.  ``make_dp_model_class(Base)`` returns a subclass of ``Base`` whose
``train_step``

1. evaluates the compiled loss per example (the loss passed to ``compile`` is used
   *unreduced*: you may pass it with any reduction, the per-example values are taken from
   ``Loss.call`` / the loss function, and ``sample_weight`` multiplies them),
2. gets the clipped sum of microbatch gradients with the fast per-layer path (functional and
   Sequential models) or ``tf.vectorized_map`` over microbatches (any model); see
   ``tf_dpkit.private_gradients`` and the ``per_example_method`` attribute,
3. clips, sums, noises and averages with the DP optimizer's settings (the optimizer is the
   single source of truth: ``l2_norm_clip``, ``noise_multiplier``, ``num_microbatches``),
4. adds the gradient of the data-independent weight regularisers *after* clipping,
5. applies the update and updates the metrics with the predictions of step 2 (no second
   forward pass).

Compiling with a non-DP optimizer raises ``TypeError``.  Single-output models with one loss are
supported; ``activity_regularizer`` and ``add_loss`` (batch-level, data-dependent losses that
cannot be clipped per example) are refused.  When the model's output carries a Keras mask
(e.g. after ``Embedding(mask_zero=True)`` in a sequence model), each example's loss is the
mean over its unmasked positions.
"""
from __future__ import annotations

import functools

import keras
import tensorflow as tf

from tf_dpkit.optimizers import is_dp_optimizer
from tf_dpkit.model_gradients import clipped_sum_for_model


def _per_example_loss_fn(loss):
  """Returns ``f(y_true, y_pred) -> [batch]`` unreduced losses for a compile() loss spec."""
  if loss is None:
    raise ValueError("DP models need `loss=` in compile() (a Keras loss, its name, or a "
                     "function returning one loss per example).")
  if isinstance(loss, (list, tuple, dict)):
    raise ValueError("DP models support a single loss (single-output models); got "
                     f"{type(loss).__name__}.")
  loss_obj = keras.losses.get(loss)
  if isinstance(loss_obj, keras.losses.Loss):
    return loss_obj.call
  if callable(loss_obj):
    return loss_obj
  raise ValueError(f"Unsupported loss {loss!r}.")


def _weight_regularization(variables):
  terms = [v.regularizer(v) for v in variables if getattr(v, "regularizer", None) is not None]
  return tf.add_n([tf.cast(t, tf.float32) for t in terms]) if terms else None


class _DPTrainStep:
  """Mixin holding the private ``compile`` and ``train_step``."""

  def compile(self, optimizer="rmsprop", loss=None, **kwargs):  # pylint: disable=missing-function-docstring
    if not is_dp_optimizer(optimizer):
      raise TypeError(
          f"{type(self).__name__} trains with DP-SGD and needs a tf_dpkit DP optimizer (e.g. "
          "tf_dpkit.DPGradientDescentGaussianOptimizer(l2_norm_clip=..., noise_multiplier=..., "
          f"learning_rate=...)), got {optimizer!r}.")
    self._dp_per_example_loss = _per_example_loss_fn(loss)
    super().compile(optimizer=optimizer, loss=loss, **kwargs)
    if not is_dp_optimizer(self.optimizer):
      raise ValueError(
          f"Keras wrapped the DP optimizer in {type(self.optimizer).__name__} (the "
          f"'{self.dtype_policy.name}' dtype policy does this); dynamic loss scaling is not "
          "supported by DP models. Use the 'float32' or 'mixed_bfloat16' policy.")

  def compile_from_config(self, config):
    """Re-compiles a loaded ``.keras`` model with its saved DP optimizer and loss."""
    config = keras.saving.deserialize_keras_object(config)
    self.compile(**config)
    if self.built:
      self.optimizer.build(self.trainable_variables)

  def _check_no_added_losses(self):
    added = [layer.name for layer in self._flatten_layers()
             if getattr(layer, "_losses", None)]
    if added:
      raise ValueError(
          f"Layers {added} call add_loss(): such a loss is computed from the whole batch and "
          "is not clipped per example, so DP models refuse it. Make it part of the per-example "
          "loss passed to compile(), or a weight regularizer (added after clipping).")

  def _check_no_activity_regularizers(self):
    for layer in self._flatten_layers():
      if getattr(layer, "activity_regularizer", None) is not None:
        raise ValueError(
            f"Layer {layer.name!r} has an activity_regularizer: that loss depends on the data "
            "and is not clipped per example, so DP models refuse it.")

  # How per-microbatch gradients are computed: "auto" (fast per-layer path when the model is a
  # layer graph, else whole-model vectorized_map), "fast" or "vectorized".  Not a DP setting.
  per_example_method = "auto"

  def train_step(self, data):
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    optimizer = self.optimizer
    variables = self.trainable_variables
    self._check_no_activity_regularizers()
    clipped, y_pred = clipped_sum_for_model(
        self, self._dp_per_example_loss, x, y, sample_weight, optimizer.l2_norm_clip,
        optimizer.num_microbatches, self.per_example_method)
    self._check_no_added_losses()
    mean_loss = tf.reduce_mean(clipped.losses)
    with tf.GradientTape() as tape:
      regularization = _weight_regularization(variables)
    reg_grads = None
    if regularization is not None:
      reg_grads = tape.gradient(regularization, variables)
      mean_loss = mean_loss + regularization
    grads = optimizer.privatize(clipped, data_independent_grads=reg_grads)
    optimizer.apply(grads, variables)
    batch = tf.shape(tf.nest.flatten(x)[0])[0]
    self._loss_tracker.update_state(mean_loss, sample_weight=batch)
    return self.compute_metrics(x, y, y_pred, sample_weight=sample_weight)


@functools.lru_cache(maxsize=None)
def make_dp_model_class(cls):
  """Returns a subclass of the Keras model class ``cls`` whose ``fit`` runs DP-SGD.

  The DP settings come from the optimizer passed to ``compile`` (it must be a tf_dpkit DP
  optimizer).  Per-microbatch gradients use ``tf.vectorized_map``; see the module docstring
  for the step.  The class is cached per ``cls`` and registered for ``.keras`` serialization.
  """
  if not (isinstance(cls, type) and issubclass(cls, keras.Model)):
    raise TypeError(f"make_dp_model_class expects a subclass of keras.Model, got {cls!r}.")
  if issubclass(cls, _DPTrainStep):
    return cls
  name = "DP" + cls.__name__ if cls.__name__ != "Model" else "DPModel"
  dp_cls = type(name, (_DPTrainStep, cls), {"__doc__": f"{cls.__name__} trained with DP-SGD "
                                            "in ``fit`` (see ``tf_dpkit.models``)."})
  return keras.saving.register_keras_serializable(package="tf_dpkit", name=name)(dp_cls)


DPModel = make_dp_model_class(keras.Model)
DPSequential = make_dp_model_class(keras.Sequential)
