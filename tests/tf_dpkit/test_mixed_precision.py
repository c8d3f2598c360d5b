"""mixed_float16 with DP: static loss scale, float32 clipping, per-microbatch overflow -> zero.

References are independent of the code under test: brute-force removal of each example
(``removal_sensitivity``), the same batch without the overflowing example, the float32 model
with the same weights, and the Gaussian's standard deviation ``sigma C``.
"""
from __future__ import annotations

import math

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_dpkit
from tf_dpkit.clipping.testing import removal_sensitivity
from tf_dpkit.dp_gradients import clipped_sum_for_model
from tf_dpkit.optimizers.base import DEFAULT_FLOAT16_LOSS_SCALE

C = 0.05  # small enough that every example here is clipped: each moves the sum by exactly C
TOL = 1e-3
SCE = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
RNG = np.random.default_rng(3)


@pytest.fixture
def policy():
  """Sets the global Keras dtype policy for one test (restored afterwards)."""
  before = keras.config.dtype_policy()
  yield keras.config.set_dtype_policy
  keras.config.set_dtype_policy(before)


def _dense():
  return keras.Sequential([keras.Input((5,)), keras.layers.Dense(6, activation="tanh"),
                           keras.layers.Dense(3)])


def _conv():
  return keras.Sequential([keras.Input((6, 6, 1)), keras.layers.Conv2D(3, 3, activation="relu"),
                           keras.layers.Flatten(), keras.layers.Dense(3)])


def _embedding():
  return keras.Sequential([keras.Input((4,), dtype="int32"), keras.layers.Embedding(10, 4),
                           keras.layers.Flatten(), keras.layers.Dense(3)])


MODELS = {"dense": (_dense, lambda n: RNG.normal(size=(n, 5)).astype(np.float32) * 3),
          "conv": (_conv, lambda n: RNG.normal(size=(n, 6, 6, 1)).astype(np.float32) * 3),
          "embedding": (_embedding, lambda n: RNG.integers(0, 10, (n, 4)).astype(np.int32))}


def _sensitivity(model, x, y, method, loss_scale):
  def clipped_sum(keep):
    clipped, _ = clipped_sum_for_model(model, SCE, tf.constant(x[keep]), tf.constant(y[keep]),
                                       None, C, None, method, loss_scale=loss_scale)
    assert all(g.dtype == tf.float32 for g in clipped.grads)
    assert clipped.norms.dtype == tf.float32
    return clipped.grads
  return removal_sensitivity(clipped_sum, len(x))


@pytest.mark.parametrize("name,method", [("dense", "fast"), ("dense", "vectorized"),
                                         ("conv", "fast"), ("embedding", "fast")])
def test_removal_sensitivity_is_within_c_under_mixed_float16(policy, name, method):
  policy("mixed_float16")
  keras.utils.set_random_seed(1)
  make, inputs = MODELS[name]
  model = make()
  x, y = inputs(5), RNG.integers(0, 3, 5)
  sensitivity = _sensitivity(model, x, y, method, DEFAULT_FLOAT16_LOSS_SCALE)
  # Every example is clipped (C is tiny), so removing one moves the sum by C up to round-off;
  # clipping the scaled gradients (C/S) or forgetting to unscale (S C) would miss by 2**10.
  assert C * (1 - 1e-2) <= sensitivity <= C * (1 + TOL)


@pytest.mark.slow
@pytest.mark.parametrize("name,method", [("conv", "vectorized"), ("embedding", "vectorized")])
def test_removal_sensitivity_is_within_c_under_mixed_float16_slow(policy, name, method):
  test_removal_sensitivity_is_within_c_under_mixed_float16(policy, name, method)


# ---------------------------------------------------------------------------------------------
# One example whose float16 gradient overflows at the loss scale.

def _linear_loss(y_true, y_pred):
  """Per-example ``sum(y * pred)``: its gradient w.r.t. the prediction is ``y``, so an example
  with ``y * S > 65504`` (float16's largest finite value) overflows in the scaled backward
  pass, while its loss (``y * pred``) stays finite."""
  return tf.reduce_sum(tf.cast(y_true, y_pred.dtype) * y_pred, axis=-1)


def _overflow_model():
  return keras.Sequential([keras.Input((3,)), keras.layers.Dense(64, activation="tanh"),
                           keras.layers.Dense(1)])


BIG = 100.0  # 100 * 2**10 = 102400 > 65504: overflows in float16, not in float32
X_OVERFLOW = RNG.normal(size=(4, 3)).astype(np.float32)
Y_OVERFLOW = np.array([0.5, BIG, -0.3, 0.2], np.float32)


def _clipped(model, x, y, method, loss_scale):
  if method == "jacobian":  # the optimizer interface of custom loops (vector loss + tape)
    with tf.GradientTape() as tape:
      loss = _linear_loss(tf.constant(y)[:, None], model(tf.constant(x), training=True))
      assert loss.shape == (len(x),)
      loss = tf.cast(loss, tf.float32)
    return tf_dpkit.clipping.clipped_sum_from_vector_loss(
        loss, model.trainable_variables, C, tape=tape, loss_scale=loss_scale)
  clipped, _ = clipped_sum_for_model(model, _linear_loss, tf.constant(x), tf.constant(y)[:, None],
                                     None, C, None, method, loss_scale=loss_scale)
  return clipped


@pytest.mark.parametrize("method", ["fast", "jacobian",
                                    pytest.param("vectorized", marks=pytest.mark.slow)])
def test_an_overflowing_example_contributes_zero_and_the_bound_holds(policy, method):
  keras.utils.set_random_seed(2)
  float32_model = _overflow_model()
  weights = float32_model.get_weights()
  # float32: the example's gradient is finite, so it moves the sum (by C: it is clipped).
  full = _clipped(float32_model, X_OVERFLOW, Y_OVERFLOW, method, None)
  rest = _clipped(float32_model, np.delete(X_OVERFLOW, 1, 0), np.delete(Y_OVERFLOW, 1), method,
                  None)
  moved = math.sqrt(sum(float(tf.reduce_sum(tf.square(a - b)))
                        for a, b in zip(full.grads, rest.grads)))
  assert moved == pytest.approx(C, rel=1e-3)

  policy("mixed_float16")
  model = _overflow_model()
  model.set_weights(weights)
  scale = DEFAULT_FLOAT16_LOSS_SCALE
  assert BIG * scale > 65504.0  # float16's largest finite value
  full = _clipped(model, X_OVERFLOW, Y_OVERFLOW, method, scale)
  rest = _clipped(model, np.delete(X_OVERFLOW, 1, 0), np.delete(Y_OVERFLOW, 1), method, scale)
  for a, b in zip(full.grads, rest.grads):
    assert np.all(np.isfinite(a.numpy()))
    np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-7)  # it contributes exactly 0
  assert full.norms.numpy()[1] == 0.0  # zeroed before clipping: norm 0 <= C
  np.testing.assert_allclose(np.delete(full.norms.numpy(), 1), rest.norms.numpy(), rtol=1e-6)

  def clipped_sum(keep):
    return _clipped(model, X_OVERFLOW[keep], Y_OVERFLOW[keep], method, scale).grads
  assert removal_sensitivity(clipped_sum, len(X_OVERFLOW)) <= C * (1 + TOL)


@pytest.mark.parametrize("method", ["fast", pytest.param("vectorized", marks=pytest.mark.slow)])
def test_an_activation_overflowing_float16_leaves_the_sum_finite_and_bounded(policy, method):
  policy("mixed_float16")
  keras.utils.set_random_seed(9)
  model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dense(2)])
  x = RNG.normal(size=(4, 3)).astype(np.float32)
  x[2] = 1e6  # its first layer's outputs exceed 65504: inf in float16 for the second layer
  y = RNG.integers(0, 2, 4)
  assert not np.all(np.isfinite(model.layers[0](x[2:3]).numpy()))

  def clipped_sum(keep):
    clipped, _ = clipped_sum_for_model(model, SCE, tf.constant(x[keep]), tf.constant(y[keep]),
                                       None, C, None, method,
                                       loss_scale=DEFAULT_FLOAT16_LOSS_SCALE)
    assert all(np.all(np.isfinite(g.numpy())) for g in clipped.grads)
    return clipped.grads
  assert removal_sensitivity(clipped_sum, len(x)) <= C * (1 + TOL)


def test_fit_with_an_overflowing_example_takes_every_step_with_unchanged_noise(policy):
  policy("mixed_float16")
  keras.utils.set_random_seed(4)
  sigma = 2.0
  model = tf_dpkit.DPSequential(_overflow_model().layers)
  optimizer = tf_dpkit.DPGradientDescentGaussianOptimizer(C, sigma, learning_rate=1.0, seed=11)
  model.compile(optimizer=optimizer, loss=_linear_loss)
  assert model.optimizer is optimizer  # not wrapped in a dynamic LossScaleOptimizer
  before = [w.copy() for w in model.get_weights()]
  x = np.repeat(X_OVERFLOW, 2, axis=0)
  y = np.repeat(Y_OVERFLOW, 2)[:, None]
  model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
  assert int(optimizer.iterations.numpy()) == 2  # no step skipped (both batches overflow)
  after = model.get_weights()
  assert all(np.all(np.isfinite(w)) for w in after)
  # Noise 0 would leave updates of norm <= lr * C * 3 / 4 per step; the noise (std sigma C / 4
  # per coordinate, lr 1) is what moved the 321 weights: its std over them matches sigma C / 4.
  deltas = np.concatenate([(a - b).ravel() for a, b in zip(after, before)])
  assert deltas.size == 321
  # Two steps: each coordinate moved by the sum of two independent draws (plus the tiny clipped
  # signal): std sqrt(2) sigma C / 4.  Tolerance 15%: the std estimate from 321 values has a
  # relative std of about 1/sqrt(642) = 4%.
  expected = math.sqrt(2) * sigma * C / 4
  assert np.std(deltas) == pytest.approx(expected, rel=0.15)


# ---------------------------------------------------------------------------------------------
# mixed_float16 matches float32.

@pytest.mark.parametrize("method", ["fast", pytest.param("vectorized", marks=pytest.mark.slow)])
def test_mixed_float16_update_matches_float32(policy, method):
  keras.utils.set_random_seed(6)
  x = RNG.normal(size=(8, 6, 6, 1)).astype(np.float32)
  y = RNG.integers(0, 3, 8)
  updates = {}
  weights = None
  for name in ("float32", "mixed_float16"):
    policy(name)
    model = tf_dpkit.DPSequential(_conv().layers)
    model.per_example_method = method
    if weights is None:
      weights = model.get_weights()
    model.set_weights(weights)
    model.compile(tf_dpkit.DPGradientDescentGaussianOptimizer(0.5, 0.0, learning_rate=1.0),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    updates[name] = np.concatenate([(a - b).ravel() for a, b in zip(model.get_weights(),
                                                                    weights)])
  reference = updates["float32"]
  assert np.linalg.norm(reference) > 0.05  # a real step (clip 0.5, some examples clipped)
  # float16 activations carry about 3 significant digits (unit round-off 4.9e-4); measured
  # relative errors are 4e-4 (fast) and 6e-4 (vectorized): required below 5e-3.
  error = np.linalg.norm(updates["mixed_float16"] - reference) / np.linalg.norm(reference)
  assert error < 5e-3


@pytest.mark.slow
def test_a_static_loss_scale_factor_does_not_change_the_float32_update():
  keras.utils.set_random_seed(8)
  x = RNG.normal(size=(6, 5)).astype(np.float32)
  y = RNG.integers(0, 3, 6)
  updates = []
  weights = None
  for factor in (None, 8.0):
    model = tf_dpkit.DPSequential(_dense().layers)
    weights = weights or model.get_weights()
    model.set_weights(weights)
    optimizer = tf_dpkit.DPGradientDescentGaussianOptimizer(0.5, 0.0, learning_rate=1.0,
                                                            loss_scale_factor=factor)
    assert optimizer.static_loss_scale(model) == factor
    model.compile(optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, batch_size=6, epochs=1, verbose=0)
    updates.append([a - b for a, b in zip(model.get_weights(), weights)])
  for a, b in zip(*updates):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


# ---------------------------------------------------------------------------------------------
# Which scale, and what is refused.

def test_static_loss_scale_defaults_to_2_to_10_under_float16_only(policy):
  optimizer = tf_dpkit.DPGradientDescentGaussianOptimizer(1.0, 1.0, learning_rate=0.1)
  policy("mixed_float16")
  float16_model = _dense()
  assert optimizer.static_loss_scale(float16_model) == 2.0 ** 10
  assert optimizer.static_loss_scale() == 2.0 ** 10  # custom loops: the global policy
  policy("mixed_bfloat16")
  assert optimizer.static_loss_scale(_dense()) is None  # bfloat16 has float32's range
  assert optimizer.static_loss_scale() is None
  policy("float32")
  assert optimizer.static_loss_scale(_dense()) is None
  assert optimizer.static_loss_scale(float16_model) == 2.0 ** 10  # the model's own policy
  chosen = tf_dpkit.DPGradientDescentGaussianOptimizer(1.0, 1.0, learning_rate=0.1,
                                                       loss_scale_factor=256)
  assert chosen.static_loss_scale(float16_model) == 256.0


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), "big"])
def test_a_bad_loss_scale_factor_is_refused(bad):
  with pytest.raises(ValueError, match="loss_scale_factor must be a finite number in"):
    tf_dpkit.DPGradientDescentGaussianOptimizer(1.0, 1.0, learning_rate=0.1,
                                                loss_scale_factor=bad)


def test_dynamic_loss_scaling_is_refused_under_mixed_float16(policy):
  policy("mixed_float16")
  model = tf_dpkit.DPSequential([keras.Input((3,)), keras.layers.Dense(2)])
  optimizer = tf_dpkit.DPGradientDescentGaussianOptimizer(C, 1.0, learning_rate=0.1)
  with pytest.raises(ValueError, match="auto_scale_loss=True.*loss_scale_factor"):
    model.compile(optimizer, loss="mse", auto_scale_loss=True)
  with pytest.raises(TypeError, match="LossScaleOptimizer.*static loss scale"):
    model.compile(keras.optimizers.LossScaleOptimizer(optimizer), loss="mse")
  model.compile(optimizer, loss="mse", auto_scale_loss=False)
  assert model.optimizer is optimizer
