"""``keras.layers.GroupNormalization`` over the last axis (channels last).

Each example's channels are split into ``G`` groups of ``C / G`` consecutive channels; each
group is normalised by its own mean and variance over the example's positions and the group's
channels (``xhat = (x - mean) / sqrt(var + epsilon)``, no batch statistics), then scaled and
shifted per channel: ``z = xhat * gamma + beta``.  The weights act on ``xhat`` only, so the
norms and the clipped sum are those of ``layer_normalization.scale_shift_trace`` (exact,
one pass over ``g`` and ``xhat``; no per-example gradient beyond the [M, C] sums).
"""
from __future__ import annotations

import keras
import tensorflow as tf

from tf_dpkit.clipping.rules._linear import as_sequence, static
from tf_dpkit.clipping.rules.layer_normalization import scale_shift_trace
from tf_dpkit.clipping.rules.registry import register_layer_rule


@register_layer_rule(keras.layers.GroupNormalization)
def group_normalization_rule(layer, inputs):
  """``keras.layers.GroupNormalization`` with ``axis`` the last axis; declines other axes."""
  rank = inputs.shape.rank
  channels = static(inputs.shape[-1]) if rank is not None else None
  if (rank is None or rank < 2 or not isinstance(layer.axis, int) or
      layer.axis % rank != rank - 1 or channels is None or channels % layer.groups):
    return None
  groups = int(layer.groups)
  seq = as_sequence(inputs)  # [B, S, C]
  grouped = tf.reshape(seq, tf.stack([tf.shape(seq)[0], tf.shape(seq)[1], groups,
                                      channels // groups]))
  mean, variance = tf.nn.moments(grouped, axes=[1, 3], keepdims=True)
  normalized = (grouped - mean) * tf.math.rsqrt(variance + layer.epsilon)
  normalized = tf.reshape(normalized, tf.shape(inputs))
  normalized.set_shape(inputs.shape)
  return scale_shift_trace(layer, inputs, normalized, layer.gamma if layer.scale else None,
                           layer.beta if layer.center else None)
