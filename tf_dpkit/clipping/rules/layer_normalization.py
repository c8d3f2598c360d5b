"""Normalisation layers whose trainable weights are a per-channel scale and shift on the last
axis: ``z = xhat * gamma + beta`` with ``xhat`` the normalised input (no weight in it).

Example ``i``'s gradients are per-channel sums over its positions ``s``:
``dgamma_i = sum_s g_is * xhat_is`` and ``dbeta_i = sum_s g_is`` (``g = dL_i/dz``), so exact
per-microbatch norms cost one elementwise pass over ``g`` and ``xhat``; they are kept
([M, C] each) and give the clipped sum by one small contraction.  :func:`scale_shift_trace`
is the one place this is formed.  (``GroupNormalization``, whose statistics are per example
rather than per position, takes its per-example gradients from the backward pass at its
[B, 1, G, C/G] scale and shift instead: ``group_normalization``.)
"""
from __future__ import annotations

import keras
import tensorflow as tf

from tf_dpkit.clipping.clipped_sum import scaled_row_sum
from tf_dpkit.clipping.rules._linear import as_sequence, group_examples, propagate_mask
from tf_dpkit.clipping.rules.registry import LayerTrace, register_layer_rule


def scale_shift_trace(layer, inputs, normalized, gamma, beta, z=None):
  """The ``LayerTrace`` of ``z = normalized * gamma + beta`` (either may be None), both of
  shape [C] and acting on the last axis of ``normalized`` ([B, ..., C], independent of the
  layer's weights).

  ``squared_norms(g, M)``: ``sum_c (sum_s g_s xhat_s)_c^2 + sum_c (sum_s g_s)_c^2`` over each
  microbatch's positions ``s`` (its examples' positions together), counting only the weights
  in ``layer.trainable_variables``; ``clipped_sum(factors)``: ``sum_j c_j grad_j`` for
  ``layer.trainable_variables`` in their order, from the [M, C] per-microbatch gradients.

  ``normalized`` may be a zero-argument callable returning ``xhat`` (formed only when the norms
  are, outside the differentiated forward pass); ``z``, when given, is the layer's output
  formed by the caller (equal to ``xhat * gamma + beta``; the caller's own, cheaper form),
  else it is formed here from ``normalized`` (then a tensor).
  """
  if z is None:
    z = normalized
    if gamma is not None:
      z = z * gamma
    if beta is not None:
      z = z + beta
  outputs = propagate_mask(inputs, z)
  trainable = {id(v) for v in layer.trainable_variables}
  kept = {}

  def squared_norms(g, num_groups):
    g_seq = group_examples(as_sequence(g), num_groups)
    if gamma is not None and id(gamma) in trainable:
      xhat = normalized() if callable(normalized) else normalized
      xhat = group_examples(as_sequence(tf.cast(xhat, g_seq.dtype)), num_groups)
      kept[id(gamma)] = tf.reduce_sum(g_seq * xhat, axis=1)  # [M, C]
    if beta is not None and id(beta) in trainable:
      kept[id(beta)] = tf.reduce_sum(g_seq, axis=1)  # [M, C]
    return tf.add_n([tf.reduce_sum(tf.square(grads), axis=1) for grads in kept.values()])

  def clipped_sum(factors):
    if set(kept) != trainable:
      return None
    return [scaled_row_sum(factors, kept[id(v)])
            for v in layer.trainable_variables]
  return LayerTrace(outputs, z, squared_norms, clipped_sum)


@register_layer_rule(keras.layers.LayerNormalization)
def layer_normalization_rule(layer, inputs):
  """``keras.layers.LayerNormalization`` over the last axis (gamma and beta are diagonal)."""
  axis = layer.axis if isinstance(layer.axis, (list, tuple)) else [layer.axis]
  rank = inputs.shape.rank
  if [a % rank for a in axis] != [rank - 1] or getattr(layer, "rms_scaling", False):
    return None
  mean, variance = tf.nn.moments(inputs, axes=[rank - 1], keepdims=True)
  normalized = (inputs - mean) * tf.math.rsqrt(variance + layer.epsilon)
  return scale_shift_trace(layer, inputs, normalized, layer.gamma if layer.scale else None,
                           layer.beta if layer.center else None)
