"""The Embedding rule (per-(microbatch, token) sums of output gradients) against brute force.

References: each example's gradient of the embedding table from its own ``tf.GradientTape``
(one example at a time), or, for the 16-bit and out-of-range cases, the closed form
``G_j[v] = sum_{positions of microbatch j with id v} g`` summed in float64 by numpy.

Every test runs twice: with the compiled CPU kernels (tf_dpkit.native) and with the
TensorFlow-op code the rule uses elsewhere (GPU, float64, XLA, no compiler).
"""
import numpy as np
import pytest
import keras
import tensorflow as tf

from tf_dpkit import native
from tf_dpkit.clipping import clipped_sum_fast
from tf_dpkit.clipping.clipped_sum import clip_factors
from tf_dpkit.clipping.rules import embedding as embedding_rules
from tf_dpkit.clipping.rules import lookup_rule, registry
from tf_dpkit.clipping.testing import removal_sensitivity

RNG = np.random.default_rng(18)
SCE = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)


@pytest.fixture(autouse=True, params=["compiled", "tf_ops"])
def kernels(request, monkeypatch):
  if request.param == "tf_ops":
    monkeypatch.setattr(native, "kernels_for", lambda family, device, dtype: None)
  elif native.kernels("embedding") is None:
    pytest.skip(f"compiled CPU kernels unavailable here: {native.status('embedding')}")
  return request.param


def test_the_compiled_kernels_are_what_runs_on_this_cpu(kernels):
  layer = _layer(50, 4, tf.zeros([6, 5], tf.int32))
  trace = lookup_rule(layer)(layer, tf.zeros([6, 5], tf.int32))

  @tf.function
  def step(g, factors):
    norms = trace.squared_norms(g, 3)
    return norms, trace.clipped_sum(factors)

  graph = step.get_concrete_function(tf.TensorSpec([6, 5, 4]), tf.TensorSpec([3])).graph
  used = {op.type for op in graph.get_operations()}
  compiled = {"DpkitTokenSquaredNorms", "DpkitScatterScaledRows"}
  assert (compiled <= used) == (kernels == "compiled"), used & compiled


def _layer(vocab, dim, ids, **kwargs):
  layer = keras.layers.Embedding(vocab, dim, **kwargs)
  layer(ids)
  layer.embeddings.assign(tf.cast(RNG.normal(size=(vocab, dim)), layer.embeddings.dtype))
  return layer


def _tape_reference(layer, ids, g, groups):
  """Per-microbatch squared norms and gradients (float64) from one tape per example."""
  batch = int(ids.shape[0])
  per_example = []
  for i in range(batch):
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(tf.cast(layer(ids[i:i + 1]), tf.float32) * g[i:i + 1])
    grad = tape.gradient(loss, layer.embeddings)
    per_example.append(tf.convert_to_tensor(grad).numpy().astype(np.float64))
  k = batch // groups
  grouped = np.stack([sum(per_example[j * k:(j + 1) * k]) for j in range(groups)])
  return np.sum(grouped ** 2, axis=(1, 2)), grouped


def _closed_form(ids, g, vocab, groups):
  """G_j[v] = sum of g over the positions of microbatch j whose id is v (ids outside [0, V)
  touch no row), in float64."""
  ids = np.asarray(ids).reshape(groups, -1)
  g = np.asarray(tf.cast(g, tf.float64)).reshape(groups, ids.shape[1], -1)
  grads = np.zeros((groups, vocab, g.shape[-1]))
  for j in range(groups):
    for s, v in enumerate(ids[j]):
      if 0 <= v < vocab:
        grads[j, v] += g[j, s]
  return np.sum(grads ** 2, axis=(1, 2)), grads


def _check_rule(layer, ids, groups, rtol=1e-5):
  trace = lookup_rule(layer)(layer, ids)
  np.testing.assert_array_equal(trace.outputs.numpy(), layer(ids).numpy())
  g = tf.constant(RNG.normal(size=trace.outputs.shape).astype(np.float32))
  norms = trace.squared_norms(g, groups).numpy()
  want_norms, grads = _tape_reference(layer, ids, g, groups)
  np.testing.assert_allclose(norms, want_norms, rtol=rtol)
  factors = clip_factors(tf.constant(np.sqrt(want_norms), tf.float32),
                         float(np.median(np.sqrt(want_norms)))).numpy()
  assert 0 < np.sum(factors < 1) < groups  # some microbatches clipped, some not
  (clipped,) = trace.clipped_sum(tf.constant(factors))
  np.testing.assert_allclose(clipped.numpy(), np.tensordot(factors, grads, axes=1),
                             rtol=rtol, atol=1e-5)


ID_CASES = [
    # name, vocab, ids, Embedding kwargs
    ("many_repeats", 5, lambda: RNG.integers(0, 5, (8, 30)), {}),
    ("one_token_repeated", 9, lambda: np.repeat(RNG.integers(0, 9, (8, 1)), 12, axis=1), {}),
    ("padding_mask_zero", 9, lambda: RNG.integers(1, 9, (8, 10)) * (RNG.random((8, 10)) < 0.6),
     {"mask_zero": True}),
    ("rank3_ids", 7, lambda: RNG.integers(0, 7, (8, 3, 5)), {}),
    ("rank1_ids", 4, lambda: RNG.integers(0, 4, (8,)), {}),
    ("int64_ids", 6, lambda: RNG.integers(0, 6, (8, 7)).astype(np.int64), {}),
    ("float_ids", 6, lambda: RNG.integers(0, 6, (8, 7)).astype(np.float32), {}),
]


@pytest.mark.parametrize("num_microbatches", [None, 4])
@pytest.mark.parametrize("name, vocab, make_ids, kwargs", ID_CASES, ids=[c[0] for c in ID_CASES])
def test_norms_and_clipped_sum_equal_per_example_tapes(name, vocab, make_ids, kwargs,
                                                       num_microbatches):
  ids = tf.constant(make_ids())
  layer = _layer(vocab, 3, ids, **kwargs)
  _check_rule(layer, ids, 8 if num_microbatches is None else num_microbatches)


def test_ids_repeated_across_examples_are_not_merged():
  # Every example holds the same tokens: merging across examples would give each the norm of
  # the batch's sum; the per-example norms must stay each example's own.
  ids = tf.constant(np.tile(RNG.integers(0, 3, (1, 6)), (5, 1)))
  layer = _layer(3, 4, ids)
  trace = lookup_rule(layer)(layer, ids)
  g = tf.constant(RNG.normal(size=(5, 6, 4)).astype(np.float32))
  want, _ = _closed_form(ids, g, 3, 5)
  np.testing.assert_allclose(trace.squared_norms(g, 5).numpy(), want, rtol=1e-5)
  merged, _ = _closed_form(ids, g, 3, 1)
  assert np.all(want < 0.9 * merged[0])


@pytest.mark.parametrize("num_microbatches", [None, 2])
def test_dynamic_batch_size(num_microbatches):
  ids = tf.constant(RNG.integers(0, 4, (6, 2, 5)), tf.int32)
  layer = _layer(4, 3, ids)
  g = tf.constant(RNG.normal(size=(6, 2, 5, 3)).astype(np.float32))

  @tf.function(input_signature=[tf.TensorSpec([None, 2, 5], tf.int32),
                                tf.TensorSpec([None, 2, 5, 3], tf.float32)])
  def norms_and_sum(ids, g):
    trace = lookup_rule(layer)(layer, ids)
    groups = tf.shape(ids)[0] if num_microbatches is None else num_microbatches
    norms = trace.squared_norms(g, groups)
    return norms, trace.clipped_sum(tf.fill([groups], 0.5))[0]

  groups = 6 if num_microbatches is None else num_microbatches
  norms, clipped = norms_and_sum(ids, g)
  want, grads = _tape_reference(layer, ids, g, groups)
  np.testing.assert_allclose(norms.numpy(), want, rtol=1e-5)
  np.testing.assert_allclose(clipped.numpy(), 0.5 * grads.sum(0), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype, value, repeats", [
    # float16: 64 x 2000 = 128000 overflows float16 (max 65504).
    ("float16", 2000.0, 64),
    # bfloat16 (8-bit mantissa): adding 1 to 256 gives 256, so 300 ones would sum to 256.
    ("bfloat16", 1.0, 300)])
def test_16_bit_output_gradients_are_summed_in_float32(dtype, value, repeats):
  ids = tf.constant([[1] * repeats, [2] * repeats], tf.int32)
  layer = _layer(3, 2, ids, dtype=dtype)
  trace = lookup_rule(layer)(layer, ids)
  g = tf.cast(tf.fill([2, repeats, 2], value), dtype)
  norms = trace.squared_norms(g, 2)
  assert norms.dtype == tf.float32
  want, grads = _closed_form(ids, g, 3, 2)
  np.testing.assert_allclose(want, 2 * (repeats * value) ** 2)  # the reference is exact
  np.testing.assert_allclose(norms.numpy(), want, rtol=1e-7)
  (clipped,) = trace.clipped_sum(tf.constant([1.0, 0.25]))
  np.testing.assert_allclose(clipped.numpy(), grads[0] + 0.25 * grads[1], rtol=1e-7)


def test_out_of_range_ids_touch_no_row_and_never_join_another_microbatch():
  # tf.gather gives a zero row for ids outside [0, V) on GPU (an error on CPU), and the gradient
  # of E drops them: they must count for nothing, in the norms and in the clipped sum, whatever
  # their dtype (2**32 + 1 wraps to 1 in int32) and wherever they sit next to counted ids.
  vocab = 4
  ids = tf.constant([[vocab, 1, -1, 2**32 + 1], [0, 0, 1, 3], [vocab + 1, vocab, 0, -2**40]],
                    tf.int64)  # 2**32 + 1 would wrap to 1 in int32
  g = tf.constant(RNG.normal(size=(3, 4, 2)).astype(np.float32))
  sums = embedding_rules.TokenSums(ids, vocab)
  want, grads = _closed_form(ids, g, vocab, 3)
  np.testing.assert_allclose(sums.squared_norms(g, 3).numpy(), want, rtol=1e-6)
  (clipped,) = sums.clipped_sum(tf.constant([0.5, 1.0, 2.0]))
  np.testing.assert_allclose(clipped.numpy(), np.tensordot([0.5, 1.0, 2.0], grads, axes=1),
                             rtol=1e-6, atol=1e-7)


def _text_model():
  keras.utils.set_random_seed(4)
  return keras.Sequential([
      keras.Input((16,), dtype="int32"), keras.layers.Embedding(6, 4, mask_zero=True),
      keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(3, use_bias=False)])


def _repeated_token_batch():
  """Each example one token repeated over a padded length; tokens shared across examples."""
  tokens = np.array([1, 1, 1, 2, 2, 3, 5, 1])
  lengths = np.array([16, 16, 9, 16, 4, 16, 12, 1])
  x = (np.arange(16)[None, :] < lengths[:, None]) * tokens[:, None]
  return tf.constant(x, tf.int32), tf.constant(RNG.integers(0, 3, 8))


@pytest.mark.parametrize("num_microbatches", [None, 2])
def test_model_clipped_sum_equals_per_example_brute_force(num_microbatches):
  model = _text_model()
  x, y = _repeated_token_batch()
  groups = 8 if num_microbatches is None else num_microbatches

  @tf.function(autograph=False, input_signature=[tf.TensorSpec([None, 16], tf.int32),
                                tf.TensorSpec([None], tf.int64)])
  def fast(x, y):
    cs, _ = clipped_sum_fast(model, SCE, (x, y, None), 0.05, num_microbatches)
    return cs.grads, cs.norms

  grads, norms = fast(x, y)
  per_example = []
  for i in range(8):
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(SCE(y[i:i + 1], model(x[i:i + 1], training=True)))
    per_example.append([tf.convert_to_tensor(t).numpy().astype(np.float64)
                        for t in tape.gradient(loss, model.trainable_variables)])
  k = 8 // groups
  grouped = [[sum(per_example[j * k + i][v] for i in range(k)) / k for v in range(2)]
             for j in range(groups)]
  want_norms = np.sqrt([sum(np.sum(t ** 2) for t in gj) for gj in grouped])
  np.testing.assert_allclose(norms.numpy(), want_norms, rtol=1e-5)
  factors = np.minimum(1.0, 0.05 / want_norms)
  assert np.all(factors < 1)
  for v, got in enumerate(grads):
    want = sum(factors[j] * grouped[j][v] for j in range(groups))
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-7)


def _model_sensitivity(model, x, y, clip):
  return removal_sensitivity(lambda keep: clipped_sum_fast(
      model, SCE, (tf.gather(x, keep), tf.gather(y, keep), None), clip)[0].grads, len(y))


def test_removal_sensitivity_with_adversarially_repeated_tokens(monkeypatch):
  model = _text_model()
  x, y = _repeated_token_batch()
  clip = 0.05
  sensitivity = _model_sensitivity(model, x, y, clip)
  assert 0.5 * clip < sensitivity <= clip * (1 + 1e-5)

  # Positive control: a rule that sums per-position squared norms (forgetting that repeated
  # tokens add up in one row) under-clips these examples (by up to sqrt(16) = 4: the embedding
  # gradient dominates), and the measurement catches it.
  def per_position_rule(layer, inputs):
    trace = embedding_rules.embedding_rule(layer, inputs)
    return trace._replace(
        squared_norms=lambda g, m: tf.reduce_sum(tf.reshape(tf.square(g), [m, -1]), axis=1),
        clipped_sum=None)
  monkeypatch.setitem(registry._RULES, keras.layers.Embedding, per_position_rule)  # pylint: disable=protected-access
  assert _model_sensitivity(model, x, y, clip) > 2.5 * clip
