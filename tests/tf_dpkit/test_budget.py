"""Privacy accountant, the PrivacyBudget callback and train-to-a-budget, against analysis/."""
import math
import warnings

import keras
import numpy as np
import pytest

import tf_dpkit
from analysis import calibration, pld_accountant, rdp_accountant
from tf_dpkit.budget import PrivacyLedger, PrivacyBudget, noise_multiplier_for_budget
from tf_dpkit.data import poisson_batches
from dp_references import exact_gaussian_epsilon

ORDERS = rdp_accountant.DEFAULT_ORDERS


def _rdp_eps(qs, sigmas, steps, delta=1e-5):
  rdp = rdp_accountant.compute_heterogeneous_rdp(qs, sigmas, steps, ORDERS)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    return rdp_accountant.get_privacy_spent(ORDERS, rdp, target_delta=delta)[0]


def test_poisson_phases_match_analysis_for_rdp_and_pld():
  acc = PrivacyLedger(1e-5)
  acc.record(0.01, 1.1, 300)
  acc.record(0.01, 1.1, 200)  # merged with the previous phase
  acc.record(0.02, 0.9, 100)
  assert len(acc.phases) == 2 and acc.steps == 600
  assert math.isclose(acc.epsilon(), _rdp_eps([0.01, 0.02], [1.1, 0.9], [500, 100]), rel_tol=1e-12)
  pld = PrivacyLedger.from_state_dict({**acc.state_dict(), "accountant": "pld"})
  expected = pld_accountant.compute_epsilon_heterogeneous([0.01, 0.02], [1.1, 0.9], [500, 100], 1e-5)
  assert math.isclose(pld.epsilon(), expected, rel_tol=1e-12)
  assert pld.epsilon() < acc.epsilon()  # PLD is the tighter accountant here


def test_pld_accountant_reports_the_smaller_of_pld_and_rdp():
  # Issue 11: 1e6 epochs of MNIST at batch 256, where the PLD grid alone gives 23,722 against
  # RDP's 3,451; both are valid, so the PLD accountant reports the smaller (3,072.5).
  q, steps = 256 / 60000, 234_375_000
  rdp = PrivacyLedger(1e-5)
  rdp.record(q, 1.1, steps)
  pld = PrivacyLedger.from_state_dict({**rdp.state_dict(), "accountant": "pld"})
  capped = pld_accountant.compute_epsilon_with_rdp_cap([q], [1.1], [steps], 1e-5)
  assert pld.epsilon() == capped.epsilon <= rdp.epsilon() == pytest.approx(3451.09, abs=0.01)
  assert 3000 < pld.epsilon() < 3073 and capped.pld_epsilon > 20000


def test_shuffle_is_accounted_without_amplification_and_microbatches_halve_sigma():
  acc = PrivacyLedger(1e-5)
  acc.record(0.1, 1.2, 25, sampling="shuffle", steps_per_epoch=10)  # touches 3 epochs
  # Unamplified only: exactly one Gaussian mechanism (mpmath reference, not analysis/).
  assert math.isclose(acc.epsilon(), exact_gaussian_epsilon(1.2, 3, 1e-5), rel_tol=1e-9)
  assert acc.epsilon() < _rdp_eps([1.0], [1.2], [3])
  acc = PrivacyLedger(1e-5)
  acc.record(0.1, 1.2, 40, microbatch_size=4)
  assert math.isclose(acc.epsilon(), _rdp_eps([0.1], [0.6], [40]), rel_tol=1e-12)


def test_restored_accountant_continues_like_an_uninterrupted_one():
  whole, first = PrivacyLedger(1e-6), PrivacyLedger(1e-6)
  for step in range(50):
    whole.record(0.05, 1.0)
    if step < 20:
      first.record(0.05, 1.0)
  resumed = PrivacyLedger.from_state_dict(first.state_dict())
  for _ in range(30):
    resumed.record(0.05, 1.0)
  assert resumed.epsilon() == whole.epsilon() and resumed.steps == 50


@pytest.mark.parametrize("kwargs, match", [
    (dict(sampling_probability=0.0, noise_multiplier=1.0), r"sampling_probability must be in \(0, 1\]"),
    (dict(sampling_probability=1.5, noise_multiplier=1.0), r"sampling_probability"),
    (dict(sampling_probability=0.1, noise_multiplier=-1.0), r"noise_multiplier must be >= 0"),
    (dict(sampling_probability=0.1, noise_multiplier=1.0, steps=1.5), r"steps must be an integer"),
    (dict(sampling_probability=0.1, noise_multiplier=1.0, sampling="random"), r"sampling must be one of"),
    (dict(sampling_probability=0.1, noise_multiplier=1.0, sampling="shuffle"), r"needs steps_per_epoch"),
    (dict(sampling_probability=0.1, noise_multiplier=1.0, microbatch_size=0), r"microbatch_size"),
    (dict(sampling_probability=float("nan"), noise_multiplier=1.0), r"sampling_probability"),
    (dict(sampling_probability="0.1", noise_multiplier=1.0), r"sampling_probability"),
    (dict(sampling_probability=0.1, noise_multiplier=float("nan")), r"noise_multiplier"),
    (dict(sampling_probability=0.1, noise_multiplier="1"), r"noise_multiplier"),
    (dict(sampling_probability=0.1, noise_multiplier=1.0, steps=float("inf")), r"steps must be"),
    (dict(sampling_probability=0.1, noise_multiplier=1.0, steps="3"), r"steps must be"),
    (dict(sampling_probability=0.1, noise_multiplier=1.0, sampling="shuffle", steps_per_epoch=2.5),
     r"steps_per_epoch must be an integer in \[1, inf\]"),
    (dict(sampling_probability=0.1, noise_multiplier=1.0, sampling="shuffle", steps_per_epoch=0),
     r"steps_per_epoch must be an integer in \[1, inf\]"),
])
def test_record_rejects_bad_input(kwargs, match):
  with pytest.raises(ValueError, match=match):
    PrivacyLedger(1e-5).record(**kwargs)


def test_load_state_dict_validates_what_it_restores():
  good = PrivacyLedger(1e-5)
  good.record(0.1, 1.0, 5)
  state = good.state_dict()
  bad_phase = {**state, "phases": [{**state["phases"][0], "steps": -3}]}
  with pytest.raises(ValueError, match="steps must be an integer >= 0"):
    PrivacyLedger.from_state_dict(bad_phase)
  with pytest.raises(ValueError, match=r"delta must be in \(0, 1\)"):
    PrivacyLedger.from_state_dict({**state, "delta": float("nan")})
  with pytest.raises(ValueError, match="Not a PrivacyLedger state_dict"):
    PrivacyLedger.from_state_dict({"delta": 1e-5, "accountant": "rdp"})
  with pytest.raises(ValueError, match="Not a PrivacyLedger state_dict"):
    PrivacyLedger.from_state_dict({**state, "phases": [{"q": 0.1}]})
  target = PrivacyLedger(1e-5)
  with pytest.raises(ValueError):
    target.load_state_dict(bad_phase)
  assert target.phases == []  # a failed restore leaves the accountant unchanged
  assert PrivacyLedger.from_state_dict(state).epsilon() == good.epsilon()


def test_accountant_rejects_bad_delta_and_accountant():
  with pytest.raises(ValueError, match=r"delta must be in \(0, 1\)"):
    PrivacyLedger(1.0)
  with pytest.raises(ValueError, match="accountant must be one of"):
    PrivacyLedger(1e-5, "moments")


N, BATCH = 256, 32


def _data():
  rng = np.random.default_rng(0)
  return rng.normal(size=(N, 4)).astype(np.float32), rng.integers(0, 2, N)


def _model(sigma=1.0, steps_per_execution=1):
  model = tf_dpkit.DPSequential([keras.Input((4,)), keras.layers.Dense(2)])
  model.compile(tf_dpkit.DPGradientDescentGaussianOptimizer(
      1.0, sigma, learning_rate=0.1, expected_batch_size=BATCH, seed=0),
      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      steps_per_execution=steps_per_execution)
  return model


@pytest.mark.parametrize("steps_per_execution", [1, 4])
def test_callback_stops_before_exceeding_the_target_and_logs_analysis_epsilon(steps_per_execution):
  q, sigma, target = BATCH / N, 2.0, 2.0
  # The first step count whose epsilon exceeds the target, by brute force over analysis/.
  limit = next(s for s in range(1, 400) if _rdp_eps([q], [sigma], [s]) > target) - 1
  model = _model(sigma, steps_per_execution)
  budget = PrivacyBudget(q, 1e-5, target_epsilon=target, verbose=False)
  data = poisson_batches(_data(), expected_batch_size=BATCH, steps=400, seed=1)
  history = model.fit(data, epochs=40, steps_per_epoch=10, callbacks=[budget], verbose=0)
  taken = int(model.optimizer.iterations.numpy())
  assert taken == budget.accountant.steps
  assert limit - steps_per_execution < taken <= limit
  assert budget.stopped_at_step == taken
  assert math.isclose(history.history["epsilon"][-1], _rdp_eps([q], [sigma], [taken]), rel_tol=1e-12)
  assert history.history["epsilon"][-1] <= target


def test_callback_logs_epsilon_every_epoch_without_target():
  model = _model()
  budget = PrivacyBudget(BATCH / N, 1e-5, verbose=False)
  data = poisson_batches(_data(), expected_batch_size=BATCH, steps=24, seed=2)
  history = model.fit(data, epochs=3, steps_per_epoch=8, callbacks=[budget], verbose=0)
  expected = [_rdp_eps([BATCH / N], [1.0], [8 * (e + 1)]) for e in range(3)]
  np.testing.assert_allclose(history.history["epsilon"], expected, rtol=1e-12)


def test_callback_continues_a_restored_accountant():
  q = BATCH / N
  data = poisson_batches(_data(), expected_batch_size=BATCH, steps=30, seed=3)
  model = _model()
  first = PrivacyBudget(q, 1e-5, verbose=False)
  model.fit(data.take(10), epochs=1, steps_per_epoch=10, callbacks=[first], verbose=0)
  restored = PrivacyLedger.from_state_dict(first.accountant.state_dict())
  second = PrivacyBudget(q, accountant=restored, verbose=False)
  history = model.fit(data.skip(10), epochs=1, steps_per_epoch=20, callbacks=[second], verbose=0)
  assert math.isclose(history.history["epsilon"][-1], _rdp_eps([q], [1.0], [30]), rel_tol=1e-12)


def test_callback_refuses_a_target_that_allows_no_step_and_non_dp_models():
  model = _model(sigma=0.3)
  data = poisson_batches(_data(), expected_batch_size=BATCH, steps=5, seed=4)
  with pytest.raises(ValueError, match="does not allow even one more step"):
    model.fit(data, epochs=1, steps_per_epoch=5, verbose=0,
              callbacks=[PrivacyBudget(BATCH / N, target_epsilon=1e-3, verbose=False)])
  plain = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
  plain.compile("sgd", loss="mse")
  with pytest.raises(TypeError, match="needs a model compiled with a tf_dpkit DP optimizer"):
    plain.fit(np.zeros((4, 4)), np.zeros((4, 2)), verbose=0,
              callbacks=[PrivacyBudget(0.1, verbose=False)])
  with pytest.raises(ValueError, match="target_epsilon must be > 0"):
    PrivacyBudget(0.1, target_epsilon=-1.0)


def test_fit_after_unrecorded_steps_is_refused():
  # Steps taken without a PrivacyBudget are in no ledger: a later budget must not omit them.
  q = BATCH / N
  data = poisson_batches(_data(), expected_batch_size=BATCH, steps=20, seed=6)
  model = _model()
  model.fit(data.take(10), epochs=1, steps_per_epoch=10, verbose=0)
  with pytest.raises(ValueError, match="already taken 10 steps but the privacy ledger records 0"):
    model.fit(data.skip(10), epochs=1, steps_per_epoch=10, verbose=0,
              callbacks=[PrivacyBudget(q, verbose=False)])


def test_callback_delta_must_agree_with_a_given_accountant():
  accountant = PrivacyLedger(1e-6)
  assert PrivacyBudget(0.1, accountant=accountant).accountant.delta == 1e-6
  assert PrivacyBudget(0.1, 1e-6, accountant=accountant).accountant is accountant
  with pytest.raises(ValueError, match="delta=1e-05 differs from the given accountant's delta=1e-06"):
    PrivacyBudget(0.1, 1e-5, accountant=accountant)
  assert PrivacyBudget(0.1).accountant.delta == 1e-5


@pytest.mark.parametrize("batch_size", [None, 30, 6, 2.5])
def test_callback_needs_batch_size_a_multiple_of_num_microbatches(batch_size):
  model = tf_dpkit.DPSequential([keras.Input((4,)), keras.layers.Dense(2)])
  model.compile(tf_dpkit.DPGradientDescentGaussianOptimizer(1.0, 1.0, 8, learning_rate=0.1),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  x, y = _data()
  with pytest.raises(ValueError, match="integer multiple of the optimizer's num_microbatches=8"):
    model.fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=[PrivacyBudget(
        32 / N, sampling="shuffle", steps_per_epoch=N // 32, batch_size=batch_size)])


def test_callback_with_microbatches_accounts_half_sigma():
  model = tf_dpkit.DPSequential([keras.Input((4,)), keras.layers.Dense(2)])
  model.compile(tf_dpkit.DPGradientDescentGaussianOptimizer(1.0, 1.0, 8, learning_rate=0.1),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  x, y = _data()
  budget = PrivacyBudget(32 / N, sampling="shuffle", steps_per_epoch=N // 32, batch_size=32,
                         verbose=False)
  history = model.fit(x, y, batch_size=32, epochs=2, verbose=0, callbacks=[budget])
  # Two passes of the plain Gaussian mechanism with sigma / 2 = 0.5 (microbatches of 4).
  assert math.isclose(history.history["epsilon"][-1], exact_gaussian_epsilon(0.5, 2, 1e-5),
                      rel_tol=1e-9)


@pytest.mark.parametrize("epochs", [1, 2.5])
def test_noise_multiplier_for_budget_shuffle_and_microbatches_match_the_accountant(epochs):
  sigma = noise_multiplier_for_budget(3.0, 1e-5, 1000, 100, epochs, sampling="shuffle")
  passes = math.ceil(epochs)
  # Calibrated exactly (one Gaussian mechanism), as the accountant reports it.
  assert exact_gaussian_epsilon(sigma, passes, 1e-5) <= 3.0 * (1 + 1e-9)
  assert exact_gaussian_epsilon(sigma * 0.999, passes, 1e-5) > 3.0
  # q = 1 is the same mechanism, and also calibrated exactly (no longer by RDP).
  assert sigma == pytest.approx(calibration.compute_noise_multiplier(3.0, 1e-5, 1.0, passes),
                                rel=2e-4)
  doubled = noise_multiplier_for_budget(3.0, 1e-5, 1000, 100, epochs, sampling="shuffle",
                                        microbatch_size=4)
  assert doubled == pytest.approx(2 * sigma, rel=2e-4)  # both searched to 1e-4
  acc = PrivacyLedger(1e-5)
  acc.record(0.1, doubled, int(epochs * 10), sampling="shuffle", steps_per_epoch=10,
             microbatch_size=4)
  assert acc.epsilon() <= 3.0
  with pytest.raises(ValueError, match="sampling must be one of"):
    noise_multiplier_for_budget(3.0, 1e-5, 1000, 100, 1, sampling="fixed")
  with pytest.raises(ValueError, match=r"microbatch_size must be an integer in \[1, inf\]"):
    noise_multiplier_for_budget(3.0, 1e-5, 1000, 100, 1, microbatch_size=0)


def test_noise_multiplier_for_budget_meets_the_target_tightly():
  sigma = noise_multiplier_for_budget(2.0, 1e-5, 60000, 256, 15)
  steps = math.ceil(15 * 60000 / 256)
  assert sigma == calibration.compute_noise_multiplier_for_training(2.0, 1e-5, 60000, 256, 15)
  assert _rdp_eps([256 / 60000], [sigma], [steps]) <= 2.0
  assert _rdp_eps([256 / 60000], [sigma * 0.999], [steps]) > 2.0 * 0.999


def test_poisson_accounting_of_keras_batched_arrays_is_refused():
  # Was: fit(x, y, batch_size=20) on 200 examples with PrivacyBudget(20 / 200) logged the
  # Poisson-subsampled epsilon for shuffled fixed batches, which get no amplification.
  x, y = _data()
  model = _model()
  with pytest.raises(ValueError, match="in-memory arrays, which Keras cuts into shuffled"):
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0,
              callbacks=[PrivacyBudget(BATCH / N, 1e-5, verbose=False)])
  assert int(model.optimizer.iterations.numpy()) == 0


def test_poisson_accounting_needs_an_optimizer_normalising_by_the_expected_batch():
  model = tf_dpkit.DPSequential([keras.Input((4,)), keras.layers.Dense(2)])
  model.compile(tf_dpkit.DPGradientDescentGaussianOptimizer(1.0, 1.0, learning_rate=0.1),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  data = poisson_batches(_data(), expected_batch_size=BATCH, steps=4, seed=7)
  with pytest.raises(ValueError, match="needs an optimizer built with expected_batch_size"):
    model.fit(data, epochs=1, steps_per_epoch=4, verbose=0,
              callbacks=[PrivacyBudget(BATCH / N, 1e-5, verbose=False)])


def test_keras_batched_arrays_are_accounted_as_shuffled_passes():
  x, y = _data()
  model = tf_dpkit.DPSequential([keras.Input((4,)), keras.layers.Dense(2)])
  model.compile(tf_dpkit.DPGradientDescentGaussianOptimizer(1.0, 1.1, learning_rate=0.1),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  budget = PrivacyBudget(BATCH / N, 1e-5, sampling="shuffle", steps_per_epoch=N // BATCH,
                         verbose=False)
  history = model.fit(x, y, batch_size=BATCH, epochs=2, verbose=0, callbacks=[budget])
  # Two passes of the Gaussian mechanism (q = 1, sigma 1.1) are exactly one Gaussian mechanism
  # with sigma 1.1 / sqrt(2); its exact epsilon (Balle & Wang 2018) is the eps whose delta,
  # evaluated here in 50-digit arithmetic, is 1e-5 (5.87 in issue 12).
  import mpmath
  mpmath.mp.dps = 50
  sigma = mpmath.mpf(1.1) / mpmath.sqrt(2)
  eps = mpmath.mpf(history.history["epsilon"][-1])
  delta = mpmath.ncdf(1 / (2 * sigma) - eps * sigma) - mpmath.e**eps * mpmath.ncdf(
      -1 / (2 * sigma) - eps * sigma)
  assert float(delta) == pytest.approx(1e-5, rel=1e-8)
  assert round(float(eps), 2) == 5.87


def test_reaching_the_target_at_the_planned_end_is_not_reported_as_an_early_stop(capsys):
  # Issue 34: at the planned end of a make_private run the callback used to print "stopping
  # after N steps", which reads like an early stop.  A target between the epsilons after 24 and
  # 25 steps, a fit of exactly 24 steps: it runs them all and says nothing about stopping.
  q = BATCH / N
  target = 0.5 * (_rdp_eps([q], [1.0], [24]) + _rdp_eps([q], [1.0], [25]))
  budget = PrivacyBudget(q, 1e-5, target_epsilon=target)
  model = _model()
  model.fit(poisson_batches(_data(), expected_batch_size=BATCH, steps=24, seed=5), epochs=3,
            steps_per_epoch=8, callbacks=[budget], verbose=0)
  assert int(model.optimizer.iterations.numpy()) == 24 and budget.stopped_at_step is None
  assert "stopping" not in capsys.readouterr().out
  # A fit planned past the budget still stops early, and says so.
  budget = PrivacyBudget(q, 1e-5, target_epsilon=target)
  model = _model()
  model.fit(poisson_batches(_data(), expected_batch_size=BATCH, steps=40, seed=6), epochs=5,
            steps_per_epoch=8, callbacks=[budget], verbose=0)
  assert budget.stopped_at_step == 24
  assert "stopping early, after 24 steps (this fit planned to run to optimizer step 40)" in (
      capsys.readouterr().out)


def test_the_poisson_refusal_gives_complete_advice_that_then_works():
  # Issue 34: following the advice (sampling='shuffle', steps_per_epoch=...) led straight to a
  # second error asking for batch_size.  The advice now names every argument, with the
  # batches per epoch filled in, and following it trains.
  x, y = _data()
  model = tf_dpkit.DPSequential([keras.Input((4,)), keras.layers.Dense(2)])
  model.compile(tf_dpkit.DPGradientDescentGaussianOptimizer(1.0, 1.0, num_microbatches=4,
                                                            learning_rate=0.1, seed=0),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  n = len(x) // 8 * 8
  with pytest.raises(ValueError) as raised:
    model.fit(x[:n], y[:n], batch_size=8, callbacks=[PrivacyBudget(8 / n, 1e-5)], verbose=0)
  message = str(raised.value)
  assert (f"sampling='shuffle', steps_per_epoch={n // 8}, batch_size=<examples per batch, a "
          "multiple of num_microbatches=4>" in message)
  history = model.fit(x[:n], y[:n], batch_size=8, verbose=0, callbacks=[PrivacyBudget(
      8 / n, 1e-5, sampling="shuffle", steps_per_epoch=n // 8, batch_size=8, verbose=False)])
  assert history.history["epsilon"][-1] > 0


def test_the_former_ledger_name_is_an_alias_for_one_release():
  from tf_dpkit import budget  # pylint: disable=g-import-not-at-top
  assert budget.PrivacyAccountant is budget.PrivacyLedger
  ledger = budget.PrivacyAccountant(1e-5)
  ledger.record(0.01, 1.1, steps=100)
  assert isinstance(ledger, budget.PrivacyLedger) and ledger.steps == 100


def test_noise_for_budget_with_also_matches_the_ledger_that_records_both():
  """Calibrated beside the private feature statistics (two Gaussian sums of multiplier 6, an
  event GaussianEvent(6 / sqrt 2)): a ledger that records them and then the training's steps
  meets the target with the sigma returned, and not with 0.1% less noise."""
  from analysis import events as events_lib  # pylint: disable=g-import-not-at-top
  n, batch, epochs, target = 10_000, 500, 5, 2.0
  statistics = events_lib.GaussianEvent(6.0 / math.sqrt(2.0))
  sigma = noise_multiplier_for_budget(target, 1e-5, n, batch, epochs, also=(statistics,))
  alone = noise_multiplier_for_budget(target, 1e-5, n, batch, epochs)
  assert sigma > alone

  def ledger_epsilon(s):
    ledger = PrivacyLedger(1e-5)
    ledger.record(1.0, 6.0, 2)  # how tf_dpkit.features records the statistics
    ledger.record(batch / n, s, epochs * n // batch)
    return ledger.epsilon()

  assert ledger_epsilon(sigma) <= target < ledger_epsilon(sigma * 0.999)
  with pytest.raises(ValueError, match="already spent by the also= events alone"):
    noise_multiplier_for_budget(0.1, 1e-5, n, batch, epochs, also=(statistics,))


def test_callback_continuing_a_ledger_with_statistics_stops_at_the_composed_limit():
  """A ledger that already holds two Gaussian sums (feature statistics, multiplier 6): training
  stops at the last step whose epsilon, composed with them, is within the target (brute force
  over analysis/), and the stop step counts optimizer steps, not the ledger's."""
  q, sigma, target = BATCH / N, 2.0, 2.0
  with_statistics = lambda s: _rdp_eps([1.0, q], [6.0, sigma], [2, s])
  limit = next(s for s in range(1, 400) if with_statistics(s) > target) - 1
  assert limit < next(s for s in range(1, 400) if _rdp_eps([q], [sigma], [s]) > target) - 1
  ledger = PrivacyLedger(1e-5)
  ledger.record(1.0, 6.0, 2)
  model = _model(sigma)
  budget = PrivacyBudget(q, target_epsilon=target, accountant=ledger, verbose=False)
  data = poisson_batches(_data(), expected_batch_size=BATCH, steps=400, seed=1)
  history = model.fit(data, epochs=40, steps_per_epoch=10, callbacks=[budget], verbose=0)
  taken = int(model.optimizer.iterations.numpy())
  assert taken == limit == budget.stopped_at_step and ledger.steps == taken + 2
  assert math.isclose(history.history["epsilon"][-1], with_statistics(taken), rel_tol=1e-12)


def test_callback_refuses_to_replace_a_non_empty_ledger_by_the_saved_one():
  """Resuming with a ledger that holds a new release (statistics computed again) while the
  optimizer's saved ledger holds more steps: replacing it would drop the new release."""
  q = BATCH / N
  data = poisson_batches(_data(), expected_batch_size=BATCH, steps=20, seed=3)
  model = _model()
  first = PrivacyLedger(1e-5)
  first.record(1.0, 6.0, 2)
  model.fit(data.take(10), epochs=1, steps_per_epoch=10, verbose=0,
            callbacks=[PrivacyBudget(q, accountant=first, verbose=False)])
  again = PrivacyLedger(1e-5)
  again.record(1.0, 6.0, 2)  # released again on resuming
  with pytest.raises(ValueError, match="would drop what the passed ledger recorded"):
    model.fit(data.skip(10), epochs=1, steps_per_epoch=10, verbose=0,
              callbacks=[PrivacyBudget(q, accountant=again, verbose=False)])
  # The saved run's own ledger continues.
  resumed = PrivacyLedger.from_state_dict(first.state_dict())
  history = model.fit(data.skip(10), epochs=1, steps_per_epoch=10, verbose=0,
                      callbacks=[PrivacyBudget(q, accountant=resumed, verbose=False)])
  assert math.isclose(history.history["epsilon"][-1], _rdp_eps([1.0, q], [6.0, 1.0], [2, 20]),
                      rel_tol=1e-12)
