"""Re-iterated pipelines draw fresh batches; replaying transformations and training another
mechanism under a ``make_private`` configuration are refused (issue 31 item 1, issue 34 item 1).

The epsilon a ledger reports counts every step as a fresh Poisson sample (or a fresh shuffled
epoch).  These tests check that what runs is that: the batches fed to ``fit`` when a pipeline
is iterated again (more epochs than it holds, a second ``fit``, ``repeat``) are new draws,
independent of the first pass, and that the logged epsilon is then dp_accounting's for the
steps that ran.
"""
import math

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_dpkit
from tf_dpkit.budget import PrivacyBudget
from tf_dpkit.data import distributed_poisson_batches, poisson_batches, shuffled_batches
from tf_dpkit.data.poisson import pipeline_of
from dp_references import dp_accounting

N, BATCH, DELTA = 64, 8.0, 1e-3


def _data():
  rng = np.random.default_rng(0)
  return rng.normal(size=(N, 3)).astype(np.float32), np.arange(N) % 2


def _label_ids(dataset):
  """Each element's example ids: the data's row index, recovered from x (row i is unique)."""
  x, _ = _data()
  out = []
  for element in dataset:
    xb, weight = element[0].numpy(), element[-1].numpy()
    ids = [int(np.flatnonzero((x == row).all(axis=1))[0]) for row in xb]
    out.append(tuple(i for i, w in zip(ids, weight) if w > 0))
  return out


def test_second_pass_draws_fresh_independent_batches():
  data = poisson_batches(_data(), expected_batch_size=BATCH, steps=50, seed=7)
  first, second = _label_ids(data), _label_ids(data)
  assert len(first) == len(second) == 50 and first != second
  # Independent Bernoulli(q) draws per pass: the overlap of step t's batches in the two passes
  # has mean N q^2 = 1 (identical batches would overlap by N q = 8 on average).  Over 50 steps
  # the mean overlap is within 4 standard errors of 1 (sd of one overlap <= sqrt(N q^2) = 1).
  q = BATCH / N
  overlaps = [len(set(a) & set(b)) for a, b in zip(first, second)]
  assert abs(np.mean(overlaps) - N * q * q) < 4 * math.sqrt(N * q * q) / math.sqrt(50)
  # Inclusion frequency of every example over both passes: Binomial(100, q) each; the mean over
  # examples is q within 4 standard errors.
  counts = np.zeros(N)
  for batch in first + second:
    counts[list(batch)] += 1
  assert abs(counts.mean() / 100 - q) < 4 * math.sqrt(q * (1 - q) / (100 * N))


def test_repeat_and_a_third_pass_continue_the_stream_without_reuse():
  data = poisson_batches(_data(), expected_batch_size=BATCH, steps=5, seed=11)
  passes = [_label_ids(data) for _ in range(3)] + [_label_ids(data.repeat(2))]
  flat = [b for p in passes for b in p]
  assert len(flat) == 25
  # With q = 1/8 and 64 examples, two independent draws coincide with negligible probability.
  assert len(set(flat)) == 25


def test_shuffled_batches_replay_whole_epochs_and_stay_checkpointable(tmp_path):
  # Accounted per epoch as one pass holding every example once: a replayed permutation is such
  # a pass, so replay is allowed (and the iterator stays checkpointable: no stateful op).
  data = shuffled_batches(_data(), 16, epochs=1, seed=5)
  first, second = _label_ids(data), _label_ids(data)
  assert sorted(i for b in first for i in b) == list(range(N))
  assert sorted(i for b in second for i in b) == list(range(N))
  iterator = iter(data)
  next(iterator)
  tf.train.Checkpoint(iterator=iterator).write(str(tmp_path / "ckpt"))


def _model(sigma=1.0):
  model = tf_dpkit.DPSequential([keras.Input((3,)), keras.layers.Dense(2)])
  model.compile(tf_dpkit.DPGradientDescentGaussianOptimizer(
      1.0, sigma, learning_rate=0.1, expected_batch_size=BATCH, seed=0),
      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  return model


def _recording(dataset, seen):
  """``dataset`` with an element-wise map that records each batch's ids (a host callback)."""
  x, _ = _data()

  def record(xb, weight):
    ids = [int(np.flatnonzero((x == row).all(axis=1))[0]) for row in xb.numpy()]
    seen.append(tuple(i for i, w in zip(ids, weight.numpy()) if w > 0))
    return 0

  def element(xb, yb, weight):
    token = tf.py_function(record, [xb, weight], tf.int32)
    with tf.control_dependencies([token]):
      return tf.identity(xb), yb, weight

  return dataset.map(element)


def _rdp_poisson_epsilon(q, sigma, steps, delta=DELTA):
  dpa = dp_accounting()
  from dp_accounting.rdp import rdp_privacy_accountant  # pylint: disable=g-import-not-at-top
  accountant = rdp_privacy_accountant.RdpAccountant()
  accountant.compose(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(sigma)), steps)
  return accountant.get_epsilon(delta)


def test_fit_with_more_epochs_than_batches_trains_on_fresh_batches_and_logs_their_epsilon():
  # The slip of issue 31: poisson_batches(steps=<batches per epoch>) and fit(epochs=4).
  seen = []
  data = _recording(poisson_batches(_data(), expected_batch_size=BATCH, steps=6, seed=3), seen)
  budget = PrivacyBudget(BATCH / N, DELTA, verbose=False)
  history = _model().fit(data, epochs=4, callbacks=[budget], verbose=0)
  epochs = [tuple(seen[6 * e:6 * e + 6]) for e in range(4)]
  assert len(seen) == 24 and len(set(epochs)) == 4  # no epoch replays another
  assert len(set(seen)) == 24
  # What ran is 24 fresh Poisson steps: dp_accounting's epsilon for them (RDP, its own orders).
  assert math.isclose(history.history["epsilon"][-1], _rdp_poisson_epsilon(BATCH / N, 1.0, 24),
                      rel_tol=0.02)
  assert budget.accountant.steps == 24


def test_a_second_fit_continues_with_fresh_batches():
  seen = []
  data = _recording(poisson_batches(_data(), expected_batch_size=BATCH, steps=5, seed=4), seen)
  model = _model()
  model.fit(data, epochs=1, callbacks=[PrivacyBudget(BATCH / N, DELTA, verbose=False)], verbose=0)
  model.fit(data, epochs=1, callbacks=[PrivacyBudget(BATCH / N, DELTA, verbose=False)], verbose=0)
  assert len(seen) == 10 and len(set(seen)) == 10


@pytest.mark.parametrize("transform, name", [
    (lambda d: d.cache(), "CacheDataset"),
    (lambda d: d.prefetch(2).cache(), "CacheDataset"),
    (lambda d: d.filter(lambda x, y, w: tf.reduce_sum(w) > 3), "FilterDataset"),
    (lambda d: d.unbatch().batch(8), "BatchDataset"),
    (lambda d: d.concatenate(d), "ConcatenateDataset"),
    (lambda d: d.ignore_errors(), "IgnoreErrorsDataset"),
])
def test_replaying_or_recutting_transformations_are_refused(transform, name):
  data = transform(poisson_batches(_data(), expected_batch_size=BATCH, steps=4, seed=1))
  with pytest.raises(ValueError, match=f"transformed by {name}"):
    _model().fit(data, epochs=1, callbacks=[PrivacyBudget(BATCH / N, DELTA, verbose=False)],
                 verbose=0)


def test_keeping_transformations_keep_the_pipeline_and_its_checks():
  base = poisson_batches(_data(), expected_batch_size=BATCH, steps=4, seed=1)
  derived = base.prefetch(1).repeat(2).take(6).map(lambda x, y, w: (x, y, w))
  assert pipeline_of(derived) == pipeline_of(base)
  # The budget's checks now see the derived pipeline: a wrong q is refused.
  with pytest.raises(ValueError, match="sampling probability"):
    _model().fit(derived, epochs=1,
                 callbacks=[PrivacyBudget(2 * BATCH / N, DELTA, verbose=False)], verbose=0)
  history = _model().fit(derived, epochs=1,
                         callbacks=[PrivacyBudget(BATCH / N, DELTA, verbose=False)], verbose=0)
  assert math.isclose(history.history["epsilon"][-1], _rdp_poisson_epsilon(BATCH / N, 1.0, 6),
                      rel_tol=0.02)


def _private(epochs=1):
  return tf_dpkit.make_private(_data(), batch_size=int(BATCH), epochs=epochs, l2_norm_clip=1.0,
                               noise_multiplier=1.0, delta=DELTA)


def _private_model(private):
  model = tf_dpkit.DPSequential([keras.Input((3,)), keras.layers.Dense(2)])
  model.compile(optimizer=private.optimizer(keras.optimizers.SGD, learning_rate=0.1),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  return model


def test_make_private_refuses_the_habitual_fit_on_arrays():
  private = _private()
  x, y = _data()
  with pytest.raises(ValueError, match="in-memory arrays.*fit_arguments"):
    _private_model(private).fit(x, y, batch_size=8, verbose=0)


def test_make_private_refuses_its_batches_without_a_budget_and_other_batches():
  private = _private()
  with pytest.raises(ValueError, match="no tf_dpkit.budget.PrivacyBudget"):
    _private_model(private).fit(private.dataset(seed=1), epochs=1, verbose=0)
  other = shuffled_batches(_data(), 8, epochs=1, seed=1)
  with pytest.raises(ValueError, match="shuffle batches"):
    _private_model(private).fit(other, epochs=1, callbacks=[private.budget(verbose=False)],
                                verbose=0)


def test_make_private_with_more_epochs_than_planned_logs_what_ran():
  # make_private(epochs=1) + fit(epochs=3): fresh batches each epoch, epsilon of 3 epochs.
  private = _private(epochs=1)
  seen = []
  data = _recording(private.dataset(seed=2), seen)
  history = _private_model(private).fit(data, epochs=3, callbacks=[private.budget(verbose=False)],
                                        verbose=0)
  steps = 3 * private.steps
  assert len(seen) == steps and len(set(seen)) == steps
  assert math.isclose(history.history["epsilon"][-1],
                      _rdp_poisson_epsilon(private.sampling_probability, 1.0, steps), rel_tol=0.02)
  assert history.history["epsilon"][-1] > private.epsilon
  # The run through fit_arguments is accepted as before.
  _private_model(private).fit(**private.fit_arguments(seed=3, verbose=False), verbose=0)


def test_distributed_poisson_batches_draw_fresh_batches_on_a_second_pass():
  strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
  data = distributed_poisson_batches(strategy, _data(), expected_batch_size=BATCH, steps=20,
                                     seed=9)
  first = [tuple(e[-1].numpy().shape) + tuple(e[0].numpy().ravel()[:3]) for e in data]
  second = [tuple(e[-1].numpy().shape) + tuple(e[0].numpy().ravel()[:3]) for e in data]
  assert len(first) == len(second) == 20 and first != second
  # The first pass is poisson_batches' batches for the same seed (one replica).
  plain = [tuple(e[-1].numpy().shape) + tuple(e[0].numpy().ravel()[:3])
           for e in poisson_batches(_data(), expected_batch_size=BATCH, steps=20, seed=9)]
  assert first == plain


def test_graph_mode_passes_draw_fresh_batches_too():
  v1 = tf.compat.v1
  with tf.Graph().as_default():
    ds = poisson_batches(_data(), expected_batch_size=BATCH, steps=3, seed=7).repeat(2)
    element = v1.data.make_one_shot_iterator(ds).get_next()
    with v1.Session() as sess:
      weights = [sess.run(element[-1]) for _ in range(6)]
  eager = [e[-1].numpy() for e in poisson_batches(_data(), expected_batch_size=BATCH, steps=6,
                                                  seed=7)]
  assert [w.shape for w in weights] == [w.shape for w in eager]  # the same 6-step stream
