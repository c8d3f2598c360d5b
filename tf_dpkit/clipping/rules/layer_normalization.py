"""``keras.layers.LayerNormalization`` over the last axis (diagonal gamma and beta)."""
from __future__ import annotations

import keras
import tensorflow as tf

from tf_dpkit.clipping.rules._linear import as_sequence, group_examples, propagate_mask
from tf_dpkit.clipping.rules.registry import LayerTrace, register_layer_rule


@register_layer_rule(keras.layers.LayerNormalization)
def layer_normalization_rule(layer, inputs):
  """``keras.layers.LayerNormalization`` over the last axis (gamma and beta are diagonal)."""
  axis = layer.axis if isinstance(layer.axis, (list, tuple)) else [layer.axis]
  rank = inputs.shape.rank
  if [a % rank for a in axis] != [rank - 1] or getattr(layer, "rms_scaling", False):
    return None
  mean, variance = tf.nn.moments(inputs, axes=[rank - 1], keepdims=True)
  normalized = (inputs - mean) * tf.math.rsqrt(variance + layer.epsilon)
  z = normalized
  if layer.scale:
    z = z * layer.gamma
  if layer.center:
    z = z + layer.beta
  outputs = propagate_mask(inputs, z)

  def squared_norms(g, num_groups):
    total = 0.0
    g_seq = group_examples(as_sequence(g), num_groups)
    if layer.scale:
      xhat = group_examples(as_sequence(normalized), num_groups)
      total += tf.reduce_sum(tf.square(tf.reduce_sum(g_seq * xhat, axis=1)), axis=1)
    if layer.center:
      total += tf.reduce_sum(tf.square(tf.reduce_sum(g_seq, axis=1)), axis=1)
    return total
  return LayerTrace(outputs, z, squared_norms)
