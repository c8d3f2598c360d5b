"""Noise-multiplier and clip-norm schedules in the Keras DP optimizers and the budget callback.

References: the noise std of every step (sample stds per piece), exact clipped sums with noise
0 (the rows' norms are known), dp_accounting composing the pieces for the logged epsilon.
"""
import math

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_dpkit
from analysis.schedules import PiecewiseConstant
from dp_references import dp_accounting, dp_rdp
from tf_dpkit.budget import PrivacyLedger, PrivacyBudget
from tf_dpkit.clipping import clipped_sum_vectorized
from tf_dpkit.data import poisson_batches
from tf_dpkit.optimizers import DPGradientDescentGaussianOptimizer as DPSGD

ORDERS = [1 + x / 4 for x in range(1, 39)] + list(range(11, 65)) + [128, 256, 512, 1024]
DIM = 16


def _output_as_loss(y_true, y_pred):
  del y_true
  return y_pred[:, 0]


def _linear_model(dim=DIM):
  return tf_dpkit.DPSequential([keras.Input((dim,)), keras.layers.Dense(1, use_bias=False)])


def test_each_step_gets_the_noise_and_clip_of_its_piece():
  """Zero inputs (zero gradients), kernel reset each step, SGD lr 1, n = 10: the update is
  -(noise) / n with std sigma_t C_t.  Schedules: sigma 0.5 then 2.0 (from step 150), C 1.0
  then 3.0 (from step 100): stds 0.5, 1.5, 6.0 over 100 / 50 / 150 steps x 16 parameters
  (1,600 / 800 / 2,400 draws: relative standard errors of the std 1.8%, 2.5%, 1.4%;
  tolerances 10%, 13%, 8%, over 5 of them)."""
  steps, n = 300, 10.0
  w = tf.Variable(tf.zeros([DIM]))
  optimizer = DPSGD(PiecewiseConstant([100], [1.0, 3.0]), PiecewiseConstant([150], [0.5, 2.0]),
                    expected_batch_size=n, learning_rate=1.0, seed=4)
  optimizer.build([w])
  x = tf.zeros([4, DIM])

  @tf.function
  def run():
    updates = tf.TensorArray(tf.float32, size=steps)
    for t in tf.range(steps):
      w.assign(tf.zeros_like(w))
      clipped, _ = clipped_sum_vectorized(lambda b: (tf.linalg.matvec(b[0], w), ()), (x,), [w],
                                          optimizer.l2_norm_clip_for_step())
      optimizer.apply(optimizer.privatize(clipped), [w])
      updates = updates.write(t, -tf.convert_to_tensor(w) * n)
    return updates.stack()

  noise = run().numpy().astype(np.float64)
  assert int(optimizer.iterations.numpy()) == steps
  for (start, stop), std, tolerance in (((0, 100), 0.5, 0.10), ((100, 150), 1.5, 0.13),
                                        ((150, 300), 6.0, 0.08)):
    assert np.std(noise[start:stop]) / std == pytest.approx(1.0, abs=tolerance)


def test_a_clip_schedule_clips_each_step_at_its_value_exactly():
  """Noise 0: each step's update is -lr * (sum of rows clipped at C_t) / n, rows of norms 0.5,
  1, 2, 4; C_t = 0.75, 0.75, 3.0, 3.0 (boundary at step 2)."""
  rng = np.random.default_rng(0)
  rows = rng.normal(size=(4, 3))
  rows *= (np.array([0.5, 1.0, 2.0, 4.0]) / np.linalg.norm(rows, axis=1))[:, None]
  model = _linear_model(3)
  model.compile(optimizer=DPSGD(PiecewiseConstant([2], [0.75, 3.0]), 0.0, expected_batch_size=4,
                                learning_rate=1.0), loss=_output_as_loss)
  for step, clip in enumerate([0.75, 0.75, 3.0, 3.0]):
    before = model.trainable_variables[0].numpy()[:, 0].astype(np.float64)
    model.train_on_batch(rows.astype(np.float32), np.zeros(4, np.float32))
    after = model.trainable_variables[0].numpy()[:, 0]
    norms = np.linalg.norm(rows, axis=1)
    wanted = (rows * np.minimum(1.0, clip / norms)[:, None]).sum(axis=0) / 4
    np.testing.assert_allclose(before - after, wanted, rtol=1e-5, atol=1e-7,
                               err_msg=f"step {step}")


def test_fit_accounts_every_piece_and_stops_at_the_budget():
  dpa, rdp = dp_accounting(), dp_rdp()
  n, batch, q, delta = 128, 16, 16 / 128, 1e-5
  rng = np.random.default_rng(1)
  data = rng.normal(size=(n, 3)).astype(np.float32), rng.integers(0, 2, n)
  schedule = PiecewiseConstant([5, 12], [3.0, 1.5, 4.0])

  def model():
    m = tf_dpkit.DPSequential([keras.Input((3,)), keras.layers.Dense(2)])
    m.compile(DPSGD(1.0, schedule, learning_rate=0.1, expected_batch_size=batch, seed=0),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return m

  def reference(steps):
    accountant = rdp.RdpAccountant(ORDERS)
    accountant.compose(dpa.ComposedDpEvent([
        dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(z)), k)
        for z, k in schedule.pieces(0, steps)]))
    return accountant.get_epsilon(delta)

  # A budget between the epsilons after 9 and 10 steps: training stops after 9.
  target = (reference(9) + reference(10)) / 2
  budget = PrivacyBudget(q, delta, target, verbose=False)
  fitted = model()
  history = fitted.fit(poisson_batches(data, expected_batch_size=batch, steps=16, seed=2),
                       epochs=2, steps_per_epoch=8, verbose=0, callbacks=[budget])
  assert int(fitted.optimizer.iterations.numpy()) == 9 == budget.stopped_at_step
  assert [(p.noise_multiplier, p.steps) for p in budget.accountant.phases] == [(3.0, 5),
                                                                                (1.5, 4)]
  for logged, steps in zip(history.history["epsilon"], (8, 9)):
    assert logged == pytest.approx(reference(steps), rel=1e-4)
    assert logged <= reference(steps) * (1 + 1e-12)
  assert budget.accountant.epsilon() <= target < reference(10)


def test_a_schedule_that_would_overflow_the_ledger_is_refused_before_any_step():
  too_many = PiecewiseConstant(list(range(1, 65)), [1.0 + (i % 2) for i in range(65)])
  with pytest.raises(ValueError, match="65 pieces.*at most 64 phases"):
    DPSGD(1.0, too_many, learning_rate=0.1, expected_batch_size=16)
  # 40 pieces fit the ledger alone, not after 30 recorded phases.
  forty = PiecewiseConstant(list(range(1, 40)), [1.0 + (i % 2) for i in range(40)])
  accountant = PrivacyLedger(1e-5)
  for i in range(30):
    accountant.record(0.1, 5.0 + i, 1)
  model = tf_dpkit.DPSequential([keras.Input((3,)), keras.layers.Dense(2)])
  model.compile(DPSGD(1.0, forty, learning_rate=0.1, expected_batch_size=16, seed=0),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  data = np.zeros((160, 3), np.float32), np.zeros(160, np.int64)
  budget = PrivacyBudget(0.1, accountant=accountant, verbose=False)
  with pytest.raises(ValueError, match="privacy ledger hold 70 phases"):
    model.fit(poisson_batches(data, expected_batch_size=16, steps=40, seed=0), epochs=1,
              steps_per_epoch=40, verbose=0, callbacks=[budget])
  assert int(model.optimizer.iterations.numpy()) == 0


def test_schedules_round_trip_through_the_config():
  optimizer = DPSGD({"boundaries": [10], "values": [1.0, 0.5]},
                    PiecewiseConstant([20, 30], [1.1, 0.9, 1.3]), learning_rate=0.1,
                    expected_batch_size=8)
  config = optimizer.get_config()
  assert config["l2_norm_clip"] == {"boundaries": [10], "values": [1.0, 0.5]}
  restored = DPSGD.from_config(config)
  assert restored.noise_multiplier_schedule == PiecewiseConstant([20, 30], [1.1, 0.9, 1.3])
  assert restored.l2_norm_clip == PiecewiseConstant([10], [1.0, 0.5])


def test_unsupported_combinations_are_refused():
  schedule = PiecewiseConstant([3], [1.0, 2.0])
  with pytest.raises(ValueError, match="adaptive_clipping does not combine"):
    DPSGD(schedule, 1.0, expected_batch_size=64, adaptive_clipping=True, learning_rate=0.1)
  with pytest.raises(ValueError, match="gradient_accumulation_steps"):
    DPSGD(1.0, schedule, expected_batch_size=64, gradient_accumulation_steps=2,
          learning_rate=0.1)
  with pytest.raises(ValueError, match="Keras 3 DP optimizers only"):
    tf_dpkit.v1.DPGradientDescentGaussianOptimizer(1.0, schedule, learning_rate=0.1)
  with pytest.raises(ValueError, match="noise_multiplier values"):
    DPSGD(1.0, PiecewiseConstant([3], [1.0, 2.0]).get_config() | {"values": [1.0, -1.0]},
          learning_rate=0.1)
  # A sum clipped at a number, not at this step's scheduled clip, is refused before any noise.
  optimizer = DPSGD(PiecewiseConstant([3], [0.5, 2.0]), 1.0, learning_rate=0.1)
  w = tf.Variable(tf.ones([3]))
  clipped, _ = clipped_sum_vectorized(lambda b: (tf.linalg.matvec(b[0], w), ()),
                                      (tf.ones([2, 3]),), [w], 0.5)
  with pytest.raises(ValueError, match="l2_norm_clip schedule"):
    optimizer.privatize(clipped)
  assert math.isclose(float(optimizer.l2_norm_clip_for_step()), 0.5)
