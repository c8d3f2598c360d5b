"""Per-microbatch gradient norms of linear maps: the one place they are formed.

Linear maps ``z_s = a_s W`` summed over positions ``s`` (Dense on sequences, convolutions
after unfolding) have per-microbatch gradient ``A^T G``; its squared norm is computed either
explicitly (cost ``M S d p``, memory ``M d p``) or with the Gram form
``sum((A A^T) * (G G^T))`` (cost ``M S^2 (d + p)``), whichever is cheaper; with one position
(``S = 1``) the gradient is the outer product ``a^T g`` and its squared norm is
``||a||^2 ||g||^2`` (cost ``M (d + p)``, no batched matmul).

The choice needs ``S`` (positions per microbatch), ``d`` and ``p``, which must not depend on
the batch size being known while tracing (Poisson batches and Keras's array batches have a
``None`` batch dimension): :func:`as_sequence` and :func:`group_examples` keep every static
size other than the batch, and :func:`per_example_groups` marks the ``num_groups`` of one
microbatch per example, so that the group length ``S`` is static then too.  Only when the
number of examples per microbatch is itself unknown while tracing (microbatches of a
``None``-sized batch) is the choice made when the step runs.
"""
from __future__ import annotations

import tensorflow as tf

from tf_dpkit.clipping.clipped_sum import scaled_row_sum
from tf_dpkit.clipping import _keras_internals

_ONE_PER_EXAMPLE = "_tf_dpkit_one_example_per_group"


def static(dim):
  return tf.compat.dimension_value(dim)


def per_example_groups(batch_size):
  """``num_groups`` for one microbatch per example: the batch size ``B`` (int32 scalar), marked
  so that :func:`examples_per_group` knows ``k = 1`` while tracing even when ``B`` is not."""
  groups = tf.identity(batch_size)
  setattr(groups, _ONE_PER_EXAMPLE, True)
  return groups


def examples_per_group(num_groups, batch_size=None):
  """``k = B / M`` as a Python int when it is known while tracing, else None.

  Known when ``num_groups`` came from :func:`per_example_groups` (``k = 1``), or when both
  ``M`` and the static batch size ``batch_size`` are known.
  """
  if getattr(num_groups, _ONE_PER_EXAMPLE, False):
    return 1
  groups = tf.get_static_value(num_groups)
  if groups is None or batch_size is None or int(groups) <= 0 or batch_size % int(groups):
    return None
  return int(batch_size) // int(groups)


def group_examples(tensor, num_groups):
  """[B, S, ...] -> [M, (B/M) S, ...]: a microbatch becomes one long "example".

  Every static size of the result except ``M`` is kept whenever ``B/M`` is known while tracing
  (:func:`examples_per_group`), whether or not ``B`` is.
  """
  k = examples_per_group(num_groups, static(tensor.shape[0]))
  if k == 1:
    return tensor
  shape = tf.shape(tensor)
  length = static(tensor.shape[1])
  length = -1 if k is None or length is None else k * length
  rest = [static(d) if static(d) is not None else shape[i + 2]
          for i, d in enumerate(tensor.shape[2:])]
  return tf.reshape(tensor, tf.stack([num_groups, length] + rest))


def keeping_costs_no_memory(gradient_size, input_size, output_size):
  """Whether a layer's per-microbatch weight gradients (``gradient_size`` entries per
  microbatch) may be kept until the clip factors are known: when they are no larger than the
  layer's input plus its output gradient per example (``input_size + output_size`` entries),
  which the fast path's vector-Jacobian product would keep alive instead.  Sizes unknown while
  tracing (None) give False.  The one memory rule for kept gradients: with it the clipped sum
  costs no more memory than the VJP, whose extra cost is one more weight-gradient pass.
  (``LinearNorms`` keeps them only in its explicit form, chosen when ``S (d + p) >= d p`` for
  ``S`` positions per microbatch: the same bound when a microbatch is one example.)
  """
  if gradient_size is None or input_size is None or output_size is None:
    return False
  return gradient_size <= input_size + output_size


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
    if s == 1:
      # One position per microbatch (a Dense layer on [B, d] inputs, one example each): the
      # gradient a^T g is rank one, ||a^T g||^2 = ||a||^2 ||g||^2, and the bias gradient is g.
      a_sq = tf.reduce_sum(tf.square(a[:, 0]), axis=1)
      g_sq = tf.reduce_sum(tf.square(g[:, 0]), axis=1)
      return g_sq * (a_sq + 1.0) if self.with_bias else g_sq * a_sq
    if s is None and d is not None and p is not None:
      # Examples per microbatch unknown while tracing: choose when the step runs; the clipped
      # sum then comes from the vector-Jacobian product (no per-microbatch gradients kept).
      s = tf.shape(a)[1]
      norms = tf.cond(self.explicit_is_cheaper(s, d, p),
                      lambda: tf.reduce_sum(tf.square(tf.matmul(a, g, transpose_a=True)),
                                            axis=[1, 2]),
                      lambda: self._gram_squared_norms(a, g))
      return norms + self._bias_squared_norms(g)
    if s is not None and d is not None and p is not None and not self.explicit_is_cheaper(s, d, p):
      return self._gram_squared_norms(a, g) + self._bias_squared_norms(g)
    return self._explicit_squared_norms(tf.matmul(a, g, transpose_a=True), g)  # [M, d, p]

  @staticmethod
  def explicit_is_cheaper(positions, d, p):
    """Whether the explicit per-microbatch gradients (``S d p``) cost no more than the Gram form
    (``S^2 (d + p)``) for ``S = positions``: the one rule :meth:`squared_norms` chooses by (a
    Python bool for ints, a bool tensor when ``S`` is known only when the step runs)."""
    return positions * (d + p) >= d * p

  @staticmethod
  def _gram_squared_norms(a, g):
    return tf.reduce_sum(
        tf.matmul(a, a, transpose_b=True) * tf.matmul(g, g, transpose_b=True), axis=[1, 2])

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
    grads = [tf.reshape(scaled_row_sum(factors, self.kernel_grads), kernel_shape)]
    if self.with_bias:
      grads.append(scaled_row_sum(factors, self.bias_grads))
    return grads


def as_sequence(t):
  """[B, ..., d] -> [B, S, d] (S = product of the middle dims, 1 for 2-D), keeping the static
  ``S`` and ``d`` when the batch size is unknown while tracing."""
  shape = tf.shape(t)
  rank = t.shape.rank
  middle = t.shape[1:-1].num_elements() if rank is not None else None
  last = static(t.shape[-1]) if rank is not None else None
  return tf.reshape(t, tf.stack([shape[0], -1 if middle is None else middle,
                                 shape[-1] if last is None else last]))


def propagate_mask(inputs, outputs):
  """Attaches ``inputs``'s Keras mask to ``outputs`` (position-wise layers keep the mask)."""
  mask = _keras_internals.keras_mask(inputs)
  if mask is not None:
    _keras_internals.set_keras_mask(outputs, mask)
  return outputs

