"""The privacy bugs that the PATE-GAN reproduction study (Ganev et al. 2024) found in public
implementations, each tested absent in tf_dpkit.generative, and the public label rule of the
conditional generators (issue 36, items 2 and 5).

Every check is a function that is run on the real code AND on a deliberately broken variant
(a "mutant"), so each test shows that its check can fail:

* teachers train only on their own shard: minibatch positions (by construction) and the
  gradient of teacher t's loss with respect to the real rows of other shards (zero);
  custom teacher models that mix teachers are refused;
* the noise the aggregator adds and the accountant's parameter agree (flip rates);
* the student and the generator never receive a real row (a spy on their inputs);
* the released epsilon is data-independent (identical for two different data sets);
* pre-processing of the tabular tutorial is public (a row's scaling ignores other rows);
* fake labels of conditional generators are uniform public randomness, never label counts.
"""
import math
import os
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from scipy import optimize, stats

from tf_dpkit import generative
from tf_dpkit.generative import dpgan as dg
from tf_dpkit.generative import pategan as pg

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHAPE = (6,)
K = 2
LATENT = 3
TEACHERS = 4


def _gan(num_classes=K, **kwargs):
  keras.utils.set_random_seed(0)
  g = generative.mlp_generator(LATENT, num_classes, SHAPE, hidden=(8,), batch_norm=False)
  s = generative.mlp_discriminator(num_classes, SHAPE, hidden=(8,))
  settings = dict(latent_dim=LATENT, num_teachers=TEACHERS, num_classes=num_classes,
                  noise_scale=2.0, teacher_hidden=(5,), teacher_batch_size=4,
                  student_batch_size=6, generator_batch_size=6, noise_seed=7, partition_seed=3,
                  seed=1)
  settings.update(kwargs)
  return pg.PATEGAN(g, s, **settings)


def _data(n=16, seed=0, labels=None):
  rng = np.random.default_rng(seed)
  x = rng.uniform(size=(n, *SHAPE)).astype(np.float32)
  y = rng.integers(0, K, n) if labels is None else np.full(n, labels)
  return x, y


# -- teachers: own shard only ------------------------------------------------------------------


def _batches_stay_in_shards(gan, x, y):
  """True iff every teacher's real minibatch rows come from its own shard (rows identified
  by their unique first feature)."""
  ids = {float(v): i for i, v in enumerate(x[:, 0])}
  xb, _ = gan.teacher_batch(x, np.eye(K, dtype=np.float32)[y], np.random.default_rng(5))
  return all({ids[float(v)] for v in xb.numpy()[:, t, 0]} <= set(gan.shards[t].tolist())
             for t in range(gan.num_teachers))


@pytest.mark.parametrize("balance", [False, True])
def test_teacher_minibatches_come_from_own_shard_and_a_mutant_is_caught(monkeypatch, balance):
  x, y = _data()
  y[:12] = 0  # 4 of 16 rows of class 1
  gan = _gan(teacher_class_balance=balance, teacher_batch_size=400)
  gan.fit(x, y, iterations=1, verbose=False)
  assert _batches_stay_in_shards(gan, x, y)
  _, yb = gan.teacher_batch(x, np.eye(K, dtype=np.float32)[y], np.random.default_rng(1))
  share = yb.numpy()[..., 1].mean(0)  # per teacher
  for t, shard in enumerate(gan.shards):
    has_both = len(set(y[shard].tolist())) == 2
    expected = 0.5 if balance and has_both else y[shard].mean()
    assert abs(share[t] - expected) < 4.5 * math.sqrt(0.25 / 400)
  # Mutant: every teacher draws from the whole data set.
  def whole_data(self, x, y_onehot, rng):
    picks = rng.integers(0, len(x), (self.teacher_batch_size, self.num_teachers))
    return tf.constant(x[picks]), tf.constant(y_onehot[picks])
  monkeypatch.setattr(pg.PATEGAN, "teacher_batch", whole_data)
  assert not _batches_stay_in_shards(gan, x, y)


def _cross_shard_gradient(gan):
  """Largest |d grad_t / d x_real[:, s]| over teachers t != s: the sensitivity of teacher t's
  weight gradient to the real rows given to teacher s (0 when teachers are isolated)."""
  rng = np.random.default_rng(0)
  b = 3
  x_real = tf.constant(rng.uniform(size=(b, TEACHERS, *SHAPE)), tf.float32)
  y_real = tf.constant(np.eye(K, dtype=np.float32)[rng.integers(0, K, (b, TEACHERS))])
  x_fake = tf.constant(rng.uniform(size=(b, TEACHERS, *SHAPE)), tf.float32)
  y_fake = tf.constant(np.eye(K, dtype=np.float32)[rng.integers(0, K, (b, TEACHERS))])
  variables = gan.teachers.trainable_variables
  worst = 0.0
  for t in range(TEACHERS):
    with tf.GradientTape() as outer:
      outer.watch(x_real)
      with tf.GradientTape() as inner:
        loss = tf.reduce_sum(gan.teacher_losses(x_real, y_real, x_fake, y_fake))
      grads = inner.gradient(loss, variables)
      # Teacher t's slice of every weight gradient (the teacher axis comes first), projected
      # on fixed pseudo-random directions.
      projection = sum(tf.reduce_sum(g[t] * tf.constant(
          np.random.default_rng(i).normal(size=g[t].shape), tf.float32))
                       for i, g in enumerate(grads))
    d = outer.gradient(projection, x_real).numpy()  # [b, k, ...]
    own = np.abs(d[:, t]).max()
    assert own > 0  # positive control: teacher t's gradient does read its own rows
    worst = max(worst, float(np.abs(np.delete(d, t, axis=1)).max()))
  return worst


@pytest.mark.parametrize("teachers", ["mlp", "conv1d", "row_statistics"])
def test_teacher_gradient_ignores_other_shards_and_a_mutant_is_caught(monkeypatch, teachers):
  """MLP teachers, teachers with per-teacher 1-D convolutions (TeacherConv1D) and teachers
  that read the rows' statistics (RowStatistics on each teacher's slice)."""
  if teachers == "mlp":
    gan = _gan()
  elif teachers == "row_statistics":
    gan = _gan(teachers=pg.teacher_ensemble_discriminator(TEACHERS, K, SHAPE, hidden=(5,),
                                                          row_statistics=True))
  else:
    gan = _gan(teachers=pg.teacher_ensemble_discriminator(
        TEACHERS, K, SHAPE, hidden=(5,), conv_filters=(2, 3), kernel_size=3))
  assert _cross_shard_gradient(gan) == 0.0
  # Mutant: each teacher's real term uses the logits averaged over the teachers.
  def mixed(self, x_real, y_real, x_fake, y_fake):
    real = self.teachers(self._inputs(x_real, y_real), training=True)
    fake = self.teachers(self._inputs(x_fake, y_fake), training=True)
    real = 0.5 * real + 0.5 * tf.reduce_mean(real, axis=1, keepdims=True)
    return (tf.reduce_mean(tf.math.softplus(-real), 0) +
            tf.reduce_mean(tf.math.softplus(fake), 0))
  monkeypatch.setattr(pg.PATEGAN, "teacher_losses", mixed)
  assert _cross_shard_gradient(gan) > 1e-4


def _shared_dense_teachers():
  """A mutant teacher model: one Dense kernel shared by every teacher."""
  image, label = keras.Input((TEACHERS, *SHAPE)), keras.Input((TEACHERS, K))
  h = keras.layers.Concatenate()([image, label])
  h = keras.layers.Dense(1)(h)  # acts on the last axis: the same weights for all teachers
  return keras.Model([image, label], keras.layers.Reshape((TEACHERS,))(h))


def _mixing_teachers():
  """A mutant teacher model: teacher outputs mix through a Dense layer across teachers."""
  image, label = keras.Input((TEACHERS, *SHAPE)), keras.Input((TEACHERS, K))
  own = pg.teacher_ensemble_discriminator(TEACHERS, K, SHAPE, hidden=(3,))([image, label])
  mixed = keras.layers.Dense(TEACHERS)(own)  # [B, k] -> [B, k]: every teacher reads all
  return keras.Model([image, label], mixed)


def _shared_conv_teachers():
  """A mutant teacher model: one Conv2D kernel (1 x 3) slides along every teacher's row."""
  image, label = keras.Input((TEACHERS, *SHAPE)), keras.Input((TEACHERS, K))
  h = keras.layers.Reshape((TEACHERS, SHAPE[0], 1))(image)
  h = keras.layers.Conv2D(2, (1, 3), padding="same")(h)  # the same weights for all teachers
  h = keras.layers.Concatenate()([keras.layers.Reshape((TEACHERS, 2 * SHAPE[0]))(h), label])
  dense, _, _ = pg._teachers._layers()  # pylint: disable=protected-access
  return keras.Model([image, label], keras.layers.Reshape((TEACHERS,))(dense(TEACHERS, 1)(h)))


def _pooled_statistics_teachers():
  """A mutant teacher model: the row statistics are standardised over the TEACHER axis (a
  weightless layer that lets every teacher's output read every other teacher's slice)."""
  image, label = keras.Input((TEACHERS, *SHAPE)), keras.Input((TEACHERS, K))
  stats_ = generative.RowStatistics()(image)  # [B, k, 4], per slice: fine so far
  pooled = keras.layers.Lambda(
      lambda v: v - keras.ops.mean(v, axis=1, keepdims=True))(stats_)  # mixes the teachers
  h = keras.layers.Concatenate()([pooled, label])
  dense, _, _ = pg._teachers._layers()  # pylint: disable=protected-access
  h = keras.layers.LeakyReLU(0.2)(dense(TEACHERS, 3)(h))
  return keras.Model([image, label], keras.layers.Reshape((TEACHERS,))(dense(TEACHERS, 1)(h)))


def test_custom_teachers_that_share_weights_or_mix_teachers_are_refused():
  pg.check_teachers_isolated(pg.teacher_ensemble_discriminator(TEACHERS, K, SHAPE, (5,)),
                             TEACHERS, SHAPE, K)
  pg.check_teachers_isolated(pg.teacher_ensemble_discriminator(
      TEACHERS, K, SHAPE, (5,), row_statistics=True), TEACHERS, SHAPE, K)
  with pytest.raises(ValueError, match="input slices of other teachers"):
    _gan(teachers=_pooled_statistics_teachers())
  pg.check_teachers_isolated(pg.teacher_ensemble_discriminator(
      TEACHERS, K, SHAPE, (5,), conv_filters=(2,), kernel_size=3), TEACHERS, SHAPE, K)
  with pytest.raises(ValueError, match="shared between teachers"):
    _gan(teachers=_shared_dense_teachers())
  with pytest.raises(ValueError, match="shared between teachers"):
    _gan(teachers=_shared_conv_teachers())
  with pytest.raises(ValueError, match="input slices of other teachers"):
    _gan(teachers=_mixing_teachers())
  ok = _gan(teachers=pg.teacher_ensemble_discriminator(TEACHERS, K, SHAPE, hidden=(2,)))
  assert ok.teachers.output_shape == (None, TEACHERS)


# -- noise scale and accountant agree ----------------------------------------------------------


def _exact_gaussian_epsilon(queries, sigma, delta):
  """Exact epsilon of ``queries`` GNMax answers on two classes, each a Gaussian mechanism of
  L2 sensitivity sqrt(2) (Balle & Wang 2018), independent of the accountant."""
  mu = math.sqrt(queries) * math.sqrt(2.0) / sigma
  f = lambda e: (stats.norm.cdf(-e / mu + mu / 2) - math.exp(e) * stats.norm.cdf(-e / mu - mu / 2)
                 - delta)
  return optimize.brentq(f, 0.0, 700.0, xtol=1e-12)


def _noise_matches_accountant(gan, queries=1000):
  """Answers ``queries`` identical queries with votes (fake, real) = (0, g) and returns
  ``(observed flip rate, flip rate predicted by the accountant's sigma, its std error)``.

  The accountant's sigma is read back from its data-independent epsilon (inverting the exact
  Gaussian formula); a GNMax answer flips to "fake" with probability Phi(-g / (sqrt(2) s)).
  """
  gap = 4
  gan._votes_fn = lambda x, y: tf.constant(np.tile([[0, gap]], (len(x), 1)), tf.int64)
  labels = gan.label_queries(np.zeros((queries, *SHAPE), np.float32),
                             np.eye(K, dtype=np.float32)[np.zeros(queries, int)])
  eps = gan.accountant.data_independent_epsilon(1e-5)
  sigma = optimize.brentq(lambda s: _exact_gaussian_epsilon(queries, s, 1e-5) - eps, 1.5, 100.0)
  predicted = stats.norm.cdf(-gap / (math.sqrt(2.0) * sigma))
  return 1.0 - labels.mean(), predicted, math.sqrt(predicted * (1 - predicted) / queries)


def test_aggregator_noise_and_accountant_use_the_same_sigma_and_a_mutant_is_caught():
  gan = _gan(noise_scale=3.0)
  observed, predicted, se = _noise_matches_accountant(gan)
  assert abs(observed - predicted) < 4.5 * se
  assert predicted == pytest.approx(stats.norm.cdf(-4 / (math.sqrt(2) * 3.0)), rel=1e-4)
  # Mutant: the aggregator adds twice the noise the accountant is told about.
  mutant = _gan(noise_scale=3.0)
  mutant._aggregator.sigma = 6.0
  mutant._aggregator.accountant.compose_gnmax = (
      lambda row, sigma, _f=mutant.accountant.compose_gnmax: _f(row, sigma / 2.0))
  observed, predicted, se = _noise_matches_accountant(mutant)
  assert abs(observed - predicted) > 8 * se


# -- the student and the generator never receive real rows -------------------------------------


def _inputs_seen_by_student_and_generator(gan, x, y, iterations=2):
  """Runs ``fit`` eagerly with spies on the student and generator calls; returns the arrays
  they received: (student rows, generator label batches)."""
  seen = {"student": [], "generator_labels": []}
  student_call, generator_call = gan.student, gan.generator

  def spy_student(inputs, *args, **kwargs):
    seen["student"].append(np.asarray(inputs[0]))
    return student_call(inputs, *args, **kwargs)

  def spy_generator(inputs, *args, **kwargs):
    seen["generator_labels"].append(np.asarray(inputs[1]))
    return generator_call(inputs, *args, **kwargs)

  tf.config.run_functions_eagerly(True)
  try:
    object.__setattr__(gan, "student", _Proxy(gan.student, spy_student))
    object.__setattr__(gan, "generator", _Proxy(gan.generator, spy_generator))
    gan.fit(x, y, iterations=iterations, verbose=False)
  finally:
    tf.config.run_functions_eagerly(False)
  return np.concatenate(seen["student"]), np.concatenate(seen["generator_labels"])


class _Proxy:
  """Forwards attribute access to a Keras model but routes calls to ``call``."""

  def __init__(self, model, call):
    self._model, self._call = model, call

  def __call__(self, *args, **kwargs):
    return self._call(*args, **kwargs)

  def __getattr__(self, name):
    return getattr(self._model, name)


def _holds_a_real_row(rows, x):
  return any(np.any(np.all(np.isclose(rows, row, atol=1e-6), axis=1)) for row in x)


def test_student_never_receives_a_real_row_and_a_mutant_is_caught(monkeypatch):
  x, y = _data(n=12)
  rows, _ = _inputs_seen_by_student_and_generator(_gan(), x, y)
  assert len(rows) > 0 and not _holds_a_real_row(rows, x)
  # Mutant: the student's queries include real rows (the bug the study found).
  original = pg.PATEGAN._queries
  def leaky(self):
    xq, yq = original(self)
    return tf.concat([xq[:-1], tf.constant(x[:1])], 0), yq
  monkeypatch.setattr(pg.PATEGAN, "_queries", leaky)
  rows, _ = _inputs_seen_by_student_and_generator(_gan(), x, y)
  assert _holds_a_real_row(rows, x)


# -- labels of the conditional generator: uniform, public -------------------------------------


def test_fake_labels_are_uniform_and_ignore_private_label_counts_and_a_mutant_is_caught(
    monkeypatch):
  x, y_balanced = _data(n=12)
  _, y_zeros = _data(n=12, labels=0)
  _, a = _inputs_seen_by_student_and_generator(_gan(), x, y_balanced)
  _, b = _inputs_seen_by_student_and_generator(_gan(), x, y_zeros)
  np.testing.assert_array_equal(a, b)  # the same public draws whatever the private labels
  # Uniform over the K classes: the public rule itself, many draws (4.5 standard deviations).
  _, labels = dg.public_latent(tf.random.Generator.from_seed(0), 4000, LATENT, K)
  share = labels.numpy().mean(0)
  assert np.all(np.abs(share - 1 / K) < 4.5 * math.sqrt(0.25 / 4000))
  # Mutant: fake labels drawn from the private label frequencies.
  seen_y = {}
  original_fit = pg.PATEGAN.fit
  def fit(self, x, y=None, **kwargs):
    seen_y["y"] = y
    return original_fit(self, x, y, **kwargs)
  def from_counts(self, batch):
    z = self._rng.normal([batch, self.latent_dim])
    freq = np.bincount(seen_y["y"], minlength=K) / len(seen_y["y"])
    labels = np.random.default_rng(0).choice(K, batch, p=freq)
    return z, tf.one_hot(labels, K)
  monkeypatch.setattr(pg.PATEGAN, "fit", fit)
  monkeypatch.setattr(pg.PATEGAN, "_latent", from_counts)
  _, a = _inputs_seen_by_student_and_generator(_gan(), x, y_balanced)
  _, b = _inputs_seen_by_student_and_generator(_gan(), x, y_zeros)
  assert not np.array_equal(a, b)


# -- the released epsilon is publishable -------------------------------------------------------


def _released_epsilon(x, y):
  # Small noise against 4 teachers: the data-dependent bound can fall below the
  # data-independent one when the teachers agree.
  gan = _gan(noise_scale=0.5, teacher_learning_rate=0.05)
  out = gan.fit(x, y, iterations=2, verbose=False)
  return out["epsilon"], gan


def test_released_epsilon_is_data_independent_and_a_mutant_is_caught(monkeypatch):
  (xa, ya), (xb, yb) = _data(seed=0), _data(seed=1, labels=1)
  xb[:] = 0.0  # a very different data set
  ea, gan_a = _released_epsilon(xa, ya)
  eb, gan_b = _released_epsilon(xb, yb)
  assert ea == eb == pytest.approx(_exact_gaussian_epsilon(12, 0.5, 1e-5), rel=1e-6)
  # The data-dependent bound does depend on the data (positive control) ...
  assert gan_a.data_dependent_epsilon() != gan_b.data_dependent_epsilon()
  # ... so a release of it (the mutant) would fail the same comparison.
  monkeypatch.setattr(pg.PATEGAN, "epsilon", pg.PATEGAN.data_dependent_epsilon)
  ea, _ = _released_epsilon(xa, ya)
  eb, _ = _released_epsilon(xb, yb)
  assert ea != eb


# -- the tabular tutorial's pre-processing and release -----------------------------------------


def _tutorial_module(name):
  sys.path.insert(0, ROOT)
  try:
    return __import__(f"tutorials.data.{name}", fromlist=[name])
  finally:
    sys.path.remove(ROOT)


def _scaling_is_public(scale):
  """True iff each row's scaled values ignore the other rows: scaling a row alone, inside the
  data, and inside data whose other rows are replaced by extremes gives the same values."""
  rng = np.random.default_rng(0)
  x = rng.normal(0, 150, size=(20, 178)).astype(np.float32)
  alone = scale(x[:1])
  other = x.copy()
  other[1:] = rng.choice([-2048.0, 2047.0], size=other[1:].shape)
  return (np.array_equal(alone, scale(x)[:1]) and np.array_equal(alone, scale(other)[:1]))


def test_tabular_preprocessing_is_public_and_a_min_max_mutant_is_caught():
  data = _tutorial_module("epileptic_seizure")
  assert _scaling_is_public(data.to_unit)
  # Closed form at the public bounds and the scale.
  a, b = np.arcsinh(-2048 / 100), np.arcsinh(2047 / 100)
  np.testing.assert_allclose(data.to_unit(np.array([-5000.0, 0.0, 300.0, 9000.0])),
                             [0.0, -a / (b - a), (np.arcsinh(3.0) - a) / (b - a), 1.0],
                             rtol=1e-6)
  counts = np.arange(-2048, 2048, 7, dtype=np.float32)
  np.testing.assert_array_equal(data.from_unit(data.to_unit(counts)), counts)
  # Mutant: min-max scaling with the private data's own extremes.
  assert not _scaling_is_public(lambda x: (x - x.min()) / (x.max() - x.min()))


def test_tabular_loader_checks_digest_and_split_is_stratified(tmp_path):
  data = _tutorial_module("epileptic_seizure")
  bad = tmp_path / "copy.csv.gz"
  with open(data.PATH, "rb") as handle:
    payload = bytearray(handle.read())
  payload[-10] ^= 1
  bad.write_bytes(bytes(payload))
  with pytest.raises(ValueError, match="SHA-256"):
    data.load(bad)
  y = np.repeat([0, 1], [80, 20])
  x = np.arange(100, dtype=np.float32)[:, None]
  (xa, ya), (xb, yb) = data.split(x, y)
  assert (len(yb), int(yb.sum()), len(ya), int(ya.sum())) == (20, 4, 80, 16)
  assert sorted(np.r_[xa[:, 0], xb[:, 0]].tolist()) == list(range(100))
  (xc, _), _ = data.split(x, y)
  np.testing.assert_array_equal(xa, xc)  # fixed public seed


def test_tabular_release_labels_come_from_the_public_fraction_only():
  sys.path.insert(0, ROOT)
  try:
    from tutorials import tabular_pategan_tutorial as tut  # pylint: disable=g-import-not-at-top
  finally:
    sys.path.remove(ROOT)
  keras.utils.set_random_seed(0)
  g = generative.mlp_generator(4, 2, (178,), hidden=(8,), batch_norm=False)
  x, y = tut.release(g, 50, 0.3, seed=2)
  assert x.shape == (50, 178) and y.shape == (50,) and int(y.sum()) == 15
  assert x.min() >= -2048 and x.max() <= 2047 and np.array_equal(x, np.round(x))


def test_query_noise_and_class_balance_settings():
  with pytest.raises(ValueError, match="teacher_class_balance must be True or False"):
    _gan(teacher_class_balance=1)
  with pytest.raises(ValueError, match="query_noise"):
    _gan(query_noise=-0.1)
  with pytest.raises(ValueError, match="query_noise"):
    _gan(query_noise=math.inf)
  plain, noisy = _gan(student_batch_size=500), _gan(student_batch_size=500, query_noise=5.0)
  xq, _ = plain._queries()
  assert 0.0 <= float(tf.reduce_min(xq)) and float(tf.reduce_max(xq)) <= 1.0  # sigmoid output
  xq, _ = noisy._queries()  # generator output in [0, 1] plus N(0, 5^2): std within 5 +- 0.3
  assert abs(float(tf.math.reduce_std(xq)) - 5.0) < 0.3
  assert noisy.get_config()["query_noise"] == 5.0
  assert noisy.get_config()["teacher_class_balance"] is False


def test_query_scale_noise_rescales_each_query_about_its_mean_by_a_public_lognormal():
  """With the same public seed the queries differ only by the rescaling: per query,
  ``x_s - m = (x - m) f`` with one factor ``f``; ``log f`` is N(0, s^2) (KS test, fixed seed).
  Only generated examples are touched: the rescaling reads no real row."""
  with pytest.raises(ValueError, match="query_scale_noise"):
    _gan(query_scale_noise=-1.0)
  with pytest.raises(ValueError, match="query_scale_noise"):
    _gan(query_scale_noise=math.nan)
  n, s = 400, 0.7
  xq, yq = _gan(student_batch_size=n)._queries()
  xs, ys = _gan(student_batch_size=n, query_scale_noise=s)._queries()
  np.testing.assert_array_equal(yq.numpy(), ys.numpy())
  x, x_scaled = xq.numpy().astype(np.float64), xs.numpy().astype(np.float64)
  mean = x.mean(axis=1, keepdims=True)
  np.testing.assert_allclose(x_scaled.mean(axis=1, keepdims=True), mean, atol=1e-5)
  factor = np.linalg.norm(x_scaled - mean, axis=1) / np.linalg.norm(x - mean, axis=1)
  np.testing.assert_allclose(x_scaled - mean, (x - mean) * factor[:, None], atol=1e-5)
  assert stats.kstest(np.log(factor) / s, "norm").pvalue > 0.01
  assert abs(np.log(factor).std() - s) < 4 * s / math.sqrt(2 * n)
  assert _gan(query_scale_noise=s).get_config()["query_scale_noise"] == s
