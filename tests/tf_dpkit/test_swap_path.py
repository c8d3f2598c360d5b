"""The optimizer swap on the fast path: ``optimizer.minimize(vector_loss, var_list, tape=tape)``
on a DP model's outputs (``tf_dpkit.clipping.swap``)."""
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_dpkit
import tf_dpkit.clipping
from tf_dpkit.clipping import swap

LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
B = 8


def _cnn(cls=tf_dpkit.DPSequential):
  keras.utils.set_random_seed(1)
  return cls([keras.Input((6, 6, 1)), keras.layers.Conv2D(3, 3, activation="tanh"),
              keras.layers.Flatten(), keras.layers.Dense(4)])


def _embedding(cls=tf_dpkit.DPSequential):
  keras.utils.set_random_seed(2)
  return cls([keras.Input((5,), dtype="int32"), keras.layers.Embedding(20, 4),
              keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(4)])


def _two_inputs(cls=tf_dpkit.DPModel):
  keras.utils.set_random_seed(3)
  a, b = keras.Input((3,)), keras.Input((2,))
  h = keras.layers.Concatenate()([keras.layers.Dense(4, activation="tanh")(a),
                                  keras.layers.Dense(2)(b)])
  return cls([a, b], keras.layers.Dense(4)(h))


def _batch(name, n=B, seed=0):
  rng = np.random.default_rng(seed)
  y = rng.integers(0, 4, n)
  if name == "cnn":
    return rng.normal(size=(n, 6, 6, 1)).astype(np.float32) * 2, y
  if name == "embedding":
    return rng.integers(0, 20, (n, 5)).astype(np.int32), y
  return [rng.normal(size=(n, 3)).astype(np.float32) * 2,
          rng.normal(size=(n, 2)).astype(np.float32) * 2], y


MODELS = {"cnn": _cnn, "embedding": _embedding, "two_inputs": _two_inputs}


def _jacobian_warnings(caught):
  return [w for w in caught if "full Jacobian" in str(w.message)]


def _swap_step(optimizer, model, x, y, use_function=False):
  def step(x, y):
    with tf.GradientTape() as tape:
      loss = LOSS(y, model(x, training=True))
    optimizer.minimize(loss, model.trainable_variables, tape=tape)
  (tf.function(step) if use_function else step)(x, y)


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("use_function", [False, True])
def test_swap_update_equals_private_gradients_update(name, use_function, monkeypatch):
  """Same seed, same noise: the swap's step is private_gradients' step."""
  taken = []
  original = swap.clipped_sum_from_record
  monkeypatch.setattr(swap, "clipped_sum_from_record",
                      lambda *a, **k: taken.append(1) or original(*a, **k))
  swapped, reference = MODELS[name](), MODELS[name]()
  reference.set_weights(swapped.get_weights())
  make = lambda: tf_dpkit.DPGradientDescentGaussianOptimizer(  # noqa: E731
      l2_norm_clip=0.5, noise_multiplier=0.7, learning_rate=0.5, seed=11)
  opt_swap, opt_ref = make(), make()
  x, y = _batch(name)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for _ in range(2):
      _swap_step(opt_swap, swapped, x, y, use_function)
  assert not _jacobian_warnings(caught)
  assert len(taken) == 2  # the swap path ran at each step (or each trace)
  for _ in range(2):
    grads = tf_dpkit.private_gradients(opt_ref, reference, LOSS, x, y)
    opt_ref.apply(grads, reference.trainable_variables)
  before = MODELS[name]().get_weights()
  moved = max(np.abs(a - b).max() for a, b in zip(swapped.get_weights(), before))
  assert moved > 1e-2  # the step did something
  for got, want in zip(swapped.get_weights(), reference.get_weights()):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def _brute_clipped_sum(model, x, y, clip, num_microbatches=None):
  """sum_j clip_C(grad mean(L[microbatch j])), each microbatch's gradient on its own tape."""
  n = len(y)
  m = n if num_microbatches is None else num_microbatches
  k = n // m
  total = [np.zeros(v.shape, np.float64) for v in model.trainable_variables]
  norms = []
  for j in range(m):
    rows = slice(j * k, (j + 1) * k)
    xj = [t[rows] for t in x] if isinstance(x, list) else x[rows]
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(LOSS(y[rows], model(xj, training=False)))
    grads = [tf.convert_to_tensor(g).numpy().astype(np.float64)
             for g in tape.gradient(loss, model.trainable_variables)]
    norm = np.sqrt(sum((g ** 2).sum() for g in grads))
    norms.append(norm)
    factor = min(1.0, clip / norm)
    total = [t + factor * g for t, g in zip(total, grads)]
  return total, np.array(norms)


def _swap_clipped_sum(model, x, y, clip, num_microbatches=None):
  """The swap path's clipped sum, read off a noise-free step: grads = sum / M."""
  optimizer = tf_dpkit.DPGradientDescentGaussianOptimizer(
      l2_norm_clip=clip, noise_multiplier=0.0, num_microbatches=num_microbatches,
      learning_rate=1.0)
  with tf.GradientTape() as tape:
    loss = LOSS(y, model(x, training=True))
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    grads_and_vars = optimizer.compute_gradients(loss, model.trainable_variables, tape=tape)
  assert not _jacobian_warnings(caught)
  m = len(y) if num_microbatches is None else num_microbatches
  return [g.numpy().astype(np.float64) * m for g, _ in grads_and_vars]


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("num_microbatches", [None, 2])
def test_swap_clipped_sum_equals_brute_force(name, num_microbatches):
  model = MODELS[name]()
  x, y = _batch(name)
  _, norms = _brute_clipped_sum(model, x, y, 1.0, num_microbatches)
  clip = float(np.median(norms))  # clips some microbatches, leaves others
  want, _ = _brute_clipped_sum(model, x, y, clip, num_microbatches)
  assert norms.min() < clip < norms.max()
  got = _swap_clipped_sum(model, x, y, clip, num_microbatches)
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_removing_one_example_moves_the_swap_sum_by_at_most_clip(name):
  model = MODELS[name]()
  x, y = _batch(name)
  clip = 0.05  # binds for every example here (checked below)
  _, norms = _brute_clipped_sum(model, x, y, clip)
  full = _swap_clipped_sum(model, x, y, clip)
  for k in (0, 3):
    keep = np.arange(B) != k
    x_minus = [t[keep] for t in x] if isinstance(x, list) else x[keep]
    minus = _swap_clipped_sum(model, x_minus, y[keep], clip)
    moved = np.sqrt(sum(((a - b) ** 2).sum() for a, b in zip(full, minus)))
    assert norms[k] > clip
    assert clip / 2 < moved <= clip * (1 + 1e-4)


@pytest.mark.parametrize("mixing", ["mean_repeated", "centred"])
@pytest.mark.parametrize("use_function", [False, True])
def test_a_loss_that_mixes_examples_is_refused(mixing, use_function):
  model = _cnn()
  x, y = _batch("cnn")
  optimizer = tf_dpkit.DPGradientDescentGaussianOptimizer(l2_norm_clip=1.0, noise_multiplier=1.0,
                                              learning_rate=0.1)

  def step(x, y):
    with tf.GradientTape() as tape:
      losses = LOSS(y, model(x, training=True))
      if mixing == "mean_repeated":
        loss = tf.repeat(tf.reduce_mean(losses)[None], tf.shape(losses)[0])
      else:
        loss = tf.square(losses - tf.reduce_mean(losses))
    optimizer.minimize(loss, model.trainable_variables, tape=tape)

  before = model.get_weights()
  with pytest.raises((ValueError, tf.errors.InvalidArgumentError), match="not per example"):
    (tf.function(step) if use_function else step)(x, y)
  for a, b in zip(model.get_weights(), before):
    np.testing.assert_array_equal(a, b)


def test_a_loss_mixing_only_within_a_microbatch_is_accepted():
  """With microbatches the contract is per microbatch: a loss centred on its microbatch's mean
  is that microbatch's own business."""
  model = _cnn()
  x, y = _batch("cnn")
  optimizer = tf_dpkit.DPGradientDescentGaussianOptimizer(l2_norm_clip=1.0, noise_multiplier=0.0,
                                              num_microbatches=2, learning_rate=0.1)
  with tf.GradientTape() as tape:
    losses = tf.reshape(LOSS(y, model(x, training=True)), [2, -1])
    loss = tf.reshape(tf.square(losses - tf.reduce_mean(losses, axis=1, keepdims=True)), [-1])
  optimizer.minimize(loss, model.trainable_variables, tape=tape)


class _Subclassed(keras.Model):

  def __init__(self):
    super().__init__()
    self.flatten = keras.layers.Flatten()
    self.dense = keras.layers.Dense(4)

  def call(self, x, training=None):
    return self.dense(self.flatten(x))


@pytest.mark.parametrize("make", [lambda: tf_dpkit.make_dp_model_class(_Subclassed)(),
                                  lambda: _cnn(keras.Sequential)],
                         ids=["dp_subclassed", "plain_keras"])
def test_untraceable_model_takes_the_jacobian_path_and_says_so_once(make):
  model = make()
  x, y = _batch("cnn")
  model(x)
  optimizer = tf_dpkit.DPGradientDescentGaussianOptimizer(l2_norm_clip=0.3, noise_multiplier=0.0,
                                              learning_rate=1.0)
  want, _ = _brute_clipped_sum(model, x, y, 0.3)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for step in range(3):
      with tf.GradientTape() as tape:
        loss = LOSS(y, model(x, training=True))
      grads = optimizer.compute_gradients(loss, model.trainable_variables, tape=tape)
      if step == 0:
        for (g, _), w in zip(grads, want):
          np.testing.assert_allclose(g.numpy() * B, w, rtol=1e-4, atol=1e-5)
      optimizer.apply_gradients(grads)
  found = _jacobian_warnings(caught)
  assert len(found) == 1
  message = str(found[0].message)
  assert "[B, P]" in message and "B backward passes" in message
  assert "DPSequential" in message and "private_gradients" in message


def test_model_called_twice_takes_the_exact_jacobian_path():
  model = _cnn()
  x, y = _batch("cnn")
  optimizer = tf_dpkit.DPGradientDescentGaussianOptimizer(l2_norm_clip=0.3, noise_multiplier=0.0,
                                              learning_rate=1.0)
  want, _ = _brute_clipped_sum(model, x, y, 0.3)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    with tf.GradientTape() as tape:
      model(x, training=True)
      loss = LOSS(y, model(x, training=True))
    grads = optimizer.compute_gradients(loss, model.trainable_variables, tape=tape)
  assert "called 2 times" in str(_jacobian_warnings(caught)[0].message)
  for (g, _), w in zip(grads, want):
    np.testing.assert_allclose(g.numpy() * B, w, rtol=1e-4, atol=1e-5)


def test_var_list_other_than_the_models_variables_takes_the_jacobian_path():
  model = _cnn()
  x, y = _batch("cnn")
  optimizer = tf_dpkit.DPGradientDescentGaussianOptimizer(l2_norm_clip=0.3, noise_multiplier=0.0,
                                              learning_rate=1.0)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    with tf.GradientTape() as tape:
      loss = LOSS(y, model(x, training=True))
    optimizer.compute_gradients(loss, model.trainable_variables[:2], tape=tape)
  assert "var_list is not the trainable variables" in str(_jacobian_warnings(caught)[0].message)


def test_a_loss_of_another_batch_size_is_refused():
  model = _cnn()
  x, y = _batch("cnn")
  optimizer = tf_dpkit.DPGradientDescentGaussianOptimizer(l2_norm_clip=1.0, noise_multiplier=1.0,
                                              learning_rate=0.1)
  with tf.GradientTape() as tape:
    loss = LOSS(y, model(x, training=True))[:4]
  with pytest.raises((ValueError, tf.errors.InvalidArgumentError), match="one entry per"):
    optimizer.minimize(loss, model.trainable_variables, tape=tape)


def test_the_swap_outputs_are_the_models_outputs():
  model = _cnn()
  x, _ = _batch("cnn")
  with tf.GradientTape():
    traced = model(x, training=True)
  swap.take_record(model.trainable_variables)
  np.testing.assert_allclose(traced.numpy(), model(x, training=False).numpy(), rtol=1e-5,
                             atol=1e-6)


def test_a_built_keras_model_converts_with_dp_model_of_its_inputs_and_outputs():
  """README: tf_dpkit.DPModel(model.input, model.output) makes a Keras model traceable
  (same layers and variables)."""
  plain = _two_inputs(keras.Model)
  model = tf_dpkit.DPModel(plain.input, plain.output)
  assert [id(v) for v in model.trainable_variables] == [
      id(v) for v in plain.trainable_variables]
  x, y = _batch("two_inputs")
  want, _ = _brute_clipped_sum(plain, x, y, 0.3)
  got = _swap_clipped_sum(model, x, y, 0.3)
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_swap_under_mixed_float16_matches_float32_brute_force():
  policy = keras.config.dtype_policy()
  keras.config.set_dtype_policy("mixed_float16")
  try:
    model = _cnn()
  finally:
    keras.config.set_dtype_policy(policy)
  x, y = _batch("cnn")
  want, _ = _brute_clipped_sum(model, x, y, 0.3)
  got = _swap_clipped_sum(model, x, y, 0.3)
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, rtol=2e-2, atol=2e-3)


def test_per_layer_clip_norms_on_the_swap_equal_private_gradients():
  def make_model():
    keras.utils.set_random_seed(4)
    return tf_dpkit.DPSequential([keras.Input((6, 6, 1)),
                                  keras.layers.Conv2D(3, 3, activation="tanh", name="conv"),
                                  keras.layers.Flatten(), keras.layers.Dense(4, name="head")])
  swapped, reference = make_model(), make_model()
  make = lambda: tf_dpkit.DPGradientDescentGaussianOptimizer(  # noqa: E731
      l2_norm_clip=tf_dpkit.clipping.LayerClipNorms({"conv": 0.2, "head": 0.1}), noise_multiplier=0.5,
      learning_rate=0.5, seed=5)
  opt_swap, opt_ref = make(), make()
  x, y = _batch("cnn")
  _swap_step(opt_swap, swapped, x, y)
  opt_ref.apply(tf_dpkit.private_gradients(opt_ref, reference, LOSS, x, y),
                reference.trainable_variables)
  for got, want in zip(swapped.get_weights(), reference.get_weights()):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("use_function", [False, True])
def test_per_example_losses_with_rounding_are_not_refused(use_function):
  """Mean over output axes, sample weights, a non-power-of-two scale: the contract check
  compares exactly, and these are per example."""
  model = _cnn()
  x, y = _batch("cnn")
  weights = np.linspace(0.3, 1.7, B).astype(np.float32)
  optimizer = tf_dpkit.DPGradientDescentGaussianOptimizer(l2_norm_clip=0.7, noise_multiplier=0.0,
                                                          learning_rate=1.0)
  mse = keras.losses.MeanSquaredError(reduction=None)

  def step(x, y):
    with tf.GradientTape() as tape:
      out = model(x, training=True)
      loss = (mse(tf.one_hot(y, 4), tf.tanh(out)) * weights / 3.0 +
              0.1 * LOSS(y, out))
    return optimizer.compute_gradients(loss, model.trainable_variables, tape=tape)

  for _ in range(3):
    (tf.function(step) if use_function else step)(x, y)


@pytest.mark.parametrize("kind", ["tf_privacy_compat", "v1"])
def test_compat_and_v1_optimizers_take_the_swap(kind, monkeypatch):
  from tf_dpkit.compat import tf_privacy  # pylint: disable=g-import-not-at-top
  taken = []
  original = swap.clipped_sum_from_record
  monkeypatch.setattr(swap, "clipped_sum_from_record",
                      lambda *a, **k: taken.append(1) or original(*a, **k))
  model = _cnn()
  x, y = _batch("cnn")
  _, norms = _brute_clipped_sum(model, x, y, 1.0)
  clip = float(np.median(norms))
  want, _ = _brute_clipped_sum(model, x, y, clip)
  if kind == "v1":
    optimizer = tf_dpkit.v1.DPGradientDescentGaussianOptimizer(
        l2_norm_clip=clip, noise_multiplier=0.0, learning_rate=1.0)
  else:
    optimizer = tf_privacy.DPKerasSGDOptimizer(
        l2_norm_clip=clip, noise_multiplier=0.0, learning_rate=1.0)
  with tf.GradientTape() as tape:
    loss = LOSS(y, model(x, training=True))
  grads = optimizer.compute_gradients(loss, model.trainable_variables, tape=tape)
  assert taken
  for (g, _), w in zip(grads, want):
    np.testing.assert_allclose(g.numpy() * B, w, rtol=1e-4, atol=1e-5)


def _cond_loss(y_true, y_pred):
  """Cross-entropy, doubled for the examples whose label is 0: a ``tf.cond`` on each example's
  own label (evaluated on one example at a time by tf_dpkit's isolation of custom losses),
  which ``pfor`` cannot vectorise (it raises an AttributeError inside TensorFlow)."""
  ce = keras.losses.sparse_categorical_crossentropy(y_true, y_pred, from_logits=True)
  return tf.cond(tf.equal(tf.reshape(y_true, [-1])[0], 0), lambda: 2.0 * ce, lambda: ce)


@pytest.mark.parametrize("method", ["fast", "vectorized"])
def test_a_loss_with_a_tf_cond_on_the_example_gives_the_brute_force_clipped_sum(method, caplog):
  from tf_dpkit.dp_gradients import clipped_sum_for_model
  model = _cnn()
  x, y = _batch("cnn")
  y[:3] = 0  # some examples take each branch
  clip = 0.05
  want = [np.zeros(v.shape) for v in model.trainable_variables]
  for i in range(B):
    with tf.GradientTape() as tape:
      loss = (2.0 if y[i] == 0 else 1.0) * LOSS(y[i:i + 1], model(x[i:i + 1]))[0]
    grads = [g.numpy().astype(np.float64) for g in tape.gradient(loss, model.trainable_variables)]
    factor = min(1.0, clip / np.sqrt(sum((g ** 2).sum() for g in grads)))
    assert factor < 1.0  # clipping binds, so a wrong branch would change the sum
    want = [w + factor * g for w, g in zip(want, grads)]
  step = tf.function(lambda x, y: clipped_sum_for_model(model, _cond_loss, x, y, None, clip,
                                                        method=method)[0].grads)
  with caplog.at_level("ERROR", logger="tensorflow"):
    got = step(tf.constant(x), tf.constant(y))
  for g, w in zip(got, want):
    np.testing.assert_allclose(g.numpy(), w, rtol=1e-4, atol=1e-6)
  # pfor's failure is answered by tf.map_fn; its own ERROR log of the op does not reach users.
  assert not [r for r in caplog.records if "pfor" in r.getMessage()]
