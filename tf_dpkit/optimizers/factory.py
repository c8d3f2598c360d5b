"""``make_gaussian_optimizer_class``: one entry point for Keras 3 and ``tf.compat.v1`` optimizers."""
from __future__ import annotations

import functools

import keras
import tensorflow as tf

from tf_dpkit.optimizers.keras_optimizer import make_keras_dp_class
from tf_dpkit.optimizers.v1_optimizer import make_v1_dp_class


@functools.lru_cache(maxsize=None)
def make_gaussian_optimizer_class(cls):
  """Returns the DP-SGD (Gaussian mechanism) version of an optimizer class.

  Args:
    cls: a subclass of ``keras.optimizers.Optimizer`` (SGD, Adam, AdamW, ..., user subclasses)
      or of ``tf.compat.v1.train.Optimizer`` (GradientDescentOptimizer, AdamOptimizer, ...).

  Returns:
    A subclass of ``cls`` whose constructor is
    ``(l2_norm_clip, noise_multiplier, num_microbatches=None, *args, seed=None,
    expected_batch_size=None, **kwargs)``, the rest going to ``cls``.  It takes a vector loss
    (one entry per example), clips each microbatch gradient to L2 norm ``l2_norm_clip``,
    sums, adds Gaussian noise of std ``noise_multiplier * l2_norm_clip``, divides by the
    number of microbatches and applies ``cls``'s update.  The same class object is returned
    for the same ``cls`` (cached); Keras classes are registered for serialization as
    ``tf_dpkit>DP<Name>``.

  Raises:
    TypeError: ``cls`` is not such an optimizer class, or is already a DP class.
  """
  if not isinstance(cls, type):
    raise TypeError(
        "make_gaussian_optimizer_class expects an optimizer CLASS (a subclass of "
        "keras.optimizers.Optimizer or tf.compat.v1.train.Optimizer), got "
        f"{cls!r} of type {type(cls).__name__}.")
  if hasattr(cls, "_dp_base_class"):
    raise TypeError(f"{cls.__name__} is already differentially private; wrap its base class "
                    f"{cls._dp_base_class.__name__} instead.")
  if issubclass(cls, keras.optimizers.Optimizer):
    if cls is keras.optimizers.Optimizer:
      raise TypeError("keras.optimizers.Optimizer is abstract; pass a concrete optimizer class.")
    return make_keras_dp_class(cls)
  if issubclass(cls, tf.compat.v1.train.Optimizer):
    if cls is tf.compat.v1.train.Optimizer:
      raise TypeError("tf.compat.v1.train.Optimizer is abstract; pass a concrete optimizer class.")
    return make_v1_dp_class(cls)
  raise TypeError(
      "make_gaussian_optimizer_class accepts subclasses of keras.optimizers.Optimizer (Keras 3) "
      f"or tf.compat.v1.train.Optimizer, got {cls.__module__}.{cls.__name__}.")
