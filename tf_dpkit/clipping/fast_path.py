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

Layers with trainable weights but no rule fall back to a layer-local ``tf.vectorized_map`` over
examples (exact for layers that treat examples independently).  Models whose call logic is not
a Keras layer graph (subclassed models) are not handled here: :func:`fast_path_available` says
so and ``DPModel`` then uses the whole-model ``tf.vectorized_map`` path.
"""
from __future__ import annotations

import keras
import tensorflow as tf
from keras.src.models import functional as keras_functional

from tf_dpkit.clipping.clipped_sum import ClippedSum, clip_factors
from tf_dpkit.clipping.layer_registry import LayerTrace, group_examples, lookup_rule


def layer_graph(model):
  """Returns the Keras functional graph that runs ``model``, or None if it has none."""
  if isinstance(model, keras.Sequential):
    return getattr(model, "_functional", None)
  if isinstance(model, keras_functional.Functional):
    return model
  return None


def fast_path_available(model) -> bool:
  """True when ``model``'s computation is a Keras layer graph the fast path can walk."""
  return layer_graph(model) is not None


def _layer_local_trace(layer, args, kwargs, outputs):
  """Fallback rule: per-example gradients of this layer alone, by ``tf.vectorized_map``."""
  if len(args) != 1 or not isinstance(outputs, tf.Tensor):
    raise NotImplementedError(
        f"Layer {layer.name!r} ({type(layer).__name__}) has no fast-path rule and is not a "
        "single-input, single-output layer.")
  inputs = args[0]
  variables = layer.trainable_variables

  def squared_norms(g, num_groups):
    def per_example(example):
      x_i, g_i = example
      with tf.GradientTape() as tape:
        out = layer(x_i[None], **kwargs)
      return tape.gradient(out, variables, output_gradients=g_i[None],
                           unconnected_gradients=tf.UnconnectedGradients.ZERO)
    grads = tf.vectorized_map(per_example, (inputs, g))
    total = 0.0
    for grad in grads:
      grouped = tf.reduce_sum(group_examples(grad[:, None], num_groups), axis=1)
      total += tf.reduce_sum(tf.reshape(tf.square(grouped), [num_groups, -1]), axis=1)
    return total
  return LayerTrace(outputs, outputs, squared_norms)


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
    inputs: ``(x, y, sample_weight)`` with batch dimension B; ``sample_weight`` [B] multiplies
      each example's loss.
    l2_norm_clip: clip norm C > 0.
    num_microbatches: None (per example) or M dividing B.

  Returns:
    ``(ClippedSum, y_pred)``; the sums are aligned with ``model.trainable_variables``.
  """
  graph = layer_graph(model)
  x, y, sample_weight = inputs
  batch = tf.shape(tf.nest.flatten(x)[0])[0]
  groups = batch if num_microbatches is None else num_microbatches
  checks = []
  if num_microbatches is not None:
    checks.append(tf.debugging.assert_equal(
        batch % num_microbatches, 0,
        message=f"num_microbatches={num_microbatches} must divide the batch size. For the last, "
        "smaller batch use `drop_remainder=True` in the input pipeline, or "
        "`num_microbatches=None` (one microbatch per example)."))
  per_group = tf.cast(batch // groups, tf.float32)
  records = []

  def operation_fn(layer):
    default = keras_functional.operation_fn(layer, training=True)

    def call(*args, **kwargs):
      _check_examples_independent(layer)
      if not layer.trainable_weights:
        return default(*args, **kwargs)
      trace = None
      rule = lookup_rule(layer)
      if rule is not None and len(args) == 1 and not kwargs:
        trace = rule(layer, args[0])
      if trace is None:
        outputs = default(*args, **kwargs)
        trace = _layer_local_trace(layer, args, {"training": True} if kwargs.get(
            "training", True) else {}, outputs)
      records.append((layer, trace))
      return trace.outputs
    return call

  with tf.control_dependencies(checks):
    with tf.GradientTape(persistent=True) as tape:
      x_std = graph._standardize_inputs(x)  # pylint: disable=protected-access
      y_pred = graph._run_through_graph(x_std, operation_fn=operation_fn)  # pylint: disable=protected-access
      y_pred = tf.nest.flatten(y_pred)[0] if isinstance(y_pred, (list, tuple)) else y_pred
      per_example = tf.convert_to_tensor(per_example_loss_fn(y, y_pred))
      per_example = tf.reduce_mean(tf.reshape(per_example, [batch, -1]), axis=1)
      per_example *= tf.cast(sample_weight, per_example.dtype)
      total = tf.reduce_sum(per_example) / tf.cast(per_group, per_example.dtype)
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
    shape = tf.concat([[batch], tf.ones([tf.rank(g) - 1], tf.int32)], 0)
    weighted = g * tf.reshape(tf.cast(example_factors, g.dtype), shape)
    layer_vars = layer.trainable_variables
    vjp = tape.gradient(trace.watched, layer_vars, output_gradients=weighted,
                        unconnected_gradients=tf.UnconnectedGradients.ZERO)
    for v, grad in zip(layer_vars, vjp):
      grad = tf.convert_to_tensor(grad)
      i = index[id(v)]
      sums[i] = grad if sums[i] is None else sums[i] + grad
  del tape
  sums = [tf.zeros_like(v) if s is None else s for v, s in zip(variables, sums)]
  losses = tf.reduce_sum(tf.reshape(per_example, [groups, -1]), axis=1) / per_group
  return ClippedSum(sums, norms, losses), y_pred
