"""``keras.layers.EinsumDense``: per-example kernel gradients by one einsum."""
from __future__ import annotations

import keras
import tensorflow as tf

from tf_dpkit.clipping.rules._linear import group_examples, propagate_mask
from tf_dpkit.clipping.rules.registry import LayerTrace, register_layer_rule


@register_layer_rule(keras.layers.EinsumDense)
def einsum_dense_rule(layer, inputs):
  """``keras.layers.EinsumDense``: per-example kernel gradients by one einsum (first input
  letter = batch), bias gradients by summing ``g`` over the non-bias output axes."""
  if getattr(layer, "lora_enabled", False) or getattr(layer, "quantization_mode", None):
    return None
  equation = layer.equation.replace(" ", "")
  lhs, out_spec = equation.split("->")
  in_spec, kernel_spec = lhs.split(",")
  if "." in equation or not in_spec or in_spec[0] != out_spec[0] or in_spec[0] in kernel_spec:
    return None
  batch_letter = in_spec[0]
  z = tf.einsum(equation, inputs, layer.kernel)
  if layer.bias is not None:
    z = z + layer.bias
  outputs = propagate_mask(inputs, layer.activation(z) if layer.activation else z)

  def squared_norms(g, num_groups):
    per_example = tf.einsum(f"{in_spec},{out_spec}->{batch_letter}{kernel_spec}", inputs, g)
    grouped = tf.reduce_sum(group_examples(per_example[:, None], num_groups), axis=1)
    total = tf.reduce_sum(tf.reshape(tf.square(grouped), [num_groups, -1]), axis=1)
    if layer.bias is not None:
      # The bias broadcasts against the output's trailing axes: sum g over the axes where the
      # (left-padded) bias shape is 1.
      bias_shape = list(layer.bias.shape)
      padded = [1] * (g.shape.rank - 1 - len(bias_shape)) + bias_shape
      reduce_axes = [i + 1 for i, d in enumerate(padded) if d == 1]
      bias_grad = tf.reduce_sum(g, axis=reduce_axes) if reduce_axes else g
      bias_grad = tf.reshape(bias_grad, [tf.shape(g)[0], -1])
      grouped_bias = tf.reduce_sum(group_examples(bias_grad[:, None], num_groups), axis=1)
      total += tf.reduce_sum(tf.reshape(tf.square(grouped_bias), [num_groups, -1]), axis=1)
    return total
  return LayerTrace(outputs, z, squared_norms)
