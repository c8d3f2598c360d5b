"""``keras.layers.Embedding``: per-microbatch gradient norms from output gradients summed by token.

The layer gathers rows of ``E`` [V, d]: ``z[b, s] = E[id[b, s]]`` for ids of any rank [B, ...].
With ``g[b, s] = dL_b/dz[b, s]``, microbatch ``j``'s gradient of ``E`` has rows

    G_j[v] = sum over positions (b, s) of microbatch j with id[b, s] = v of g[b, s],

so ``||G_j||^2 = sum_v ||G_j[v]||^2``.  :class:`TokenSums` forms it in time linear in the number
of positions (up to sorting each microbatch's ids): a token at one position of microbatch ``j``
adds that position's ``||g||^2``; the positions of a token repeated within ``j`` (equal ids are
adjacent once ``j``'s ids are sorted) have their ``g`` summed first, then squared.  Sums and
squares are accumulated in float32 at least.  Tokens are matched within a microbatch only, so
equal ids in different examples of one microbatch are merged and in different microbatches
never.  Ids outside ``[0, V)`` (an error on CPU, a zero row on GPU) touch no row of ``E`` and
count for nothing.

The clipped sum ``sum_j c_j G_j`` is one scatter of ``c_j g`` over the counted positions into
a dense [V, d] result: a linear function of the same ``g`` the norms were formed from, so each
microbatch's share has the norm that was clipped.

On a CPU, float32 work runs as two compiled kernels (``tf_dpkit.native``:
``dpkit_token_squared_norms``, ``dpkit_scatter_scaled_rows``, which find a microbatch's tokens
with a hash table instead of a sort); elsewhere as the TensorFlow ops below.  Both compute the
sums above, in different orders.
"""
from __future__ import annotations

import keras
import tensorflow as tf

from tf_dpkit import native
from tf_dpkit.clipping import _keras_internals
from tf_dpkit.clipping.rules.registry import LayerTrace, register_layer_rule


class TokenSums:
  """Per-(microbatch, token) sums of output gradients: the embedding's per-microbatch gradients.

  ``squared_norms(g, M)`` with ``g`` [B, ..., d] (``ids.shape + [d]``) returns the [M] values
  ``||G_j||^2`` (see the module docstring) in ``g``'s dtype, or float32 for 16-bit ``g``;
  ``clipped_sum(factors)`` then returns ``[sum_j c_j G_j]`` ([V, d]) as one scatter of the
  positions' ``c_j g``.
  """

  def __init__(self, ids, vocab_size):
    self.ids = ids
    self.vocab_size = int(vocab_size)
    self._positions = None

  def squared_norms(self, g, num_groups):
    vocab = self.vocab_size
    # [M, K]: the K positions of each microbatch.  Ids outside [0, V) become -1 or V (not
    # counted), so that no cast or wrap can turn them into a counted id.
    ids = tf.cast(tf.clip_by_value(tf.reshape(self.ids, tf.stack([num_groups, -1])), -1, vocab),
                  tf.int32)
    counted = tf.logical_and(ids >= 0, ids < vocab)
    length = tf.shape(ids)[1]
    dtype = tf.float32 if g.dtype.size < 4 else g.dtype
    rows = tf.reshape(tf.cast(g, dtype), tf.stack([num_groups, length, tf.shape(g)[-1]]))
    # Decided once: clipped_sum follows it.
    kernels = native.kernels_for("embedding", g.device, dtype)
    self._positions = (ids, counted, rows, kernels)
    if kernels is not None:
      return kernels.dpkit_token_squared_norms(ids, rows, tf.constant(vocab, tf.int64))

    # Sorting each microbatch's ids puts the positions of one token next to each other (this
    # depends on the ids only, so it can run while the backward pass runs).
    sorted_ids, order = tf.math.top_k(ids, k=length)  # descending
    same = tf.equal(sorted_ids[:, 1:], sorted_ids[:, :-1])  # [M, K - 1]: as the previous
    pad = lambda t, where, value: tf.pad(t, [[0, 0], where], constant_values=value)[:, :length]
    starts = pad(tf.logical_not(same), [1, 0], True)  # first position of its token
    repeated = tf.logical_or(pad(same, [1, 0], False), pad(same, [0, 1], False))
    counted = tf.logical_and(sorted_ids >= 0, sorted_ids < vocab)

    # A token at one position of its microbatch: its row of G_j is that position's g.
    once = tf.logical_and(counted, tf.logical_not(repeated))
    position_squares = tf.gather(tf.reduce_sum(tf.square(rows), axis=2), order, batch_dims=1)
    squared = tf.reduce_sum(tf.where(once, position_squares, tf.zeros([], dtype)), axis=1)

    # A token at several positions: sum their g (runs of equal sorted ids), then square.
    pick = tf.cast(tf.where(tf.logical_and(counted, repeated)), tf.int32)  # [D, 2], row-major
    # Gathered as int32: GatherNd has no GPU kernel for bool (it would run on the host).
    run_starts = tf.gather_nd(tf.cast(starts, tf.int32), pick)
    run = tf.cumsum(run_starts) - 1
    picked = tf.gather_nd(rows, tf.stack([pick[:, 0], tf.gather_nd(order, pick)], axis=1))
    run_sums = tf.math.segment_sum(picked, run)  # [runs, d]
    run_group = tf.boolean_mask(pick[:, 0], run_starts > 0)
    return squared + tf.math.unsorted_segment_sum(
        tf.reduce_sum(tf.square(run_sums), axis=1), run_group, num_groups)

  def clipped_sum(self, factors):
    if self._positions is None:
      return None
    ids, counted, rows, kernels = self._positions
    if kernels is not None:
      return [kernels.dpkit_scatter_scaled_rows(ids, rows, tf.cast(factors, rows.dtype),
                                                tf.constant(self.vocab_size, tf.int64))]
    # [B * positions, V] sparse matrix with c_j at (position, id): the clipped sum is its
    # transpose times the positions' g (scaling and scatter in one op).
    scale = tf.cast(counted, rows.dtype) * tf.cast(factors, rows.dtype)[:, None]
    positions = tf.size(ids, out_type=tf.int64)
    indices = tf.stack([tf.range(positions), tf.reshape(tf.cast(tf.where(counted, ids, 0), tf.int64), [-1])], axis=1)
    weights = tf.SparseTensor(indices, tf.reshape(scale, [-1]), tf.stack([positions, self.vocab_size]))
    return [tf.sparse.sparse_dense_matmul(weights, tf.reshape(rows, tf.stack([-1, tf.shape(rows)[2]])), adjoint_a=True)]


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
