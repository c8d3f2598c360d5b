"""Fast clipped sums for Keras functional and Sequential models (ghost clipping / book-keeping).

One forward pass with each trainable layer run by its rule, one backward pass for every
example's output gradients, per-microbatch norms and the clipped sum from the same gradients.
Bound ``||S(D) - S(D - x)|| <= C`` when every node acts per example (``independence``), each
variable belongs to one layer call, and non-finite examples contribute 0.  Design and contract:
``docs/design/clipping_fast_path.md``.
"""
from __future__ import annotations

import keras
import tensorflow as tf

from tf_dpkit import _autograph
from tf_dpkit.clipping import _keras_internals as internals
from tf_dpkit.clipping import independence, pooling
from tf_dpkit.clipping.clipped_sum import (at_least_float32, clip_factors, finite_entries,
                                           finite_rows_zeroed, issue_clipped_sum, scaled_row_sum)
from tf_dpkit.clipping.contract import (isolated_per_example_losses, map_examples,
                                        per_example_weights, pfor_is_safe)
from tf_dpkit.clipping.per_example import (assert_nonempty, check_grouping,
                                           rows_divisible_checks)
from tf_dpkit.clipping.rules import LayerTrace, group_examples, lookup_rule
from tf_dpkit.clipping.rules._linear import per_example_groups


def _shared_trainable_layers(graph):
  """Names of trainable layers called more than once in the graph (weights shared across uses)."""
  calls = {}
  for node in internals.graph_nodes(graph):
    op = node.operation
    if op is not None and not node.is_input and getattr(op, "trainable_weights", None):
      calls[id(op)] = (op.name, calls.get(id(op), (None, 0))[1] + 1)
  return [name for name, count in calls.values() if count > 1]


def _variables_of_several_layers(graph):
  """Names of trainable variables owned by more than one layer of the graph (tied weights)."""
  owners = {}
  for layer in graph.layers:
    for v in layer.trainable_variables:
      owners.setdefault(id(v), (v.path if hasattr(v, "path") else v.name, set()))[1].add(id(layer))
  return [name for name, layers in owners.values() if len(layers) > 1]


def _check_records_own_distinct_variables(records):
  seen = {}
  for layer, _ in records:
    for v in layer.trainable_variables:
      if id(v) in seen and seen[id(v)] is not layer:
        raise ValueError(
            f"Variable {v.name!r} is used by layers {seen[id(v)].name!r} and {layer.name!r}: "
            "its per-example gradient is a sum over both, whose norm the per-layer fast path "
            "cannot give (it would under-clip). Use per_example_method='vectorized'.")
      seen[id(v)] = layer


def graph_walkable(model) -> bool:
  """True when ``model`` is a Keras layer graph the fast path can walk exactly: False for
  subclassed models, for graphs that call one trainable layer more than once, and for graphs in
  which two layers share a trainable variable (tied weights)."""
  graph = internals.layer_graph(model)
  return (graph is not None and not _shared_trainable_layers(graph)
          and not _variables_of_several_layers(graph))


@_autograph.graph_code
def fast_path_available(model) -> bool:
  """True when the fast path's bound holds for ``model``: it is walkable (:func:`graph_walkable`)
  and every node of its graph is cleared as per example (``independence.batch_mixing``)."""
  return graph_walkable(model) and independence.batch_mixing(model) is None


def example_mixing_layers(model) -> list:
  """The layers of ``model`` known to mix the examples of a batch (BatchNormalization: its batch
  mean and variance make one example's output depend on the others), the one list every
  per-example DP path refuses."""
  return [layer for layer in internals.sublayers(model, include_self=True)
          if isinstance(layer, keras.layers.BatchNormalization)]


def check_examples_independent(model):
  """Raises ``ValueError`` for layers known to mix the examples of a batch."""
  mixing = example_mixing_layers(model)
  if mixing:
    raise ValueError(
        f"Layer {mixing[0].name!r} is BatchNormalization, which mixes examples in a batch and "
        "breaks per-example privacy. Use keras.layers.GroupNormalization or "
        "LayerNormalization.")


def check_fast_path_examples_independent(model):
  """Raises ``ValueError`` naming the first node of ``model``'s graph that is not cleared as
  per example (``independence.batch_mixing``): the fast path runs the forward pass on the
  whole batch, so such a node could carry one example into every other example's gradient."""
  mixing = independence.batch_mixing(model)
  if mixing is not None:
    raise ValueError(
        f"The fast clipping path cannot be used: {independence.describe(mixing)}. Use "
        "method='vectorized' (DPModel.per_example_method = 'vectorized', or 'auto'), which "
        "computes each example's gradient from that example alone.")


class _FiniteInputs(list):
  """The [B] flags of the examples whose rows of the rules' float inputs were finite (a list,
  one entry per distinct input), and those inputs as the rules read them: each distinct tensor
  goes through ``clipped_sum.finite_entries`` once per step, however many layers read it (the
  query, key and value projections of self-attention share one input)."""

  def __init__(self):
    super().__init__()
    self._read = {}

  def read(self, tensor, dtype):
    """``tensor`` cast to ``dtype`` with its inf/NaN entries read as 0; flags appended."""
    key = (id(tensor), dtype)
    if key not in self._read:
      # Cast as Keras's Layer.__call__ would (e.g. a float32 output layer after float16 layers).
      cleaned, finite = finite_entries(tf.cast(tensor, dtype) if tensor.dtype != dtype else tensor)
      self.append(finite)
      self._read[key] = (tensor, cleaned)  # the tensor is kept so that its id stays unique
    return self._read[key][1]


def _run_rule(rule, layer, inputs, finite_examples):
  """``rule(layer, inputs)`` in the variables' dtype; outputs in the layer's compute dtype.

  Float inputs reach the rule through ``finite_examples.read`` (``clipped_sum.finite_entries``):
  inf/NaN entries are read as 0 (a float16 overflow or an inf/NaN feature of one example would
  otherwise make the norms and clipped sums of the whole batch NaN, ``0 * inf``), and the [B]
  flags of the examples whose row was finite join ``finite_examples``: the other examples are
  left out of the clipped sum (module docstring).
  """
  mixed = layer.compute_dtype != layer.variable_dtype
  if inputs.dtype.is_floating:
    mask = internals.keras_mask(inputs)
    inputs = finite_examples.read(inputs, tf.as_dtype(layer.variable_dtype))
    if mask is not None:
      internals.set_keras_mask(inputs, mask)
  if not mixed:
    return rule(layer, inputs)
  with internals.no_autocast():
    trace = rule(layer, inputs)
  if trace is None:
    return None
  outputs = trace.outputs
  if outputs.dtype.is_floating:
    out_mask = internals.keras_mask(outputs)
    outputs = tf.cast(outputs, layer.compute_dtype)
    if out_mask is not None:
      internals.set_keras_mask(outputs, out_mask)
  return trace._replace(outputs=outputs)


def _replayed_trace(layer, call, call_args, call_kwargs, outputs, batch):
  """Per-example gradients of ``layer`` from its exact ``call`` replayed on each example alone.

  ``call_args`` / ``call_kwargs`` are what Keras passed to ``call`` in the forward pass; every
  tensor of rank >= 1 in them must have the batch as its leading axis (checked when the step
  runs) and is sliced per example, everything else is passed as it was.  The per-example
  gradients give the layer's squared norms and, with the clip factors, its clipped sum.
  """
  watched = [t for t in tf.nest.flatten(outputs)
             if isinstance(t, tf.Tensor) and t.dtype.is_floating]
  if not watched:
    raise NotImplementedError(
        f"Layer {layer.name!r} ({type(layer).__name__}) has no fast-path rule and no float "
        "output to differentiate; use per_example_method='vectorized'.")
  flat_call = tf.nest.flatten((call_args, call_kwargs))
  batched = [i for i, t in enumerate(flat_call)
             if isinstance(t, tf.Tensor) and t.shape.rank is not None and t.shape.rank >= 1]
  checks = [tf.debugging.assert_equal(
      tf.shape(flat_call[i])[0], batch,
      message=f"Layer {layer.name!r}: a call argument does not have the batch as its leading "
      "axis, so the layer cannot be replayed per example") for i in batched]
  variables = layer.trainable_variables
  cache = {}

  def per_example(example):
    one_inputs, one_g = example
    flat = list(flat_call)
    for i, t in zip(batched, one_inputs):
      flat[i] = t[None]
    args, kwargs = tf.nest.pack_sequence_as((call_args, call_kwargs), flat)
    with tf.GradientTape() as tape:
      with internals.autocast_scope(layer):
        out = call(*args, **kwargs)
    out = [t for t in tf.nest.flatten(out) if isinstance(t, tf.Tensor) and t.dtype.is_floating]
    grads = tape.gradient(out, variables, output_gradients=[g[None] for g in one_g],
                          unconnected_gradients=tf.UnconnectedGradients.ZERO)
    grads = [tf.cast(grad, tf.float32) for grad in grads]
    finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(grad)) for grad in grads])
    # This example's gradient overflowed (mixed_float16): it contributes 0.
    return [tf.where(finite, grad, tf.zeros_like(grad)) for grad in grads]

  def squared_norms(g, num_groups):
    with tf.control_dependencies(checks):
      grads = map_examples(per_example, ([flat_call[i] for i in batched], list(g)),
                           vectorize=pfor_is_safe([layer]))
    cache["grouped"] = [tf.reduce_sum(group_examples(grad[:, None], num_groups), axis=1)
                        for grad in grads]
    return tf.add_n([tf.reduce_sum(tf.reshape(tf.square(grad), [num_groups, -1]), axis=1)
                     for grad in cache["grouped"]])

  def clipped_sum(factors):
    return [scaled_row_sum(factors, grad) for grad in cache["grouped"]]
  return LayerTrace(outputs, watched, squared_norms, clipped_sum)


# Composite layers (exact classes) known to call each sublayer once, on batch-major inputs whose
# leading axis is the batch, outside any loop: only these run their sublayers by rule.  Any other
# composite (e.g. an RNN whose cell holds a Dense: the cell runs inside a while loop) is replayed.
_COMPOSITES_WITH_RULED_SUBLAYERS = (keras.layers.MultiHeadAttention,)


def _rule_covered_sublayers(layer):
  """Sublayers with rules that together own all of ``layer``'s trainable variables, or None.

  Only for the composites in ``_COMPOSITES_WITH_RULED_SUBLAYERS`` (``MultiHeadAttention``: four
  ``EinsumDense`` sublayers), which are then run as they are, with those sublayers executed by
  their rules.
  """
  if type(layer) not in _COMPOSITES_WITH_RULED_SUBLAYERS:
    return None
  covered, subs = set(), []
  for sub in internals.sublayers(layer):
    if sub.trainable_variables and lookup_rule(sub) is not None and not any(
        s.trainable_variables for s in internals.sublayers(sub)):
      subs.append(sub)
      covered.update(id(v) for v in sub.trainable_variables)
  if subs and covered == {id(v) for v in layer.trainable_variables}:
    return subs
  return None


def _call_with_rules(layer, subs, default_call, args, kwargs, records, batch, finite_examples):
  """Calls ``layer`` with each of ``subs`` executed (and recorded) by its rule, or returns
  None (nothing recorded) when a rule declines."""
  start = len(records)
  declined = []

  def by_rule(sub):
    rule = lookup_rule(sub)

    def call(inputs, *unused_args, **unused_kwargs):
      check = tf.debugging.assert_equal(
          tf.shape(inputs)[0], batch, message=f"Sublayer {sub.name!r} of {layer.name!r} was "
          "called on inputs whose leading axis is not the batch")
      with tf.control_dependencies([check]):
        trace = _run_rule(rule, sub, inputs, finite_examples)
      if trace is None:
        declined.append(sub.name)
        raise NotImplementedError(f"The rule for {sub.name!r} declined its configuration.")
      records.append((sub, trace))
      return trace.outputs
    return call

  try:
    with internals.calls_replaced([(sub, by_rule(sub)) for sub in subs]):
      outputs = default_call(*args, **kwargs)
  except NotImplementedError:
    if not declined:
      raise
    del records[start:]
    return None
  called = [id(sub) for sub, _ in records[start:]]
  if len(called) != len(set(called)):
    raise NotImplementedError(
        f"Layer {layer.name!r} calls a sublayer more than once; use the vectorized path.")
  return outputs


def check_fast_path_model(model):
  """Returns ``model``'s layer graph after the checks the fast path's bound needs (a walkable
  functional/Sequential graph, no layer known to mix examples, every node cleared as per
  example); raises ``ValueError`` naming what fails."""
  graph = internals.layer_graph(model)
  if graph is None:
    raise ValueError(f"The fast path needs a Keras functional or Sequential model, got "
                     f"{type(model).__name__}; use clipped_sum_vectorized.")
  shared = _shared_trainable_layers(graph)
  if shared:
    raise ValueError(f"The fast path cannot handle layers called more than once: {shared}; use "
                     "the vectorized path.")
  tied = _variables_of_several_layers(graph)
  if tied:
    raise ValueError(f"The fast path cannot handle variables shared by several layers: {tied}; "
                     "use the vectorized path.")
  check_examples_independent(model)
  check_fast_path_examples_independent(model)
  return graph


def _rule_input(args, kwargs):
  """The one input a rule is called with, or None when the call has other arguments.

  A rule takes one tensor (its Keras mask attached) and runs in training mode: a call whose
  keyword arguments are ``training``, ``None`` values, or a ``mask`` (attached to a copy of the
  input, where a recurrent rule reads it) qualifies; anything else is replayed as called.
  """
  if len(args) != 1 or not isinstance(args[0], tf.Tensor):
    return None
  other = {k: v for k, v in kwargs.items() if v is not None and k != "training"}
  if set(other) - {"mask"}:
    return None
  inputs = args[0]
  mask = other.get("mask")
  if mask is not None and internals.keras_mask(inputs) is not mask:
    inputs = tf.identity(inputs)
    internals.set_keras_mask(inputs, mask)
  return inputs


def forward_with_rules(model, graph, x, batch):
  """The fast path's forward phase: runs ``graph`` on ``x`` with each trainable layer executed
  by its rule (or recorded for replay), under the caller's persistent ``GradientTape``.

  Returns ``(y_pred, records, finite_examples)``: the model's outputs, one ``(layer,
  LayerTrace)`` per trainable layer call, and the [B] flags of the examples whose rule inputs
  were finite.  :func:`backward_with_rules` turns the records and the output gradients
  ``dL/d trace.watched`` into the clipped sum.
  """
  records = []
  finite_examples = _FiniteInputs()  # [B] flags: the example's rows of rule inputs are finite
  variables_before = {id(v) for v in model.trainable_variables}

  def operation_fn(layer):
    default = internals.training_call(layer)

    def call(*args, **kwargs):
      if not getattr(layer, "trainable_weights", None):
        inputs = _rule_input(args, kwargs)
        outputs = pooling.fast_call(layer, inputs) if inputs is not None else None
        return default(*args, **kwargs) if outputs is None else outputs
      rule = lookup_rule(layer)
      rule_input = _rule_input(args, kwargs) if rule is not None else None
      if rule_input is not None:
        trace = _run_rule(rule, layer, rule_input, finite_examples)
        if trace is not None:
          records.append((layer, trace))
          return trace.outputs
      subs = _rule_covered_sublayers(layer)
      if subs is not None:
        outputs = _call_with_rules(layer, subs, default, args, kwargs, records, batch,
                                   finite_examples)
        if outputs is not None:
          return outputs
      with internals.recording_call(layer) as (calls, original_call):
        outputs = default(*args, **kwargs)
      if len(calls) != 1:
        raise NotImplementedError(
            f"Layer {layer.name!r} ran its call {len(calls)} times for one use; use "
            "per_example_method='vectorized'.")
      records.append((layer, _replayed_trace(layer, original_call, *calls[0], outputs, batch)))
      return outputs
    return call

  y_pred = internals.run_graph(graph, x, operation_fn)
  _check_records_own_distinct_variables(records)
  created = [v.path for v in model.trainable_variables if id(v) not in variables_before]
  if created:
    raise ValueError(
        f"The model created the trainable variables {created} during this step (a sublayer is "
        "built on its first call), so their per-example gradients were not clipped. Call the "
        "model once on a batch before training (DPModel.fit does this) so that every weight "
        "exists.")
  return y_pred, records, finite_examples


def _finite_microbatch_norms(records, output_grads, finite_examples, per_example, groups, scale):
  """Backward phase 1: which microbatches are finite, and their gradient norms.

  Each record's output gradient is gated on its own, as soon as it exists: the rows of a
  microbatch with an inf/NaN entry there (e.g. a float16 overflow of the scaled backward pass)
  become exact zeros (``clipped_sum.finite_rows_zeroed``), then the record's norms are formed.
  Nothing waits for the other records, so a layer whose rule keeps its per-microbatch
  gradients frees its output gradient (and its input) during the backward pass, as a
  non-private backward pass would.  A microbatch is finite when its rows of every output
  gradient, of every rule's input (``finite_examples``; read as 0 there) and its weighted loss
  are, and its squared norm is finite; the others get squared norm 0 here and clip factor 0
  (``_record_clip_factors``), and every rule's inputs and gated output gradients are finite, so
  their share of every clipped sum is exactly 0 (a rule's kept per-microbatch gradients, which
  can still overflow, are contracted by ``clipped_sum.scaled_row_sum``).  Squares are summed in float32 and divided by
  ``S^2`` (norms of the unscaled gradients).

  Returns ``(output_grads, squared_by_record, norms, finite)``: the gated output gradients, per
  record the [M] squared norms of its layer's share, the [M] norms ``sqrt(sum over records)``,
  and the [M] flags of the finite microbatches (a microbatch whose squared norm overflows
  float32 is not finite either; its squares are 0).
  """
  flags = [tf.reduce_all(tf.reshape(tf.stack(finite_examples + [tf.math.is_finite(per_example)]),
                                    tf.stack([len(finite_examples) + 1, groups, -1])),
                         axis=[0, 2])]
  gated, squared_by_record = [], []
  for (_, trace), g in zip(records, output_grads):
    flat = []
    for part in tf.nest.flatten(g):
      if part is not None:
        part, ok = finite_rows_zeroed(part, groups)
        flags.append(ok)
      flat.append(part)
    g = tf.nest.pack_sequence_as(g, flat)
    gated.append(g)
    squared_by_record.append(tf.cast(trace.squared_norms(g, groups), tf.float32) / (scale * scale))
  finite = tf.reduce_all(tf.stack(flags), axis=0)
  finite = tf.logical_and(finite, tf.math.is_finite(tf.add_n(squared_by_record)))
  squared_by_record = [tf.where(finite, sq, tf.zeros_like(sq)) for sq in squared_by_record]
  norms = tf.sqrt(tf.maximum(tf.add_n(squared_by_record), 0.0))
  return gated, squared_by_record, norms, finite


def _record_clip_factors(records, squared_by_record, norms, finite, l2_norm_clip):
  """Backward phase 2: per record, the [M] factors ``min(1, C / norm)`` its layer's share of
  each microbatch gradient is multiplied by.

  With one clip norm C every record gets the same factors (``clip_factors`` of the total
  norms); with per-layer clip norms (``tf_dpkit.clipping.groups``) each record gets its group's
  factors, formed from the squared norms of that group's records.  A microbatch that is not
  ``finite`` gets factor 0: it is left out of the sum.
  """
  if hasattr(l2_norm_clip, "group_of"):  # per-layer clip norms (tf_dpkit.clipping.groups)
    record_group = [l2_norm_clip.group_of(layer.trainable_variables) for layer, _ in records]
    zero = tf.zeros_like(norms)
    group_factors = l2_norm_clip.factors([
        tf.add_n([zero] + [sq for sq, k in zip(squared_by_record, record_group) if k == group])
        for group in range(len(l2_norm_clip.clips))])
    record_factors = [group_factors[k] for k in record_group]
  else:
    record_factors = [clip_factors(norms, l2_norm_clip)] * len(records)
  return [tf.where(finite, f, tf.zeros_like(f)) for f in record_factors]


def _clipped_sums_by_variable(model, tape, records, output_grads, record_factors, group_size,
                              batch, scale):
  """Backward phase 3: the clipped sums ``sum_j factor_j * g_j`` aligned with
  ``model.trainable_variables``, divided by the loss scale ``S`` and cast to each variable's
  dtype.

  A record's rule forms its layer's sums directly (``trace.clipped_sum(factors)``) or, when it
  has no such form, they are one vector-Jacobian product on ``tape`` with each example's output
  gradient weighted by its microbatch's factor.  A variable no record reaches gets zeros.
  """
  variables = model.trainable_variables
  index = {id(v): i for i, v in enumerate(variables)}
  sums = [None] * len(variables)
  for (layer, trace), g, factors in zip(records, output_grads, record_factors):
    layer_vars = layer.trainable_variables
    layer_sums = trace.clipped_sum(factors) if trace.clipped_sum is not None else None
    if layer_sums is None:
      example_factors = tf.repeat(factors, group_size)
      weighted = tf.nest.map_structure(
          lambda t: t * tf.reshape(tf.cast(example_factors, t.dtype), tf.concat(
              [[batch], tf.ones([tf.rank(t) - 1], tf.int32)], 0)), g)
      layer_sums = tape.gradient(trace.watched, layer_vars, output_gradients=weighted,
                                 unconnected_gradients=tf.UnconnectedGradients.ZERO)
    for v, grad in zip(layer_vars, layer_sums):
      grad = tf.cast(at_least_float32(tf.convert_to_tensor(grad)) / scale, v.dtype)
      i = index[id(v)]
      sums[i] = grad if sums[i] is None else sums[i] + grad
  return [tf.zeros_like(v) if s is None else s for v, s in zip(variables, sums)]


def backward_with_rules(model, tape, records, output_grads, finite_examples, per_example, groups,
                        group_size, batch, scale, l2_norm_clip):
  """The fast path's backward phase: output gradients -> per-microbatch norms -> clip factors
  -> clipped sums (module docstring).

  Args:
    model: the model whose ``trainable_variables`` the sums are aligned with.
    tape: the persistent tape the forward phase ran under (for layers whose rule forms its
      clipped sum as a vector-Jacobian product).
    records, finite_examples: from :func:`forward_with_rules`.
    output_grads: per record, ``g = d(S * sum_i L_i / k) / d trace.watched`` ([B, ...]).
    per_example: the [B] weighted per-example losses (non-finite ones leave their microbatch
      out; their microbatch means are the sum's ``losses``).
    groups: M (int or scalar tensor); ``group_size``: k = B / M; ``batch``: B.
    scale: the static loss scale ``S`` (1.0 without one); ``l2_norm_clip``: as for
      :func:`clipped_sum_fast`.
  Returns:
    the ``ClippedSum``.
  """
  output_grads, squared_by_record, norms, finite = _finite_microbatch_norms(
      records, output_grads, finite_examples, per_example, groups, scale)
  record_factors = _record_clip_factors(records, squared_by_record, norms, finite, l2_norm_clip)
  sums = _clipped_sums_by_variable(model, tape, records, output_grads, record_factors,
                                   group_size, batch, scale)
  per_group = tf.cast(group_size, tf.float32)
  losses = tf.reduce_sum(tf.reshape(per_example, [groups, -1]), axis=1) / per_group
  return issue_clipped_sum(sums, norms, losses, l2_norm_clip)


def _checked_microbatched_inputs(inputs, num_microbatches, microbatch_size):
  """:func:`clipped_sum_fast`'s first phase: the batch size B, the microbatch count M, and the
  inputs routed through the checks on both.

  M is ``num_microbatches``; else ``B // microbatch_size`` (a Python int when B is static, so
  that the rules keep static shapes, else known when the step runs); else one microbatch per
  example, marked (``per_example_groups``) so that rules keep static per-example shapes when B
  is unknown while tracing.  The checks (B >= 1, k or M divides B) run before any op reads the
  inputs, so that none (e.g. a rule reshaping the raw input into microbatches) fails first
  with a less helpful error.  Returns ``(x, y, sample_weight, batch, groups)``, ``sample_weight``
  as [B] weights (``per_example_weights``).
  """
  microbatch_size = check_grouping(num_microbatches, microbatch_size)
  x, y, sample_weight = inputs
  batch = tf.shape(tf.nest.flatten(x)[0])[0]
  sample_weight = per_example_weights(sample_weight, batch)
  checks = [assert_nonempty(batch)]
  if microbatch_size is not None:
    static_batch = tf.compat.dimension_value(tf.nest.flatten(x)[0].shape[0])
    checks += rows_divisible_checks(batch, microbatch_size, static_batch)
    groups = (batch // microbatch_size if static_batch is None
              else static_batch // microbatch_size)
  else:
    groups = per_example_groups(batch) if num_microbatches is None else num_microbatches
  if num_microbatches is not None:
    checks.append(tf.debugging.assert_equal(
        batch % num_microbatches, 0,
        message=f"num_microbatches={num_microbatches} must divide the batch size. For the last, "
        "smaller batch use `drop_remainder=True` in the input pipeline, or "
        "`num_microbatches=None` (one microbatch per example)."))
  with tf.control_dependencies(checks):
    x, y, sample_weight = tf.nest.map_structure(tf.identity, (x, y, sample_weight))
  return x, y, sample_weight, batch, groups


def _forward_and_output_gradients(model, graph, per_example_loss_fn, x, y, sample_weight, batch,
                                  group_size, loss_scale):
  """:func:`clipped_sum_fast`'s second phase: the forward pass with the rules
  (:func:`forward_with_rules`) and the weighted per-example losses ``L_i`` under a persistent
  tape, then the output gradients ``g = d(S * sum_i L_i / k) / d trace.watched`` of every record.

  Returns ``(tape, y_pred, records, finite_examples, per_example, output_grads, scale)``; the
  caller deletes ``tape`` once the backward phase has used it.
  """
  per_group = tf.cast(group_size, tf.float32)
  with tf.GradientTape(persistent=True) as tape:
    y_pred, records, finite_examples = forward_with_rules(model, graph, x, batch)
    per_example = isolated_per_example_losses(per_example_loss_fn, y, y_pred, batch)
    per_example *= tf.cast(sample_weight, per_example.dtype)
    total = tf.reduce_sum(per_example) / tf.cast(per_group, per_example.dtype)
    scale = 1.0 if loss_scale is None else float(loss_scale)
    scaled_total = total * scale if loss_scale is not None else total
  output_grads = tape.gradient(scaled_total, [trace.watched for _, trace in records],
                               unconnected_gradients=tf.UnconnectedGradients.ZERO)
  return tape, y_pred, records, finite_examples, per_example, output_grads, scale


@_autograph.graph_code
def clipped_sum_fast(model, per_example_loss_fn, inputs, l2_norm_clip, num_microbatches=None,
                     loss_scale=None, microbatch_size=None):
  """Clipped sum of per-microbatch gradients of a functional/Sequential Keras model.

  Args:
    model: a built Keras functional or Sequential model (see :func:`fast_path_available`).
    per_example_loss_fn: ``f(y_true, y_pred) -> [b]`` (or [b, ...], averaged per example, see
      ``contract.per_example_loss_function``); it is applied to each example alone.
    inputs: ``(x, y, sample_weight)`` with batch dimension B >= 1; ``sample_weight`` ([B] or
      [B, 1]) multiplies each example's loss.
    l2_norm_clip: clip norm C > 0, or per-layer clip norms resolved for ``model``
      (``tf_dpkit.clipping.groups.ResolvedGroups``: each record's layer is clipped with its
      group's norm).
    num_microbatches: None (per example) or M dividing B.
    loss_scale: optional static loss scale ``S > 0`` (mixed_float16): the backward pass is of
      ``S * loss``; norms and sums are of the unscaled gradients, and a microbatch whose
      gradients are non-finite contributes zero (see the module docstring).
    microbatch_size: None, or k in [1, 1024] (not with ``num_microbatches``): microbatch j is
      rows ``j*k .. (j+1)*k - 1``, M = B / k is known only when the step runs (Poisson
      batches), and each microbatch's gradient is the MEAN ``(1/k) sum_r grad L_r`` of its
      rows' gradients; its norm is formed from the same output gradients as every
      microbatch's (augmentation multiplicity, ``tf_dpkit.augmentation``).

  Returns:
    ``(ClippedSum, y_pred)``; the sums are aligned with ``model.trainable_variables``.
  """
  graph = check_fast_path_model(model)
  x, y, sample_weight, batch, groups = _checked_microbatched_inputs(
      inputs, num_microbatches, microbatch_size)
  # max(M, 1): an empty batch must fail at the checks above (which a graph may run later),
  # not with an integer division by zero.
  group_size = batch // tf.maximum(groups, 1)  # examples per microbatch
  tape, y_pred, records, finite_examples, per_example, output_grads, scale = (
      _forward_and_output_gradients(model, graph, per_example_loss_fn, x, y, sample_weight,
                                    batch, group_size, loss_scale))
  clipped = backward_with_rules(model, tape, records, output_grads, finite_examples,
                                per_example, groups, group_size, batch, scale, l2_norm_clip)
  del tape
  return clipped, y_pred
