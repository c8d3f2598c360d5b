"""The auditing side of tf_dpkit: canaries, audits, and the regression audits of broken pipelines.

The regression tests train a small model (8 features, 4 classes, 2,048 real examples, 256
canaries, 120 Poisson steps of expected batch 64) once per pipeline with fixed seeds and audit
it with 64 guesses at delta 1e-5 and 95% confidence.  The claimed epsilon (sigma 2, about 0.75)
is computed with analysis.rdp_accountant; a correct pipeline must audit below it, and each
broken pipeline (tf_dpkit.auditing.broken) above it, with the score fixed for that test in
advance.  (Measured when written: correct 0.0 with either score; noise off 2.55, the same
noise every step 2.55 (step_range), averaged clipping 1.84; 3.03 is the most 64 guesses can
show.)
"""
import math

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_dpkit
from analysis import auditing as stats
from analysis import gaussian, rdp_accountant
from tf_dpkit import auditing
from tf_dpkit.auditing import broken
from tf_dpkit.data import poisson_batches

N_REAL, DIM, CLASSES, CANARIES = 2048, 8, 4, 256
BATCH, STEPS, SIGMA, LR, GUESSES, DELTA = 64.0, 120, 2.0, 0.5, 64, 1e-5


def _data():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(N_REAL, DIM)).astype(np.float32)
  y = ((x[:, 0] > 0).astype(np.int32) + 2 * (x[:, 1] > 0)).astype(np.int32)
  return x, y


def _base():
  keras.utils.set_random_seed(0)
  return keras.Sequential([keras.Input((DIM,)), keras.layers.Dense(16, activation="relu"),
                           keras.layers.Dense(CLASSES)])


_LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)


def _audited_run(kind, with_model=False):
  """Trains once (correct or broken ``kind``); returns (canaries, trajectory, claimed eps)
  (and the model with ``with_model``)."""
  x, y = _data()
  canaries = auditing.make_canaries(CANARIES, CLASSES, seed=1)
  (x_all, codes), y_all = auditing.training_data(x, y, canaries)
  if kind == "correct":
    optimizer = tf_dpkit.DPGradientDescentGaussianOptimizer(
        1.0, SIGMA, learning_rate=LR, expected_batch_size=BATCH, seed=3)
    model_class = tf_dpkit.DPModel
  else:
    optimizer, model_class = broken.broken_training(
        kind, l2_norm_clip=1.0, noise_multiplier=SIGMA, expected_batch_size=BATCH,
        learning_rate=LR, seed=3)
  model = auditing.canary_model(_base(), CANARIES, model_class=model_class)
  model.compile(optimizer, loss=_LOSS)
  recorder = auditing.CanaryRecorder(canaries)
  model.fit(poisson_batches(((x_all, codes), y_all), expected_batch_size=BATCH, steps=STEPS,
                            seed=5), epochs=1, steps_per_epoch=STEPS, verbose=0,
            callbacks=[recorder])
  orders = rdp_accountant.DEFAULT_ORDERS
  rdp = rdp_accountant.compute_rdp(BATCH / len(y_all), SIGMA, STEPS, orders)
  claimed = rdp_accountant.get_privacy_spent(orders, rdp, target_delta=DELTA)[0]
  if with_model:
    return canaries, recorder.trajectory, claimed, model
  return canaries, recorder.trajectory, claimed


@pytest.fixture(scope="module")
def correct_run():
  return _audited_run("correct")


@pytest.mark.parametrize("score", ["sum", "step_range"])
def test_a_correct_pipeline_audits_below_its_claimed_epsilon(correct_run, score):
  canaries, trajectory, claimed = correct_run
  assert trajectory.shape == (STEPS + 1, CANARIES)
  audit = auditing.one_run_audit(auditing.canary_scores(trajectory, score), canaries.included,
                                 GUESSES, delta=DELTA)
  # The audit could show at most max_epsilon_lower_bound, which is above the claim: the test
  # could fail.
  assert audit.max_epsilon_lower_bound > claimed
  assert audit.epsilon_lower_bound < claimed


@pytest.mark.parametrize("kind, score", [("noise_off", "sum"),
                                         ("same_noise_every_step", "step_range"),
                                         ("averaged_clipping", "sum")])
def test_the_audit_catches_a_broken_pipeline(kind, score):
  canaries, trajectory, claimed = _audited_run(kind)
  audit = auditing.one_run_audit(auditing.canary_scores(trajectory, score), canaries.included,
                                 GUESSES, delta=DELTA)
  assert audit.epsilon_lower_bound > claimed, (kind, audit, claimed)


def test_black_box_scores_are_minus_the_canary_losses_and_catch_noise_off():
  canaries, _, claimed, model = _audited_run("noise_off", with_model=True)
  scores = auditing.black_box_scores(model, canaries, _LOSS)
  j = 3
  code = np.zeros((1, CANARIES), np.float32)
  code[0, j] = canaries.scale
  expected = -_LOSS(canaries.labels[j:j + 1], model([np.zeros((1, DIM), np.float32), code]))
  assert scores[j] == pytest.approx(float(expected[0]), rel=1e-5)
  audit = auditing.one_run_audit(scores, canaries.included, GUESSES, delta=DELTA)
  assert audit.epsilon_lower_bound > claimed


def test_canaries_touch_only_their_own_row_of_the_head():
  canaries = auditing.make_canaries(6, CLASSES, seed=2)
  x, y = _data()
  model = auditing.canary_model(_base(), 6, model_class=keras.Model)
  (x_all, codes), y_all = auditing.training_data(x[:5], y[:5], canaries)
  head = model.get_layer("canary_head").kernel
  inside = np.flatnonzero(canaries.included)
  for i in range(len(y_all)):
    with tf.GradientTape() as tape:
      loss = _LOSS(y_all[i:i + 1], model([x_all[i:i + 1], codes[i:i + 1]]))
    grad = tape.gradient(loss, head).numpy()
    rows = np.flatnonzero(np.abs(grad).sum(axis=1))
    if i < 5:
      assert rows.size == 0  # real examples never touch the head
    else:
      assert rows.tolist() == [inside[i - 5]]
      # Its entry at the canary's label is the cross-entropy gradient -s (1 - p_y) < 0.
      assert grad[inside[i - 5], canaries.labels[inside[i - 5]]] < 0


def test_training_data_and_canary_set():
  canaries = auditing.make_canaries(1000, 10, seed=0, scale=7.0)
  assert canaries.included.dtype == bool
  # Each canary included w.p. 1/2: 1,000 draws, mean within 4 standard errors (0.016).
  assert abs(canaries.included.mean() - 0.5) < 4 * 0.5 / np.sqrt(1000)
  assert set(np.unique(canaries.labels)) == set(range(10))
  x = np.ones((3, 2, 2), np.float32)
  (x_all, codes), y_all = auditing.training_data(x, np.array([1, 2, 3]), canaries)
  k = int(canaries.included.sum())
  assert x_all.shape == (3 + k, 2, 2) and codes.shape == (3 + k, 1000) and y_all.shape == (3 + k,)
  assert np.all(x_all[3:] == 0) and np.all(codes[:3] == 0)
  assert np.all(codes[3:].sum(axis=1) == 7.0)
  np.testing.assert_array_equal(np.argmax(codes[3:], axis=1), np.flatnonzero(canaries.included))
  np.testing.assert_array_equal(y_all[3:], canaries.labels[canaries.included])
  assert "included" not in repr(canaries)


def test_canary_scores_are_the_stated_functions_of_the_trajectory():
  trajectory = np.array([[0.0, 1.0], [0.5, 1.0], [0.5, 3.0], [2.0, 2.0]])
  np.testing.assert_allclose(auditing.canary_scores(trajectory, "sum"), [2.0, 1.0])
  # Steps: [0.5, 0, 1.5] and [0, 2, -1].
  np.testing.assert_allclose(auditing.canary_scores(trajectory, "step_range"), [1.5, 3.0])


def test_one_run_audit_guesses_the_extremes_and_uses_the_binomial_bound():
  scores = np.array([5.0, 4.0, 3.0, 2.0, 1.0, 0.0, -1.0, -2.0])
  included = np.array([True, False, True, True, False, True, False, False])
  audit = auditing.one_run_audit(scores, included, 4, delta=0.0)
  # In: canaries 0, 1 (one right); out: 7, 6 (both right).
  assert audit.num_correct == 3 and audit.num_guesses == 4 and audit.num_canaries == 8
  assert audit.epsilon_lower_bound == stats.one_run_epsilon_lower_bound(8, 4, 3)
  assert audit.max_epsilon_lower_bound == stats.max_one_run_epsilon_lower_bound(8, 4)
  # Ties: lower index first, both ways.
  tied = auditing.one_run_audit(np.zeros(4), np.array([True, True, False, False]), 2)
  assert tied.num_correct == 1  # in: canary 0 (right); out: canary 0 (wrong)


def test_many_run_audit_bounds_a_simulated_gaussian_mechanism():
  # A Gaussian mechanism with noise multiplier 1: scores N(1, 1) with the canary, N(0, 1)
  # without.  Its epsilon at delta 1e-5 (analytic) bounds every valid lower bound; with 2,000
  # runs the bound is clearly positive.
  from analysis import gaussian  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(4)
  audit = auditing.many_run_audit(rng.normal(1.0, 1.0, 2000), rng.normal(0.0, 1.0, 2000),
                                  delta=1e-5)
  assert 0.3 < audit.epsilon_lower_bound < gaussian.epsilon_for_delta(1.0, 1e-5)
  assert audit.positives == audit.negatives == 1000
  assert audit.epsilon_lower_bound == stats.epsilon_lower_bound(
      audit.true_positives, 1000, audit.false_positives, 1000, delta=1e-5)


def test_membership_report_matches_a_brute_force_auc():
  x, y = _data()
  model = _base()
  members, nonmembers = (x[:100], y[:100]), (x[100:300], y[100:300])
  report = auditing.membership_inference_report(model, members, nonmembers, _LOSS,
                                                batch_size=64)
  s_in = -_LOSS(members[1], model(members[0])).numpy().astype(np.float64)
  s_out = -_LOSS(nonmembers[1], model(nonmembers[0])).numpy().astype(np.float64)
  brute = np.mean([(a > b) + 0.5 * (a == b) for a in s_in for b in s_out])
  assert report.auc == pytest.approx(brute, abs=1e-9)
  assert report.num_members == 100 and report.num_nonmembers == 200
  assert set(report.tpr_at_fpr) == {0.001, 0.01, 0.1}


@pytest.mark.parametrize("call, message", [
    (lambda: auditing.make_canaries(1, 10), r"num_canaries must be an integer in \[2, inf\]"),
    (lambda: auditing.make_canaries(5, 1), r"num_classes must be an integer in \[2, inf\]"),
    (lambda: auditing.make_canaries(5, 3, scale=0.0), r"scale must be"),
    (lambda: auditing.canary_scores(np.zeros((1, 3))), r"trajectory must be \[steps \+ 1"),
    (lambda: auditing.canary_scores(np.zeros((2, 3)), "max"), r"score must be one of"),
    (lambda: auditing.one_run_audit(np.zeros(4), np.zeros(4, bool), 3),
     r"num_guesses must be even"),
    (lambda: auditing.one_run_audit(np.zeros(4), np.zeros(4, bool), 6),
     r"num_guesses must be an integer in \[2, 4\]"),
    (lambda: auditing.one_run_audit(np.zeros(4), np.zeros(3, bool), 2),
     r"scores and included must be 1-D of the same length"),
    (lambda: auditing.one_run_audit(np.zeros(4), np.zeros(4), 2), r"included must be boolean"),
    (lambda: auditing.one_run_audit(np.array([0, 1, np.nan, 2]), np.zeros(4, bool), 2),
     r"scores must be finite"),
    (lambda: auditing.many_run_audit([1.0], [0.0, 1.0]), r"scores_with must be a 1-D array"),
    (lambda: auditing.training_data(np.zeros((3, 2)), np.zeros(2, int),
                                    auditing.make_canaries(2, 2, seed=0)),
     r"x and y must hold the same number"),
    (lambda: broken.broken_training("typo", l2_norm_clip=1.0, noise_multiplier=1.0,
                                    expected_batch_size=8.0, learning_rate=0.1),
     r"kind must be one of"),
    (lambda: broken.broken_training("noise_off", l2_norm_clip=0.0, noise_multiplier=1.0,
                                    expected_batch_size=8.0, learning_rate=0.1),
     r"l2_norm_clip must be"),
])
def test_bad_arguments_are_refused_by_name(call, message):
  with pytest.raises(ValueError, match=message):
    call()


def test_canary_model_needs_one_input_and_logits():
  two_outputs = keras.Model(*(lambda i: (i, [keras.layers.Dense(2)(i), keras.layers.Dense(2)(i)]))(
      keras.Input((3,))))
  with pytest.raises(ValueError, match="base must be a built Keras model with one input"):
    auditing.canary_model(two_outputs, 4)


def _one_step_scores(noise_multiplier, runs, seed):
  """Scores of one DP-SGD step (tf_dpkit.private_gradients) with and without a canary.

  A linear model on 3 features; 16 real examples use features 0-1 only, the canary (feature
  2 = 50, so its gradient norm is far above C = 1: clipping-aware) is the only example touching
  weight row 2.  Score: minus the private gradient at w[2, label] (SGD would raise it).
  """
  model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(
      2, use_bias=False, kernel_initializer="zeros")])  # the canary starts at p = 1/2
  optimizer = tf_dpkit.DPGradientDescentGaussianOptimizer(1.0, noise_multiplier,
                                                          learning_rate=1.0, seed=seed)
  rng = np.random.default_rng(seed)
  x = np.zeros((16, 3), np.float32)
  x[:, :2] = rng.normal(size=(16, 2))
  y = rng.integers(0, 2, 16).astype(np.int32)
  canary_x, canary_y = np.array([[0.0, 0.0, 50.0]], np.float32), np.array([1], np.int32)

  @tf.function
  def score(xb, yb):
    grads = tf_dpkit.private_gradients(optimizer, model, _LOSS, xb, yb)
    return -grads[0][2, 1]
  with_ = [float(score(np.concatenate([x, canary_x]), np.concatenate([y, canary_y])))
           for _ in range(runs)]
  without = [float(score(x, y)) for _ in range(runs)]
  return np.array(with_), np.array(without)


@pytest.mark.parametrize("sigma", [1.0, 0.0])
def test_many_run_audit_of_one_dp_sgd_step(sigma):
  # One step of the Gaussian mechanism with noise multiplier sigma (sensitivity C of the sum):
  # its epsilon at delta 1e-5 (analytic, analysis.gaussian) must bound the audit at sigma 1;
  # without noise the canary is always seen and the bound is large.  400 runs each.
  from analysis import gaussian  # pylint: disable=g-import-not-at-top
  with_, without = _one_step_scores(sigma, 400, seed=11)
  audit = auditing.many_run_audit(with_, without, delta=1e-5)
  if sigma:
    assert 0.2 < audit.epsilon_lower_bound < gaussian.epsilon_for_delta(sigma, 1e-5)
  else:
    # 200 of 200 caught, no false positive: the most 200 + 200 runs can show (about 3.98).
    assert audit.epsilon_lower_bound > 3.5


# ------------------------------------------------------------------------------------------
# Dirac canaries: a fixed unit gradient in a coordinate of their own, through DPModel.


def _dirac_run(kind, sigma, canaries, steps, normaliser=64.0, lr=0.5, seed=3):
  """Full-batch training of the Dirac canary model; the recorded head in units lr C / n."""
  x, y = _data()
  x, y = x[:32], y[:32]
  if kind == "dp":
    optimizer = tf_dpkit.DPGradientDescentGaussianOptimizer(
        1.0, sigma, learning_rate=lr, expected_batch_size=normaliser, seed=seed)
    model_class = tf_dpkit.DPModel
  else:
    optimizer, model_class = broken.broken_training(
        kind, l2_norm_clip=1.0, noise_multiplier=sigma, expected_batch_size=normaliser,
        learning_rate=lr, seed=seed)
  model = auditing.dirac_canary_model(_base(), canaries.num_canaries, model_class=model_class)
  model.compile(optimizer, loss=auditing.dirac_loss(scale=10.0))
  (x_all, index), y_all = auditing.dirac_training_data(x, y, canaries)
  batch = ((tf.constant(x_all), tf.constant(index)), tf.constant(y_all))
  recorder = auditing.DiracRecorder()
  model.fit(tf.data.Dataset.from_tensors(batch).repeat(steps), epochs=1, steps_per_epoch=steps,
            verbose=0, callbacks=[recorder])
  return recorder.trajectory * normaliser / lr


def test_dirac_canaries_move_exactly_their_own_coordinate_by_c_per_step():
  # Noise 0: an included canary's coordinate moves by exactly lr C / n each step (clipped
  # from norm 10 to C = 1), an excluded one's not at all, whatever the real examples do.
  canaries = auditing.make_canaries(40, CLASSES, seed=2)
  trajectory = _dirac_run("dp", 0.0, canaries, steps=3)
  expected = np.outer(np.arange(4), canaries.included.astype(np.float64))
  np.testing.assert_allclose(trajectory, expected, atol=1e-5)


def test_dirac_canary_noise_is_the_claimed_gaussian_and_the_audit_stays_below_it():
  # Full batch, T steps: each canary's total shift is T [included] + N(0, T sigma^2), so
  # each inclusion bit is a Gaussian mechanism with mu = sqrt(T) / sigma.
  m, steps, sigma = 2000, 4, 2.0
  canaries = auditing.make_canaries(m, CLASSES, seed=4)
  scores = auditing.canary_scores(_dirac_run("dp", sigma, canaries, steps))
  shift = scores[canaries.included].mean() - scores[~canaries.included].mean()
  spread = scores[~canaries.included].std()
  assert abs(shift - steps) < 4 * sigma * math.sqrt(steps) * math.sqrt(4.0 / m)
  assert abs(spread / (sigma * math.sqrt(steps)) - 1) < 0.1
  mu = math.sqrt(steps) / sigma
  audit = auditing.one_run_audit(scores, canaries.included, 200, delta=DELTA)
  assert audit.gdp_mu_lower_bound < mu
  assert audit.fdp_epsilon_lower_bound < gaussian.epsilon_for_delta(1 / mu, DELTA)
  assert audit.fdp_epsilon_lower_bound == stats.one_run_fdp_epsilon_lower_bound(
      m, 200, audit.num_correct, DELTA)


@pytest.mark.parametrize("kind", ["noise_off", "averaged_clipping"])
def test_the_dirac_audit_catches_a_broken_pipeline(kind):
  m, steps = 400, 2
  sigma = gaussian.noise_multiplier_for_epsilon(1.0, DELTA, count=steps)
  canaries = auditing.make_canaries(m, CLASSES, seed=6)
  scores = auditing.canary_scores(_dirac_run(kind, sigma, canaries, steps))
  audit = auditing.one_run_audit(scores, canaries.included, 100, delta=DELTA)
  assert audit.epsilon_lower_bound > 1.0 and audit.fdp_epsilon_lower_bound > 1.0


def test_dirac_training_data_and_loss():
  canaries = auditing.CanarySet(np.zeros(3, np.int64), np.array([True, False, True]), 1.0, 2)
  x = np.ones((2, 3), np.float32)
  (x_all, index), y_all = auditing.dirac_training_data(x, np.array([1, 0]), canaries)
  np.testing.assert_array_equal(index, [0, 0, 0, 2])
  np.testing.assert_array_equal(y_all, [1, 0, -1, -1])
  np.testing.assert_array_equal(x_all[2:], 0.0)
  logits = tf.constant([[0.0, 0.0, 5.0], [2.0, 0.0, -3.0]])
  losses = auditing.dirac_loss(scale=4.0)(tf.constant([-1, 0]), logits).numpy()
  np.testing.assert_allclose(losses, [-20.0, math.log(1 + math.exp(-2.0))], rtol=1e-6)
  with pytest.raises(ValueError, match="y must be integer class labels >= 0"):
    auditing.dirac_training_data(x, np.array([1, -1]), canaries)
  with pytest.raises(ValueError, match="scale must be"):
    auditing.dirac_loss(scale=0.0)
  with pytest.raises(ValueError, match="num_canaries"):
    auditing.dirac_canary_model(_base(), 1)
