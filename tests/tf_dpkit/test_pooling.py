"""The compiled max-pooling gradient (tf_dpkit.native "pool") and the fast path's use of it
(tf_dpkit.clipping.pooling).

References: a brute force written here (``np.argmax`` of each flattened window: the first
maximum in row-major order) for finite inputs; TensorFlow's own CPU ``MaxPoolGrad`` with oneDNN
off (ties, inf and NaN included, bit for bit); the fast path's clipped sum with the layer's own
call, and TensorFlow-autodiff per-example gradients clipped and summed by brute force.
"""
import numpy as np
import pytest
import keras
import tensorflow as tf

from tf_dpkit import native
from tf_dpkit.clipping import clipped_sum_fast, pooling
from tf_dpkit.clipping.rules.conv import onednn_enabled, same_or_valid_pads

OPS = native.kernels("pool")
needs_kernels = pytest.mark.skipif(
    OPS is None, reason=f"compiled kernels unavailable here: {native.status('pool')}")
RNG = np.random.default_rng(7)
XENT = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)

# (x shape, pool size, strides, padding)
CASES = [((3, 14, 14, 16), (2, 2), (1, 1), "VALID"), ((2, 9, 8, 5), (3, 3), (2, 2), "SAME"),
         ((2, 7, 7, 3), (2, 2), (2, 2), "SAME"), ((2, 6, 9, 4), (2, 3), (1, 2), "VALID"),
         ((1, 5, 5, 33), (5, 5), (1, 1), "SAME"), ((4, 4, 4, 1), (4, 4), (4, 4), "VALID")]


def argmax_brute_force(x, g, pool_size, strides, padding):
  """dx of a max pooling: each window's output gradient to ``np.argmax`` of the flattened
  window (its first maximum in row-major order); finite x only."""
  (kh, kw), (sh, sw) = pool_size, strides
  _, height, width, _ = x.shape
  if padding == "SAME":
    out_h, out_w = -(-height // sh), -(-width // sw)
    top = max((out_h - 1) * sh + kh - height, 0) // 2
    left = max((out_w - 1) * sw + kw - width, 0) // 2
  else:
    out_h, out_w, top, left = (height - kh) // sh + 1, (width - kw) // sw + 1, 0, 0
  assert g.shape[1:3] == (out_h, out_w)
  dx = np.zeros(x.shape)
  for b, oy, ox, c in np.ndindex(g.shape):
    rows = range(max(oy * sh - top, 0), min(oy * sh - top + kh, height))
    cols = range(max(ox * sw - left, 0), min(ox * sw - left + kw, width))
    window = np.array([[x[b, i, j, c] for j in cols] for i in rows])
    i, j = np.unravel_index(np.argmax(window), window.shape)
    dx[b, rows[i], cols[j], c] += g[b, oy, ox, c]
  return dx


def _pool_grad(x, pool_size, strides, padding, g):
  pads = same_or_valid_pads(x.shape[1:3], pool_size, strides, [1, 1], padding)
  return OPS.dpkit_max_pool_grad(x, g, ksize=pool_size, strides=strides, pads=list(pads))


def _ties(shape):
  """Values from three levels: most windows hold tied maxima."""
  return RNG.integers(0, 3, size=shape).astype(np.float32)


@needs_kernels
@pytest.mark.parametrize("shape, pool_size, strides, padding", CASES)
def test_kernel_equals_the_first_row_major_maximum_with_ties(shape, pool_size, strides, padding):
  x = _ties(shape)
  out = tf.nn.max_pool2d(x, pool_size, strides, padding)
  g = RNG.normal(size=out.shape).astype(np.float32)
  got = _pool_grad(tf.constant(x), pool_size, strides, padding, g).numpy()
  want = argmax_brute_force(x, g, pool_size, strides, padding)
  # float32 sums of at most kh kw output gradients per entry
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
  assert np.count_nonzero(got) <= out.shape.num_elements()


@needs_kernels
@pytest.mark.skipif(onednn_enabled(), reason="TensorFlow's MaxPoolGrad is oneDNN's here")
@pytest.mark.parametrize("shape, pool_size, strides, padding", CASES)
@pytest.mark.parametrize("values", ["ties", "inf_and_nan"])
def test_kernel_equals_tensorflows_cpu_max_pool_grad_bit_for_bit(shape, pool_size, strides,
                                                                  padding, values):
  x = _ties(shape)
  if values == "inf_and_nan":
    flat = x.reshape(-1)
    picks = RNG.choice(flat.size, size=max(3, flat.size // 10), replace=False)
    flat[picks] = RNG.choice([np.inf, -np.inf, np.nan], size=picks.size)
  x = tf.constant(x)
  out = tf.nn.max_pool2d(x, pool_size, strides, padding)
  g = tf.constant(RNG.normal(size=out.shape).astype(np.float32))
  want = tf.raw_ops.MaxPoolGrad(orig_input=x, orig_output=out, grad=g,
                                ksize=[1, *pool_size, 1], strides=[1, *strides, 1],
                                padding=padding)
  np.testing.assert_array_equal(_pool_grad(x, pool_size, strides, padding, g).numpy(),
                                want.numpy())


@needs_kernels
@pytest.mark.parametrize("shape, pool_size, strides, padding", CASES[:3])
def test_max_pool_2d_is_tensorflows_pooling_with_the_kernels_gradient(shape, pool_size, strides,
                                                                      padding):
  x = tf.constant(RNG.normal(size=shape).astype(np.float32))
  with tf.GradientTape(persistent=True) as tape:
    tape.watch(x)
    ours = pooling.max_pool_2d(x, pool_size, strides, padding, OPS)
    loss = tf.reduce_sum(tf.sin(ours))
  np.testing.assert_array_equal(ours.numpy(),
                                tf.nn.max_pool2d(x, pool_size, strides, padding).numpy())
  g = tf.cos(ours).numpy()
  np.testing.assert_allclose(tape.gradient(loss, x).numpy(),
                             argmax_brute_force(x.numpy(), g, pool_size, strides, padding),
                             rtol=1e-6, atol=1e-6)


@needs_kernels
@pytest.mark.parametrize("x_shape, g_shape, attrs, message", [
    ([2, 5, 5], [2, 4, 4, 1], {}, "x and g must be rank 4"),
    ([2, 5, 5, 3], [3, 4, 4, 3], {}, "g must have x's batch and channels"),
    ([2, 5, 5, 3], [2, 4, 4, 2], {}, "g must have x's batch and channels"),
    ([2, 5, 5, 3], [2, 7, 4, 3], {}, "has windows outside x"),
    ([2, 5, 5, 3], [2, 4, 4, 3], {"ksize": [2]}, "ksize must have 2 entries"),
    ([2, 5, 5, 3], [2, 4, 4, 3], {"strides": [0, 1]}, "must be positive"),
    ([2, 5, 5, 3], [2, 4, 4, 3], {"pads": [-1, 0]}, "pads non-negative"),
    ([2, 5, 5, 3], [2, 4, 4, 3], {"pads": [2, 0]}, "has windows outside x"),
    # windows over an image without rows (or columns) must not read or write anything
    ([1, 0, 1, 1], [1, 1, 1, 1], {"ksize": [2, 1], "pads": [1, 0]}, "has windows outside x"),
    ([1, 1, 0, 1], [1, 1, 1, 1], {"ksize": [1, 2], "pads": [0, 1]}, "has windows outside x"),
])
def test_kernel_refuses_bad_arguments(x_shape, g_shape, attrs, message):
  attrs = {"ksize": [2, 2], "strides": [1, 1], "pads": [0, 0], **attrs}
  with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match=message):
    OPS.dpkit_max_pool_grad(np.zeros(x_shape, np.float32), np.zeros(g_shape, np.float32),
                            **attrs)


@needs_kernels
@pytest.mark.parametrize("x_shape, g_shape", [([2, 5, 5, 3], [2, 0, 4, 3]),
                                              ([0, 5, 5, 3], [0, 4, 4, 3]),
                                              ([2, 5, 5, 0], [2, 4, 4, 0])])
def test_kernel_without_windows_returns_zeros(x_shape, g_shape):
  dx = OPS.dpkit_max_pool_grad(np.ones(x_shape, np.float32), np.ones(g_shape, np.float32),
                               ksize=[2, 2], strides=[1, 1], pads=[0, 0])
  np.testing.assert_array_equal(dx.numpy(), np.zeros(x_shape, np.float32))


def _cnn(first_kernel="glorot_uniform"):
  model = keras.Sequential([
      keras.Input((12, 12, 2)),
      keras.layers.Conv2D(4, 3, activation="tanh", kernel_initializer=first_kernel),
      keras.layers.MaxPooling2D(2, 1), keras.layers.Conv2D(6, 3, strides=2, activation="tanh"),
      keras.layers.MaxPooling2D(2, 2, padding="same"), keras.layers.Flatten(),
      keras.layers.Dense(3)])
  model.build((None, 12, 12, 2))
  return model


class _SubclassedPool(keras.layers.MaxPooling2D):
  pass


@needs_kernels
def test_fast_call_takes_exactly_float32_channels_last_max_pooling_without_onednn(monkeypatch):
  x = tf.zeros([2, 6, 6, 3])
  layer = keras.layers.MaxPooling2D(2, 1)
  monkeypatch.setattr(pooling, "onednn_enabled", lambda: False)
  assert pooling.fast_call(layer, x) is not None
  assert pooling.fast_call(_SubclassedPool(2, 1), x) is None  # may override call
  assert pooling.fast_call(keras.layers.MaxPooling2D(2, 1, data_format="channels_first"),
                           x) is None
  assert pooling.fast_call(keras.layers.AveragePooling2D(2, 1), x) is None
  assert pooling.fast_call(keras.layers.MaxPooling2D(2, 1, dtype="mixed_float16"), x) is None
  assert pooling.fast_call(layer, tf.zeros([2, 6, 6, 3], tf.float64)) is None
  assert pooling.fast_call(layer, tf.zeros([2, 6, 6])) is None
  monkeypatch.setattr(native, "kernels_for", lambda family, device, dtype: None)
  assert pooling.fast_call(layer, x) is None
  monkeypatch.undo()
  monkeypatch.setattr(pooling, "onednn_enabled", lambda: True)  # oneDNN's gradient is faster
  assert pooling.fast_call(layer, x) is None


def _counting_fast_call(monkeypatch):
  """Replaces pooling.fast_call by a wrapper; returns the list of (MaxPooling2D call used the
  kernel) flags it appends to."""
  calls = []
  fast_call = pooling.fast_call

  def counted(layer, inputs):
    outputs = fast_call(layer, inputs)
    if isinstance(layer, keras.layers.MaxPooling2D):
      calls.append(outputs is not None)
    return outputs
  monkeypatch.setattr(pooling, "fast_call", counted)
  return calls


@needs_kernels
@pytest.mark.parametrize("in_function", [False, True])
def test_fast_path_clipped_sum_is_unchanged_by_the_kernel(in_function, monkeypatch):
  # With the kernel and with the layer's own call: the same norms and sums (bit for bit where
  # TensorFlow's gradient is its CPU kernel, i.e. with oneDNN off), eagerly and in a
  # tf.function, and the kernel really ran.  Integer-valued inputs and an all-ones first kernel
  # make tied maxima in the first pooling's windows.
  monkeypatch.setattr(pooling, "onednn_enabled", lambda: False)
  model = _cnn(first_kernel="ones")
  x = tf.constant(_ties((8, 12, 12, 2)) - 1.0)
  y = tf.constant(RNG.integers(0, 3, 8))
  first = model.layers[0](x)
  windows = tf.image.extract_patches(first, [1, 2, 2, 1], [1, 1, 1, 1], [1, 1, 1, 1], "VALID")
  windows = tf.reshape(windows, [-1, 4, first.shape[-1]])
  tied = tf.reduce_sum(tf.cast(windows == tf.reduce_max(windows, axis=1, keepdims=True),
                               tf.int32), axis=1) > 1
  assert tf.reduce_mean(tf.cast(tied, tf.float32)) > 0.1  # many windows hold ties

  def clipped():
    result = clipped_sum_fast(model, XENT, (x, y, tf.ones([8])), 0.5)[0]
    return [result.norms, *result.grads]
  run = tf.function(clipped) if in_function else clipped
  calls = _counting_fast_call(monkeypatch)
  with_kernel = run()
  assert calls == [True, True]
  monkeypatch.setattr(pooling, "fast_call", lambda layer, inputs: None)
  run = tf.function(clipped) if in_function else clipped
  without = run()
  for a, b in zip(with_kernel, without):
    if onednn_enabled():  # TensorFlow's gradient is oneDNN's: the same up to rounding
      np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-7)
    else:
      np.testing.assert_array_equal(a.numpy(), b.numpy())


@needs_kernels
def test_fast_path_with_the_kernel_equals_brute_force_and_moves_at_most_c(monkeypatch):
  # Sum of per-example gradients (TensorFlow autodiff of the Keras model, one example at a time)
  # clipped to C; then every leave-one-out batch moves the clipped sum by at most C.
  monkeypatch.setattr(pooling, "onednn_enabled", lambda: False)
  calls = _counting_fast_call(monkeypatch)
  model = _cnn()
  clip = 0.05
  x = tf.constant(RNG.normal(size=(6, 12, 12, 2)).astype(np.float32))
  y = tf.constant(RNG.integers(0, 3, 6))
  full = clipped_sum_fast(model, XENT, (x, y, tf.ones([6])), clip)[0]
  assert calls == [True, True]
  expected = [np.zeros(v.shape) for v in model.trainable_variables]
  for i in range(6):
    with tf.GradientTape() as tape:
      loss = XENT(y[i:i + 1], model(x[i:i + 1], training=True))[0]
    grads = [g.numpy().astype(np.float64) for g in tape.gradient(loss, model.trainable_variables)]
    norm = np.sqrt(sum(np.sum(g**2) for g in grads))
    assert norm > clip  # the clip binds for every example
    for e, g in zip(expected, grads):
      e += g * min(1.0, clip / norm)
  for got, want in zip(full.grads, expected):
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-7)
  for i in range(6):
    keep = [j for j in range(6) if j != i]
    part = clipped_sum_fast(model, XENT, (tf.gather(x, keep), tf.gather(y, keep),
                                          tf.ones([5])), clip)[0]
    moved = np.sqrt(sum(np.sum((a.numpy().astype(np.float64) - b.numpy())**2)
                        for a, b in zip(full.grads, part.grads)))
    assert moved <= clip * (1 + 1e-5)
