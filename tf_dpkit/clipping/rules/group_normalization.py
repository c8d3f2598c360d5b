"""``keras.layers.GroupNormalization`` over the last axis (channels last).

Each example's channels are split into ``G`` groups of ``C / G`` consecutive channels; each
group is normalised by its own mean and variance over the example's positions and the group's
channels (``xhat = (x - mean) / sqrt(var + epsilon)``, no batch statistics), then scaled and
shifted per channel: ``z = xhat * gamma + beta``.  The weights act on ``xhat`` only, so the
norms and the clipped sum are those of ``layer_normalization.scale_shift_trace`` (exact,
one pass over ``g`` and ``xhat``; no per-example gradient beyond the [M, C] sums).  The output
itself is formed as Keras forms it (one fused scale-and-shift pass), which the backward pass
differentiates; ``xhat`` is formed only for the norms.
"""
from __future__ import annotations

import keras
import tensorflow as tf

from tf_dpkit.clipping.rules._linear import as_sequence, static
from tf_dpkit.clipping.rules.layer_normalization import scale_shift_trace
from tf_dpkit.clipping.rules.registry import register_layer_rule


@register_layer_rule(keras.layers.GroupNormalization)
def group_normalization_rule(layer, inputs):
  """``keras.layers.GroupNormalization`` with ``axis`` the last axis; declines other axes.

  The output is formed as Keras forms it (statistics in at least float32, then one fused
  ``x * (gamma / sigma) + (beta - mean gamma / sigma)`` pass), so the differentiated forward
  pass costs what Keras's does; ``xhat`` for the scale's per-example gradients is formed only
  when the norms are, from the same statistics.
  """
  rank = inputs.shape.rank
  channels = static(inputs.shape[-1]) if rank is not None else None
  if (rank is None or rank < 2 or not isinstance(layer.axis, int) or
      layer.axis % rank != rank - 1 or channels is None or channels % layer.groups):
    return None
  groups = int(layer.groups)
  seq = as_sequence(inputs)  # [B, S, C]
  grouped = tf.reshape(seq, tf.stack([tf.shape(seq)[0], tf.shape(seq)[1], groups,
                                      channels // groups]))
  compute_dtype = keras.backend.result_type(grouped.dtype, "float32")  # Keras's own rule
  grouped = tf.cast(grouped, compute_dtype)
  mean, variance = tf.nn.moments(grouped, axes=[1, 3], keepdims=True)  # [B, 1, G, 1]
  inverse = tf.math.rsqrt(variance + layer.epsilon)
  per_channel = [1, 1, groups, channels // groups]
  gamma = layer.gamma if layer.scale else None
  beta = layer.beta if layer.center else None
  scale = inverse if gamma is None else inverse * tf.cast(tf.reshape(gamma, per_channel),
                                                          compute_dtype)
  shift = -mean * scale
  if beta is not None:
    shift = shift + tf.cast(tf.reshape(beta, per_channel), compute_dtype)
  z = tf.cast(tf.reshape(grouped * scale + shift, tf.shape(inputs)), layer.compute_dtype)
  z.set_shape(inputs.shape)

  def normalized():  # xhat, outside the differentiated forward pass
    xhat = (grouped - mean) * inverse
    return tf.reshape(tf.stop_gradient(xhat), tf.shape(inputs))
  return scale_shift_trace(layer, inputs, normalized, gamma, beta, z=z)
