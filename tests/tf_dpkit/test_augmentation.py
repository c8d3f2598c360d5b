"""Augmentation multiplicity (tf_dpkit.augmentation): each example's K augmented copies enter the
clipped sum as ONE term, clip_C(mean_k grad L(f(a_k(x_i)), y_i)).

References are independent of the code under test: per-example, per-copy GradientTape loops in
NumPy (brute force), the triangle inequality bound C for one removed example, the closed form
K*C of the wrong per-row rule (positive control), and the Gaussian noise std sigma*C/n.
"""
import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_dpkit
from tf_dpkit.augmentation import AugmentationMultiplicity, check_augmentation
from tf_dpkit.clipping import clipped_sum_fast, clipped_sum_vectorized
from tf_dpkit.dp_gradients import clipped_sum_for_model

K = 3
CLIP = 0.4
XENT = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)


def _jitter(example, seed):
  """Data-independent random scale and shift of one example (stateless, keyed by seed)."""
  u = tf.random.stateless_uniform(tf.shape(example), seed=seed, minval=-1.0, maxval=1.0)
  return example * (1.0 + 0.5 * u) + 0.3 * u


def _model(seed=0, width=5, inputs=4, classes=3):
  keras.utils.set_random_seed(seed)
  x = keras.Input((inputs,))
  h = keras.layers.Dense(width, activation="tanh")(x)
  return keras.Model(x, keras.layers.Dense(classes)(h))


def _flat(grads):
  return np.concatenate([np.reshape(np.asarray(g, np.float64), [-1]) for g in grads])


def _mlp_gradient(weights, x, y, w):
  """Closed-form gradient of w * xent(softmax(tanh(x W1 + b1) W2 + b2), y) for ONE row (NumPy,
  float64): the hand-derived backward pass of the two-layer model of :func:`_model`."""
  w1, b1, w2, b2 = [np.asarray(v, np.float64) for v in weights]
  h = np.tanh(x @ w1 + b1)
  z = h @ w2 + b2
  p = np.exp(z - z.max())
  p /= p.sum()
  dz = w * (p - np.eye(len(p))[y])
  da = (w2 @ dz) * (1.0 - h * h)
  return np.concatenate([np.outer(x, da).ravel(), da, np.outer(h, dz).ravel(), dz])


def _reference(model, x_rows, y_rows, w_rows, k, clip):
  """sum_i clip_C(mean_k grad(w_i * loss(f(row_ik), y_i))), one closed-form gradient per row."""
  weights = [v.numpy() for v in model.trainable_variables]
  x_rows, y_rows, w_rows = (np.asarray(x_rows, np.float64), np.asarray(y_rows),
                            np.asarray(w_rows, np.float64))
  total, norms = 0.0, []
  for i in range(len(x_rows) // k):
    mean = np.mean([_mlp_gradient(weights, x_rows[r], y_rows[r], w_rows[r])
                    for r in range(i * k, (i + 1) * k)], axis=0)
    norm = np.linalg.norm(mean)
    norms.append(norm)
    total = total + mean * min(1.0, clip / norm)
  return total, np.array(norms)


def _batch(rng, size, inputs=4, classes=3):
  return (rng.normal(size=(size, inputs)).astype(np.float32),
          rng.integers(0, classes, size).astype(np.int64),
          rng.uniform(0.5, 2.0, size).astype(np.float32))


@pytest.mark.parametrize("method", ["fast", "vectorized"])
def test_clipped_sum_equals_brute_force_for_variable_batch_sizes(method):
  model = _model()
  clip = 2.0  # between the examples' norms (about 1 to 3.6): both regimes occur
  augmentation = AugmentationMultiplicity(_jitter, K, seed=11)
  signature = [tf.TensorSpec([None, 4]), tf.TensorSpec([None], tf.int64),
               tf.TensorSpec([None])]

  @tf.function(input_signature=signature)
  def clipped(x_rows, y_rows, w_rows):  # a batch size known only when the step runs
    result, _ = clipped_sum_for_model(model, XENT, x_rows, y_rows, w_rows, clip, None, method,
                                      microbatch_size=K)
    return result.grads, result.norms

  rng = np.random.default_rng(3)
  clipped_some = 0
  for size in (1, 4, 7):  # Poisson-like batch sizes
    x, y, w = _batch(rng, size)
    rows = augmentation.augmented_rows(x, y, w, tf.constant([size, 1], tf.int64))
    grads, norms = clipped(*rows)
    expected, expected_norms = _reference(model, *rows, K, clip)
    np.testing.assert_allclose(_flat(grads), expected, atol=1e-5)
    np.testing.assert_allclose(norms.numpy(), expected_norms, rtol=1e-5)
    assert norms.shape == (size,)  # one norm per EXAMPLE, not per row
    clipped_some += int(np.sum(expected_norms > clip))
  assert 0 < clipped_some < 12  # both regimes (clipped and not) were exercised


def test_augmented_rows_are_grouped_per_example_and_data_independent():
  seen_shapes = []

  def recording(example, seed):
    seen_shapes.append(tuple(example.shape))
    return _jitter(example, seed)

  augmentation = AugmentationMultiplicity(recording, K, seed=4)
  rng = np.random.default_rng(0)
  x, y, w = _batch(rng, 5)
  seed = tf.constant([7, 9], tf.int64)
  x_rows, y_rows, w_rows = augmentation.augmented_rows(x, y, w, seed)
  assert all(shape == (4,) for shape in seen_shapes)  # one example at a time, no batch axis
  np.testing.assert_array_equal(y_rows.numpy(), np.repeat(y, K))
  np.testing.assert_array_equal(w_rows.numpy(), np.repeat(w, K))
  # The randomness u_r of row r does not depend on the data: solve x_r = x (1 + u/2) + 0.3 u.
  u = (x_rows.numpy() - np.repeat(x, K, axis=0)) / (0.5 * np.repeat(x, K, axis=0) + 0.3)
  other = rng.normal(size=x.shape).astype(np.float32)
  other_rows = augmentation.augmented_rows(other, y, w, seed)[0].numpy()
  u_other = (other_rows - np.repeat(other, K, axis=0)) / (0.5 * np.repeat(other, K, axis=0) + 0.3)
  np.testing.assert_allclose(u, u_other, atol=2e-4)
  assert np.all(np.abs(u) <= 1.0 + 1e-4)
  assert len({tuple(np.round(row, 5)) for row in u}) == len(u)  # every copy its own draw
  # Equal seeds give equal rows; fresh step seeds (the counter advances) give new ones.
  np.testing.assert_array_equal(augmentation.augmented_rows(x, y, w, seed)[0], x_rows)
  first = augmentation.augment_batch(x, y, w, step=0)[0]
  second = augmentation.augment_batch(x, y, w, step=0)[0]
  assert not np.allclose(first, second)


def _summer(model, method, microbatch_size):
  """The clipped sum as a function of the rows, traced once for any number of rows."""

  @tf.function(input_signature=[tf.TensorSpec([None, 4]), tf.TensorSpec([None], tf.int64)])
  def clipped(x_rows, y_rows):
    result, _ = clipped_sum_for_model(model, XENT, x_rows, y_rows, None, CLIP, None, method,
                                      microbatch_size=microbatch_size)
    return result.grads
  return lambda x_rows, y_rows: _flat(clipped(x_rows, y_rows))


@pytest.mark.parametrize("method", ["fast", "vectorized"])
def test_removing_one_example_moves_the_sum_by_at_most_c(method):
  rng = np.random.default_rng(5)
  worst = 0.0
  for trial in range(2):
    model = _model(seed=trial, width=4 + trial)
    size = 3 + trial
    x, y, _ = _batch(rng, size)
    x_rows = np.repeat(x, K, axis=0) * rng.uniform(0.5, 1.5, (size * K, 1)).astype(np.float32)
    # Example 0: huge copies of opposite sign (their gradients point apart); example 1: huge
    # identical copies (same direction, the worst case for per-row clipping).
    x_rows[0:K] = 1e4 * np.array([[1, -2, 3, 1], [-1, 2, -3, -1], [2, 1, 0, -5]])[:K]
    x_rows[K:2 * K] = 1e4 * x[1]
    y_rows = np.repeat(y, K)
    clipped_sum = _summer(model, method, K)
    full = clipped_sum(x_rows, y_rows)
    for removed in range(size):
      keep = np.array([r // K != removed for r in range(size * K)])
      moved = np.linalg.norm(full - clipped_sum(x_rows[keep], y_rows[keep]))
      worst = max(worst, moved)
      assert moved <= CLIP + 1e-5, (trial, removed, moved)
  assert worst > 0.9 * CLIP  # the bound is attained (a huge example is clipped to C)


@pytest.mark.parametrize("method", ["fast", pytest.param("vectorized", marks=pytest.mark.slow)])
def test_positive_control_per_row_clipping_moves_the_sum_by_k_c(method):
  """The WRONG rule (each augmented row its own unit) lets one example move the sum by K*C, so
  the bound asserted above can fail."""
  model = _model(seed=1)
  rng = np.random.default_rng(2)
  x, y, _ = _batch(rng, 3)
  x_rows, y_rows = np.repeat(x, K, axis=0), np.repeat(y, K)
  x_rows[0:K] = 1e4 * x[0]  # K identical huge copies: each row's gradient clipped to C
  keep = np.arange(3 * K) >= K
  per_row, per_example = _summer(model, method, None), _summer(model, method, K)
  per_row = np.linalg.norm(per_row(x_rows, y_rows) - per_row(x_rows[keep], y_rows[keep]))
  per_example = np.linalg.norm(per_example(x_rows, y_rows)
                               - per_example(x_rows[keep], y_rows[keep]))
  np.testing.assert_allclose(per_row, K * CLIP, rtol=1e-4)
  np.testing.assert_allclose(per_example, CLIP, rtol=1e-4)


def _variable_batches(sizes, seed=0, inputs=4, classes=3):
  rng = np.random.default_rng(seed)
  batches = [_batch(rng, s, inputs, classes)[:2] for s in sizes]
  signature = (tf.TensorSpec([None, inputs]), tf.TensorSpec([None], tf.int64))
  return tf.data.Dataset.from_generator(lambda: iter(batches), output_signature=signature)


def _dp_model(seed=0):
  keras.utils.set_random_seed(seed)
  return tf_dpkit.DPSequential([keras.Input((4,)), keras.layers.Dense(5, activation="tanh"),
                                keras.layers.Dense(3)])


# The fit-level tests run the vectorized path under `-m slow` (the clipping tests above cover
# both paths in the default suite; fit passes `per_example_method` through unchanged).
FIT_METHODS = ["fast", pytest.param("vectorized", marks=pytest.mark.slow)]


@pytest.mark.parametrize("method", FIT_METHODS)
def test_multiplicity_one_trains_bit_for_bit_as_without_it(method):
  weights = []
  for augmentation in (None, AugmentationMultiplicity(lambda example, seed: example, 1)):
    model = _dp_model()
    model.per_example_method = method
    optimizer = tf_dpkit.DPGradientDescentGaussianOptimizer(
        l2_norm_clip=CLIP, noise_multiplier=1.3, learning_rate=0.5, seed=17,
        expected_batch_size=4.0)
    model.compile(optimizer=optimizer, loss=XENT, augmentation=augmentation)
    model.fit(_variable_batches([3, 6, 2]), epochs=1, verbose=0)
    weights.append([w.numpy() for w in model.trainable_variables])
  assert not np.allclose(weights[0][0], _dp_model().trainable_variables[0].numpy())  # trained
  for a, b in zip(*weights):
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("method", FIT_METHODS)
def test_fit_step_is_minus_brute_force_sum_over_expected_examples(method):
  """One noiseless SGD step of fit with K copies: delta = -S / n, with S the brute-force sum of
  the examples' clipped mean gradients over the rows fit drew, n the expected EXAMPLES."""
  expected_batch = 4.0
  model = _dp_model(seed=2)
  model.per_example_method = method
  before = [w.numpy() for w in model.trainable_variables]
  model.compile(optimizer=tf_dpkit.DPGradientDescentGaussianOptimizer(
      l2_norm_clip=CLIP, noise_multiplier=0.0, learning_rate=1.0,
      expected_batch_size=expected_batch),
                loss=XENT, augmentation=AugmentationMultiplicity(_jitter, K, seed=23))
  data = _variable_batches([6], seed=4)
  history = model.fit(data, epochs=1, verbose=0)
  # A twin with the same seed draws the same rows for step 0 (fresh draw counter).
  twin = AugmentationMultiplicity(_jitter, K, seed=23)
  x, y = next(iter(data))
  rows = twin.augmented_rows(x, y, tf.ones([6]), twin.step_seed(0))
  reference_model = _dp_model(seed=2)
  total, norms = _reference(reference_model, *rows, K, CLIP)
  assert np.any(norms > CLIP)
  delta = _flat([w.numpy() for w in model.trainable_variables]) - _flat(before)
  np.testing.assert_allclose(delta, -total / expected_batch, atol=1e-5)
  assert np.isfinite(history.history["loss"][0])


def test_gradient_accumulation_with_multiplicity_is_brute_force_over_the_logical_batch():
  """fit with k = 2 micro-batches (3 and 4 examples) per logical step and K copies: nothing
  moves after the first micro-step; after the second, delta = -S / n with S the brute-force
  sum, over BOTH micro-batches, of the examples' clipped mean gradients over the rows fit drew
  (micro-step m augments with draw m of the same step), and n the expected examples of the
  logical batch (7), not its rows (21)."""
  expected_batch = 7.0
  model = _dp_model(seed=5)
  before = [w.numpy() for w in model.trainable_variables]
  model.compile(optimizer=tf_dpkit.DPGradientDescentGaussianOptimizer(
      l2_norm_clip=CLIP, noise_multiplier=0.0, learning_rate=1.0,
      expected_batch_size=expected_batch, gradient_accumulation_steps=2),
                loss=XENT, augmentation=AugmentationMultiplicity(_jitter, K, seed=41))
  data = _variable_batches([3, 4], seed=8)
  trace = []

  class Record(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
      trace.append(_flat([w.numpy() for w in model.trainable_variables]))

  model.fit(data, epochs=1, verbose=0, callbacks=[Record()])
  np.testing.assert_array_equal(trace[0], _flat(before))  # the first micro-step only adds
  twin = AugmentationMultiplicity(_jitter, K, seed=41)
  reference_model = _dp_model(seed=5)
  total, norms = 0.0, []
  for x, y in data:
    rows = twin.augmented_rows(x, y, tf.ones([tf.shape(x)[0]]), twin.step_seed(0))
    part, part_norms = _reference(reference_model, *rows, K, CLIP)
    total, norms = total + part, norms + list(part_norms)
  assert len(norms) == 7 and max(norms) > CLIP  # clipping is active
  np.testing.assert_allclose(trace[1] - _flat(before), -total / expected_batch, atol=1e-5)
  assert int(model.optimizer.iterations.numpy()) == 1  # one logical step


def test_private_gradients_with_augmentation_is_brute_force_sum_over_expected_examples():
  expected_batch = 5.0
  model = _model(seed=3)
  optimizer = tf_dpkit.DPGradientDescentGaussianOptimizer(
      l2_norm_clip=CLIP, noise_multiplier=0.0, learning_rate=1.0,
      expected_batch_size=expected_batch)
  x, y, w = _batch(np.random.default_rng(6), 4)
  grads = tf_dpkit.private_gradients(
      optimizer, model, XENT, x, y, w, method="fast",
      augmentation=AugmentationMultiplicity(_jitter, K, seed=31))
  twin = AugmentationMultiplicity(_jitter, K, seed=31)
  rows = twin.augmented_rows(x, y, w, twin.step_seed(optimizer.iterations))
  total, _ = _reference(model, *rows, K, CLIP)
  np.testing.assert_allclose(_flat(grads), total / expected_batch, atol=1e-6)


def test_noise_std_is_sigma_c_over_expected_examples_not_rows():
  """Zero loss: the bias update is pure noise N(0, (sigma C / n)^2) with n = expected EXAMPLES;
  dividing by the expected rows K n would make it 4 times smaller."""
  sigma, clip, expected_batch, multiplicity, draws = 2.0, 0.5, 8.0, 4, 4000
  keras.utils.set_random_seed(0)
  model = tf_dpkit.DPSequential([keras.Input((1,)), keras.layers.Dense(draws)])
  bias = model.layers[-1].bias
  model.compile(
      optimizer=tf_dpkit.DPGradientDescentGaussianOptimizer(
          l2_norm_clip=clip, noise_multiplier=sigma, learning_rate=1.0, seed=5,
          expected_batch_size=expected_batch),
      loss=lambda y_true, y_pred: 0.0 * tf.reduce_sum(y_pred, axis=-1),
      augmentation=AugmentationMultiplicity(_jitter, multiplicity, seed=6))
  rng = np.random.default_rng(1)
  data = tf.data.Dataset.from_tensors((rng.normal(size=(6, 1)).astype(np.float32),
                                       np.zeros(6, np.float32)))
  before = bias.numpy().copy()
  model.fit(data, epochs=1, verbose=0)
  update = bias.numpy() - before
  expected = sigma * clip / expected_batch
  assert abs(np.std(update) / expected - 1.0) < 0.05  # sample-std error ~ 1/sqrt(2*4000) = 1.1%
  assert abs(np.mean(update)) < 4 * expected / np.sqrt(draws)


# ------------------------------------------------------------------------------------ errors


@pytest.mark.parametrize("multiplicity", [0, -1, 1025, 2.0, True, "3", None])
def test_multiplicity_outside_1_to_1024_is_refused(multiplicity):
  with pytest.raises(ValueError, match=r"multiplicity must be an integer in \[1, 1024\]"):
    AugmentationMultiplicity(_jitter, multiplicity)


def test_bad_augment_fn_and_seed_are_refused():
  with pytest.raises(TypeError, match="augment_fn must be callable"):
    AugmentationMultiplicity("flip", 2)
  for seed in (-1, 2**62, 1.5):
    with pytest.raises(ValueError, match="seed must be None or an integer"):
      AugmentationMultiplicity(_jitter, 2, seed=seed)
  with pytest.raises(TypeError, match="augmentation must be None or a tf_dpkit"):
    check_augmentation(_jitter)
  with pytest.raises(ValueError, match="got num_microbatches=4"):
    check_augmentation(AugmentationMultiplicity(_jitter, 2), num_microbatches=4)
  assert check_augmentation(None, num_microbatches=4) is None
  assert AugmentationMultiplicity(_jitter, 1024).multiplicity == 1024
  assert AugmentationMultiplicity(_jitter, 1).microbatch_size is None


def test_augment_fn_returning_another_structure_is_refused():
  augmentation = AugmentationMultiplicity(lambda example, seed: (example, example), 2, seed=1)
  with pytest.raises(ValueError, match="must return the structure of the example"):
    augmentation.augmented_rows(np.ones((3, 2), np.float32), None, None,
                                tf.constant([1, 2], tf.int64))


def test_num_microbatches_with_multiplicity_above_one_is_refused():
  model = _dp_model()
  optimizer = tf_dpkit.DPGradientDescentGaussianOptimizer(
      l2_norm_clip=1.0, noise_multiplier=1.0, num_microbatches=2, learning_rate=0.1)
  with pytest.raises(ValueError, match="needs the DP optimizer's num_microbatches=None"):
    model.compile(optimizer=optimizer, loss=XENT,
                  augmentation=AugmentationMultiplicity(_jitter, 2))
  with pytest.raises(ValueError, match="needs the DP optimizer's num_microbatches=None"):
    tf_dpkit.private_gradients(optimizer, model, XENT, np.ones((4, 4), np.float32),
                               np.zeros(4, np.int64),
                               augmentation=AugmentationMultiplicity(_jitter, 2))
  with pytest.raises(TypeError, match="augmentation must be None or a tf_dpkit"):
    model.compile(optimizer=tf_dpkit.DPGradientDescentGaussianOptimizer(
        l2_norm_clip=1.0, noise_multiplier=1.0, learning_rate=0.1), loss=XENT,
                  augmentation=_jitter)
  # K = 1 keeps today's meaning of num_microbatches (nothing is grouped per example).
  model.compile(optimizer=optimizer, loss=XENT,
                augmentation=AugmentationMultiplicity(_jitter, 1))
  assert model.augmentation.multiplicity == 1


def test_clipping_paths_refuse_bad_microbatch_size():
  model = _model()
  x, y = np.ones((6, 4), np.float32), np.zeros(6, np.int64)
  weights = np.ones(6, np.float32)
  fast = lambda **kw: clipped_sum_fast(model, XENT, (x, y, weights), 1.0, **kw)
  vectorized = lambda **kw: clipped_sum_vectorized(
      lambda inputs: (XENT(inputs[1], model(inputs[0])), ()), (x, y),
      model.trainable_variables, 1.0, **kw)
  for run in (fast, vectorized):
    with pytest.raises(ValueError, match="give at most one of them"):
      run(num_microbatches=2, microbatch_size=3)
    for size in (0, 1025, 1.5):
      with pytest.raises(ValueError, match=r"microbatch_size must be None or an integer"):
        run(microbatch_size=size)
    with pytest.raises(ValueError, match=r"microbatch_size=4 must divide the number of rows"):
      run(microbatch_size=4)  # 6 rows: a static size is checked before the step

  @tf.function(input_signature=[tf.TensorSpec([None, 4]), tf.TensorSpec([None], tf.int64)])
  def dynamic(xb, yb):
    return clipped_sum_fast(model, XENT, (xb, yb, None), 1.0, microbatch_size=4)[0].norms
  with pytest.raises(tf.errors.InvalidArgumentError, match="must divide the number of rows"):
    dynamic(x, y)


def _conv_model():
  """Every fast-path rule family on images and sequences: Conv2D, DepthwiseConv2D,
  LayerNormalization, EinsumDense and Dense on sequences and vectors."""
  keras.utils.set_random_seed(4)
  inputs = keras.Input((8, 8, 3))
  h = keras.layers.Conv2D(5, 3, activation="relu")(inputs)
  h = keras.layers.DepthwiseConv2D(3, depth_multiplier=2, activation="tanh")(h)
  h = keras.layers.Reshape((-1, 10))(h)
  h = keras.layers.LayerNormalization()(h)
  h = keras.layers.EinsumDense("bsd,de->bse", output_shape=(16, 6), bias_axes="e")(h)
  h = keras.layers.Dense(7, activation="relu")(h)
  return keras.Model(inputs, keras.layers.Dense(3)(keras.layers.Flatten()(h)))


def _flip_and_shift(example, seed):
  """A random horizontal flip and brightness shift of one image (stateless)."""
  flipped = tf.image.stateless_random_flip_left_right(example, seed)
  return flipped + tf.random.stateless_uniform([], seed=seed[::-1], minval=-0.2, maxval=0.2)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["fast", "vectorized"])
def test_conv_model_clipped_sum_equals_per_copy_tapes(method):
  """Rules with an unknown number of rows per group (Poisson batches, K copies) against one
  GradientTape per example and copy."""
  model, k, clip = _conv_model(), 4, 10.0
  augmentation = AugmentationMultiplicity(_flip_and_shift, k, seed=8)

  @tf.function(input_signature=[tf.TensorSpec([None, 8, 8, 3]),
                                tf.TensorSpec([None], tf.int64)])
  def clipped(x_rows, y_rows):
    result, _ = clipped_sum_for_model(model, XENT, x_rows, y_rows, None, clip, None, method,
                                      microbatch_size=k)
    return result.grads

  rng = np.random.default_rng(9)
  norms = []
  for size in (1, 5):
    x = rng.normal(size=(size, 8, 8, 3)).astype(np.float32)
    y = rng.integers(0, 3, size)
    x_rows, y_rows, _ = augmentation.augmented_rows(x, y, None, tf.constant([size, 2], tf.int64))
    expected = 0.0
    for i in range(size):
      copies = []
      for r in range(i * k, (i + 1) * k):
        with tf.GradientTape() as tape:
          loss = XENT(y_rows[r:r + 1], model(x_rows[r:r + 1]))[0]
        copies.append(_flat(tape.gradient(loss, model.trainable_variables)))
      mean = np.mean(copies, axis=0)
      norms.append(np.linalg.norm(mean))
      expected = expected + mean * min(1.0, clip / norms[-1])
    np.testing.assert_allclose(_flat(clipped(x_rows, y_rows)), expected, atol=2e-5)
  assert min(norms) < clip < max(norms), norms  # clipped and unclipped examples


def test_make_private_keeps_augmentation_and_the_same_accounting():
  """make_private carries the augmentation to compile; the event and epsilon are those of the
  run without it (the privacy unit stays the example)."""
  flip = lambda example, seed: example * tf.sign(  # noqa: E731
      tf.random.stateless_uniform([], seed=seed, minval=-1.0, maxval=1.0))
  rng = np.random.default_rng(0)
  data = (rng.normal(size=(200, 4)).astype(np.float32), rng.integers(0, 2, 200))
  augmentation = tf_dpkit.AugmentationMultiplicity(flip, 4, seed=1)
  common = dict(batch_size=20, epochs=1, noise_multiplier=1.2, l2_norm_clip=1.0, delta=1e-3)
  plain = tf_dpkit.make_private(data, **common)
  private = tf_dpkit.make_private(data, augmentation=augmentation, **common)
  assert private.augmentation is augmentation and plain.augmentation is None
  assert private.epsilon == plain.epsilon and private.event == plain.event
  model = tf_dpkit.DPSequential([keras.Input((4,)), keras.layers.Dense(2)])
  model.compile(optimizer=private.optimizer(keras.optimizers.SGD, learning_rate=0.1),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                augmentation=private.augmentation)
  model.fit(**private.fit_arguments(seed=3, verbose=False), verbose=0)
  with pytest.raises(ValueError, match="needs the DP optimizer's num_microbatches=None"):
    tf_dpkit.make_private(data, sampling="shuffle", num_microbatches=4,
                          augmentation=augmentation, **common)
  with pytest.raises(TypeError, match="augmentation must be None or a tf_dpkit"):
    tf_dpkit.make_private(data, augmentation=flip, **common)
