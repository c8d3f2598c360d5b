"""Clip per-microbatch gradients to an L2 ball and sum them.

For microbatch gradients ``g_1..g_M`` (each the concatenation of all variables' gradients)
the clipped sum is

    S = sum_j g_j * min(1, C / ||g_j||_2)

so each microbatch moves ``S`` by at most ``C`` in L2 norm: the sensitivity DP-SGD's noise is
calibrated to.  Norms are taken over all variables together (global clipping).

Before clipping, per-microbatch gradients are promoted to float32 when they are float16 or
bfloat16, divided by the static loss scale when one was used (mixed_float16), and a microbatch
with any non-finite entry, or whose loss is non-finite, is replaced by zero
(:func:`unscaled_finite_float32`): its share then has norm ``0 <= C``, so the bound above holds
whatever one example does to float16's range, and an example with an inf/NaN feature or label
contributes 0 instead of turning the whole sum into NaN (which would reveal its presence).
"""
from __future__ import annotations

import numbers

import tensorflow as tf

from tf_dpkit import _autograph


_ISSUED = object()


class ClippedSum:
  """A clipped sum of per-microbatch gradients, made only by tf_dpkit's clipping paths.

  Attributes (read-only):
    grads: tuple, one tensor per variable, ``sum_j clip(g_j)`` (not yet noised or averaged).
    norms: float tensor [M], the pre-clipping L2 norm of each microbatch gradient.
    losses: float tensor [M], each microbatch's mean loss (for logging).
    l2_norm_clip: the clip norm ``C`` the sum was clipped at, as the clipping path was given it
      (a number, or the variable of an adaptive clip norm); None when unknown.

  A DP optimizer's ``privatize`` accepts only a ``ClippedSum``, so raw gradients cannot be
  certified private; the constructor is not public (it refuses callers outside the clipping
  package).
  """

  __slots__ = ("_grads", "_norms", "_losses", "_l2_norm_clip")

  def __init__(self, grads, norms, losses, l2_norm_clip=None, *, _token=None):
    if _token is not _ISSUED:
      raise TypeError(
          "ClippedSum is made only by tf_dpkit's clipping functions (private_gradients, "
          "clipped_sum_fast, clipped_sum_vectorized, clipped_sum_from_vector_loss), so that "
          "only clipped gradients can be noised and certified private.")
    self._grads, self._norms, self._losses = tuple(grads), norms, losses
    self._l2_norm_clip = l2_norm_clip

  grads = property(lambda self: self._grads)
  norms = property(lambda self: self._norms)
  losses = property(lambda self: self._losses)
  l2_norm_clip = property(lambda self: self._l2_norm_clip)

  def __iter__(self):
    return iter((list(self._grads), self._norms, self._losses))


def issue_clipped_sum(grads, norms, losses, l2_norm_clip=None) -> ClippedSum:
  """Wraps the output of a clipping path (inside the clipping package only); ``l2_norm_clip``
  is the clip norm it was given (see ``ClippedSum.l2_norm_clip``)."""
  # Per-layer clip norms (tf_dpkit.clipping.groups) record their total sqrt(sum C_l^2).
  l2_norm_clip = getattr(l2_norm_clip, "total", l2_norm_clip)
  return ClippedSum(grads, norms, losses, l2_norm_clip, _token=_ISSUED)


@_autograph.graph_code
def global_norms(per_microbatch_grads) -> tf.Tensor:
  """Returns the [M] L2 norms of per-microbatch gradients stacked on axis 0 of each tensor.

  ``norm_j = sqrt(sum_v ||g_{j,v}||^2)`` over all variables ``v``; ``None`` entries count as 0.
  """
  squares = [
      tf.reduce_sum(tf.reshape(tf.square(g), [tf.shape(g)[0], -1]), axis=1)
      for g in per_microbatch_grads if g is not None
  ]
  if not squares:
    raise ValueError("No variable has a gradient: nothing to clip.")
  return tf.sqrt(tf.add_n(squares))


def clip_factors(norms: tf.Tensor, l2_norm_clip) -> tf.Tensor:
  """Returns ``min(1, C / norm)`` per microbatch; a zero norm gets factor 1 (never NaN).

  ``l2_norm_clip``: a number, or a scalar tensor or variable (e.g. an adaptive clip norm).
  """
  # convert_to_tensor keeps a Python float's full precision (tf.cast would round it to float32).
  clip = (tf.convert_to_tensor(l2_norm_clip, dtype=norms.dtype)
          if isinstance(l2_norm_clip, numbers.Real) else tf.cast(l2_norm_clip, norms.dtype))
  return tf.minimum(tf.ones_like(norms), tf.math.divide_no_nan(clip, norms) +
                    tf.cast(tf.equal(norms, 0), norms.dtype))


def at_least_float32(tensor):
  """``tensor`` cast to float32 if it is float16 or bfloat16 (other dtypes unchanged): the one
  rule for the precision per-example norms, clip factors and clipped sums are formed in."""
  if tensor.dtype in (tf.float16, tf.bfloat16):
    return tf.cast(tensor, tf.float32)
  return tensor


def _all_finite_hint(tensor):
  """Scalar bool that is True only if every entry of ``tensor`` is finite, cheaply.

  The sum of the entries is inf or NaN whenever one entry is (``inf + x = inf``,
  ``inf - inf = NaN``, NaN propagates), so a finite sum proves every entry finite; the converse
  fails only when the sum of finite entries overflows, and then the callers take their exact
  entry-by-entry branch.  One vectorised reduction instead of a boolean tensor the size of
  ``tensor`` and a select over it.  Half precision gets False (its sums overflow at 65504, so
  the hint would send it to the exact branch anyway).
  """
  if tensor.dtype not in (tf.float32, tf.float64):
    return tf.constant(False)
  return tf.math.is_finite(tf.reduce_sum(tensor))


def finite_rows(tensors, num_rows) -> tf.Tensor:
  """[M] bool: row ``j`` of every tensor in ``tensors`` (each ``[M*k, ...]``, rows grouped
  ``k`` at a time into ``M`` groups) is finite (no inf or NaN)."""
  present = [tf.convert_to_tensor(t) for t in tensors if t is not None]  # IndexedSlices: dense
  if not present:
    return tf.ones([num_rows], tf.bool)

  def exact():
    ok = [tf.reduce_all(tf.reshape(tf.math.is_finite(t), [num_rows, -1]), axis=1)
          for t in present]
    return tf.reduce_all(tf.stack(ok), axis=0)

  hint = tf.reduce_all(tf.stack([_all_finite_hint(t) for t in present]))
  return tf.cond(hint, lambda: tf.ones([num_rows], tf.bool), exact)


def finite_entries(tensor):
  """``(tensor with every inf/NaN entry replaced by 0, [B] bool: row b had no such entry)``.

  The one rule by which the fast path reads a layer's input (``tensor`` [B, ...], float): the
  rule then works on finite values, and the row flags mark the examples to leave out (clip
  factor 0; see ``fast_path._finite_microbatch_norms``), so their contribution to every
  clipped sum is exactly 0.  ``tf.where``, not a product: ``0 * inf`` would be NaN.
  Both are exact; when every entry is finite (the sum of the entries is, see
  ``_all_finite_hint``) the tensor passes through unchanged without the select.

  Gradient: the upstream gradient, unchanged (straight-through).  That is the exact gradient
  on every row whose entries are all finite; a row with an inf/NaN entry belongs to an example
  the fast path leaves out (above): its clip factor is 0 and the non-finite rows of every
  output gradient are zeroed before any norm or sum, so what flows back through it adds
  exactly 0 to the clipped sum.  Differentiating the
  ``tf.cond`` itself would cost memory for nothing (docs/design/clipping_fast_path.md).
  """
  batch = tf.shape(tensor)[0]

  def exact(t):
    finite = tf.math.is_finite(t)
    rows = tf.reduce_all(tf.reshape(finite, tf.stack([batch, -1])), axis=1)
    return tf.where(finite, t, tf.zeros([], t.dtype)), rows

  @tf.custom_gradient
  def guarded(t):
    cleaned, rows = tf.cond(_all_finite_hint(t),
                            lambda: (tf.identity(t), tf.ones([batch], tf.bool)),
                            lambda: exact(t))
    return (cleaned, rows), lambda upstream, _rows_upstream=None: upstream

  return guarded(tensor)


def finite_microbatches(per_microbatch_grads, losses=None):
  """[M] bool: microbatch ``j``'s gradient has no inf/NaN entry (in any tensor of the list,
  each ``[M, ...]``, ``None`` skipped) and, when ``losses`` [M] is given, its loss is finite."""
  present = [g for g in per_microbatch_grads if g is not None]
  if not present:
    raise ValueError("No variable has a gradient: nothing to clip.")
  keep = finite_rows(present, tf.shape(present[0])[0])
  if losses is not None:
    keep = tf.logical_and(keep, tf.math.is_finite(losses))
  return keep


def finite_rows_zeroed(tensor, num_rows):
  """``(tensor with the rows of its non-finite groups set to 0, [M] bool: group j was finite)``.

  ``tensor`` is ``[M*k, ...]`` (rows grouped ``k`` at a time); a group with an inf/NaN entry
  in any of its rows has all its rows replaced by exact zeros (``tf.where``).  One tensor at a
  time, so that a caller can gate each tensor as soon as it exists and free it after its last
  use, instead of waiting for a whole list (:func:`finite_rows`, :func:`zero_rows_all`).  When
  the sum of the entries is finite (``_all_finite_hint``) the tensor passes through unchanged.
  """
  t = tf.convert_to_tensor(tensor)  # IndexedSlices: dense

  def exact():
    ok = tf.reduce_all(tf.reshape(tf.math.is_finite(t), tf.stack([num_rows, -1])), axis=1)
    return zero_rows(t, ok), ok

  return tf.cond(_all_finite_hint(t), lambda: (tf.identity(t), tf.ones([num_rows], tf.bool)),
                 exact)


def scaled_row_sum(factors, rows):
  """``sum_j factors[j] * rows[j]`` over the leading axis (``factors`` [M], ``rows`` [M, ...]),
  where a row whose factor is 0 adds exactly 0 even if it holds inf or NaN.

  The one contraction by which a rule turns the per-microbatch gradients it kept into its
  clipped sum.  A microbatch left out of the sum (clip factor 0: an inf/NaN input, loss or
  output gradient, or a squared norm that overflows) may still have kept rows that overflowed
  to inf, and ``0 * inf`` is NaN; a row with a nonzero factor is finite (its squared norm was).
  The plain contraction is taken when its result is finite (it then met no inf/NaN), else the
  contraction over the rows with a nonzero factor, zeros elsewhere; both are exact.
  """
  factors = tf.cast(factors, rows.dtype)
  total = tf.tensordot(factors, rows, axes=1)

  def exact():
    return tf.tensordot(factors, zero_rows(rows, tf.not_equal(factors, 0)), axes=1)

  return tf.cond(_all_finite_hint(total), lambda: tf.identity(total), exact)


def zero_rows(tensor, keep):
  """``tensor`` [M*k, ...] with the rows of the groups where ``keep`` [M] is False set to 0
  (``tf.where``, so a NaN or inf there does not reach the result)."""
  return zero_rows_all([tensor], keep)[0]


def zero_rows_all(tensors, keep):
  """:func:`zero_rows` of each tensor of the list ``tensors`` (``None`` stays ``None``) with
  one ``keep`` [M]: when every group is kept (the usual case) the tensors pass as they are,
  under one ``tf.cond`` for the whole list rather than one per tensor."""
  # IndexedSlices (e.g. an output gradient) are made dense, as tf.where would.
  present = [i for i, t in enumerate(tensors) if t is not None]
  dense = [tf.convert_to_tensor(tensors[i]) for i in present]
  if not dense:
    return list(tensors)

  def select():
    chosen = []
    for tensor in dense:
      rows = tf.shape(tensor)[0]
      # max(M, 1): an empty batch (M = 0) must fail at the clear empty-batch assertion, which
      # a graph may run after this op, not with an integer division by zero here.
      repeated = tf.repeat(keep, rows // tf.maximum(tf.shape(keep)[0], 1))
      repeated = tf.reshape(repeated,
                            tf.concat([[rows], tf.ones([tf.rank(tensor) - 1], tf.int32)], 0))
      chosen.append(tf.where(repeated, tensor, tf.zeros([], tensor.dtype)))
    return chosen

  out = tf.cond(tf.reduce_all(keep), lambda: [tf.identity(t) for t in dense], select)
  result = list(tensors)
  for i, t in zip(present, tf.nest.flatten(out)):
    result[i] = t
  return result


def unscaled_finite_float32(per_microbatch_grads, loss_scale=None, losses=None, keep=None):
  """Per-microbatch gradients ready to clip: float32, loss scale removed, non-finite zeroed.

  Each ``[M, ...]`` half-precision tensor is cast to float32 (float16/bfloat16 gradients of mixed-precision
  models are squared and summed in float32), divided by ``loss_scale`` ``S`` when given (the
  gradients were computed for ``S * loss``; clipping acts on the unscaled gradient), and a
  microbatch whose gradient has any inf or NaN entry (float16 overflow) is replaced by zero in
  every variable.  A zeroed microbatch contributes a vector of norm ``0 <= C`` to the clipped
  sum, so the sensitivity bound holds and no step is skipped: which microbatches are zeroed is
  a function of each microbatch alone, never a batch-level decision (unlike Keras's dynamic
  loss scaling, whose skipped steps and scale changes depend on the whole private batch).
  A microbatch whose loss in ``losses`` [M] (optional) is inf or NaN is zeroed as well, even
  where its gradient is finite; ``keep`` [M] (optional) is the result of
  :func:`finite_microbatches` when the caller already formed it.
  """
  grads = [None if g is None else at_least_float32(g) for g in per_microbatch_grads]
  if loss_scale is not None:
    grads = [None if g is None else g / tf.constant(loss_scale, g.dtype) for g in grads]
  if not any(g is not None for g in grads):
    return grads
  if keep is None:
    keep = finite_microbatches(grads, losses)
  return zero_rows_all(grads, keep)


@_autograph.graph_code
def clip_and_sum(per_microbatch_grads, l2_norm_clip, loss_scale=None, losses=None, keep=None):
  """Clips each microbatch gradient to L2 norm ``l2_norm_clip`` and sums over microbatches.

  Args:
    per_microbatch_grads: list with one tensor ``[M, *variable.shape]`` per variable
      (``None`` for a variable the loss does not reach: it stays ``None``).
    l2_norm_clip: clip norm ``C > 0`` (gradient units).
    loss_scale: optional static loss scale ``S > 0`` the gradients were computed at (see
      :func:`unscaled_finite_float32`, applied first: float32, divided by ``S``, microbatches
      with a non-finite entry zeroed).
    losses: optional [M] microbatch losses: a microbatch whose loss is non-finite is zeroed too.
    keep: optional [M] bool from :func:`finite_microbatches` (formed by the caller already).

  Returns:
    ``(summed_grads, norms)``: the list of ``sum_j g_j min(1, C/||g_j||)`` (half precision
    promoted to float32) and the [M] norms.
  """
  per_microbatch_grads = unscaled_finite_float32(per_microbatch_grads, loss_scale, losses, keep)
  if hasattr(l2_norm_clip, "clip_and_sum"):  # per-layer clip norms (tf_dpkit.clipping.groups)
    return l2_norm_clip.clip_and_sum(per_microbatch_grads)
  norms = global_norms(per_microbatch_grads)
  factors = clip_factors(norms, l2_norm_clip)
  summed = []
  for g in per_microbatch_grads:
    if g is None:
      summed.append(None)
      continue
    summed.append(tf.tensordot(tf.cast(factors, g.dtype), g, axes=[[0], [0]]))
  return summed, norms
