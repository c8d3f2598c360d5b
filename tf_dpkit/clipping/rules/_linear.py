"""Per-microbatch gradient norms of linear maps: the one place they are formed.

Linear maps ``z_s = a_s W`` summed over positions ``s`` (Dense on sequences, convolutions
after unfolding) have per-microbatch gradient ``A^T G``; its squared norm is computed either
explicitly (cost ``M S d p``) or with the Gram form ``sum((A A^T) * (G G^T))`` (cost
``M S^2 (d + p)``), whichever is cheaper for the static shapes.
"""
from __future__ import annotations

import tensorflow as tf

from tf_dpkit.clipping import _keras_internals


def group_examples(tensor, num_groups):
  """[B, S, ...] -> [M, (B/M) S, ...]: a microbatch becomes one long "example"."""
  shape = tf.shape(tensor)
  return tf.reshape(tensor, tf.concat([[num_groups, -1], shape[2:]], 0))


def static(dim):
  return tf.compat.dimension_value(dim)


class LinearNorms:
  """Per-microbatch gradient norms of ``z_s = a_s W (+ b)`` summed over positions s.

  ``squared_norms(a, g, M)`` with A [B,S,d], G [B,S,p] returns ``||A_j^T G_j||^2 (+ ||sum_s
  G_j||^2)`` for the M microbatches.  When the explicit form is the cheaper one, the
  per-microbatch gradients are kept, and ``clipped_sum(factors, kernel_shape)`` returns
  ``sum_j c_j grad_j`` from them with one small contraction (no VJP needed).
  """

  def __init__(self, with_bias):
    self.with_bias = with_bias
    self.kernel_grads = None
    self.bias_grads = None

  def squared_norms(self, a, g, num_groups):
    a = group_examples(a, num_groups)
    g = group_examples(g, num_groups)
    s, d, p = static(a.shape[1]), static(a.shape[2]), static(g.shape[2])
    use_gram = s is not None and d is not None and p is not None and s * s * (d + p) < s * d * p
    if use_gram:
      norms = tf.reduce_sum(
          tf.matmul(a, a, transpose_b=True) * tf.matmul(g, g, transpose_b=True), axis=[1, 2])
      return norms + self._bias_squared_norms(g)
    return self._explicit_squared_norms(tf.matmul(a, g, transpose_a=True), g)  # [M, d, p]

  def squared_norms_from_kernel_grads(self, kernel_grads, g, num_groups):
    """As :meth:`squared_norms`, given the per-microbatch kernel gradients [M, d, p] (formed by
    the caller some cheaper way) and G [B, S, p]."""
    return self._explicit_squared_norms(kernel_grads, group_examples(g, num_groups))

  def _explicit_squared_norms(self, kernel_grads, grouped_g):
    self.kernel_grads = kernel_grads
    norms = tf.reduce_sum(tf.square(kernel_grads), axis=[1, 2])
    return norms + self._bias_squared_norms(grouped_g)

  def _bias_squared_norms(self, grouped_g):
    if not self.with_bias:
      return 0.0
    self.bias_grads = tf.reduce_sum(grouped_g, axis=1)  # [M, p]
    return tf.reduce_sum(tf.square(self.bias_grads), axis=1)

  def clipped_sum(self, factors, kernel_shape):
    if self.kernel_grads is None:
      return None
    factors = tf.cast(factors, self.kernel_grads.dtype)
    grads = [tf.reshape(tf.tensordot(factors, self.kernel_grads, axes=1), kernel_shape)]
    if self.with_bias:
      grads.append(tf.tensordot(factors, self.bias_grads, axes=1))
    return grads


def as_sequence(t):
  """[B, ..., d] -> [B, S, d] (S = product of the middle dims, 1 for 2-D)."""
  shape = tf.shape(t)
  return tf.reshape(t, tf.stack([shape[0], -1, shape[-1]]))


def propagate_mask(inputs, outputs):
  """Attaches ``inputs``'s Keras mask to ``outputs`` (position-wise layers keep the mask)."""
  mask = _keras_internals.keras_mask(inputs)
  if mask is not None:
    _keras_internals.set_keras_mask(outputs, mask)
  return outputs

