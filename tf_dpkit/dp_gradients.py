"""One call from (model, per-example loss, batch) to private gradients, for ``fit`` and loops.

    grads = tf_dpkit.private_gradients(optimizer, model, loss_fn, x, y)
    optimizer.apply(grads, model.trainable_variables)

``method`` picks how per-microbatch gradients are obtained:

* ``"fast"``: the per-layer path (``tf_dpkit.clipping.fast_path``) for Keras functional and
  Sequential models: per-example norms from layer inputs and output gradients, about the
  cost of a non-private step or a small multiple of it;
* ``"vectorized"``: ``tf.vectorized_map`` of the whole model over microbatches (any model);
* ``"auto"`` (default): ``"fast"`` when the model is a layer graph whose every node is cleared
  as per example (``tf_dpkit.clipping.independence``), else ``"vectorized"``; a graph refused
  only because a layer may mix the examples of a batch is said so once (a ``UserWarning``
  naming the layer).

Both give the same clipped sum up to float round-off (tested).  On both, the loss must be per
example (see ``tf_dpkit.clipping.contract``): one entry per example, computed from that example
alone; the fast path enforces the latter by evaluating the loss on each example separately.
"""
from __future__ import annotations

import tensorflow as tf

from tf_dpkit import _autograph
from tf_dpkit import augmentation as augmentation_lib
from tf_dpkit.clipping import groups, independence, swap
from tf_dpkit.clipping.contract import (per_example_loss_function, per_example_weights,
                                        pfor_is_safe)
from tf_dpkit.clipping.fast_path import (check_examples_independent,
                                         check_fast_path_examples_independent, clipped_sum_fast,
                                         graph_walkable)
from tf_dpkit.clipping.per_example import clipped_sum_vectorized

__all__ = ["METHODS", "clipped_sum_for_model", "private_gradients", "resolve_method"]

METHODS = ("auto", "fast", "vectorized")


def resolve_method(model, method):
  """Returns ``"fast"`` or ``"vectorized"`` for ``method`` in ``METHODS``."""
  if method not in METHODS:
    raise ValueError(f"method must be one of {METHODS}, got {method!r}.")
  if method == "vectorized":
    return method
  if not graph_walkable(model):
    if method == "auto":
      return "vectorized"
    raise ValueError(
        f"method='fast' needs a Keras functional or Sequential model (built with an Input) "
        f"that calls each trainable layer once and shares no variable between layers; "
        f"this {type(model).__name__} is not one. Use method='vectorized'.")
  if method == "fast":
    check_fast_path_examples_independent(model)
    return method
  mixing = independence.batch_mixing(model)
  if mixing is not None:
    independence.warn_fast_path_refused(model, mixing)
    return "vectorized"
  return "fast"


def clipped_sum_for_model(model, per_example_loss_fn, x, y, sample_weight, l2_norm_clip,
                          num_microbatches=None, method="auto", loss_scale=None,
                          microbatch_size=None):
  """``(ClippedSum, y_pred)`` for a Keras model; see the module docstring for ``method``.

  ``loss_scale``: optional static loss scale ``S > 0`` (mixed_float16, see
  ``DPOptimizerBase.static_loss_scale``): gradients of ``S * loss``, unscaled before clipping.
  ``microbatch_size``: None, or k (not with ``num_microbatches``): every k consecutive rows
  form one microbatch whose gradient is the mean of its rows' gradients, clipped as one unit
  (augmentation multiplicity: the rows are one example's k augmented copies).
  """
  # The model is called inside this path's own tapes: as Keras calls it (no swap tracing).
  with swap.suspended():
    return _clipped_sum_for_model(model, per_example_loss_fn, x, y, sample_weight, l2_norm_clip,
                                  num_microbatches, method, loss_scale, microbatch_size)


def _clipped_sum_for_model(model, per_example_loss_fn, x, y, sample_weight, l2_norm_clip,
                           num_microbatches, method, loss_scale, microbatch_size):
  check_examples_independent(model)
  if isinstance(l2_norm_clip, groups.LayerClipNorms):  # per-layer: bound to this model
    l2_norm_clip = l2_norm_clip.resolve(model)
  per_example_loss_fn = per_example_loss_function(per_example_loss_fn)
  batch = tf.shape(tf.nest.flatten(x)[0])[0]
  sample_weight = per_example_weights(sample_weight, batch)
  if resolve_method(model, method) == "fast":
    return clipped_sum_fast(model, per_example_loss_fn, (x, y, sample_weight), l2_norm_clip,
                            num_microbatches, loss_scale=loss_scale,
                            microbatch_size=microbatch_size)

  independence.warn_if_single_example_gradients_not_finite(model, x)

  def microbatch_loss(inputs):
    x_mb, y_mb, w_mb = inputs
    y_pred = model(x_mb, training=True)
    per_example = per_example_loss_fn(y_mb, y_pred)
    return per_example * tf.cast(w_mb, per_example.dtype), y_pred

  return clipped_sum_vectorized(microbatch_loss, (x, y, sample_weight),
                                model.trainable_variables, l2_norm_clip, num_microbatches,
                                vectorize=pfor_is_safe([model]), loss_scale=loss_scale,
                                microbatch_size=microbatch_size)


@_autograph.graph_code
def private_gradients(optimizer, model, per_example_loss_fn, x, y, sample_weight=None,
                      method="auto", augmentation=None):
  """Private average gradients for ``model.trainable_variables`` (ready for ``optimizer.apply``).

  Args:
    optimizer: a tf_dpkit Keras DP optimizer (its clip, noise and microbatch settings apply).
    model: a Keras model.
    per_example_loss_fn: ``f(y_true, y_pred) -> [B]`` losses, one per example (unreduced).
    x: a batch of the model's inputs, batch dimension B >= 1.
    y: the batch's targets.
    sample_weight: optional [B] (or [B, 1]) weights multiplying each example's loss.
    method: ``"auto"``, ``"fast"`` or ``"vectorized"``.
    augmentation: None, or a :class:`tf_dpkit.AugmentationMultiplicity` with K copies: each
      example contributes ``clip_C((1/K) sum_k grad L(aug_k(x_i), y_i))`` (needs the
      optimizer's ``num_microbatches=None`` when K > 1); the noise and the normaliser are
      those of the B examples.
  """
  augmentation_lib.check_augmentation(augmentation, optimizer.num_microbatches)
  x, y, sample_weight, microbatch_size = augmentation_lib.rows_for_step(
      augmentation, x, y, sample_weight, optimizer.iterations)
  clipped, _ = clipped_sum_for_model(model, per_example_loss_fn, x, y, sample_weight,
                                     optimizer.l2_norm_clip_for_step(),
                                     optimizer.replica_num_microbatches(),
                                     method, loss_scale=optimizer.static_loss_scale(model),
                                     microbatch_size=microbatch_size)
  return optimizer.privatize(clipped)
