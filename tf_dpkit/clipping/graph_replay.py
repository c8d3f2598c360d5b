"""Per-example replay of a ``tf.compat.v1`` graph's vector loss: clipping at O(B) cost, no tape.

In a v1 graph the vector loss ``L`` [B] is computed from batch-major inputs (``tf.data``
iterator outputs, placeholders) and variable reads.  :func:`clipped_sum_replayed` re-creates
the ops between those inputs and ``L`` on one microbatch (``k = B / M`` consecutive rows; one
example without microbatches), maps that copy over the microbatches with ``tf.vectorized_map``
and differentiates each copy alone, so microbatch ``j``'s gradient is a function of its own
rows only (the clipped sum moves by at most ``C`` when one example is removed, whatever the
loss does), and the cost is about one batched backward pass instead of the ``M`` of the
Jacobian path.  Random ops whose shape follows the batch (dropout masks) are not re-drawn:
each copy reads its own rows of the batch's draw.  Each step asserts that the replayed losses
equal ``L`` (the batch loss the user wrote), so a loss that mixes examples is stopped with an
error, never trained as a different function.  What cannot be replayed is reported by
:func:`plan_replay` (the optimizer then takes the exact Jacobian path and says so once).
Design: ``docs/design/clipping_graph_replay.md``.
"""
from __future__ import annotations

import tensorflow as tf

from tf_dpkit.clipping import swap
from tf_dpkit.clipping.clipped_sum import clip_and_sum, issue_clipped_sum
from tf_dpkit.clipping.contract import map_examples
from tf_dpkit.clipping.per_example import split_into_microbatches

#: Ops whose outputs are batch-major inputs of the step (each example's rows are its data).
BATCH_SOURCE_TYPES = frozenset({
    "IteratorGetNext", "IteratorGetNextSync", "OptionalGetValue", "Placeholder",
    "PlaceholderWithDefault"})

#: Random ops whose value depends on the data only through input 0, the output shape: when that
#: shape follows the batch, each replayed microbatch reads its own rows of the batch's draw.
RANDOM_TYPES = frozenset({
    "RandomUniform", "RandomStandardNormal", "TruncatedNormal", "RandomUniformInt",
    "StatelessRandomUniform", "StatelessRandomNormal", "StatelessTruncatedNormal",
    "StatelessRandomUniformV2", "StatelessRandomNormalV2", "StatelessTruncatedNormalV2",
    "StatelessRandomUniformIntV2", "StatelessRandomUniformFullIntV2"})

_CONTROL_FLOW_TYPES = frozenset({
    "Switch", "Merge", "Enter", "Exit", "NextIteration", "LoopCond", "RefSwitch", "RefMerge",
    "RefEnter", "RefExit", "RefNextIteration"})

#: Replayed and batch losses agree when ``|a - b| <= ATOL + RTOL * max(|a|, |b|)`` (both
#: non-finite also agrees): float rounding of batched and single-example kernels differs by
#: orders of magnitude less; a loss that mixes examples differs by far more.
RTOL, ATOL = 1e-3, 1e-4


class Unreplayable(ValueError):
  """The vector loss's graph cannot be replayed per example; ``str(e)`` says why."""


class ReplayPlan:
  """What :func:`plan_replay` found: the batch-major source tensors and the ops to re-create
  (in topological order) between them and the loss."""

  def __init__(self, loss, sources, ops):
    self.loss, self.sources, self.ops = loss, sources, ops


def _static(dim):
  return tf.compat.dimension_value(dim)


def _postorder(root, expand):
  """Ops reachable from ``root`` through data inputs, inputs before users; ``expand(op)``
  says whether to walk into ``op``'s inputs."""
  order, visited, stack = [], set(), [(root, False)]
  while stack:
    op, done = stack.pop()
    if done:
      order.append(op)
      continue
    if op in visited:
      continue
    visited.add(op)
    stack.append((op, True))
    if expand(op):
      stack.extend((t.op, False) for t in op.inputs if t.op not in visited)
  return order


def _is_resource_variable(var):
  handle = getattr(var, "handle", None)
  try:
    return handle is not None and handle.dtype == tf.resource
  except (AttributeError, TypeError, ValueError):
    return False


def _batch_major(tensor, batch, random_draw):
  """Whether source ``tensor`` holds one row per example (``batch``: the static B or None);
  raises :class:`Unreplayable` where that cannot be told from its static shape."""
  rank = tensor.shape.rank
  if rank is None:
    raise Unreplayable(f"the input {tensor.name} has an unknown rank")
  if rank == 0:
    if random_draw:
      raise Unreplayable(f"the random op {tensor.op.name} draws a scalar of batch-dependent shape")
    return False
  leading = _static(tensor.shape[0])
  if leading is None or leading == batch:
    return True
  if batch is None or random_draw:
    raise Unreplayable(
        f"the input {tensor.name} has {leading} rows, and the batch size is "
        f"{'unknown' if batch is None else batch}, so whether it is batch-major is unclear")
  return False  # e.g. a [K] class-weight placeholder next to a batch of B != K examples


def plan_replay(vector_loss, var_list) -> ReplayPlan:
  """Finds the ops to replay per example; raises :class:`Unreplayable` (saying why) when the
  graph has anything the replay does not reproduce exactly: a non-resource variable, a loss
  outside a ``tf.compat.v1`` graph or not depending on a batch input, a stateful op other than
  the inputs and batch-shaped random draws, v1 control flow, control dependencies or reference
  types between the inputs and the loss."""
  graph = vector_loss.graph
  if hasattr(graph, "outer_graph"):
    raise Unreplayable("the loss is inside a tf.function (pass tape= there)")
  bad = [v.name for v in var_list if not _is_resource_variable(v)]
  if bad:
    raise Unreplayable(f"{bad[0]} is a reference variable (create resource variables, the "
                       "default under TF2 behaviour)")
  batch = _static(vector_loss.shape[0]) if vector_loss.shape.rank == 1 else None
  ancestors = _postorder(vector_loss.op, lambda op: op.type not in BATCH_SOURCE_TYPES)
  sources, batch_major, dependent = [], {}, set()

  def depends(t):  # whether tensor t holds rows of the batch (source outputs judged when read)
    if t.op.type in BATCH_SOURCE_TYPES and t.ref() not in batch_major:
      batch_major[t.ref()] = _batch_major(t, batch, random_draw=False)
      if batch_major[t.ref()]:
        sources.append(t)
    return batch_major.get(t.ref(), False) or t.op in dependent

  for op in ancestors:  # inputs before users
    if op.type in BATCH_SOURCE_TYPES:
      continue
    inputs = [depends(t) for t in op.inputs]
    if not any(inputs):
      continue
    if op.type not in RANDOM_TYPES or any(inputs[1:]):
      dependent.add(op)
      continue
    for t in op.outputs:  # a draw shaped like the batch: each copy reads its own rows
      batch_major[t.ref()] = _batch_major(t, batch, random_draw=True)
      sources.append(t)
  if vector_loss.op not in dependent:
    raise Unreplayable("the loss does not depend on a placeholder or tf.data iterator input")
  replay = [op for op in _postorder(
      vector_loss.op, lambda op: op in dependent) if op in dependent]
  used = set()
  for op in replay:
    _check_replayable(op)
    used.update(t.ref() for t in op.inputs if batch_major.get(t.ref(), False))
  return ReplayPlan(vector_loss, [t for t in sources if t.ref() in used], replay)


def _check_replayable(op):
  if op.type in _CONTROL_FLOW_TYPES:
    raise Unreplayable(f"{op.name} is tf.compat.v1 control flow ({op.type})")
  if op.op_def.is_stateful:
    raise Unreplayable(f"{op.name} ({op.type}) is a stateful op")
  if op.control_inputs:
    raise Unreplayable(f"{op.name} has control dependencies")
  if any(t.dtype._is_ref_dtype for t in list(op.inputs) + list(op.outputs)):  # pylint: disable=protected-access
    raise Unreplayable(f"{op.name} reads or makes a reference tensor")


def _replay(plan, mapping):
  """Re-creates ``plan.ops`` with ``mapping`` (source ref -> tensor) substituted; returns the
  copy of the loss."""
  graph = plan.loss.graph
  mapping = dict(mapping)
  for op in plan.ops:
    inputs = [mapping.get(t.ref(), t) for t in op.inputs]
    attrs = {k: v for k, v in op.node_def.attr.items() if k != "_class"}
    copy = graph.create_op(op.type, inputs, dtypes=[t.dtype for t in op.outputs],
                           name=op.name.split("/")[-1], attrs=attrs, op_def=op.op_def)
    for old, new in zip(op.outputs, copy.outputs):
      mapping[old.ref()] = new
  return mapping[plan.loss.ref()]


def _to_microbatches(tensor, num_microbatches):
  """[B, ...] -> [M, B/M, ...] (M = B when ``num_microbatches`` is None)."""
  leading = [-1, 1] if num_microbatches is None else [num_microbatches, -1]
  return tf.reshape(tensor, tf.concat([leading, tf.shape(tensor)[1:]], 0))


def clipped_sum_replayed(plan: ReplayPlan, var_list, l2_norm_clip, num_microbatches=None):
  """Clipped sum of per-microbatch gradients of ``plan.loss``, each microbatch replayed alone.

  ``sum_j clip_C(grad_theta mean(L^(j)))`` where ``L^(j)`` [k] is the loss graph re-run on
  microbatch ``j``'s rows of every batch-major source (``k = B / M``; one example when
  ``num_microbatches`` is None).  The semantics of :func:`~tf_dpkit.clipping.per_example.
  clipped_sum_from_vector_loss` otherwise (microbatch grouping, divisibility and non-empty
  checks, non-finite microbatches contributing 0, zero gradients for unconnected variables).

  Raises :class:`Unreplayable` when re-creating an op on one microbatch fails (e.g. a reshape
  to a hard-coded batch size) or the copy's loss is not a vector of ``k`` entries.  When the
  step runs, an ``InvalidArgumentError`` stops it if a source has not ``B`` rows or the
  replayed losses differ from ``plan.loss`` (see ``RTOL``, ``ATOL``): the loss then is not
  computed from each example alone.
  """
  var_list = list(var_list)
  checked = split_into_microbatches(plan.loss, num_microbatches)  # shape/emptiness/divisibility
  batch = tf.shape(plan.loss)[0]
  checks = [tf.debugging.assert_equal(
      tf.shape(t)[0], batch, message=f"tf_dpkit: the input {t.name} is read per example (it "
      "feeds the vector loss), but its leading dimension is not the batch size of the loss")
            for t in plan.sources]
  with tf.control_dependencies(checks + [checked]):
    microbatched = [_to_microbatches(t, num_microbatches) for t in plan.sources]
  refs = [t.ref() for t in plan.sources]
  try:
    probe = _replay(plan, zip(refs, [tf.gather(t, 0) for t in microbatched]))
  except (ValueError, TypeError, tf.errors.OpError) as e:
    raise Unreplayable(f"re-running the loss on one microbatch failed: {e}") from e
  if probe.shape.rank != 1 or not probe.shape.is_compatible_with(
      [None if num_microbatches is not None else 1]):
    raise Unreplayable(f"the loss re-run on one microbatch has shape {probe.shape}, not [rows]")

  def per_microbatch(rows):
    losses = _replay(plan, zip(refs, rows))
    grads = tf.gradients(tf.reduce_mean(losses), var_list,
                         unconnected_gradients=tf.UnconnectedGradients.ZERO)
    return [tf.convert_to_tensor(g) for g in grads], losses

  grads, row_losses = map_examples(per_microbatch, microbatched)
  row_losses = tf.reshape(row_losses, [-1])
  batch_losses = tf.cast(plan.loss, row_losses.dtype)
  finite = tf.math.is_finite(batch_losses)
  close = tf.abs(row_losses - batch_losses) <= ATOL + RTOL * tf.maximum(
      tf.abs(row_losses), tf.abs(batch_losses))
  agree = tf.where(finite, close, tf.logical_not(tf.math.is_finite(row_losses)))
  same = tf.debugging.Assert(tf.reduce_all(agree), [
      "tf_dpkit: the vector loss is not computed from each example alone: entries of the "
      "batch's loss differ from the same graph re-run on their own microbatch (a batch mean "
      "or batch statistics, x - x[0], a division by the batch size...). DP-SGD bounds one "
      "example's influence only for a per-example loss: compute each entry from its own "
      "example. Entries that differ:", tf.reduce_sum(tf.cast(tf.logical_not(agree), tf.int32))])
  losses = tf.reduce_mean(tf.reshape(row_losses, tf.stack([tf.shape(checked)[0], -1])), axis=1)
  with tf.control_dependencies([same]):
    grads = [tf.identity(g) for g in grads]
  summed, norms = clip_and_sum(grads, l2_norm_clip, losses=losses)
  return issue_clipped_sum(summed, norms, losses, l2_norm_clip)


def replay_message(owner, why) -> str:
  """What the exact Jacobian path costs in a v1 graph and what the replay needs (said once per
  optimizer)."""
  return (
      f"{owner}.minimize/compute_gradients cannot replay this tf.compat.v1 graph's vector loss "
      f"per example ({why}), so it clips through the full Jacobian d loss / d var_list of the "
      "batch loss: each of its B rows is a backward pass over the whole batch, about B times a "
      "non-private step. The per-example replay costs about one: compute the vector loss from "
      "placeholder or tf.data iterator inputs with rows per example, resource variables, and "
      "no stateful ops (other than random ops shaped like the batch), tf.compat.v1 control "
      "flow or control dependencies between the inputs and the loss.")


def clipped_sum_for_v1_optimizer(optimizer, vector_loss, var_list, l2_norm_clip,
                                 num_microbatches):
  """The replayed clipped sum for a DP ``tf.compat.v1`` optimizer's graph-mode loss, or None
  (after warning once per optimizer) when the graph cannot be replayed."""
  vector_loss = tf.convert_to_tensor(vector_loss)
  if vector_loss.shape.rank is not None and vector_loss.shape.rank != 1:
    return None  # the Jacobian path refuses it with the vector-loss error
  try:
    if vector_loss.shape.rank is None:
      raise Unreplayable("the loss has an unknown rank")
    plan = plan_replay(vector_loss, var_list)
    with tf.name_scope("dp_replay"):
      return clipped_sum_replayed(plan, var_list, l2_norm_clip, num_microbatches)
  except Unreplayable as e:
    why = str(e)
  swap.warn_jacobian_path(optimizer, message=replay_message(type(optimizer).__name__, why),
                          stacklevel=4)
  return None
