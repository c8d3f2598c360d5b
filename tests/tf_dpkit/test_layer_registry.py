"""Fast-path rules against brute-force per-example gradients, and the fast path vs vectorized_map."""
import numpy as np
import pytest
import keras
import tensorflow as tf

from tf_dpkit.clipping import (clipped_sum_fast, clipped_sum_vectorized, fast_path_available,
                               register_layer_rule)
from tf_dpkit.clipping.rules import LayerTrace, lookup_rule
from tf_dpkit.clipping.testing import check_layer_rule

RNG = np.random.default_rng(3)


def _x(*shape):
  return tf.constant(RNG.normal(size=shape).astype(np.float32))


def _built(layer, inputs):
  layer(inputs)
  return layer


CASES = [
    ("dense_2d", lambda: keras.layers.Dense(3, activation="tanh"), lambda: _x(6, 5)),
    ("dense_2d_no_bias", lambda: keras.layers.Dense(3, use_bias=False), lambda: _x(6, 5)),
    ("dense_3d_input", lambda: keras.layers.Dense(4), lambda: _x(6, 7, 5)),
    ("dense_4d_no_bias", lambda: keras.layers.Dense(2, use_bias=False), lambda: _x(6, 2, 3, 4)),
    ("dense_gram_form", lambda: keras.layers.Dense(64), lambda: _x(4, 2, 64)),
    ("conv2d_same_stride2", lambda: keras.layers.Conv2D(4, 3, strides=2, padding="same",
                                                        activation="relu"), lambda: _x(4, 9, 9, 2)),
    ("conv2d_valid_dilated", lambda: keras.layers.Conv2D(3, 3, dilation_rate=2), lambda: _x(4, 9, 8, 2)),
    ("conv1d_dilated", lambda: keras.layers.Conv1D(2, 3, dilation_rate=2), lambda: _x(6, 11, 3)),
    ("conv2d_rect_kernel_no_bias", lambda: keras.layers.Conv2D(5, (2, 4), strides=(1, 2),
                                                               use_bias=False), lambda: _x(4, 7, 9, 3)),
    ("conv1d_same", lambda: keras.layers.Conv1D(4, 3, padding="same"), lambda: _x(6, 10, 3)),
    ("conv2d_gram_form", lambda: keras.layers.Conv2D(32, 3, strides=2), lambda: _x(4, 5, 5, 8)),
    # More kernel weights (72 x 32) than input or output entries and the Gram form cheaper (16
    # positions) but not twice cheaper: compiled norms, clipped sum by a filter gradient (the
    # other conv cases keep their per-microbatch gradients or use TensorFlow ops).
    ("conv2d_many_weights", lambda: keras.layers.Conv2D(32, 3, strides=2, padding="same"),
     lambda: _x(4, 8, 8, 8)),
    ("conv1d_valid_strided", lambda: keras.layers.Conv1D(2, 2, strides=2),
     lambda: _x(6, 11, 3)),
    ("depthwise2d_same_stride2_multiplier2", lambda: keras.layers.DepthwiseConv2D(
        3, strides=2, padding="same", depth_multiplier=2, activation="relu"),
     lambda: _x(4, 9, 8, 3)),
    ("depthwise2d_valid_dilated_5ch_no_bias", lambda: keras.layers.DepthwiseConv2D(
        (3, 2), dilation_rate=2, use_bias=False), lambda: _x(4, 9, 8, 5)),
    ("depthwise1d_strided", lambda: keras.layers.DepthwiseConv1D(3, strides=2, depth_multiplier=3),
     lambda: _x(6, 11, 4)),
    ("embedding_repeated_tokens", lambda: keras.layers.Embedding(7, 3),
     lambda: tf.constant(RNG.integers(0, 7, size=(6, 9)))),
    ("embedding_mask_zero", lambda: keras.layers.Embedding(5, 4, mask_zero=True),
     lambda: tf.constant(RNG.integers(0, 5, size=(6, 4)))),
    ("layer_norm", lambda: keras.layers.LayerNormalization(), lambda: _x(6, 5)),
    ("layer_norm_3d_no_center", lambda: keras.layers.LayerNormalization(center=False),
     lambda: _x(6, 3, 5)),
    ("einsum_dense", lambda: keras.layers.EinsumDense("abc,cd->abd", output_shape=(None, 4),
                                                      bias_axes="d"), lambda: _x(6, 3, 5)),
    ("einsum_dense_heads", lambda: keras.layers.EinsumDense("abc,cde->abde", output_shape=(None, 2, 3),
                                                            bias_axes="de"), lambda: _x(4, 3, 5)),
    ("einsum_dense_partial_bias", lambda: keras.layers.EinsumDense(
        "abc,cde->abde", output_shape=(None, 2, 3), bias_axes="d"), lambda: _x(4, 3, 5)),
]


@pytest.mark.parametrize("num_microbatches", [None, 2])
@pytest.mark.parametrize("name, make_layer, make_inputs", CASES, ids=[c[0] for c in CASES])
def test_rule_matches_per_example_reference(name, make_layer, make_inputs, num_microbatches):
  inputs = make_inputs()
  layer = _built(make_layer(), inputs)
  errors = check_layer_rule(layer, inputs, num_microbatches=num_microbatches)  # asserts inside
  assert set(errors) == {"norms", "clipped_sum"}


CONV_CASES = [c for c in CASES if c[0].startswith("conv")]


def use_conv_path(path, monkeypatch):
  """Forces the conv rule's way to its norms: "compiled" (tf_dpkit.native; skipped where it is
  unavailable), else TensorFlow ops with oneDNN's branch on or off ("onednn" / "plain")."""
  from tf_dpkit import native
  from tf_dpkit.clipping.rules import conv as conv_rule
  if path == "compiled":
    if native.kernels("conv") is None:
      pytest.skip(f"compiled CPU kernels unavailable here: {native.status('conv')}")
    return
  monkeypatch.setattr(native, "kernels_for", lambda family, device, dtype: None)
  monkeypatch.setattr(conv_rule, "onednn_enabled", lambda: path == "onednn")


@pytest.mark.parametrize("path, chunk", [("compiled", 128), ("plain", 128), ("onednn", 128),
                                         ("onednn", 3)])
@pytest.mark.parametrize("num_microbatches", [None, 2])
@pytest.mark.parametrize("name, make_layer, make_inputs", CONV_CASES,
                         ids=[c[0] for c in CONV_CASES])
def test_conv_rule_matches_reference_on_each_path(
    name, make_layer, make_inputs, num_microbatches, path, chunk, monkeypatch):
  # The compiled kernel where it is available; else the per-example filter-gradient branch
  # where oneDNN is on, in chunks of examples (3: uneven chunks), or unfolding: force each way
  # so all are tested whatever CPU runs the tests.
  from tf_dpkit.clipping.rules import conv as layer_registry
  use_conv_path(path, monkeypatch)
  monkeypatch.setattr(layer_registry, "_FILTER_BACKPROP_CHUNK", chunk)
  inputs = make_inputs()
  layer = _built(make_layer(), inputs)
  check_layer_rule(layer, inputs, num_microbatches=num_microbatches)


@pytest.mark.parametrize("padding", ["SAME", "VALID"])
@pytest.mark.parametrize("shape, kernel_hw, strides", [
    ((3, 9, 9, 1), (8, 8), (2, 2)), ((2, 7, 10, 3), (3, 2), (3, 3)), ((4, 5, 6, 2), (1, 1), (1, 1))])
def test_per_example_conv_kernel_grads_match_a_per_example_loop(shape, kernel_hw, strides,
                                                                  padding):
  from tf_dpkit.clipping.rules.conv import per_example_conv_kernel_grads
  x = _x(*shape)
  kernel = tf.Variable(_x(*kernel_hw, shape[-1], 4))
  out = tf.nn.conv2d(x, kernel, strides=[1, *strides, 1], padding=padding)
  g = _x(*out.shape)
  got = per_example_conv_kernel_grads(x, g, kernel_hw, strides, padding).numpy()
  for b in range(shape[0]):
    with tf.GradientTape() as tape:
      z = tf.nn.conv2d(x[b:b + 1], kernel, strides=[1, *strides, 1], padding=padding)
    want = tape.gradient(z, kernel, output_gradients=g[b:b + 1]).numpy()
    np.testing.assert_allclose(got[b], want.reshape(-1, 4), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("batch", [0, 1, 5])
@pytest.mark.parametrize("chunk", [1, 2, 3, 5, 8])
def test_chunked_per_example_conv_kernel_grads_equal_one_call(batch, chunk):
  # Chunks change no value, whether the batch size is known while tracing (separate ops) or
  # not (zero-padded loop); compared with a per-example loop of tape gradients.
  from tf_dpkit.clipping.rules.conv import per_example_conv_kernel_grads_in_chunks
  x = _x(batch, 9, 9, 2)
  kernel = tf.Variable(_x(3, 3, 2, 4))
  g = tf.constant(RNG.normal(size=(batch, 5, 5, 4)).astype(np.float32))
  want = np.zeros((batch, 18, 4), np.float32)
  for b in range(batch):
    with tf.GradientTape() as tape:
      z = tf.nn.conv2d(x[b:b + 1], kernel, strides=[1, 2, 2, 1], padding="SAME")
    want[b] = tape.gradient(z, kernel, output_gradients=g[b:b + 1]).numpy().reshape(18, 4)
  static = per_example_conv_kernel_grads_in_chunks(x, g, (3, 3), [2, 2], "SAME", chunk)
  dynamic = tf.function(
      lambda x, g: per_example_conv_kernel_grads_in_chunks(x, g, (3, 3), [2, 2], "SAME", chunk),
      input_signature=[tf.TensorSpec([None, 9, 9, 2]), tf.TensorSpec([None, 5, 5, 4])])(x, g)
  for got in (static, dynamic):
    assert got.shape == (batch, 18, 4)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("chunk", [0, -1, 2.0, True, None])
def test_chunked_per_example_conv_kernel_grads_refuse_a_bad_chunk(chunk):
  from tf_dpkit.clipping.rules.conv import per_example_conv_kernel_grads_in_chunks
  with pytest.raises(ValueError, match=r"chunk must be a positive int, got"):
    per_example_conv_kernel_grads_in_chunks(_x(2, 5, 5, 1), _x(2, 3, 3, 2), (3, 3), [2, 2],
                                            "SAME", chunk)


def test_per_example_conv_kernel_grads_refuses_unequal_strides():
  from tf_dpkit.clipping.rules.conv import per_example_conv_kernel_grads
  with pytest.raises(ValueError, match=r"needs equal strides, got \[1, 2\]"):
    per_example_conv_kernel_grads(_x(2, 5, 5, 1), _x(2, 5, 3, 2), (1, 1), [1, 2], "SAME")


def test_check_layer_rule_catches_a_wrong_rule():
  class Scaled(keras.layers.Dense):
    pass

  def wrong_rule(layer, inputs):
    from tf_dpkit.clipping.rules.dense import dense_rule
    trace = dense_rule(layer, inputs)
    return LayerTrace(trace.outputs, trace.watched, lambda g, m: 2.0 * trace.squared_norms(g, m))
  register_layer_rule(Scaled, wrong_rule)
  inputs = _x(4, 3)
  layer = _built(Scaled(2), inputs)
  assert lookup_rule(layer) is wrong_rule
  with pytest.raises(AssertionError, match="squared norms differ"):
    check_layer_rule(layer, inputs)


def test_register_layer_rule_validates_arguments():
  with pytest.raises(TypeError, match="keras.layers.Layer subclass"):
    register_layer_rule(int, lambda layer, x: None)
  with pytest.raises(TypeError, match="rule must be callable"):
    register_layer_rule(keras.layers.Dense, 3)


def _compare_fast_and_vectorized(model, x, y, loss, num_microbatches=None, clip=0.5):
  w = tf.ones([x.shape[0]])
  fast, _ = clipped_sum_fast(model, loss, (x, y, w), clip, num_microbatches)

  def mb(inputs):
    xm, ym, wm = inputs
    return loss(ym, model(xm, training=True)) * wm, tf.zeros([tf.shape(wm)[0]])
  ref, _ = clipped_sum_vectorized(mb, (x, y, w), model.trainable_variables, clip, num_microbatches)
  np.testing.assert_allclose(fast.norms.numpy(), ref.norms.numpy(), rtol=2e-4, atol=1e-6)
  for a, b in zip(fast.grads, ref.grads):
    np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=2e-4, atol=2e-5)


MSE = lambda y, p: tf.reduce_mean(tf.square(p - y), axis=-1)
XENT = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)


@pytest.mark.parametrize("num_microbatches", [None, 4])
def test_fast_path_matches_vectorized_on_mnist_cnn(num_microbatches):
  model = keras.Sequential([
      keras.Input((28, 28, 1)), keras.layers.Conv2D(16, 8, strides=2, padding="same", activation="relu"),
      keras.layers.MaxPool2D(2, 1), keras.layers.Conv2D(32, 4, strides=2, activation="relu"),
      keras.layers.MaxPool2D(2, 1), keras.layers.Flatten(), keras.layers.Dense(32, activation="relu"),
      keras.layers.Dense(10)])
  x = tf.constant(RNG.random((8, 28, 28, 1)).astype(np.float32))
  y = tf.constant(RNG.integers(0, 10, 8))
  _compare_fast_and_vectorized(model, x, y, XENT, num_microbatches)


@pytest.mark.parametrize("path, chunk", [("compiled", 128), ("plain", 128), ("onednn", 3),
                                         ("onednn", 100)])
@pytest.mark.parametrize("num_microbatches", [None, 4])
def test_first_conv_paths_under_a_dynamic_batch(path, chunk, num_microbatches, monkeypatch):
  # The compiled kernel where available; with oneDNN the first (1-channel) conv forms
  # per-example gradients with the filter-gradient op in chunks, in a loop when the batch
  # dimension is unknown (Poisson batches; 8 examples in chunks of 3: a padded last chunk);
  # without, it unfolds.  Each must agree with the references.
  from tf_dpkit.clipping.rules import conv as layer_registry
  use_conv_path(path, monkeypatch)
  monkeypatch.setattr(layer_registry, "_FILTER_BACKPROP_CHUNK", chunk)
  model = keras.Sequential([
      keras.Input((12, 12, 1)), keras.layers.Conv2D(4, 5, strides=2, padding="same",
                                                    activation="relu"),
      keras.layers.Flatten(), keras.layers.Dense(3)])
  x = tf.constant(RNG.random((8, 12, 12, 1)).astype(np.float32))
  y = tf.constant(RNG.integers(0, 3, 8))

  @tf.function(input_signature=[tf.TensorSpec([None, 12, 12, 1]), tf.TensorSpec([None], tf.int64)])
  def fast(x, y):
    result, _ = clipped_sum_fast(model, XENT, (x, y, tf.ones_like(y, tf.float32)), 0.5,
                                 num_microbatches)
    return result.norms, result.grads

  _check_fast_clipped_sum(model, fast, x, y, num_microbatches)


def _check_fast_clipped_sum(model, fast, x, y, num_microbatches, clip=0.5):
  """``fast(x, y) -> (norms, grads)`` (8 examples, clip C) against the brute force (one example
  per microbatch) or the vectorized path (microbatches); with one example per microbatch,
  removing any one (other chunk boundaries too) moves the clipped sum by at most C, and by more
  than C/2: clipping binds for every example."""
  from tf_dpkit.clipping.testing import removal_sensitivity
  norms, grads = fast(x, y)
  if num_microbatches is None:
    expected, expected_norms = _brute_force_clipped_sum(model, XENT, x, y, clip)
    np.testing.assert_allclose(norms.numpy(), expected_norms, rtol=2e-4)
    for a, b in zip(grads, expected):
      np.testing.assert_allclose(a.numpy(), b, rtol=2e-4, atol=2e-5)
    assert np.min(expected_norms) > clip
    moved = removal_sensitivity(lambda keep: fast(tf.gather(x, keep), tf.gather(y, keep))[1], 8)
    assert clip / 2 < moved <= clip * (1 + 1e-5)
  else:
    def mb(inputs):
      xm, ym, wm = inputs
      return XENT(ym, model(xm, training=True)) * wm, tf.zeros([tf.shape(wm)[0]])
    ref, _ = clipped_sum_vectorized(mb, (x, y, tf.ones([8])), model.trainable_variables, clip,
                                    num_microbatches)
    np.testing.assert_allclose(norms.numpy(), ref.norms.numpy(), rtol=2e-4)
    for a, b in zip(grads, ref.grads):
      np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=2e-4, atol=2e-5)


def _brute_force_clipped_sum(model, loss, x, y, clip):
  """Per-example Python loop: the most direct reference."""
  grads, norms = [], []
  for i in range(x.shape[0]):
    with tf.GradientTape() as tape:
      value = tf.reduce_sum(loss(y[i:i + 1], model(x[i:i + 1], training=True)))
    g = [tf.convert_to_tensor(t).numpy() for t in tape.gradient(value, model.trainable_variables)]
    norms.append(np.sqrt(sum(np.sum(t.astype(np.float64) ** 2) for t in g)))
    grads.append(g)
  factors = np.minimum(1.0, clip / np.array(norms))
  return [sum(f * g[v] for f, g in zip(factors, grads)) for v in range(len(grads[0]))], norms


def test_fast_path_on_transformer_block_with_fallback_layers():
  # The reference is a per-example loop: whole-model vectorized_map of MultiHeadAttention
  # followed by LayerNormalization aborts inside TensorFlow 2.21's oneDNN kernels.
  inputs = keras.Input((6,), dtype="int32")
  h = keras.layers.Embedding(20, 8)(inputs)
  attn = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4)(h, h)  # layer-local fallback
  h = keras.layers.LayerNormalization()(h + attn)
  h = keras.layers.SeparableConv1D(8, 3, padding="same")(h)  # layer-local fallback
  h = keras.layers.DepthwiseConv1D(3, padding="same")(h)  # registered rule
  h = keras.layers.GlobalAveragePooling1D()(h)
  outputs = keras.layers.Dense(3)(keras.layers.Dense(8, activation="gelu")(h))
  model = keras.Model(inputs, outputs)
  x = tf.constant(RNG.integers(0, 20, size=(6, 6)).astype(np.int32))
  y = tf.constant(RNG.integers(0, 3, 6))
  fast, _ = clipped_sum_fast(model, XENT, (x, y, tf.ones([6])), 0.5)
  expected, norms = _brute_force_clipped_sum(model, XENT, x, y, 0.5)
  np.testing.assert_allclose(fast.norms.numpy(), norms, rtol=2e-4)
  for a, b in zip(fast.grads, expected):
    np.testing.assert_allclose(a.numpy(), b, rtol=2e-4, atol=2e-5)


def test_layer_called_twice_is_left_to_the_vectorized_path():
  inputs = keras.Input((4,))
  shared = keras.layers.Dense(4, activation="tanh", name="shared")
  outputs = keras.layers.Dense(1)(shared(shared(inputs)))
  model = keras.Model(inputs, outputs)
  # Its per-example gradient sums both calls; per-call norms cannot give the norm of the sum.
  assert not fast_path_available(model)
  with pytest.raises(ValueError, match="called more than once.*shared"):
    clipped_sum_fast(model, MSE, (_x(6, 4), _x(6, 1), tf.ones([6])), 1.0)


class _TiedTranspose(keras.layers.Layer):
  """Output layer reusing another Dense layer's kernel, transposed (tied weights)."""

  def __init__(self, source, **kwargs):
    super().__init__(**kwargs)
    self.source = source

  def call(self, inputs):
    return tf.matmul(inputs, self.source.kernel, transpose_b=True)


def _tied_model():
  inputs = keras.Input((5,))
  encoder = keras.layers.Dense(3, activation="tanh", name="encoder")
  outputs = _TiedTranspose(encoder, name="decoder")(encoder(inputs))
  return keras.Model(inputs, outputs)


def test_variable_shared_by_two_layers_is_left_to_the_vectorized_path():
  # Adding the two layers' squared norms drops the cross term of the shared kernel's
  # per-example gradient and can under-clip, so the fast path must refuse.
  model = _tied_model()
  x, y = _x(6, 5), _x(6, 5)
  assert not fast_path_available(model)
  with pytest.raises(ValueError, match="shared by several layers.*encoder"):
    clipped_sum_fast(model, MSE, (x, y, tf.ones([6])), 0.1)
  from tf_dpkit.dp_gradients import clipped_sum_for_model
  auto, _ = clipped_sum_for_model(model, MSE, x, y, None, 0.1)
  expected, norms = _brute_force_clipped_sum(model, MSE, x, y, 0.1)
  np.testing.assert_allclose(auto.norms.numpy(), norms, rtol=2e-4)
  for a, b in zip(auto.grads, expected):
    np.testing.assert_allclose(a.numpy(), b, rtol=2e-4, atol=2e-6)


class _TwoDenseSharingAKernel(keras.layers.Layer):
  def __init__(self, **kwargs):
    super().__init__(**kwargs)
    self.first = keras.layers.Dense(4, use_bias=False, name="first")
    self.second = keras.layers.Dense(4, use_bias=False, name="second")

  def build(self, input_shape):
    self.first.build(input_shape)
    self.second.build(input_shape)
    # pylint: disable=protected-access
    self.second._tracker.unlock()
    self.second._trainable_variables.clear()
    self.second._kernel = self.first._kernel
    self.second._tracker.lock()

  def call(self, inputs):
    return self.second(tf.tanh(self.first(inputs)))


def test_sublayers_sharing_a_variable_inside_one_layer_are_replayed_exactly():
  # Per-use rules would add the two uses' squared norms and drop the cross term (under-clip);
  # the layer is instead replayed whole per example, which gives the exact per-example gradient.
  from tf_dpkit.clipping.testing import removal_sensitivity
  inputs = keras.Input((4,))
  model = keras.Model(inputs, keras.layers.Dense(1)(_TwoDenseSharingAKernel(name="pair")(inputs)))
  assert model.layers[1].second.kernel is model.layers[1].first.kernel
  x, y = _x(6, 4) * 3.0, _x(6, 1)
  cs, _ = clipped_sum_fast(model, MSE, (x, y, tf.ones([6])), 1e6)
  expected = None
  for i in range(6):
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(MSE(y[i:i + 1], model(x[i:i + 1])))
    grads = tape.gradient(loss, model.trainable_variables)
    expected = grads if expected is None else [a + b for a, b in zip(expected, grads)]
  for got, want in zip(cs.grads, expected):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
  sensitivity = removal_sensitivity(lambda keep: clipped_sum_fast(
      model, MSE, (tf.gather(x, keep), tf.gather(y, keep), None), 0.1)[0].grads, 6)
  assert 0.05 < sensitivity <= 0.1 * (1 + 1e-5)


@pytest.mark.parametrize("method", ["fast", "vectorized"])
def test_sample_weight_column_equals_vector_and_other_shapes_are_refused(method):
  from tf_dpkit.dp_gradients import clipped_sum_for_model
  model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
  x, y = _x(5, 3), _x(5, 2)
  w = tf.constant([0.5, 1.0, 0.0, 2.0, 1.5])
  vector, _ = clipped_sum_for_model(model, MSE, x, y, w, 0.7, method=method)
  column, _ = clipped_sum_for_model(model, MSE, x, y, w[:, None], 0.7, method=method)
  np.testing.assert_allclose(column.losses.numpy(), vector.losses.numpy(), rtol=1e-6)
  for a, b in zip(column.grads, vector.grads):
    np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6)
  np.testing.assert_allclose(vector.losses.numpy(), w.numpy() * MSE(y, model(x)).numpy(),
                             rtol=1e-5)
  with pytest.raises(ValueError, match=r"sample_weight must have shape \[batch\] or \[batch, 1\]"):
    clipped_sum_for_model(model, MSE, x, y, tf.ones([5, 2]), 0.7, method=method)


@pytest.mark.parametrize("method", ["fast", "vectorized"])
def test_scalar_loss_is_refused_with_the_fix(method):
  from tf_dpkit.dp_gradients import clipped_sum_for_model
  model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
  scalar_mse = lambda y, p: tf.reduce_mean(tf.square(p - y))
  with pytest.raises(ValueError, match="returned a scalar.*one loss per example"):
    clipped_sum_for_model(model, scalar_mse, _x(4, 3), _x(4, 2), None, 1.0, method=method)


@pytest.mark.parametrize("under_strategy, keeps_freed_memory, expect_op", [
    (False, False, True), (True, False, False), (True, True, True)])
def test_first_conv_filter_backprop_op_under_a_strategy_only_where_freed_memory_is_kept(
    under_strategy, keeps_freed_memory, expect_op, monkeypatch, caplog):
  # Under a strategy the depthwise filter-gradient op's per-step scratch is returned to the
  # system each step (twice the op's time), so there the first conv uses it only when the
  # process keeps freed memory (started with MALLOC_TOP_PAD_: host_keeps_freed_memory), else
  # it unfolds.
  # Either way the norms are the brute-force ones and removing one example moves the clipped
  # sum by at most C (and by more than C/2: clipping binds).
  from tf_dpkit.clipping.rules import conv as conv_rule
  from tf_dpkit.clipping.testing import removal_sensitivity
  use_conv_path("onednn", monkeypatch)
  monkeypatch.setattr(conv_rule, "_FILTER_BACKPROP_CHUNK", 128)
  monkeypatch.setattr(conv_rule.distribute, "host_keeps_freed_memory", lambda: keeps_freed_memory)
  monkeypatch.setattr(conv_rule.distribute, "_fallback_reported", False)
  strategy = (tf.distribute.OneDeviceStrategy("/cpu:0") if under_strategy
              else tf.distribute.get_strategy())
  with strategy.scope():
    model = keras.Sequential([keras.Input((12, 12, 1)), keras.layers.Conv2D(4, 5, strides=2),
                              keras.layers.Flatten(), keras.layers.Dense(3)])
  x = tf.constant(RNG.random((8, 12, 12, 1)).astype(np.float32))
  y = tf.constant(RNG.integers(0, 3, 8))

  @tf.function
  def fast(x, y):
    result, _ = clipped_sum_fast(model, XENT, (x, y, tf.ones_like(y, tf.float32)), 0.5, None)
    return result.norms, result.grads

  graphs = []

  def clipped_sum(keep):
    xs, ys = tf.gather(x, keep), tf.gather(y, keep)
    with strategy.scope():  # traced where it runs: in the strategy's scope, or without one
      concrete = fast.get_concrete_function(xs, ys)
      graphs.append(concrete.graph)
      return concrete(xs, ys)

  norms, _ = clipped_sum(np.arange(8))
  assert tf.distribute.has_strategy() is False
  _, expected_norms = _brute_force_clipped_sum(model, XENT, x, y, 0.5)
  np.testing.assert_allclose(np.asarray(norms), expected_norms, rtol=2e-4)
  assert np.min(expected_norms) > 0.5  # every example is clipped
  sensitivity = removal_sensitivity(lambda keep: clipped_sum(keep)[1], 8)
  assert 0.25 < sensitivity <= 0.5 * (1 + 1e-5)
  for graph in graphs:
    uses_op = "DepthwiseConv2dNativeBackpropFilter" in {op.type for op in graph.get_operations()}
    assert uses_op is expect_op
  # The slower path under a strategy is reported once per process (9 traces here), with the fix.
  reports = [r for r in caplog.records if r.name == "tf_dpkit" and "slower path" in r.message]
  assert len(reports) == (0 if expect_op else 1)
  assert all("Call tf_dpkit.distribute.keep_freed_host_memory() at the top of the script" in
             r.getMessage() and "MALLOC_TOP_PAD_=67108864" in r.getMessage() for r in reports)


@pytest.mark.parametrize("accelerator", [False, True])
def test_conv_rule_takes_the_compiled_kernel_on_a_cpu_only(accelerator, monkeypatch):
  # float32 work with a static image size on this CPU: the compiled norms and no unfolding or
  # filter-gradient chunks; where a GPU could take the ops: TensorFlow ops only.
  from tf_dpkit import native
  if native.kernels("conv") is None:
    pytest.skip(f"compiled CPU kernels unavailable here: {native.status('conv')}")
  monkeypatch.setattr(native, "_accelerators_visible", lambda: accelerator)
  layer = _built(keras.layers.Conv2D(16, 8, strides=2, padding="same"), _x(2, 28, 28, 1))

  @tf.function(input_signature=[tf.TensorSpec([4, 28, 28, 1]), tf.TensorSpec([4, 14, 14, 16]),
                                tf.TensorSpec([4])])
  def step(x, g, factors):
    trace = lookup_rule(layer)(layer, x)
    return trace.squared_norms(g, 4), trace.clipped_sum(factors)

  used = {op.type for op in step.get_concrete_function().graph.get_operations()}
  assert ("DpkitConvKernelGradSquaredNorms" in used) is not accelerator
  # The TensorFlow-op ways: filter-gradient chunks (oneDNN) or unfolded patches + matmul.
  assert bool({"DepthwiseConv2dNativeBackpropFilter", "BatchMatMulV2"} & used) is accelerator


@pytest.mark.parametrize("filters, strides, kernel, padding, keeps",
                         [(4, 1, 3, "same", True), (16, 1, 3, "same", True),
                          (32, 2, 3, "same", False), (16, 1, 5, "valid", False)])
@pytest.mark.parametrize("num_microbatches", [None, 4])
def test_compiled_conv_clipped_sum_moves_at_most_c(filters, strides, kernel, padding, keeps,
                                                   num_microbatches):
  # Conv2D on 8x8x8 inputs.  The per-microbatch kernel gradients are kept where they are no
  # larger than the layer's input plus output gradient per example, which the VJP would keep
  # instead: 3x3 with 4 filters (72 x 4 <= 512 + 256) and with 16 (72 x 16 = 1152 <= 512 + 1024).
  # Elsewhere the clipped sum is the fast path's VJP (a filter gradient of factor-scaled output
  # gradients): 3x3 with 32 filters and stride 2 (2304 > 512 + 512), and 5x5 "valid" with 16
  # filters (3200 > 512 + 256) although there the explicit form is the cheaper way to the
  # norms.  Each equals the brute force, and removing any one example moves the clipped sum by
  # at most C (by more than C/2: clipping binds).
  from tf_dpkit import native
  if native.kernels("conv") is None:
    pytest.skip(f"compiled CPU kernels unavailable here: {native.status('conv')}")
  model = keras.Sequential([keras.Input((8, 8, 8)),
                            keras.layers.Conv2D(filters, kernel, strides=strides,
                                                padding=padding, activation="tanh"),
                            keras.layers.Flatten(), keras.layers.Dense(3)])
  x = tf.constant(RNG.normal(size=(8, 8, 8, 8)).astype(np.float32))
  y = tf.constant(RNG.integers(0, 3, 8))

  @tf.function(input_signature=[tf.TensorSpec([None, 8, 8, 8]), tf.TensorSpec([None], tf.int64)])
  def fast(x, y):
    result, _ = clipped_sum_fast(model, XENT, (x, y, tf.ones_like(y, tf.float32)), 0.5,
                                 num_microbatches)
    return result.norms, result.grads

  # Which way the rule takes (traced alone: the fast path's tape adds unused gradient ops).
  conv_layer = model.layers[0]

  out = 8 // strides if padding == "same" else 8 - kernel + 1

  @tf.function(input_signature=[tf.TensorSpec([8, 8, 8, 8]),
                                tf.TensorSpec([8, out, out, filters]), tf.TensorSpec([8])])
  def rule_alone(x, g, factors):
    with tf.GradientTape() as tape:
      trace = lookup_rule(conv_layer)(conv_layer, x)
    norms, sums = trace.squared_norms(g, 8), trace.clipped_sum(factors)
    if sums is None:  # as the fast path: the layer's VJP with factor-scaled output gradients
      sums = tape.gradient(trace.watched, conv_layer.trainable_variables,
                           output_gradients=g * factors[:, None, None, None])
    return norms, sums

  used = {op.type for op in rule_alone.get_concrete_function().graph.get_operations()}
  assert "DpkitConvKernelGradSquaredNorms" in used
  assert ("Conv2DBackpropFilter" in used) is not keeps
  _check_fast_clipped_sum(model, fast, x, y, num_microbatches)
