"""The fast path under a batch dimension unknown while tracing (Poisson batches, Keras's array
batches, distributed datasets): the rules must build the same contractions as for a static
batch (no per-example kernel gradients where the Gram form is cheaper) and give the same clipped
sums, which must equal a per-microbatch brute-force loop."""
import collections

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_dpkit.clipping import clipped_sum_fast

RNG = np.random.default_rng(7)
XENT = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
CLIP = 0.5


def _mlp():
  keras.utils.set_random_seed(1)
  return keras.Sequential([keras.Input((30,)), keras.layers.Dense(24, activation="tanh"),
                           keras.layers.Dense(5)])


def _mixed():
  """Every rule this module guards (Conv2D with >= 4 channels, so its choice is by shape only;
  DepthwiseConv2D, LayerNormalization, EinsumDense, Dense on sequences and on vectors)."""
  keras.utils.set_random_seed(2)
  inputs = keras.Input((10, 10, 4))
  h = keras.layers.Conv2D(6, 3, activation="relu")(inputs)
  h = keras.layers.Conv2D(8, 3, strides=2)(h)
  h = keras.layers.DepthwiseConv2D(3, depth_multiplier=2, activation="tanh")(h)
  h = keras.layers.Reshape((-1, 16))(h)
  h = keras.layers.LayerNormalization()(h)
  h = keras.layers.EinsumDense("bsd,de->bse", output_shape=(1, 8), bias_axes="e")(h)
  h = keras.layers.Dense(20, activation="relu")(h)
  outputs = keras.layers.Dense(3)(keras.layers.Flatten()(h))
  return keras.Model(inputs, outputs)


def _batch(model, size, classes):
  x = RNG.random((size,) + tuple(model.input_shape[1:])).astype(np.float32)
  return tf.constant(x), tf.constant(RNG.integers(0, classes, size))


def _traced(model, x, num_microbatches, dynamic):
  """(concrete function, its outputs): the clipped sum traced with a static or None batch."""
  feature_shape = list(x.shape[1:])
  signature = [tf.TensorSpec([None if dynamic else x.shape[0]] + feature_shape),
               tf.TensorSpec([None if dynamic else x.shape[0]], tf.int64)]

  @tf.function(input_signature=signature)
  def fast(xb, yb):
    result, _ = clipped_sum_fast(model, XENT, (xb, yb, tf.ones_like(yb, tf.float32)), CLIP,
                                 num_microbatches)
    return result.norms, result.grads
  return fast.get_concrete_function()


def _contractions(concrete):
  """The multiset of (op type, static shape without the leading axis) of every batched
  contraction (output rank >= 3: per-example or per-microbatch products, where the rules'
  cost choices show)."""
  kinds = {"MatMul", "BatchMatMulV2", "BatchMatMulV3", "Einsum", "_MklMatMul",
           "_MklBatchMatMulV2", "Conv2D", "DepthwiseConv2dNative",
           "DepthwiseConv2dNativeBackpropFilter"}
  found = collections.Counter()
  for op in concrete.graph.get_operations():
    if op.type in kinds:
      for out in op.outputs:
        if out.shape.rank is None or out.shape.rank >= 3:
          found[(op.type, tuple(out.shape.as_list()[1:]) if out.shape.rank else None)] += 1
  return found


def _brute_force(model, x, y, num_microbatches):
  """Per-microbatch loop: gradient of the mean loss of each microbatch, clipped, summed."""
  groups = x.shape[0] if num_microbatches is None else num_microbatches
  size = x.shape[0] // groups
  grads, norms = [], []
  for j in range(groups):
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(XENT(y[j * size:(j + 1) * size],
                                 model(x[j * size:(j + 1) * size], training=True)))
    g = [t.numpy().astype(np.float64) for t in tape.gradient(loss, model.trainable_variables)]
    norms.append(np.sqrt(sum(np.sum(t ** 2) for t in g)))
    grads.append(g)
  factors = np.minimum(1.0, CLIP / np.array(norms))
  return [sum(f * g[v] for f, g in zip(factors, grads)) for v in range(len(grads[0]))], norms


def _assert_matches(outputs, expected):
  (norms, grads), (ref_grads, ref_norms) = outputs, expected
  np.testing.assert_allclose(norms.numpy(), ref_norms, rtol=2e-4)
  for a, b in zip(grads, ref_grads):
    np.testing.assert_allclose(a.numpy(), b, rtol=2e-4, atol=2e-5)


def test_dense_under_a_dynamic_batch_forms_no_per_example_kernel_gradients():
  model = _mlp()
  x, y = _batch(model, 6, 5)
  concrete = _traced(model, x, None, dynamic=True)
  kernel_shapes = {tuple(layer.kernel.shape) for layer in model.layers}
  per_example_kernels = [
      (op.name, out.shape) for op in concrete.graph.get_operations() for out in op.outputs
      if out.shape.rank == 3 and tuple(out.shape.as_list()[1:]) in kernel_shapes]
  assert not per_example_kernels, per_example_kernels
  _assert_matches(concrete(x, y), _brute_force(model, x, y, None))


def test_every_rule_builds_the_static_batch_contractions_under_a_dynamic_batch():
  model = _mixed()
  x, y = _batch(model, 6, 3)
  static, dynamic = _traced(model, x, None, False), _traced(model, x, None, True)
  assert _contractions(dynamic) == _contractions(static)
  expected = _brute_force(model, x, y, None)
  _assert_matches(static(x, y), expected)
  _assert_matches(dynamic(x, y), expected)


@pytest.mark.parametrize("make_model, classes", [(_mlp, 5), (_mixed, 3)], ids=["mlp", "mixed"])
def test_microbatches_of_a_dynamic_batch_choose_when_the_step_runs(make_model, classes):
  # Examples per microbatch are unknown while tracing: each linear norm picks the Gram or the
  # explicit form at run time (the MLP's Dense layers take the Gram branch, the mixed model's
  # first convolution the explicit one); both must equal the brute-force loop.
  model = make_model()
  x, y = _batch(model, 8, classes)
  _assert_matches(_traced(model, x, 4, dynamic=True)(x, y), _brute_force(model, x, y, 4))
