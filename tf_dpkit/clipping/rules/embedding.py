"""``keras.layers.Embedding``: per-microbatch gradient norms from output gradients summed by token.

The layer gathers rows of ``E`` [V, d]: ``z[b, s] = E[id[b, s]]`` for ids of any rank [B, ...].
With ``g[b, s] = dL_b/dz[b, s]``, microbatch ``j``'s gradient of ``E`` has rows

    G_j[v] = sum over positions (b, s) of microbatch j with id[b, s] = v of g[b, s],

so ``||G_j||^2 = sum_v ||G_j[v]||^2``.  :class:`TokenSums` forms it in time linear in the number
of positions: every position gets the key ``j (V + 1) + id`` (int64), positions with equal keys
have their ``g`` summed (one segment sum, accumulated in float32 at least), and the squared row
norms are summed per microbatch.  Keys of different microbatches never coincide, so equal ids in
different examples of a microbatch are merged and in different microbatches never.  Ids outside
``[0, V)`` (an error on CPU, a zero row on GPU) touch no row of ``E``: they share the key
``j (V + 1) + V`` and count for nothing.

The clipped sum ``sum_j c_j G_j`` is formed from the same per-key sums (each scaled by its
microbatch's clip factor and added into row ``id`` of a dense [V, d] result), so every
microbatch's share has exactly the norm that was clipped.
"""
from __future__ import annotations

import keras
import tensorflow as tf

from tf_dpkit.clipping import _keras_internals
from tf_dpkit.clipping.rules.registry import LayerTrace, register_layer_rule


class TokenSums:
  """Per-(microbatch, token) sums of output gradients: the embedding's per-microbatch gradients.

  ``squared_norms(g, M)`` with ``g`` [B, ..., d] (``ids.shape + [d]``) returns the [M] values
  ``||G_j||^2`` (see the module docstring) in ``g``'s dtype, or float32 for 16-bit ``g``;
  ``clipped_sum(factors)`` then returns ``[sum_j c_j G_j]`` ([V, d]) from the sums it kept.
  """

  def __init__(self, ids, vocab_size):
    self.ids = ids
    self.vocab_size = int(vocab_size)
    self._sums = None

  def squared_norms(self, g, num_groups):
    width = self.vocab_size + 1
    ids = tf.reshape(tf.cast(self.ids, tf.int64), tf.stack([num_groups, -1]))  # [M, K]
    in_range = tf.logical_and(ids >= 0, ids < self.vocab_size)
    keys = (tf.range(tf.cast(num_groups, tf.int64), dtype=tf.int64)[:, None] * width
            + tf.where(in_range, ids, tf.constant(self.vocab_size, tf.int64)))
    unique_keys, position_key = tf.unique(tf.reshape(keys, [-1]), out_idx=tf.int32)
    dtype = tf.float32 if g.dtype.size < 4 else g.dtype
    rows = tf.reshape(tf.cast(g, dtype), tf.stack([-1, tf.shape(g)[-1]]))  # [B * positions, d]
    sums = tf.math.unsorted_segment_sum(rows, position_key, tf.size(unique_keys))  # [U, d]
    group = tf.cast(unique_keys // width, tf.int32)
    token = unique_keys % width
    counted = token < self.vocab_size
    self._sums = (sums, group, tf.where(counted, tf.cast(token, tf.int32), -1))
    squared = tf.where(counted, tf.reduce_sum(tf.square(sums), axis=1), tf.zeros([], dtype))
    return tf.math.unsorted_segment_sum(squared, group, num_groups)

  def clipped_sum(self, factors):
    if self._sums is None:
      return None
    sums, group, token = self._sums
    scale = tf.gather(tf.cast(factors, sums.dtype), group)[:, None]
    # Negative segment ids (the out-of-range ids) are dropped.
    return [tf.math.unsorted_segment_sum(scale * sums, token, self.vocab_size)]


@register_layer_rule(keras.layers.Embedding)
def embedding_rule(layer, inputs):
  """``keras.layers.Embedding`` on ids of any rank; norms and clipped sum from :class:`TokenSums`."""
  if getattr(layer, "lora_enabled", False) or getattr(layer, "quantization_mode", None):
    return None
  ids = inputs if inputs.dtype in (tf.int32, tf.int64) else tf.cast(inputs, tf.int32)
  z = tf.gather(layer.embeddings, ids)
  outputs = z
  if layer.mask_zero:
    _keras_internals.set_keras_mask(outputs, tf.not_equal(ids, 0))
  sums = TokenSums(ids, layer.input_dim)
  return LayerTrace(outputs, z, sums.squared_norms, sums.clipped_sum)
