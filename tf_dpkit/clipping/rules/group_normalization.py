"""``keras.layers.GroupNormalization`` over the last axis (channels last).

Each example's channels are split into ``G`` groups of ``C / G`` consecutive channels; each
group is normalised by its own mean and variance over the example's positions and the group's
channels (no batch statistics), then scaled and shifted per channel.  The output is formed as
Keras forms it, ``z = x * scale + shift`` with ``scale = gamma / sigma`` and ``shift = beta -
mean * scale`` (per example, group and channel: [B, 1, G, C/G]; ``scale`` is [B, 1, G, 1]
without ``gamma``), and the rule watches ``scale`` and ``shift``: the backward pass the fast path runs anyway gives each example's
``dL/dscale`` (which includes the path through ``shift``) and ``dL/dshift``, so the
per-example gradients are ``dgamma = dL/dscale / sigma`` and ``dbeta = dL/dshift``, exactly
what differentiating Keras's layer on that example alone gives, with no tensor the size of the
activations beyond the backward pass's own (docs/design/clipping_fast_path.md).
"""
from __future__ import annotations

import keras
import tensorflow as tf

from tf_dpkit.clipping.clipped_sum import scaled_row_sum
from tf_dpkit.clipping.rules._linear import as_sequence, group_examples, propagate_mask, static
from tf_dpkit.clipping.rules.registry import LayerTrace, register_layer_rule


@register_layer_rule(keras.layers.GroupNormalization)
def group_normalization_rule(layer, inputs):
  """``keras.layers.GroupNormalization`` with ``axis`` the last axis; declines other axes.

  The output is formed as Keras forms it (statistics in at least float32, then one fused
  ``x * (gamma / sigma) + (beta - mean gamma / sigma)`` pass), so the differentiated forward
  pass costs what Keras's does; the per-example gradients come from the gradients at ``scale``
  and ``shift`` (module docstring).
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
  trainable = {id(v) for v in layer.trainable_variables}
  kept = {}

  def squared_norms(g, num_groups):
    g_scale, g_shift = g  # [B, 1, G, C/G] (g_scale [B, 1, G, 1] without gamma)
    batch = tf.shape(g_shift)[0]
    per_example = {}
    if gamma is not None and id(gamma) in trainable:
      per_example[id(gamma)] = g_scale * tf.cast(inverse, g_scale.dtype)  # dgamma = dscale / sigma
    if beta is not None and id(beta) in trainable:
      per_example[id(beta)] = g_shift
    for key, grads in per_example.items():
      grads = tf.reshape(grads, tf.stack([batch, channels]))
      kept[key] = tf.reduce_sum(group_examples(grads[:, None], num_groups), axis=1)  # [M, C]
    return tf.add_n([tf.zeros([num_groups], tf.float32)] +
                    [tf.reduce_sum(tf.square(tf.cast(grads, tf.float32)), axis=1)
                     for grads in kept.values()])

  def clipped_sum(factors):
    return [scaled_row_sum(factors, kept[id(v)])
            for v in layer.trainable_variables]
  return LayerTrace(propagate_mask(inputs, z), [scale, shift], squared_norms, clipped_sum)
