"""Per-layer (group-wise) clipping: the clipped sum against a brute-force NumPy reference, its
removal sensitivity sqrt(sum C_l^2), the noise calibrated to that total, the epsilon of the
noise multiplier sigma, and every refusal."""
import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_dpkit
from analysis import rdp_accountant
from tf_dpkit.budget import PrivacyBudget
from tf_dpkit.clipping import LayerClipNorms
from tf_dpkit.clipping.testing import removal_sensitivity
from tf_dpkit.dp_gradients import clipped_sum_for_model

RNG = np.random.default_rng(0)
X = RNG.normal(size=(6, 4)).astype(np.float32)
Y = RNG.integers(0, 3, size=6)
CLIPS = {("a", "b"): 0.05, "c": 0.3}  # one group of two layers, one of one layer
TOTAL = float(np.sqrt(0.05**2 + 0.3**2))


def _loss(y_true, y_pred):
  return keras.losses.sparse_categorical_crossentropy(y_true, y_pred, from_logits=True)


def _model():
  keras.utils.set_random_seed(0)
  return keras.Sequential([keras.Input((4,)), keras.layers.Dense(5, activation="tanh", name="a"),
                           keras.layers.Dense(4, activation="tanh", name="b"),
                           keras.layers.Dense(3, name="c")])


def _reference(model, x, y, clips, group_of_variable):
  """sum_i (g_{i,l} min(1, C_l / ||g_{i,l}||))_l from per-example tapes, in float64."""
  variables = model.trainable_variables
  total = [np.zeros(v.shape, np.float64) for v in variables]
  for i in range(len(x)):
    with tf.GradientTape() as tape:
      loss = _loss(y[i:i + 1], model(x[i:i + 1]))[0]
    grads = [g.numpy().astype(np.float64) for g in tape.gradient(loss, variables)]
    for group, clip in enumerate(clips):
      members = [v for v in range(len(variables)) if group_of_variable[v] == group]
      norm = np.sqrt(sum(np.sum(grads[v] ** 2) for v in members))
      for v in members:
        total[v] += grads[v] * min(1.0, clip / norm)
  return total


@pytest.mark.parametrize("method", ["fast", "vectorized"])
def test_clipped_sum_matches_the_brute_force_group_clipping(method):
  model = _model()
  clipped, _ = clipped_sum_for_model(model, _loss, X, Y, None, LayerClipNorms(CLIPS), None,
                                     method)
  reference = _reference(model, X, Y, [0.05, 0.3], [0, 0, 0, 0, 1, 1])
  for got, want in zip(clipped.grads, reference):
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-7)
  norms = clipped.norms.numpy()  # whole-gradient norms; groups are clipped below them
  assert norms.min() > 0.3
  assert clipped.l2_norm_clip == pytest.approx(TOTAL, rel=1e-15)
  # Group-wise is not global clipping to the total: the sums differ.
  global_sum, _ = clipped_sum_for_model(model, _loss, X, Y, None, TOTAL, None, method)
  assert max(np.abs(a.numpy() - b.numpy()).max()
             for a, b in zip(global_sum.grads, clipped.grads)) > 1e-3


def test_removal_sensitivity_is_sqrt_of_the_sum_of_squared_clips_and_is_reached():
  model = _model()
  clips = LayerClipNorms({"a": 1e-3, "b": 2e-3, "c": 4e-3})  # far below every group norm
  total = float(np.sqrt(1e-6 + 4e-6 + 16e-6))

  def clipped_sum(keep):
    return clipped_sum_for_model(model, _loss, X[keep], Y[keep], None, clips, None, "fast")[0].grads
  sensitivity = removal_sensitivity(clipped_sum, 6)
  assert sensitivity <= total * (1 + 1e-5)
  assert sensitivity >= total * (1 - 1e-4)  # every group clipped: the bound is attained
  assert clips.total == pytest.approx(total, rel=1e-15)


def test_noise_std_is_sigma_times_the_total_clip_over_the_normaliser():
  # Noise is the difference of a noisy and a noise-free private gradient of the same batch.
  # 4 x 600 + 600 = 3000 coordinates: the std estimate has relative standard error 1.3%; a 6%
  # tolerance is 4.6 standard errors.
  keras.utils.set_random_seed(0)
  model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(600, name="wide"),
                            keras.layers.Dense(3, name="head")])
  clips = LayerClipNorms({"wide": 0.4, "head": 0.3})  # total 0.5
  sigma, n = 2.0, 8.0

  def grads(noise):
    optimizer = tf_dpkit.DPGradientDescentGaussianOptimizer(
        clips, noise, learning_rate=1.0, seed=3, expected_batch_size=n)
    return tf_dpkit.private_gradients(optimizer, model, _loss, X, Y)
  noise = np.concatenate([(a - b).numpy().ravel() for a, b in zip(grads(sigma), grads(0.0))])
  assert abs(np.std(noise) / (sigma * 0.5 / n) - 1) < 0.06


def test_fit_accounts_the_noise_multiplier_sigma():
  x = RNG.normal(size=(100, 4)).astype(np.float32)
  y = RNG.integers(0, 3, size=100)
  keras.utils.set_random_seed(0)
  model = tf_dpkit.DPSequential([keras.Input((4,)), keras.layers.Dense(3, name="c")])
  optimizer = tf_dpkit.DPGradientDescentGaussianOptimizer(
      LayerClipNorms({"c": 0.5}), 1.3, learning_rate=0.1, expected_batch_size=10.0)
  model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(
      from_logits=True))
  budget = PrivacyBudget(0.1, 1e-5)
  model.fit(tf_dpkit.data.poisson_batches((x, y), expected_batch_size=10, steps=3, seed=0),
            epochs=1, steps_per_epoch=3, callbacks=[budget], verbose=0)
  orders = rdp_accountant.DEFAULT_ORDERS
  reference = rdp_accountant.get_privacy_spent(
      orders, rdp_accountant.compute_rdp(0.1, 1.3, 3, orders), target_delta=1e-5)[0]
  assert budget.accountant.epsilon() == pytest.approx(reference, rel=1e-12)


def test_optimizer_holds_the_total_and_its_config_round_trips():
  optimizer = tf_dpkit.DPAdamGaussianOptimizer(LayerClipNorms(CLIPS), 1.0, learning_rate=0.1)
  assert optimizer.l2_norm_clip == pytest.approx(TOTAL, rel=1e-15)
  assert optimizer.layer_clip_norms == LayerClipNorms(CLIPS)
  again = type(optimizer).from_config(optimizer.get_config())
  assert again.layer_clip_norms == LayerClipNorms(CLIPS)
  assert again.l2_norm_clip == optimizer.l2_norm_clip


# -- refusals -----------------------------------------------------------------------------


@pytest.mark.parametrize("clip_norms, error, match", [
    ({}, TypeError, "non-empty dict"),
    ([("a", 1.0)], TypeError, "non-empty dict"),
    ({3: 1.0}, TypeError, "a layer name or a non-empty tuple"),
    ({(): 1.0}, TypeError, "a layer name or a non-empty tuple"),
    ({"a": 0.0}, ValueError, "clip norm of 'a'"),
    ({"a": float("nan")}, ValueError, "clip norm of 'a'"),
    ({"a": -1.0}, ValueError, "clip norm of 'a'"),
    ({"a": 1.0, ("a", "b"): 1.0}, ValueError, r"name layer\(s\) \['a'\] twice"),
    ({("b", "b"): 1.0}, ValueError, r"name layer\(s\) \['b'\] twice"),
])
def test_bad_clip_norms_are_refused(clip_norms, error, match):
  with pytest.raises(error, match=match):
    LayerClipNorms(clip_norms)


@pytest.mark.parametrize("clip_norms, match", [
    ({"a": 1.0, "b": 1.0, "c": 1.0, "d": 1.0}, "'d', which is not a top-level layer"),
    ({"a": 1.0, "b": 1.0}, "without a clip norm"),
])
def test_clip_norms_must_cover_the_model_exactly(clip_norms, match):
  with pytest.raises(ValueError, match=match):
    clipped_sum_for_model(_model(), _loss, X, Y, None, LayerClipNorms(clip_norms))


def test_a_layer_without_weights_is_refused():
  keras.utils.set_random_seed(0)
  model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, name="c"),
                            keras.layers.Activation("relu", name="act")])
  with pytest.raises(ValueError, match="'act', which has no trainable variables"):
    LayerClipNorms({"c": 1.0, "act": 1.0}).resolve(model)


def test_optimizer_refusals():
  with pytest.raises(ValueError, match="grouped by the model's layers"):
    optimizer = tf_dpkit.DPGradientDescentGaussianOptimizer(LayerClipNorms({"a": 1.0}), 1.0,
                                                            learning_rate=0.1)
    w = tf.Variable(tf.ones([2]))
    optimizer.compute_gradients(lambda: tf.reduce_sum(w) * tf.ones([3]), [w])
  with pytest.raises(ValueError, match="adaptive_clipping cannot be combined with per-layer"):
    tf_dpkit.DPGradientDescentGaussianOptimizer(LayerClipNorms({"a": 1.0}), 1.0,
                                                learning_rate=0.1, adaptive_clipping=True,
                                                expected_batch_size=100.0)
  with pytest.raises(ValueError, match="is not the total sqrt"):
    tf_dpkit.DPGradientDescentGaussianOptimizer(1.0, 1.0, learning_rate=0.1,
                                                layer_clip_norms={"a": 0.5})
  with pytest.raises(ValueError, match="Give per-layer clip norms once"):
    tf_dpkit.DPGradientDescentGaussianOptimizer(LayerClipNorms({"a": 1.0}), 1.0,
                                                learning_rate=0.1, layer_clip_norms={"a": 1.0})
