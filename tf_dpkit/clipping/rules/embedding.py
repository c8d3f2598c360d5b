"""``keras.layers.Embedding``: norms from token equality times the Gram matrix of ``g``."""
from __future__ import annotations

import keras
import tensorflow as tf

from tf_dpkit.clipping import _keras_internals
from tf_dpkit.clipping.rules._linear import as_sequence, group_examples
from tf_dpkit.clipping.rules.registry import LayerTrace, register_layer_rule


@register_layer_rule(keras.layers.Embedding)
def embedding_rule(layer, inputs):
  """``keras.layers.Embedding``: rows gathered by token; norms from token-equality x Gram."""
  if getattr(layer, "lora_enabled", False) or getattr(layer, "quantization_mode", None):
    return None
  ids = tf.cast(inputs, tf.int32)
  z = tf.gather(layer.embeddings, ids)
  outputs = z
  if layer.mask_zero:
    _keras_internals.set_keras_mask(outputs, tf.not_equal(ids, 0))

  def squared_norms(g, num_groups):
    tokens = group_examples(tf.reshape(ids, [tf.shape(ids)[0], -1, 1]), num_groups)[..., 0]
    grads = group_examples(as_sequence(g), num_groups)
    same = tf.cast(tf.equal(tokens[:, :, None], tokens[:, None, :]), g.dtype)
    return tf.reduce_sum(same * tf.matmul(grads, grads, transpose_b=True), axis=[1, 2])
  return LayerTrace(outputs, z, squared_norms)
