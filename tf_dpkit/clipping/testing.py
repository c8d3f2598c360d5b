"""Check a fast-path layer rule against explicit per-example gradients (for custom layers), and
measure by brute force how far one example moves a clipped sum (:func:`removal_sensitivity`).

    from tf_dpkit.clipping.testing import check_layer_rule
    check_layer_rule(MyLayer(...), inputs)   # raises AssertionError on a mismatch

The reference is brute force: for every example, the gradient of ``<layer(x_i), r_i>`` (``r``
a fixed random cotangent) with respect to the layer's trainable variables, from its own tape,
summed within microbatches.  The rule must give the same squared norms, and the clipped sum the
fast path would form (the rule's ``clipped_sum`` where it returns one, else the VJP through
``watched`` with the clip factors) the same clipped sum.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from tf_dpkit.clipping.clipped_sum import clip_factors
from tf_dpkit.clipping.rules import lookup_rule


def check_layer_rule(layer, inputs, num_microbatches=None, l2_norm_clip=None, rtol=1e-4,
                     atol=1e-5, seed=0):
  """Asserts that ``layer``'s registered rule matches the per-example reference.

  Args:
    layer: a built Keras layer with a registered rule (``register_layer_rule``).
    inputs: a batch tensor [B, ...] for the layer.
    num_microbatches: None (per example) or M dividing B.
    l2_norm_clip: clip norm for the clipped-sum check; default: the median reference norm
      (so some microbatches are clipped and some are not).
    rtol, atol: tolerances (float32 defaults).
    seed: seed of the random output cotangent.

  Returns:
    dict with the maximum absolute errors ``norms`` and ``clipped_sum``.
  """
  rule = lookup_rule(layer)
  if rule is None:
    raise AssertionError(f"No rule is registered for {type(layer).__name__}.")
  inputs = tf.convert_to_tensor(inputs)
  batch = int(inputs.shape[0])
  groups = batch if num_microbatches is None else num_microbatches
  expected_outputs = layer(inputs)
  cotangent = tf.random.stateless_normal(tf.shape(expected_outputs), seed=[seed, 1],
                                         dtype=expected_outputs.dtype)
  variables = layer.trainable_variables

  with tf.GradientTape(persistent=True) as tape:
    trace = rule(layer, inputs)
    if trace is None:
      raise AssertionError(f"The rule for {type(layer).__name__} declined this configuration.")
    total = tf.reduce_sum(trace.outputs * cotangent)
  np.testing.assert_allclose(trace.outputs.numpy(), expected_outputs.numpy(), rtol=rtol, atol=atol,
                             err_msg="rule outputs differ from layer(inputs)")
  g = tape.gradient(total, trace.watched)
  fast_sq = trace.squared_norms(g, groups).numpy()

  per_example = []
  for i in range(batch):
    with tf.GradientTape() as example_tape:
      loss = tf.reduce_sum(layer(inputs[i:i + 1]) * cotangent[i:i + 1])
    per_example.append([tf.convert_to_tensor(t).numpy() for t in example_tape.gradient(
        loss, variables, unconnected_gradients=tf.UnconnectedGradients.ZERO)])
  k = batch // groups
  grouped = [[sum(per_example[j * k + i][v] for i in range(k)) for v in range(len(variables))]
             for j in range(groups)]
  ref_sq = np.array([sum(np.sum(gv.astype(np.float64) ** 2) for gv in gj) for gj in grouped])
  np.testing.assert_allclose(fast_sq, ref_sq, rtol=rtol, atol=atol,
                             err_msg="per-microbatch squared norms differ from the reference")

  norms = np.sqrt(ref_sq)
  clip = float(np.median(norms)) if l2_norm_clip is None else l2_norm_clip
  factors = clip_factors(tf.constant(norms, tf.float32), clip).numpy()
  ref_sum = [sum(factors[j] * grouped[j][v] for j in range(groups)) for v in range(len(variables))]
  # The clipped sum the fast path would use: the rule's own clipped_sum where it gives one,
  # else the vector-Jacobian product through ``watched``.
  candidates = {}
  if trace.clipped_sum is not None:
    reused = trace.clipped_sum(tf.constant(factors))
    if reused is not None:
      candidates["book-keeping clipped_sum"] = reused
  if not candidates:
    weighted = tf.nest.map_structure(
        lambda t: t * np.repeat(factors, k).reshape([batch] + [1] * (t.shape.rank - 1)).astype(
            t.dtype.as_numpy_dtype), g)
    candidates["VJP"] = tape.gradient(trace.watched, variables, output_gradients=weighted)
  del tape
  errors = []
  for how, grads in candidates.items():
    for got, want in zip(grads, ref_sum):
      got = tf.convert_to_tensor(got).numpy()
      np.testing.assert_allclose(got, want, rtol=rtol, atol=atol,
                                 err_msg=f"clipped sum ({how}) differs from the reference")
      errors.append(float(np.max(np.abs(got - want))))
  return {"norms": float(np.max(np.abs(fast_sq - ref_sq))), "clipped_sum": max(errors)}


def removal_sensitivity(clipped_sum_fn, num_examples: int) -> float:
  """``max_k ||S(D) - S(D minus example k)||_2``: what one example moves a clipped sum.

  DP-SGD's noise is calibrated to this being at most ``C`` (the clip norm) for every data set
  ``D`` and example ``k`` (add/remove neighbours).  Brute force: ``num_examples + 1`` calls.

  Args:
    clipped_sum_fn: ``f(keep) -> list of tensors``, the clipped sum over the examples whose
      indices are in ``keep`` (an int array, ascending).
    num_examples: the size of ``D``.

  Returns:
    The largest L2 distance (float64) between the full clipped sum and one with an example
    removed.
  """
  def flat(keep):
    return np.concatenate([np.asarray(tf.convert_to_tensor(g), np.float64).ravel()
                           for g in clipped_sum_fn(keep)])
  everyone = np.arange(num_examples)
  full = flat(everyone)
  return max(float(np.linalg.norm(full - flat(everyone[everyone != k])))
             for k in range(num_examples))
