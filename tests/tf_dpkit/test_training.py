"""tf_dpkit.make_private: one configuration for optimizer, batches and budget, checked against
independent references (dp_accounting events built by hand, mpmath), and the budget's refusal
of pipelines whose numbers disagree with its own."""
import math
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_dpkit
from tf_dpkit.budget import PrivacyBudget
from tf_dpkit.data import poisson_batches, shuffled_batches
from analysis import accountants, events
from dp_references import dp_accounting, dp_pld, dp_rdp, exact_gaussian_epsilon

N = 200
ORDERS = [1 + x / 4 for x in range(1, 39)] + list(range(11, 65)) + [128, 256, 512, 1024]


def _data():
  rng = np.random.default_rng(0)
  return rng.normal(size=(N, 4)).astype(np.float32), rng.integers(0, 2, N)


def _poisson_reference(q, sigma, steps, delta=1e-5):
  """RDP epsilon of a hand-built event (independent of the configuration -> event mapping),
  checked to lie between dp_accounting's PLD and RDP values for the same event (dp_accounting's
  RDP is looser than ours at fractional orders, its PLD tighter than any RDP bound)."""
  ours = accountants.make_accountant("rdp").compose(
      events.SelfComposedEvent(events.PoissonSampledEvent(q, events.GaussianEvent(sigma)),
                               steps)).get_epsilon(delta)
  dpa = dp_accounting()
  event = dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(sigma)), steps)
  rdp = dp_rdp().RdpAccountant(ORDERS)
  rdp.compose(event)
  pld = dp_pld().PLDAccountant(value_discretization_interval=1e-3)
  pld.compose(event)
  assert pld.get_epsilon(delta) * (1 - 1e-3) <= ours <= rdp.get_epsilon(delta) * (1 + 1e-9)
  return ours


def _model(private, inputs=None):
  if inputs is None:
    model = tf_dpkit.DPSequential([keras.Input((4,)), keras.layers.Dense(2)])
  else:
    model = tf_dpkit.DPModel(inputs, keras.layers.Dense(2)(inputs["features"]))
  model.compile(optimizer=private.optimizer(keras.optimizers.SGD, learning_rate=0.1),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  return model


def test_poisson_run_calibrated_to_a_budget_end_to_end():
  private = tf_dpkit.make_private(_data(), batch_size=20, epochs=3, l2_norm_clip=1.5,
                                  target_epsilon=3.0, delta=1e-5)
  assert (private.sampling_probability, private.steps_per_epoch, private.steps) == (0.1, 10, 30)
  sigma = private.noise_multiplier
  # Calibrated: meets the budget on the hand-built event, and tightly.
  assert _poisson_reference(0.1, sigma, 30) <= 3.0 * (1 + 1e-9)
  assert _poisson_reference(0.1, sigma * (1 - 1e-3), 30) > 3.0
  model = _model(private)
  optimizer = model.optimizer
  assert (optimizer.noise_multiplier, optimizer.l2_norm_clip, optimizer.expected_batch_size,
          optimizer.num_microbatches) == (sigma, 1.5, 20.0, None)
  history = model.fit(**private.fit_arguments(seed=1, verbose=False), verbose=0)
  assert int(optimizer.iterations.numpy()) == 30
  expected = [_poisson_reference(0.1, sigma, 10 * e) for e in (1, 2, 3)]
  assert history.history["epsilon"] == pytest.approx(expected, rel=1e-6)
  assert private.epsilon == pytest.approx(expected[-1], rel=1e-6)


def test_shuffled_run_with_microbatches_is_exact_and_derives_epochs():
  # sigma 3, microbatches of 5: effective 1.5 per epoch (no amplification), exact Gaussian.
  private = tf_dpkit.make_private(_data(), batch_size=20, l2_norm_clip=1.0, noise_multiplier=3.0,
                                  target_epsilon=10.0, delta=1e-5, sampling="shuffle",
                                  num_microbatches=4)
  epochs = private.epochs
  assert exact_gaussian_epsilon(1.5, epochs, 1e-5) <= 10.0
  assert exact_gaussian_epsilon(1.5, epochs + 1, 1e-5) > 10.0  # the most whole epochs
  assert private.steps_per_epoch == 10 and private.microbatch_size == 5
  model = _model(private)
  assert model.optimizer.expected_batch_size is None and model.optimizer.num_microbatches == 4
  history = model.fit(**private.fit_arguments(seed=2, verbose=False), verbose=0)
  assert history.history["epsilon"] == pytest.approx(
      [exact_gaussian_epsilon(1.5, e, 1e-5) for e in range(1, epochs + 1)], rel=1e-6)


def test_dict_features_from_tf_data():
  x, y = _data()
  data = tf.data.Dataset.from_tensor_slices(({"features": x}, y))
  private = tf_dpkit.make_private(data, batch_size=25, epochs=1, l2_norm_clip=1.0,
                                  noise_multiplier=1.2, delta=1e-5)
  assert private.dataset_size == N and private.target_epsilon is None
  model = _model(private, {"features": keras.Input((4,), name="features")})
  history = model.fit(**private.fit_arguments(seed=3, verbose=False), verbose=0)
  assert history.history["epsilon"][-1] == pytest.approx(
      _poisson_reference(0.125, 1.2, 8), rel=1e-6)


def test_all_three_must_agree_and_two_are_needed():
  private = tf_dpkit.make_private(_data(), batch_size=20, epochs=2, l2_norm_clip=1.0,
                                  noise_multiplier=1.0, target_epsilon=50.0, delta=1e-5)
  assert private.epsilon == pytest.approx(_poisson_reference(0.1, 1.0, 20), rel=1e-6)
  with pytest.raises(ValueError, match=r"noise_multiplier=0.5 for 2 epochs spends epsilon=.* > "
                                       r"target_epsilon=1.0"):
    tf_dpkit.make_private(_data(), batch_size=20, epochs=2, l2_norm_clip=1.0,
                          noise_multiplier=0.5, target_epsilon=1.0, delta=1e-5)
  with pytest.raises(ValueError, match=r"Give two of epochs, noise_multiplier and "
                                       r"target_epsilon .* got only \['epochs'\]"):
    tf_dpkit.make_private(_data(), batch_size=20, epochs=2, l2_norm_clip=1.0, delta=1e-5)
  with pytest.raises(ValueError, match="does not allow even one epoch"):
    tf_dpkit.make_private(_data(), batch_size=20, l2_norm_clip=1.0, noise_multiplier=0.3,
                          target_epsilon=0.5, delta=1e-5)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(batch_size=0), ValueError, r"batch_size must be an integer in \[1, 200\]"),
    (dict(batch_size=201), ValueError, r"batch_size must be an integer in \[1, 200\]"),
    (dict(l2_norm_clip=0.0), ValueError, r"l2_norm_clip must be a finite number in \(0, inf\)"),
    (dict(delta=1.0), ValueError, r"delta must be in \(0, 1\)"),
    (dict(epochs=0), ValueError, r"epochs must be an integer in \[1, 1000000\]"),
    (dict(epochs=1.5), ValueError, r"epochs must be an integer"),
    (dict(sampling="random"), ValueError, r"sampling must be one of \['poisson', 'shuffle'\]"),
    (dict(accountant="moments"), ValueError, r"accountant must be one of \['pld', 'rdp'\]"),
    (dict(num_microbatches=4), ValueError, r"num_microbatches needs sampling='shuffle'"),
    (dict(sampling="shuffle", num_microbatches=3), ValueError,
     r"num_microbatches must divide batch_size=20, got 3"),
    (dict(noise_multiplier=-1.0), ValueError, r"noise_multiplier must be >= 0"),
    (dict(target_epsilon=0.0, noise_multiplier=None), ValueError, r"target_epsilon must be > 0"),
])
def test_bad_arguments_name_the_argument(kwargs, error, match):
  base = dict(batch_size=20, epochs=2, l2_norm_clip=1.0, noise_multiplier=1.0, delta=1e-5)
  base.update(kwargs)
  if base.get("noise_multiplier") is None:
    base.pop("noise_multiplier")
  with pytest.raises(error, match=match):
    tf_dpkit.make_private(_data(), **base)


def test_delta_not_below_one_over_n_warns_and_optimizer_settings_are_not_overridable():
  with pytest.warns(UserWarning, match=r"delta=0.01 is not below 1/N = 0.005"):
    tf_dpkit.make_private(_data(), batch_size=20, epochs=1, l2_norm_clip=1.0,
                          noise_multiplier=1.0, delta=0.01)
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    private = tf_dpkit.make_private(_data(), batch_size=20, epochs=1, l2_norm_clip=1.0,
                                    noise_multiplier=1.0, delta=1e-5)
  with pytest.raises(ValueError, match=r"\['noise_multiplier'\] are set by the DPTraining"):
    private.optimizer(keras.optimizers.SGD, noise_multiplier=0.1)
  with pytest.raises(TypeError, match="needs a Keras 3 optimizer class"):
    private.optimizer("sgd")
  adam = private.optimizer(keras.optimizers.Adam, learning_rate=1e-3)
  assert isinstance(adam, keras.optimizers.Adam) and adam.expected_batch_size == 20.0


# ------------------------------------------------------------------------------------------
# The budget refuses numbers that disagree with a tf_dpkit pipeline.


def _dp_model(expected_batch_size=20):
  model = tf_dpkit.DPSequential([keras.Input((4,)), keras.layers.Dense(2)])
  model.compile(tf_dpkit.DPGradientDescentGaussianOptimizer(
      1.0, 1.0, learning_rate=0.1, expected_batch_size=expected_batch_size, seed=0),
      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  return model


@pytest.mark.parametrize("make_data, budget, expected_batch_size, match", [
    (lambda: poisson_batches(_data(), expected_batch_size=20, steps=4, seed=1),
     dict(sampling_probability=0.05), 20,
     r"sampling probability q = 0.1, but PrivacyBudget was given sampling_probability=0.05"),
    (lambda: poisson_batches(_data(), expected_batch_size=20, steps=4, seed=1),
     dict(sampling_probability=0.1), 10,
     r"expected batch size qN = 20.0, but the optimizer normalises by expected_batch_size=10"),
    (lambda: shuffled_batches(_data(), 20, 1, seed=1),
     dict(sampling_probability=0.1), 20,
     r"fit was given shuffle batches .* but PrivacyBudget has sampling='poisson'"),
    (lambda: shuffled_batches(_data(), 20, 1, seed=1),
     dict(sampling_probability=0.1, sampling="shuffle", steps_per_epoch=5), None,
     r"with 10 batches per epoch, but PrivacyBudget was given steps_per_epoch=5"),
])
def test_budget_refuses_a_pipeline_that_disagrees(make_data, budget, expected_batch_size, match):
  model = _dp_model(expected_batch_size)
  with pytest.raises(ValueError, match=match):
    model.fit(make_data(), epochs=1, steps_per_epoch=4, verbose=0,
              callbacks=[PrivacyBudget(verbose=False, **budget)])
  assert int(model.optimizer.iterations.numpy()) == 0  # refused before any step


def test_budget_accepts_the_pipeline_it_describes():
  model = _dp_model()
  history = model.fit(poisson_batches(_data(), expected_batch_size=20, steps=4, seed=1),
                      epochs=1, steps_per_epoch=4, verbose=0,
                      callbacks=[PrivacyBudget(0.1, verbose=False)])
  assert math.isclose(history.history["epsilon"][-1], _poisson_reference(0.1, 1.0, 4),
                      rel_tol=1e-6)


def test_the_issue_example_fit_on_arrays():
  # Issue 12's example: fit(x, y, batch_size=20) on 200 examples, noise 1.1, 2 epochs.  As
  # Poisson it used to log 3.50; it is refused, and accounted as what ran (shuffled fixed
  # batches) it is the exact Gaussian epsilon 5.87.
  x, y = _data()
  model = tf_dpkit.DPSequential([keras.Input((4,)), keras.layers.Dense(2)])
  model.compile(tf_dpkit.DPGradientDescentGaussianOptimizer(1.0, 1.1, learning_rate=0.1),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  with pytest.raises(ValueError, match="given in-memory arrays"):
    model.fit(x, y, batch_size=20, epochs=2, verbose=0,
              callbacks=[PrivacyBudget(20 / 200, delta=1e-5, verbose=False)])
  history = model.fit(x, y, batch_size=20, epochs=2, verbose=0, callbacks=[PrivacyBudget(
      20 / 200, delta=1e-5, sampling="shuffle", steps_per_epoch=10, verbose=False)])
  assert history.history["epsilon"][-1] == pytest.approx(
      exact_gaussian_epsilon(1.1, 2, 1e-5), rel=1e-9)
  assert round(history.history["epsilon"][-1], 2) == 5.87
