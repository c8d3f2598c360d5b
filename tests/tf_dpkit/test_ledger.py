"""The privacy ledger travels with the model: resume through .keras, ModelCheckpoint and
BackupAndRestore with a fresh PrivacyBudget, in either callback order; epsilon reaches CSVLogger
whatever the order.  Every epsilon is checked against dp_accounting on the equivalent event
(1e-6 relative: the two RDP codes differ by ~1e-7 at some fractional orders; one step more or
less changes epsilon by ~2% here)."""
import csv
import math

import keras
import numpy as np
import pytest

import tf_dpkit
from tf_dpkit.budget import (Phase, PrivacyBudget, ledger_array, phases_from_ledger)
from tf_dpkit.data import poisson_batches
from dp_references import dp_accounting, dp_pld, dp_rdp, exact_gaussian_epsilon

N, BATCH, SIGMA = 128, 16, 2.0  # optimal orders are integers: dp_accounting agrees to 1e-13
Q = BATCH / N
ORDERS = [1 + x / 4 for x in range(1, 39)] + list(range(11, 65)) + [128, 256, 512, 1024]


def _reference(steps, delta=1e-5):
  """dp_accounting's RDP epsilon of `steps` Poisson-subsampled Gaussian steps."""
  dpa, rdp = dp_accounting(), dp_rdp()
  accountant = rdp.RdpAccountant(ORDERS)
  accountant.compose(dpa.SelfComposedDpEvent(
      dpa.PoissonSampledDpEvent(Q, dpa.GaussianDpEvent(SIGMA)), steps))
  return accountant.get_epsilon(delta)


def _data():
  rng = np.random.default_rng(0)
  return rng.normal(size=(N, 3)).astype(np.float32), rng.integers(0, 2, N)


def _model():
  model = tf_dpkit.DPSequential([keras.Input((3,)), keras.layers.Dense(2)])
  model.compile(tf_dpkit.DPGradientDescentGaussianOptimizer(
      1.0, SIGMA, learning_rate=0.1, expected_batch_size=BATCH, seed=0),
      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  return model


def _batches(steps, seed):
  return poisson_batches(_data(), expected_batch_size=BATCH, steps=steps, seed=seed)


def test_ledger_round_trip_and_capacity():
  phases = [Phase(0.1, 1.5, 7), Phase(1.0, 2.0, 25, "shuffle", 4, 10),
            Phase(0.05, 1.0, 3, "without_replacement", 1, None, 100, 5)]
  assert phases_from_ledger(ledger_array(phases, (64, 8))) == phases
  with pytest.raises(ValueError, match="holds at most 2 phases"):
    ledger_array(phases, (2, 8))
  with pytest.raises(ValueError, match="Not a privacy ledger row"):
    phases_from_ledger(np.full((2, 8), 9.0))


def test_fresh_callback_continues_in_the_same_process():
  model = _model()
  model.fit(_batches(6, 1), epochs=1, steps_per_epoch=6, verbose=0,
            callbacks=[PrivacyBudget(Q, verbose=False)])
  history = model.fit(_batches(4, 2), epochs=1, steps_per_epoch=4, verbose=0,
                      callbacks=[PrivacyBudget(Q, verbose=False)])
  assert math.isclose(history.history["epsilon"][-1], _reference(10), rel_tol=1e-6)


def test_resume_from_a_keras_file(tmp_path):
  model = _model()
  model.fit(_batches(6, 1), epochs=1, steps_per_epoch=6, verbose=0,
            callbacks=[PrivacyBudget(Q, verbose=False)])
  path = str(tmp_path / "model.keras")
  model.save(path)
  restored = keras.models.load_model(path)
  history = restored.fit(_batches(5, 2), epochs=1, steps_per_epoch=5, verbose=0,
                         callbacks=[PrivacyBudget(Q, verbose=False)])
  assert int(restored.optimizer.iterations.numpy()) == 11
  assert math.isclose(history.history["epsilon"][-1], _reference(11), rel_tol=1e-6)


@pytest.mark.parametrize("budget_first", [True, False])
def test_resume_from_model_checkpoint_in_either_order(tmp_path, budget_first):
  path = str(tmp_path / "ckpt.keras")
  checkpoint = keras.callbacks.ModelCheckpoint(path)
  budget = PrivacyBudget(Q, verbose=False)
  model = _model()
  model.fit(_batches(12, 1), epochs=3, steps_per_epoch=4, verbose=0,
            callbacks=[budget, checkpoint] if budget_first else [checkpoint, budget])
  restored = keras.models.load_model(path)  # saved after epoch 3: 12 steps
  history = restored.fit(_batches(4, 2), epochs=1, steps_per_epoch=4, verbose=0,
                         callbacks=[PrivacyBudget(Q, verbose=False)])
  assert math.isclose(history.history["epsilon"][-1], _reference(16), rel_tol=1e-6)


class _Interrupt(keras.callbacks.Callback):
  def on_epoch_end(self, epoch, logs=None):
    if epoch == 1:
      raise RuntimeError("interrupted")


@pytest.mark.parametrize("budget_first", [True, False])
@pytest.mark.parametrize("save_freq", ["epoch", 3])
def test_resume_with_backup_and_restore_in_either_order(tmp_path, budget_first, save_freq):
  backup = str(tmp_path / "backup")

  def callbacks():
    budget = PrivacyBudget(Q, verbose=False)
    restore = keras.callbacks.BackupAndRestore(backup, save_freq=save_freq,
                                               delete_checkpoint=False)
    return [budget, restore] if budget_first else [restore, budget]

  model = _model()
  with pytest.raises(RuntimeError, match="interrupted"):
    model.fit(_batches(20, 1), epochs=5, steps_per_epoch=4, verbose=0,
              callbacks=callbacks() + [_Interrupt()])
  fresh = _model()
  history = fresh.fit(_batches(20, 1), epochs=5, steps_per_epoch=4, verbose=0,
                      callbacks=callbacks())
  taken = int(fresh.optimizer.iterations.numpy())
  assert taken >= 20  # restored, then trained to the end
  assert math.isclose(history.history["epsilon"][-1], _reference(taken), rel_tol=1e-6)


@pytest.mark.parametrize("budget_first", [True, False])
def test_epsilon_reaches_csv_logger_in_either_order(tmp_path, budget_first):
  path = str(tmp_path / "log.csv")
  logger = keras.callbacks.CSVLogger(path)
  budget = PrivacyBudget(Q, verbose=False)
  _model().fit(_batches(8, 1), epochs=2, steps_per_epoch=4, verbose=0,
               callbacks=[budget, logger] if budget_first else [logger, budget])
  with open(path, encoding="utf-8") as handle:
    rows = list(csv.DictReader(handle))
  assert [float(r["epsilon"]) for r in rows] == pytest.approx(
      [_reference(4), _reference(8)], rel=1e-6)


def _reference_events(events, delta=1e-5):
  dpa, rdp = dp_accounting(), dp_rdp()
  accountant = rdp.RdpAccountant(ORDERS)
  accountant.compose(dpa.ComposedDpEvent(events))
  return accountant.get_epsilon(delta)


def test_changed_noise_mid_run_with_a_fresh_callback_and_optimizer():
  dpa = dp_accounting()
  model = _model()
  model.fit(_batches(6, 1), epochs=1, steps_per_epoch=6, verbose=0,
            callbacks=[PrivacyBudget(Q, verbose=False)])
  model.compile(tf_dpkit.DPGradientDescentGaussianOptimizer(
      1.0, 3.0, learning_rate=0.1, expected_batch_size=BATCH, seed=1),
      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  history = model.fit(_batches(4, 2), epochs=1, steps_per_epoch=4, verbose=0,
                      callbacks=[PrivacyBudget(Q, verbose=False)])
  expected = _reference_events([
      dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(Q, dpa.GaussianDpEvent(SIGMA)), 6),
      dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(Q, dpa.GaussianDpEvent(3.0)), 4)])
  assert math.isclose(history.history["epsilon"][-1], expected, rel_tol=1e-6)


def test_shuffled_fit_on_arrays_with_microbatches_matches_dp_accounting():
  # fit on arrays: shuffled fixed batches, each example once per epoch, no amplification; with
  # microbatches of 4 the sensitivity doubles (noise multiplier / 2 in the event).
  dpa = dp_accounting()
  model = tf_dpkit.DPSequential([keras.Input((3,)), keras.layers.Dense(2)])
  model.compile(tf_dpkit.DPGradientDescentGaussianOptimizer(
      1.0, SIGMA, num_microbatches=4, learning_rate=0.1, seed=0),
      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  x, y = _data()
  budget = PrivacyBudget(Q, sampling="shuffle", steps_per_epoch=N // BATCH, batch_size=BATCH,
                         verbose=False)
  history = model.fit(x, y, batch_size=BATCH, epochs=3, verbose=0, callbacks=[budget])
  # Unamplified Gaussian compositions are reported exactly: mpmath's analytic Gaussian (and
  # dp_accounting's PLD agrees to its grid's precision).
  expected = [exact_gaussian_epsilon(SIGMA / 2, e, 1e-5) for e in (1, 2, 3)]
  pld = dp_pld().PLDAccountant(value_discretization_interval=1e-4)
  pld.compose(dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(SIGMA / 2), 3))
  assert pld.get_epsilon(1e-5) == pytest.approx(expected[-1], rel=1e-3)
  assert history.history["epsilon"] == pytest.approx(expected, rel=1e-6)


def test_poisson_from_tf_data_and_dicts_matches_dp_accounting():
  # The same Poisson mechanism whatever the container of the data.
  x, y = _data()
  inputs = keras.Input((3,), name="features")
  model = tf_dpkit.DPModel(inputs, keras.layers.Dense(2)(inputs))
  model.compile(tf_dpkit.DPGradientDescentGaussianOptimizer(
      1.0, SIGMA, learning_rate=0.1, expected_batch_size=BATCH, seed=0),
      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  dataset = tf.data.Dataset.from_tensor_slices(({"features": x}, y))
  batches = poisson_batches(dataset, expected_batch_size=BATCH, steps=7, seed=3)
  history = model.fit(batches, epochs=1, steps_per_epoch=7, verbose=0,
                      callbacks=[PrivacyBudget(Q, verbose=False)])
  assert math.isclose(history.history["epsilon"][-1], _reference(7), rel_tol=1e-6)


def test_the_recorded_run_exports_to_dp_accounting():
  from analysis import events  # pylint: disable=g-import-not-at-top
  budget = PrivacyBudget(Q, verbose=False)
  history = _model().fit(_batches(9, 4), epochs=1, steps_per_epoch=9, verbose=0,
                         callbacks=[budget])
  exported = events.to_dp_accounting(budget.accountant.ledger)
  accountant = dp_rdp().RdpAccountant(ORDERS)
  accountant.compose(exported)
  assert math.isclose(history.history["epsilon"][-1], accountant.get_epsilon(1e-5),
                      rel_tol=1e-6)
  assert math.isclose(_reference(9), accountant.get_epsilon(1e-5), rel_tol=1e-12)


def test_epsilon_reaches_tensorboard_listed_before_the_budget(tmp_path):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  board = keras.callbacks.TensorBoard(str(tmp_path))
  _model().fit(_batches(8, 1), epochs=2, steps_per_epoch=4, verbose=0,
               callbacks=[board, PrivacyBudget(Q, verbose=False)])
  logged = []
  for path in (tmp_path / "train").iterdir():
    for event in tf.compat.v1.train.summary_iterator(str(path)):
      for value in event.summary.value:
        if value.tag == "epoch_epsilon":
          logged.append(float(tf.make_ndarray(value.tensor)))
  assert logged == pytest.approx([_reference(4), _reference(8)], rel=1e-6)
