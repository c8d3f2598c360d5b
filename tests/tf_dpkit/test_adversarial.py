"""Adversarial probes: one example never moves the clipped sum by more than C, on every path.

Each hole found under adversarial testing has a test here, with a positive control where the
measurement itself could be wrong (a deliberately broken rule must be caught).
"""
import numpy as np
import pytest
import keras
import tensorflow as tf

import tf_dpkit
from tf_dpkit.clipping import per_example, rules
from tf_dpkit.clipping.testing import removal_sensitivity
from tf_dpkit.dp_gradients import clipped_sum_for_model

C = 1.0
TOL = 1e-5
RNG = np.random.default_rng(11)
SCE = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
METHODS = ["fast", "vectorized"]


def model_sensitivity(model, loss, x, y, method, num_microbatches=None, clip=C):
  def clipped(keep):
    xs = tf.nest.map_structure(lambda t: tf.gather(t, keep), x)
    cs, _ = clipped_sum_for_model(model, loss, xs, tf.gather(y, keep), None, clip,
                                  num_microbatches, method)
    return cs.grads
  return removal_sensitivity(clipped, len(y))


def _masked_rnn(cell="SimpleRNN"):
  keras.utils.set_random_seed(1)
  return keras.Sequential([
      keras.Input((6,), dtype="int32"), keras.layers.Embedding(10, 4, mask_zero=True),
      getattr(keras.layers, cell)(5, activation="relu"), keras.layers.Dense(3)])


def _token_batch(n=6):
  x = RNG.integers(1, 10, (n, 6)).astype(np.int32)
  x[:, 3:] *= RNG.random((n, 3)) < 0.5  # padded tails of different lengths
  return tf.constant(x), tf.constant(RNG.integers(0, 3, n))


@pytest.mark.parametrize("method", ["fast", pytest.param("vectorized", marks=pytest.mark.slow)])
def test_masked_recurrent_model_is_bounded_on_both_paths(method):
  # Was 1.59 x C (fast: the per-layer replay dropped the mask) and a crash (vectorized).
  x, y = _token_batch()
  sensitivity = model_sensitivity(_masked_rnn(), SCE, x, y, method)
  assert 0.5 * C < sensitivity <= C * (1 + TOL)


def test_masked_recurrent_fast_path_equals_per_example_reference():
  x, y = _token_batch(4)
  model = _masked_rnn()
  cs, _ = clipped_sum_for_model(model, SCE, x, y, None, 1e6, None, "fast")
  expected = None
  for i in range(4):
    with tf.GradientTape() as tape:
      loss = SCE(y[i:i + 1], model(x[i:i + 1], training=True))
    grads = [tf.convert_to_tensor(g) for g in tape.gradient(loss, model.trainable_variables)]
    expected = grads if expected is None else [a + b for a, b in zip(expected, grads)]
  for got, want in zip(cs.grads, expected):
    np.testing.assert_allclose(tf.convert_to_tensor(got), tf.convert_to_tensor(want), rtol=1e-4,
                               atol=1e-6)


class TrainingDependent(keras.layers.Layer):
  """Scales its output by 3 in training: a replay without ``training=True`` gets it wrong."""

  def build(self, shape):
    self.w = self.add_weight(shape=(shape[-1], 3), initializer="glorot_uniform")

  def call(self, x, training=None):
    z = tf.matmul(x, self.w)
    return z * 3.0 if training else z


@pytest.mark.parametrize("method", METHODS)
def test_training_dependent_custom_layer_is_bounded(method):
  # Was 1.15-1.56 x C on the fast path.
  keras.utils.set_random_seed(2)
  model = keras.Sequential([keras.Input((4,)), TrainingDependent(), keras.layers.Dense(3)])
  x = tf.constant(RNG.normal(size=(6, 4)).astype(np.float32))
  y = tf.constant(RNG.integers(0, 3, 6))
  assert model_sensitivity(model, SCE, x, y, method) <= C * (1 + TOL)


def _broadcasting_mse(y_true, y_pred):  # [B] - [B, 1] -> [B, B]: every entry mixes examples
  return tf.square(tf.cast(y_true, tf.float32) - y_pred)


def _mean_centred_loss(y_true, y_pred):  # shape [B], but each entry depends on the whole batch
  return tf.reduce_sum(y_pred - tf.reduce_mean(y_pred, axis=0), axis=1) ** 2


@pytest.mark.parametrize("loss", [_broadcasting_mse, _mean_centred_loss])
def test_batch_mixing_losses_cannot_move_the_fast_path_sum_by_more_than_c(loss):
  # The [B, B] loss gave 13.6 x C on the fast path: it is now evaluated per example.
  model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
  x = tf.constant(RNG.normal(size=(6, 4)).astype(np.float32) * 5)
  y = tf.constant(RNG.normal(size=6).astype(np.float32) * 5)
  assert model_sensitivity(model, loss, x, y, "fast") <= C * (1 + TOL)
  assert model_sensitivity(model, loss, x, y, "vectorized") <= C * (1 + TOL)


def test_broadcast_loss_inside_a_microbatch_is_refused_with_the_fix():
  model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
  x = tf.zeros([4, 4])
  with pytest.raises(ValueError, match=r"\[batch, batch\] comes from broadcasting"):
    clipped_sum_for_model(model, _broadcasting_mse, x, tf.zeros([4]), None, C, 2, "vectorized")


@pytest.mark.parametrize("loss", [keras.losses.Circle(), keras.losses.circle])
@pytest.mark.parametrize("method", METHODS)
def test_losses_that_compare_examples_are_refused(loss, method):
  model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
  with pytest.raises(ValueError, match="compares examples within a batch"):
    clipped_sum_for_model(model, loss, tf.zeros([4, 4]), tf.zeros([4], tf.int32), None, C, None,
                          method)


def test_circle_loss_in_compile_is_refused():
  model = tf_dpkit.DPSequential([keras.Input((4,)), keras.layers.Dense(2)])
  with pytest.raises(ValueError, match="compares examples"):
    model.compile(tf_dpkit.DPGradientDescentGaussianOptimizer(1.0, 1.0, learning_rate=0.1),
                  loss=keras.losses.Circle())


def test_vector_loss_of_rank_two_is_refused_by_minimize():
  # A [1, B] loss was read as one microbatch: 1.93 x C.
  opt = tf_dpkit.DPGradientDescentGaussianOptimizer(C, 0.0, learning_rate=0.1)
  w = tf.Variable(tf.ones([3, 1]))
  x = tf.constant(RNG.normal(size=(5, 3)).astype(np.float32))
  with tf.GradientTape() as tape:
    loss = tf.transpose(tf.matmul(x, w))  # [1, 5]
  with pytest.raises(ValueError, match=r"shape \[batch\].*got shape \(1, 5\)"):
    opt.minimize(loss, [w], tape=tape)


def test_vector_loss_path_is_bounded():
  w = tf.Variable(RNG.normal(size=(3, 2)).astype(np.float32))
  x = tf.constant(RNG.normal(size=(6, 3)).astype(np.float32) * 4)

  def clipped(keep):
    with tf.GradientTape(persistent=True) as tape:
      loss = tf.reduce_sum(tf.matmul(tf.gather(x, keep), w) ** 2, axis=1)
    return per_example.clipped_sum_from_vector_loss(loss, [w], C, tape=tape).grads
  assert C * 0.5 < removal_sensitivity(clipped, 6) <= C * (1 + TOL)


class OverridingDense(keras.layers.Dense):
  """A Dense subclass whose call differs from Dense's: must not be trained as a plain Dense."""

  def call(self, inputs, training=None):
    return super().call(inputs) * 2.0


class DenseWithExtraWeight(keras.layers.Dense):

  def build(self, shape):
    super().build(shape)
    self.extra = self.add_weight(shape=(self.units,), initializer="ones", name="extra")

  def call(self, inputs, training=None):
    return super().call(inputs) * self.extra


@pytest.mark.parametrize("layer_cls", [OverridingDense, DenseWithExtraWeight])
def test_subclasses_of_ruled_layers_train_with_their_own_call(layer_cls):
  assert rules.lookup_rule(layer_cls(2)) is None
  keras.utils.set_random_seed(3)
  model = keras.Sequential([keras.Input((3,)), layer_cls(2)])
  x = tf.constant(RNG.normal(size=(4, 3)).astype(np.float32))
  y = tf.constant(RNG.integers(0, 2, 4))
  cs, _ = clipped_sum_for_model(model, SCE, x, y, None, 1e6, None, "fast")
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(SCE(y, model(x, training=True)))
  expected = tape.gradient(loss, model.trainable_variables)
  assert len(cs.grads) == len(model.trainable_variables)
  for got, want in zip(cs.grads, expected):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
  assert model_sensitivity(model, SCE, x, y, "fast") <= C * (1 + TOL)


def test_a_broken_rule_is_detected_by_the_sensitivity_probe():
  """Positive control: the probe must see an under-clipping rule."""

  class HalfNormDense(keras.layers.Dense):
    pass

  def under_reporting(layer, inputs):
    trace = rules.dense.dense_rule(layer, inputs)
    return trace._replace(squared_norms=lambda g, m: 0.01 * trace.squared_norms(g, m),
                          clipped_sum=None)
  rules.register_layer_rule(HalfNormDense, under_reporting)
  keras.utils.set_random_seed(4)
  model = keras.Sequential([keras.Input((3,)), HalfNormDense(2)])
  x = tf.constant(RNG.normal(size=(5, 3)).astype(np.float32) * 10)
  y = tf.constant(RNG.integers(0, 2, 5))
  assert model_sensitivity(model, SCE, x, y, "fast") > 2 * C


def test_privatize_refuses_anything_but_a_toolkit_clipped_sum():
  opt = tf_dpkit.DPGradientDescentGaussianOptimizer(C, 1.0, learning_rate=0.1)
  with pytest.raises(TypeError, match="takes the ClippedSum"):
    opt.privatize([tf.fill([3, 1], -1000.0)])
  with pytest.raises(TypeError, match="made only by tf_dpkit's clipping"):
    tf_dpkit.clipping.ClippedSum([tf.ones([1])], tf.ones([1]), tf.ones([1]))


def test_reapplying_private_gradients_says_they_are_stale():
  opt = tf_dpkit.DPGradientDescentGaussianOptimizer(C, 1.0, learning_rate=0.1)
  w = tf.Variable(tf.ones([3, 1]))
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(tf.matmul(tf.ones([4, 3]), w), axis=1)
  grads_and_vars = opt.compute_gradients(loss, [w], tape=tape)
  opt.apply_gradients(grads_and_vars)
  with pytest.raises(ValueError, match="already applied or were superseded"):
    opt.apply_gradients(grads_and_vars)


@pytest.mark.parametrize("lr", [float("nan"), float("inf"), -0.1, 0.0])
def test_bad_learning_rates_are_refused(lr):
  with pytest.raises(ValueError, match=r"learning_rate must be a finite number in \(0, inf\)"):
    tf_dpkit.DPAdamGaussianOptimizer(1.0, 1.0, learning_rate=lr)
  with pytest.raises(ValueError, match=r"learning_rate must be a finite number in \(0, inf\)"):
    tf_dpkit.v1.DPGradientDescentGaussianOptimizer(1.0, 1.0, learning_rate=lr)
  with pytest.raises(ValueError, match=r"learning_rate must be a finite number in \(0, inf\)"):
    tf_dpkit.DPGradientDescentGaussianOptimizer(1.0, 1.0, None, lr)  # positional


def test_schedules_are_accepted_as_learning_rates():
  schedule = keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.9)
  assert tf_dpkit.DPAdamGaussianOptimizer(1.0, 1.0, learning_rate=schedule) is not None


def _empty_batch_step(opt, w):
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(tf.matmul(tf.zeros([0, 3]), w), axis=1)
  opt.minimize(loss, [w], tape=tape)


@pytest.mark.parametrize("in_function", [False, True])
def test_an_empty_batch_is_a_clear_error_not_infinite_weights(in_function):
  opt = tf_dpkit.DPGradientDescentGaussianOptimizer(C, 1.0, learning_rate=0.1)
  w = tf.Variable(tf.ones([3, 1]))
  step = tf.function(_empty_batch_step) if in_function else _empty_batch_step
  with pytest.raises((ValueError, tf.errors.InvalidArgumentError), match="The batch is empty"):
    step(opt, w)
  np.testing.assert_array_equal(w.numpy(), np.ones([3, 1]))


def test_zeroing_the_rows_of_an_empty_batch_is_empty_not_a_division_by_zero():
  # A graph may run this before the empty-batch assertion: it must not fail first with
  # "Integer division by zero" (seen in 1 of 60 traced empty-batch steps before the fix).
  from tf_dpkit.clipping.clipped_sum import unscaled_finite_float32, zero_rows
  empty = zero_rows(tf.zeros([0, 3]), tf.zeros([0], tf.bool))
  assert empty.shape == (0, 3)
  assert [g.shape for g in unscaled_finite_float32([tf.zeros([0, 2, 2]), None])[:1]] == [(0, 2, 2)]
  kept = zero_rows(tf.constant([[1.0], [np.inf], [2.0], [3.0]]), tf.constant([True, False]))
  np.testing.assert_array_equal(kept.numpy(), [[1.0], [np.inf], [0.0], [0.0]])


@pytest.mark.parametrize("method", METHODS)
def test_an_empty_batch_in_fit_paths_is_a_clear_error(method):
  model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
  with pytest.raises((ValueError, tf.errors.InvalidArgumentError), match="The batch is empty"):
    clipped_sum_for_model(model, SCE, tf.zeros([0, 3]), tf.zeros([0], tf.int32), None, C, None,
                          method)


@pytest.mark.parametrize("method", METHODS)
def test_mixed_bfloat16_trains_and_stays_bounded(method):
  keras.mixed_precision.set_global_policy("mixed_bfloat16")
  try:
    keras.utils.set_random_seed(5)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"),
                              TrainingDependent(), keras.layers.Dense(2)])
    x = tf.constant(RNG.normal(size=(6, 3)).astype(np.float32) * 3)
    y = tf.constant(RNG.integers(0, 2, 6))
    assert model_sensitivity(model, SCE, x, y, method) <= C * (1 + TOL)
    dp = tf_dpkit.DPSequential([keras.Input((3,)), keras.layers.Dense(2)])
    dp.per_example_method = method
    dp.compile(tf_dpkit.DPGradientDescentGaussianOptimizer(C, 1.0, learning_rate=0.1),
               loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = dp.fit(x, y, batch_size=3, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
  finally:
    keras.mixed_precision.set_global_policy("float32")


def test_mixed_float16_refuses_a_dynamic_loss_scale_optimizer_and_names_the_static_one():
  keras.mixed_precision.set_global_policy("mixed_float16")
  try:
    model = tf_dpkit.DPSequential([keras.Input((3,)), keras.layers.Dense(2)])
    dynamic = keras.optimizers.LossScaleOptimizer(
        tf_dpkit.DPGradientDescentGaussianOptimizer(C, 1.0, learning_rate=0.1))
    with pytest.raises(TypeError, match="LossScaleOptimizer.*loss_scale_factor"):
      model.compile(dynamic, loss="mse")
  finally:
    keras.mixed_precision.set_global_policy("float32")


class DenseCell(keras.layers.Layer):
  """A recurrent cell whose weights live in a Dense sublayer (built on its first real call)."""

  def __init__(self, **kwargs):
    super().__init__(**kwargs)
    self.state_size = 4
    self.dense = keras.layers.Dense(4, activation="tanh")

  def call(self, x, states):
    h = self.dense(tf.concat([x, states[0]], -1))
    return h, [h]


class TimeMajorDense(keras.layers.Layer):
  """Calls a Dense sublayer on time-major inputs: its leading axis is not the batch."""

  def __init__(self, **kwargs):
    super().__init__(**kwargs)
    self.dense = keras.layers.Dense(3)

  def call(self, x):
    return tf.transpose(self.dense(tf.transpose(x, [1, 0, 2])), [1, 0, 2])


def _sequence_batch(n=4):
  return (tf.constant(RNG.normal(size=(n, 5, 3)).astype(np.float32) * 3),
          tf.constant(RNG.integers(0, 3, n)))


def test_weights_created_during_the_step_are_refused_then_bounded_once_built():
  model = keras.Sequential([keras.Input((5, 3)), keras.layers.RNN(DenseCell()),
                            keras.layers.Dense(3)])
  x, y = _sequence_batch()
  with pytest.raises(ValueError, match="created the trainable variables|not built yet"):
    clipped_sum_for_model(model, SCE, x, y, None, C, None, "fast")
  model(x)  # now every weight exists
  for method in METHODS:
    assert C * 0.5 < model_sensitivity(model, SCE, x, y, method) <= C * (1 + TOL)


def test_dp_fit_builds_sublayers_that_a_symbolic_build_leaves_unbuilt():
  model = tf_dpkit.DPSequential([keras.Input((5, 3)), keras.layers.RNN(DenseCell()),
                                 keras.layers.Dense(3)])
  model.compile(tf_dpkit.DPGradientDescentGaussianOptimizer(C, 0.0, learning_rate=0.5, seed=0),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  x, y = _sequence_batch()
  model.fit(x, y, batch_size=4, epochs=1, verbose=0)
  assert len(model.trainable_variables) == 4
  before = [w.copy() for w in model.get_weights()]
  model.fit(x, y, batch_size=4, epochs=1, verbose=0)
  assert all(np.any(a != b) for a, b in zip(before, model.get_weights()))


@pytest.mark.parametrize("method", METHODS)
def test_composite_calling_a_ruled_sublayer_time_major_is_bounded(method):
  model = keras.Sequential([keras.Input((5, 3)), TimeMajorDense(), keras.layers.Flatten(),
                            keras.layers.Dense(3)])
  x, y = _sequence_batch()
  assert C * 0.5 < model_sensitivity(model, SCE, x, y, method) <= C * (1 + TOL)
