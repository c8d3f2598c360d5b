"""Fast clipped sums for Keras functional and Sequential models (ghost clipping / book-keeping).

One forward pass runs the model's layer graph with each trainable layer executed by its rule
(``layer_registry``), recording the tensor ``z`` each layer's weights act on directly.  Then

1. one backward pass of ``sum_i w_i L_i / k`` gives every example's ``g = dL_i/dz`` at once;
2. each layer turns ``(inputs, g)`` into per-microbatch squared gradient norms (without forming
   per-example gradients where the Gram form is cheaper), which add up over layers to the
   squared norm of each microbatch's whole gradient;
3. clip factors ``c_j = min(1, C / norm_j)`` re-weight ``g``, and one vector-Jacobian product per
   layer, ``dz/dW^T (c * g)``, gives that layer's share of ``sum_j clip(grad_j)`` directly (no
   second backward pass through the network).

Layers with trainable weights but no rule are run with their rule-covered sublayers executed by
the rules when sublayers own all their weights (e.g. ``MultiHeadAttention``), and otherwise fall
back to a layer-local ``tf.vectorized_map`` over examples (exact for layers that treat examples
independently).  Models whose call logic is not
a Keras layer graph (subclassed models) are not handled here: :func:`fast_path_available` says
so and ``DPModel`` then uses the whole-model ``tf.vectorized_map`` path.
"""
from __future__ import annotations

import keras
import tensorflow as tf
from keras.src.models import functional as keras_functional

from tf_dpkit.clipping.clipped_sum import (ClippedSum, clip_factors, per_example_losses,
                                           per_example_weights)
from tf_dpkit.clipping.layer_registry import LayerTrace, group_examples, lookup_rule


def layer_graph(model):
  """Returns the Keras functional graph that runs ``model``, or None if it has none."""
  if isinstance(model, keras.Sequential):
    return getattr(model, "_functional", None)
  if isinstance(model, keras_functional.Functional):
    return model
  return None


def _shared_trainable_layers(graph):
  """Names of trainable layers called more than once in the graph (weights shared across uses)."""
  calls = {}
  for nodes in graph._nodes_by_depth.values():  # pylint: disable=protected-access
    for node in nodes:
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


def fast_path_available(model) -> bool:
  """True when ``model`` is a Keras layer graph the fast path can walk exactly.

  False for subclassed models, for graphs that call one trainable layer more than once, and for
  graphs in which two layers share a trainable variable (tied weights): a per-example gradient
  is then a sum over uses, whose norm the per-use rules cannot give (adding their squared norms
  would under-estimate it and under-clip).
  """
  graph = layer_graph(model)
  return (graph is not None and not _shared_trainable_layers(graph)
          and not _variables_of_several_layers(graph))


def _layer_local_trace(layer, args, kwargs, outputs):
  """Fallback rule: per-example gradients of this layer alone, by ``tf.vectorized_map``.

  Exact for layers that treat examples independently; ``args`` are the layer's tensor inputs
  (each with the batch dimension), ``kwargs`` its non-tensor call arguments.
  """
  if not isinstance(outputs, tf.Tensor) or not all(isinstance(a, tf.Tensor) for a in args):
    raise NotImplementedError(
        f"Layer {layer.name!r} ({type(layer).__name__}) has no fast-path rule and does not map "
        "batched tensors to one batched tensor; use per_example_method='vectorized'.")
  variables = layer.trainable_variables

  def squared_norms(g, num_groups):
    def per_example(example):
      *xs, g_i = example
      with tf.GradientTape() as tape:
        out = layer(*[x[None] for x in xs], **kwargs)
      return tape.gradient(out, variables, output_gradients=g_i[None],
                           unconnected_gradients=tf.UnconnectedGradients.ZERO)
    grads = tf.vectorized_map(per_example, (*args, g))
    total = 0.0
    for grad in grads:
      grouped = tf.reduce_sum(group_examples(grad[:, None], num_groups), axis=1)
      total += tf.reduce_sum(tf.reshape(tf.square(grouped), [num_groups, -1]), axis=1)
    return total
  return LayerTrace(outputs, outputs, squared_norms)


def _rule_covered_sublayers(layer):
  """Sublayers with rules that together own all of ``layer``'s trainable variables, or None.

  Composite layers such as ``MultiHeadAttention`` (four ``EinsumDense`` sublayers) are then run
  as they are, with those sublayers executed by their rules (their ``call`` is swapped for the
  duration of the call), instead of a layer-local ``vectorized_map``.
  """
  covered, sublayers = set(), []
  for sub in layer._flatten_layers(include_self=False):  # pylint: disable=protected-access
    if sub.trainable_variables and lookup_rule(sub) is not None and not any(
        s.trainable_variables for s in sub._flatten_layers(include_self=False)):  # pylint: disable=protected-access
      sublayers.append(sub)
      covered.update(id(v) for v in sub.trainable_variables)
  if sublayers and covered == {id(v) for v in layer.trainable_variables}:
    return sublayers
  return None


def _call_with_rules(layer, sublayers, default_call, args, kwargs, records):
  """Calls ``layer`` with each of ``sublayers`` executed (and recorded) by its rule."""
  start = len(records)

  def patched(sub):
    rule = lookup_rule(sub)

    def call(inputs, *unused_args, **unused_kwargs):
      trace = rule(sub, inputs)
      if trace is None:
        raise NotImplementedError(f"The rule for {sub.name!r} declined its configuration.")
      records.append((sub, trace))
      return trace.outputs
    return call

  for sub in sublayers:
    object.__setattr__(sub, "call", patched(sub))
  try:
    outputs = default_call(*args, **kwargs)
  finally:
    for sub in sublayers:
      object.__delattr__(sub, "call")
  called = [id(sub) for sub, _ in records[start:]]
  if len(called) != len(set(called)):
    raise NotImplementedError(
        f"Layer {layer.name!r} calls a sublayer more than once; use the vectorized path.")
  return outputs


def _check_examples_independent(layer):
  if isinstance(layer, keras.layers.BatchNormalization):
    raise ValueError(
        f"Layer {layer.name!r} is BatchNormalization, which mixes examples in a batch and breaks "
        "per-example privacy. Use keras.layers.GroupNormalization or LayerNormalization.")


def clipped_sum_fast(model, per_example_loss_fn, inputs, l2_norm_clip, num_microbatches=None):
  """Clipped sum of per-microbatch gradients of a functional/Sequential Keras model.

  Args:
    model: a built Keras functional or Sequential model (see :func:`fast_path_available`).
    per_example_loss_fn: ``f(y_true, y_pred) -> [B]`` (or [B, ...], averaged per example).
    inputs: ``(x, y, sample_weight)`` with batch dimension B; ``sample_weight`` ([B] or [B, 1])
      multiplies each example's loss.
    l2_norm_clip: clip norm C > 0.
    num_microbatches: None (per example) or M dividing B.

  Returns:
    ``(ClippedSum, y_pred)``; the sums are aligned with ``model.trainable_variables``.
  """
  graph = layer_graph(model)
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
  x, y, sample_weight = inputs
  batch = tf.shape(tf.nest.flatten(x)[0])[0]
  sample_weight = per_example_weights(sample_weight, batch)
  groups = batch if num_microbatches is None else num_microbatches
  checks = []
  if num_microbatches is not None:
    checks.append(tf.debugging.assert_equal(
        batch % num_microbatches, 0,
        message=f"num_microbatches={num_microbatches} must divide the batch size. For the last, "
        "smaller batch use `drop_remainder=True` in the input pipeline, or "
        "`num_microbatches=None` (one microbatch per example)."))
  if checks:
    # Route every input through the check, so that no op (e.g. a rule reshaping the raw input
    # into microbatches) can fail with a less helpful error before the check has run.
    with tf.control_dependencies(checks):
      x, y, sample_weight = tf.nest.map_structure(tf.identity, (x, y, sample_weight))
  per_group = tf.cast(batch // groups, tf.float32)
  records = []

  def operation_fn(layer):
    default = keras_functional.operation_fn(layer, training=True)

    def call(*args, **kwargs):
      _check_examples_independent(layer)
      if not getattr(layer, "trainable_weights", None):
        return default(*args, **kwargs)
      trace = None
      rule = lookup_rule(layer)
      if rule is not None and len(args) == 1 and not kwargs:
        trace = rule(layer, args[0])
      if trace is None:
        sublayers = _rule_covered_sublayers(layer)
        if sublayers is not None:
          return _call_with_rules(layer, sublayers, default, args, kwargs, records)
        outputs = default(*args, **kwargs)
        call_kwargs = {k: v for k, v in kwargs.items() if not isinstance(v, tf.Tensor)}
        trace = _layer_local_trace(layer, args, call_kwargs, outputs)
      records.append((layer, trace))
      return trace.outputs
    return call

  with tf.control_dependencies(checks):
    with tf.GradientTape(persistent=True) as tape:
      x_std = graph._standardize_inputs(x)  # pylint: disable=protected-access
      y_pred = graph._run_through_graph(x_std, operation_fn=operation_fn)  # pylint: disable=protected-access
      y_pred = tf.nest.flatten(y_pred)[0] if isinstance(y_pred, (list, tuple)) else y_pred
      per_example = per_example_losses(per_example_loss_fn(y, y_pred), batch,
                                       mask=getattr(y_pred, "_keras_mask", None))
      per_example *= tf.cast(sample_weight, per_example.dtype)
      total = tf.reduce_sum(per_example) / tf.cast(per_group, per_example.dtype)
  _check_records_own_distinct_variables(records)
  watched = [trace.watched for _, trace in records]
  output_grads = tape.gradient(total, watched, unconnected_gradients=tf.UnconnectedGradients.ZERO)
  squared = tf.add_n([trace.squared_norms(g, groups)
                      for (_, trace), g in zip(records, output_grads)])
  norms = tf.sqrt(tf.maximum(squared, 0.0))
  factors = clip_factors(norms, l2_norm_clip)
  example_factors = tf.repeat(factors, batch // groups)

  variables = model.trainable_variables
  index = {id(v): i for i, v in enumerate(variables)}
  sums = [None] * len(variables)
  for (layer, trace), g in zip(records, output_grads):
    layer_vars = layer.trainable_variables
    layer_sums = trace.clipped_sum(factors) if trace.clipped_sum is not None else None
    if layer_sums is None:
      shape = tf.concat([[batch], tf.ones([tf.rank(g) - 1], tf.int32)], 0)
      weighted = g * tf.reshape(tf.cast(example_factors, g.dtype), shape)
      layer_sums = tape.gradient(trace.watched, layer_vars, output_gradients=weighted,
                                 unconnected_gradients=tf.UnconnectedGradients.ZERO)
    for v, grad in zip(layer_vars, layer_sums):
      grad = tf.convert_to_tensor(grad)
      i = index[id(v)]
      sums[i] = grad if sums[i] is None else sums[i] + grad
  del tape
  sums = [tf.zeros_like(v) if s is None else s for v, s in zip(variables, sums)]
  losses = tf.reduce_sum(tf.reshape(per_example, [groups, -1]), axis=1) / per_group
  return ClippedSum(sums, norms, losses), y_pred
