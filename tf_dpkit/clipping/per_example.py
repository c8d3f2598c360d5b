"""Per-microbatch gradients, two ways, each ending in :func:`clip_and_sum`.

* :func:`clipped_sum_from_vector_loss` -- the optimizer interface: the loss is a vector
  already computed on a tape, so per-microbatch gradients are rows of the Jacobian
  ``d loss_mb / d theta`` (vectorized with pfor).  Cost grows with
  ``num_microbatches x batch``: fine for few microbatches, slow for per-example clipping of
  big batches.  That is inherent to the "vector loss + tape" interface; in a ``tf.compat.v1``
  graph, where the ops between the inputs and the loss can be re-run, ``graph_replay``
  replays them per microbatch instead (about linear in the batch) and falls back to this.
* :func:`clipped_sum_vectorized` -- the model interface: a loss *function* of a microbatch is
  mapped over microbatches with ``tf.vectorized_map`` (``tf.map_fn`` where ``pfor`` cannot
  vectorise the model, e.g. masked recurrent layers), so each example's backward pass only
  sees its own microbatch (cost about linear in the batch).  ``DPModel`` uses it.

Microbatch ``j`` of a batch of ``B`` examples split into ``M`` microbatches holds examples
``j*k .. (j+1)*k - 1`` with ``k = B / M``; its loss is the mean of its examples' losses.  The
grouping is given either by ``num_microbatches=M`` (k = B / M) or by ``microbatch_size=k`` (M =
B / k, known only when the step runs for batches of variable size): the latter is how
augmentation multiplicity (``tf_dpkit.augmentation``) clips the mean gradient of each
example's ``k`` consecutive augmented rows as one unit.
"""
from __future__ import annotations

import tensorflow as tf

from analysis import _checks
from tf_dpkit import _autograph
from tf_dpkit.clipping.clipped_sum import clip_and_sum, finite_microbatches, issue_clipped_sum
from tf_dpkit.clipping.contract import map_examples


def _static_batch_size(tensor):
  return tf.compat.dimension_value(tensor.shape[0]) if tensor.shape.rank else None


def _check_divisible(batch_size_tensor, num_microbatches, static_batch):
  """Raises (statically when possible) unless ``num_microbatches`` divides the batch size."""
  message = (
      "num_microbatches={m} must divide the batch size{b}. For the last, smaller batch use "
      "`drop_remainder=True` in the input pipeline, or `num_microbatches=None` (one microbatch "
      "per example).")
  if static_batch is not None:
    if static_batch % num_microbatches:
      raise ValueError(message.format(m=num_microbatches, b=f" ({static_batch})"))
    return []
  return [tf.debugging.assert_equal(
      batch_size_tensor % num_microbatches, tf.cast(0, batch_size_tensor.dtype),
      message=message.format(m=num_microbatches, b=""))]


def check_grouping(num_microbatches, microbatch_size):
  """Validates the two ways of grouping rows into microbatches; at most one may be given.

  ``num_microbatches``: None or M >= 1 (M microbatches of B / M consecutive rows).
  ``microbatch_size``: None or k in [1, 1024] (B / k microbatches of k consecutive rows).
  Returns ``microbatch_size`` as an int (or None).
  """
  if microbatch_size is None:
    return None
  microbatch_size = _checks.check_integer("microbatch_size", microbatch_size, minimum=1,
                                          maximum=MAX_MICROBATCH_SIZE, none_allowed=True)
  if num_microbatches is not None:
    raise ValueError(
        f"num_microbatches={num_microbatches} and microbatch_size={microbatch_size} both group "
        "rows into microbatches; give at most one of them (augmentation multiplicity groups "
        "each example's augmented copies, so it needs num_microbatches=None).")
  return microbatch_size


def rows_divisible_checks(rows, microbatch_size, static_rows):
  """Checks (static when possible, else run-time assertions) that ``microbatch_size`` divides
  the number of rows."""
  message = (f"microbatch_size={microbatch_size} must divide the number of rows{{b}} (each "
             "microbatch is that many consecutive rows, e.g. one example's augmented copies).")
  if static_rows is not None:
    if static_rows % microbatch_size:
      raise ValueError(message.format(b=f" ({static_rows})"))
    return []
  return [tf.debugging.assert_equal(rows % microbatch_size, tf.cast(0, rows.dtype),
                                    message=message.format(b=""))]


#: The largest ``microbatch_size`` (and augmentation multiplicity) accepted.
MAX_MICROBATCH_SIZE = 1024


def assert_nonempty(batch_size):
  """A run-time assertion that the batch (a scalar size tensor) is not empty."""
  return tf.debugging.assert_positive(
      batch_size, message="The batch is empty: DP-SGD needs at least one example per step "
      "(tf_dpkit.data.poisson_batches never yields an empty batch; drop empty batches from "
      "other pipelines).")


@_autograph.graph_code
def split_into_microbatches(vector_loss, num_microbatches=None):
  """Returns the [M] microbatch mean losses of a per-example loss vector of length B.

  Args:
    vector_loss: float tensor [B] (one entry per example, B >= 1).  A scalar loss is rejected:
      it has already averaged examples together, so their individual influence cannot be
      bounded; so is a loss of rank > 1, whose batch axis would be ambiguous.
    num_microbatches: ``None`` (M = B, one example per microbatch) or an int M dividing B.
  """
  vector_loss = tf.convert_to_tensor(vector_loss)
  if vector_loss.shape.rank == 0:
    raise ValueError(
        "DP optimizers need a vector loss with one entry per example (shape [batch]), got a "
        "scalar. Compute the loss with reduction=None (e.g. "
        "`keras.losses.SparseCategoricalCrossentropy(reduction=None)` or "
        "`tf.nn.sparse_softmax_cross_entropy_with_logits`).")
  if vector_loss.shape.rank is not None and vector_loss.shape.rank > 1:
    raise ValueError(
        f"DP optimizers need a vector loss of shape [batch] (one entry per example), got shape "
        f"{vector_loss.shape}: with more axes the batch axis is ambiguous (a [1, batch] loss "
        "would be read as one example). Reduce the other axes per example first, e.g. "
        "`tf.reduce_mean(loss, axis=list(range(1, loss.shape.rank)))` for [batch, time].")
  checks = [assert_nonempty(tf.shape(vector_loss)[0])]
  if num_microbatches is None:
    with tf.control_dependencies(checks):
      return tf.identity(vector_loss)
  checks += _check_divisible(tf.shape(vector_loss)[0], num_microbatches,
                             _static_batch_size(vector_loss))
  with tf.control_dependencies(checks):
    return tf.reduce_mean(tf.reshape(vector_loss, [num_microbatches, -1]), axis=1)


def _zeros_for_unconnected(jacobian, var_list, num_rows):
  return [
      j if j is not None else tf.zeros(
          tf.concat([[num_rows], tf.shape(v)], 0), dtype=v.dtype)
      for j, v in zip(jacobian, var_list)
  ]


@_autograph.graph_code
def clipped_sum_from_vector_loss(vector_loss, var_list, l2_norm_clip, num_microbatches=None,
                                 tape=None, loss_scale=None):
  """Clipped sum of per-microbatch gradients of a vector loss.

  ``sum_j clip_C(grad_theta mean(loss[microbatch j]))``.  Variables the loss does not reach get
  zero gradients (so they receive pure noise after noising, as in the DP-SGD analysis).

  Args:
    vector_loss: float tensor [B], recorded on ``tape`` (eager/``tf.function``) or part of the
      current v1 graph (``tape=None`` outside eager mode).
    var_list: variables to differentiate.
    l2_norm_clip: clip norm C > 0.
    num_microbatches: ``None`` (per example) or an int dividing B.
    tape: the ``tf.GradientTape`` that recorded ``vector_loss``; required in eager mode.
    loss_scale: optional static loss scale ``S > 0``; the gradients are computed for
      ``loss * S`` (float16 numerics) and divided by it *before* clipping, so the scale never
      changes clipping; a microbatch whose gradient is non-finite contributes zero
      (``clipped_sum.unscaled_finite_float32``).

  Non-finite examples: a microbatch whose loss or Jacobian row has an inf/NaN entry contributes
  0.  That is exact only while the other rows are finite: the Jacobian comes from the batch's
  one recorded forward pass, where an inf/NaN in one example's features or loss derivative
  enters every row's weight gradient (``x_i * 0`` is NaN for ``x_i`` inf), so every row is then
  non-finite, and zeroing them all would release 0 in place of the other examples' sum.  When
  every one of ``M >= 2`` microbatches is non-finite the step therefore stops with an
  ``InvalidArgumentError`` (clean the data, see ``tf_dpkit.data.check_finite_features``, or use
  a ``DPModel``, whose paths compute each example apart).
  """
  if tape is not None:
    with tape:  # the microbatch reduction must be recorded too
      losses = split_into_microbatches(vector_loss, num_microbatches)
      target = losses * loss_scale if loss_scale is not None else losses
    jacobian = tape.jacobian(target, var_list,
                             unconnected_gradients=tf.UnconnectedGradients.ZERO,
                             experimental_use_pfor=True)
  else:
    if tf.executing_eagerly():
      raise ValueError(
          "In eager mode a tensor loss needs the `tape=` that recorded it (or pass the loss as "
          "a zero-argument callable).")
    from tensorflow.python.ops.parallel_for import gradients as pfor_gradients  # pylint: disable=g-import-not-at-top
    losses = split_into_microbatches(vector_loss, num_microbatches)
    target = losses * loss_scale if loss_scale is not None else losses
    jacobian = pfor_gradients.jacobian(target, list(var_list), use_pfor=True)
    jacobian = _zeros_for_unconnected(jacobian, var_list, tf.shape(losses)[0])
  keep = finite_microbatches(jacobian, losses)
  separable = tf.debugging.Assert(
      tf.logical_or(tf.reduce_any(keep), tf.size(keep) <= 1),
      ["Every per-microbatch gradient of this batch is inf or NaN. With a vector loss the "
       "Jacobian comes from the batch's one forward pass, so one example's inf/NaN feature or "
       "label makes every row NaN; zeroing them all would reveal that example. Remove "
       "non-finite examples (tf_dpkit.data.check_finite_features) or train a DPModel, whose "
       "clipping computes each example apart. Microbatches:", tf.size(keep)])
  with tf.control_dependencies([separable]):
    keep = tf.identity(keep)
  # float32, divided by the loss scale, non-finite microbatches zeroed, then clipped.
  summed, norms = clip_and_sum(jacobian, l2_norm_clip, loss_scale=loss_scale, keep=keep)
  return issue_clipped_sum(summed, norms, losses, l2_norm_clip)


def _to_microbatches(tensor, num_microbatches, microbatch_size=None):
  """[B, ...] -> [M, B/M, ...] (M = B when ``num_microbatches`` is None; B/M =
  ``microbatch_size`` when that is given)."""
  if tensor is None:
    return None
  tensor = tf.convert_to_tensor(tensor)
  rest = tf.shape(tensor)[1:]
  if microbatch_size is not None:
    leading = [-1, microbatch_size]
  else:
    leading = [-1, 1] if num_microbatches is None else [num_microbatches, -1]
  return tf.reshape(tensor, tf.concat([leading, rest], 0))


@_autograph.graph_code
def clipped_sum_vectorized(loss_fn, inputs, var_list, l2_norm_clip, num_microbatches=None,
                           vectorize=True, loss_scale=None, microbatch_size=None):
  """Clipped sum of per-microbatch gradients, mapping ``loss_fn`` over microbatches.

  Args:
    loss_fn: ``loss_fn(microbatch_inputs) -> (per_example_losses [k], aux)`` where
      ``microbatch_inputs`` has the structure of ``inputs`` with leading dimension k = B/M,
      and ``aux`` is a (possibly empty) nest of tensors with leading dimension k (e.g. the
      predictions, returned to the caller for metrics).
    inputs: nest of tensors (``None`` leaves allowed) sharing the batch dimension B.
    var_list: variables to differentiate.
    l2_norm_clip: clip norm C > 0.
    num_microbatches: ``None`` (per example, any B) or an int M dividing B.
    vectorize: False maps with ``tf.map_fn`` only (see ``examples.pfor_is_safe``).
    loss_scale: optional static loss scale ``S > 0`` (mixed_float16): each microbatch's
      gradient is computed for ``S * loss`` and divided by ``S`` before clipping; a microbatch
      whose gradient is non-finite contributes zero (``clipped_sum.unscaled_finite_float32``).
    microbatch_size: None, or k in [1, 1024] (not with ``num_microbatches``): microbatch j is
      rows ``j*k .. (j+1)*k - 1`` and B / k (which must be an integer) is known only when the
      step runs; each microbatch's gradient is the MEAN of its rows' loss gradients,
      ``(1/k) sum_r grad L_r``, clipped as one unit (augmentation multiplicity).

  Returns:
    ``(ClippedSum, aux)`` with ``aux`` re-assembled to leading dimension B.
  """
  microbatch_size = check_grouping(num_microbatches, microbatch_size)
  flat = [x for x in tf.nest.flatten(inputs) if x is not None]
  first = tf.convert_to_tensor(flat[0])
  checks = [assert_nonempty(tf.shape(first)[0])]
  if num_microbatches is not None:
    checks += _check_divisible(tf.shape(first)[0], num_microbatches, _static_batch_size(first))
  if microbatch_size is not None:
    checks += rows_divisible_checks(tf.shape(first)[0], microbatch_size,
                                    _static_batch_size(first))
  with tf.control_dependencies(checks):
    microbatched = tf.nest.map_structure(
        lambda t: _to_microbatches(t, num_microbatches, microbatch_size), inputs)

  def per_microbatch(mb_inputs):
    with tf.GradientTape() as tape:
      per_example, aux = loss_fn(mb_inputs)
      per_example = tf.convert_to_tensor(per_example)
      if per_example.shape.rank is not None and per_example.shape.rank > 1:
        per_example = tf.reduce_mean(
            tf.reshape(per_example, [tf.shape(per_example)[0], -1]), axis=1)
      loss = tf.reduce_mean(per_example)
      scaled = loss if loss_scale is None else loss * tf.constant(loss_scale, loss.dtype)
    grads = tape.gradient(scaled, var_list, unconnected_gradients=tf.UnconnectedGradients.ZERO)
    return grads, loss, aux

  grads, losses, aux = map_examples(per_microbatch, microbatched, vectorize)
  # A microbatch whose loss is inf or NaN contributes 0, even where its gradient is finite.
  summed, norms = clip_and_sum(grads, l2_norm_clip, loss_scale=loss_scale, losses=losses)
  aux = tf.nest.map_structure(
      lambda t: tf.reshape(t, tf.concat([[-1], tf.shape(t)[2:]], 0)), aux)
  return issue_clipped_sum(summed, norms, losses, l2_norm_clip), aux
