"""``keras.layers.Dense``: norms of a linear map (see ``_linear``)."""
from __future__ import annotations

import keras
import tensorflow as tf

from tf_dpkit.clipping.rules._linear import as_sequence, LinearNorms, propagate_mask
from tf_dpkit.clipping.rules.registry import LayerTrace, register_layer_rule


@register_layer_rule(keras.layers.Dense)
def dense_rule(layer, inputs):
  """``keras.layers.Dense`` on inputs of any rank (last axis contracted)."""
  if getattr(layer, "lora_enabled", False) or getattr(layer, "quantization_mode", None):
    return None
  kernel = layer.kernel
  z = tf.tensordot(inputs, kernel, axes=[[inputs.shape.rank - 1], [0]])
  if layer.use_bias:
    z = z + layer.bias
  outputs = propagate_mask(inputs, layer.activation(z) if layer.activation else z)

  linear = LinearNorms(layer.use_bias)

  def squared_norms(g, num_groups):
    return linear.squared_norms(as_sequence(inputs), as_sequence(g), num_groups)
  return LayerTrace(outputs, z, squared_norms,
                    lambda factors: linear.clipped_sum(factors, tf.shape(kernel)))
