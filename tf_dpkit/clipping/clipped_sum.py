"""Clip per-microbatch gradients to an L2 ball and sum them.

For microbatch gradients ``g_1..g_M`` (each the concatenation of all variables' gradients)
the clipped sum is

    S = sum_j g_j * min(1, C / ||g_j||_2)

so each microbatch moves ``S`` by at most ``C`` in L2 norm: the sensitivity DP-SGD's noise is
calibrated to.  Norms are taken over all variables together (global clipping).
"""
from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf


class ClippedSum(NamedTuple):
  """Result of the per-microbatch step.

  Attributes:
    grads: list, one tensor per variable, ``sum_j clip(g_j)`` (not yet noised or averaged).
    norms: float tensor [M], the pre-clipping L2 norm of each microbatch gradient.
    losses: float tensor [M], each microbatch's mean loss (for logging).
  """
  grads: list
  norms: tf.Tensor
  losses: tf.Tensor


def per_example_losses(values, batch, mask=None,
                       name="the per-example loss function") -> tf.Tensor:
  """Returns ``values`` ([B] or [B, ...]) as [B] per-example losses (mean over trailing axes).

  With a ``mask`` (a Keras output mask, [B, T] or matching ``values``'s leading axes) and
  ``values`` of rank >= 2, each example's loss is the mean over its unmasked positions,
  ``sum_t m_t v_t / max(1, sum_t m_t)``; an example with no unmasked position gets 0.  Raises
  ``ValueError`` for a scalar, which has already summed examples together: clipping needs one
  loss per example.
  """
  values = tf.convert_to_tensor(values)
  if values.shape.rank == 0:
    raise ValueError(
        f"{name} returned a scalar; DP-SGD needs one loss per example (shape [batch] or "
        "[batch, ...]). Use an unreduced loss, e.g. a keras.losses function or a Loss with "
        "reduction=None.")
  if mask is not None and values.shape.rank is not None and values.shape.rank >= 2:
    mask = tf.cast(mask, values.dtype)
    while mask.shape.rank < values.shape.rank:
      mask = mask[..., None]
    mask = tf.broadcast_to(mask, tf.shape(values))
    masked_sum = tf.reduce_sum(tf.reshape(values * mask, [batch, -1]), axis=1)
    count = tf.reduce_sum(tf.reshape(mask, [batch, -1]), axis=1)
    return masked_sum / tf.maximum(count, 1.0)
  return tf.reduce_mean(tf.reshape(values, [batch, -1]), axis=1)


def per_example_weights(sample_weight, batch) -> tf.Tensor:
  """Returns ``sample_weight`` ([B] or [B, 1]) as [B]; ones when it is ``None``.

  Raises ``ValueError`` for any other static shape (e.g. per-timestep weights [B, T]): each
  example must enter the clipped sum with one scalar weight.
  """
  if sample_weight is None:
    return tf.ones([batch], tf.float32)
  sample_weight = tf.convert_to_tensor(sample_weight)
  shape = sample_weight.shape
  if shape.rank is not None and (shape.rank == 0 or any(
      d is not None and d != 1 for d in shape.as_list()[1:])):
    raise ValueError(
        f"sample_weight must have shape [batch] or [batch, 1] (one weight per example), got "
        f"{shape}.")
  return tf.reshape(sample_weight, [batch])


def global_norms(per_microbatch_grads) -> tf.Tensor:
  """Returns the [M] L2 norms of per-microbatch gradients stacked on axis 0 of each tensor.

  ``norm_j = sqrt(sum_v ||g_{j,v}||^2)`` over all variables ``v``; ``None`` entries count as 0.
  """
  squares = [
      tf.reduce_sum(tf.reshape(tf.square(g), [tf.shape(g)[0], -1]), axis=1)
      for g in per_microbatch_grads if g is not None
  ]
  if not squares:
    raise ValueError("No variable has a gradient: nothing to clip.")
  return tf.sqrt(tf.add_n(squares))


def clip_factors(norms: tf.Tensor, l2_norm_clip) -> tf.Tensor:
  """Returns ``min(1, C / norm)`` per microbatch; a zero norm gets factor 1 (never NaN)."""
  # convert_to_tensor keeps a Python float's full precision (tf.cast would round it to float32).
  clip = (tf.cast(l2_norm_clip, norms.dtype) if isinstance(l2_norm_clip, tf.Tensor)
          else tf.convert_to_tensor(l2_norm_clip, dtype=norms.dtype))
  return tf.minimum(tf.ones_like(norms), tf.math.divide_no_nan(clip, norms) +
                    tf.cast(tf.equal(norms, 0), norms.dtype))


def clip_and_sum(per_microbatch_grads, l2_norm_clip):
  """Clips each microbatch gradient to L2 norm ``l2_norm_clip`` and sums over microbatches.

  Args:
    per_microbatch_grads: list with one tensor ``[M, *variable.shape]`` per variable
      (``None`` for a variable the loss does not reach: it stays ``None``).
    l2_norm_clip: clip norm ``C > 0`` (gradient units).

  Returns:
    ``(summed_grads, norms)``: the list of ``sum_j g_j min(1, C/||g_j||)`` and the [M] norms.
  """
  norms = global_norms(per_microbatch_grads)
  factors = clip_factors(norms, l2_norm_clip)
  summed = []
  for g in per_microbatch_grads:
    if g is None:
      summed.append(None)
      continue
    summed.append(tf.tensordot(tf.cast(factors, g.dtype), g, axes=[[0], [0]]))
  return summed, norms
