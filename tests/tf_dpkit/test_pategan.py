"""PATE-GAN (tf_dpkit.generative.pategan): teacher isolation, student isolation, accounting,
secrets, saving, refusals and a tiny end-to-end run (tiny 4x4 images, 4 teachers)."""
import math
import pickle

import keras
import numpy as np
import pytest
import tensorflow as tf
from scipy import optimize, stats

from analysis import pate as pate_analysis
from tests import secret_search
from tf_dpkit import generative
from tf_dpkit.generative import pategan as pg

SHAPE = (4, 4, 1)
K = 3
LATENT = 5
NOISE_KEY = 1234567890123


def _models(seed=0, num_classes=K):
  keras.utils.set_random_seed(seed)
  g = generative.mlp_generator(LATENT, num_classes, SHAPE, hidden=(8,), batch_norm=False)
  s = generative.mlp_discriminator(num_classes, SHAPE, hidden=(8,))
  return g, s


def _gan(seed=0, num_classes=K, **kwargs):
  g, s = _models(seed, num_classes)
  settings = dict(latent_dim=LATENT, num_teachers=4, num_classes=num_classes, noise_scale=2.0,
                  teacher_hidden=(6,), teacher_batch_size=8, student_batch_size=5,
                  generator_batch_size=6, noise_seed=7, partition_seed=3, seed=1)
  settings.update(kwargs)
  return pg.PATEGAN(g, s, **settings)


def _data(n=8, seed=0):
  rng = np.random.default_rng(seed)
  return rng.uniform(size=(n, *SHAPE)).astype(np.float32), rng.integers(0, K, n)


def _teacher_kernels(gan):
  return [v.numpy() for v in gan.teachers.trainable_variables]


@pytest.fixture(scope="module")
def fitted():
  """A GAN fitted for 2 iterations on 10 records whose pixels all equal index / 100."""
  gan = _gan(noise_seed=NOISE_KEY)
  x, y = _data(n=10)
  x = np.broadcast_to((np.arange(10, dtype=np.float32) / 100)[:, None, None, None],
                      x.shape).copy()
  gan.fit(x, y, iterations=2, verbose=False)
  return gan, x, y


def test_partition_disjoint_and_teacher_batches_from_own_shard(fitted):
  gan, x, y = fitted
  shards = gan.shards
  assert len(shards) == 4
  union = np.concatenate(shards)
  assert sorted(union.tolist()) == list(range(10))  # disjoint and covering
  xb, yb = gan.teacher_batch(x, np.eye(K, dtype=np.float32)[y], np.random.default_rng(0))
  assert xb.shape == (8, 4, *SHAPE) and yb.shape == (8, 4, K)
  for t, shard in enumerate(shards):
    ids = np.round(xb.numpy()[:, t, 0, 0, 0] * 100).astype(int)
    assert set(ids) <= set(shard.tolist())
    np.testing.assert_array_equal(yb.numpy()[:, t], np.eye(K)[y[ids]])


def test_changing_one_record_changes_only_its_teacher():
  x, y = _data(n=8)
  base = _gan()
  base.fit(x, y, iterations=1, verbose=False)
  owner = next(t for t, s in enumerate(base.shards) if 5 in s)
  x2, y2 = x.copy(), y.copy()
  x2[5] = 1.0 - x2[5]
  y2[5] = (y2[5] + 1) % K
  other = _gan()
  other.fit(x2, y2, iterations=1, verbose=False)
  changed = set()
  for a, b in zip(_teacher_kernels(base), _teacher_kernels(other)):
    assert a.shape[0] == 4  # the teacher axis comes first
    for t in range(4):
      if not np.array_equal(a[t], b[t]):
        changed.add(t)
  assert changed == {owner}


def test_student_and_generator_never_read_real_data(monkeypatch):
  """With the teachers' votes fixed (a function of the public queries only), the student and
  generator weights are identical for two entirely different private data sets; the teachers
  differ (positive control)."""
  def fixed_votes(self, x, y):
    real = tf.cast(tf.reduce_mean(x, axis=[1, 2, 3]) * 4.0, tf.int64)  # in 0..4
    return tf.stack([4 - real, real], axis=1)

  monkeypatch.setattr(pg.PATEGAN, "_teacher_votes", fixed_votes)
  runs = []
  for data_seed in (0, 1):
    gan = _gan()
    x, y = _data(n=12, seed=data_seed)
    gan.fit(x, y, iterations=3, verbose=False)
    runs.append(gan)
  a, b = runs
  for va, vb in zip(a.student.weights + a.generator.weights,
                    b.student.weights + b.generator.weights):
    np.testing.assert_array_equal(va.numpy(), vb.numpy())
  assert any(not np.array_equal(p, q) for p, q in zip(_teacher_kernels(a), _teacher_kernels(b)))
  assert a.accountant.queries == 15


def test_votes_are_counts_of_teacher_decisions(fitted):
  gan = fitted[0]
  xq, yq = _data(n=6, seed=5)
  onehot = np.eye(K, dtype=np.float32)[yq]
  counts = gan._votes_fn(tf.constant(xq), tf.constant(onehot)).numpy()
  tiled = [np.repeat(xq[:, None], 4, 1), np.repeat(onehot[:, None], 4, 1)]
  logits = gan.teachers.predict(tiled, verbose=0)
  np.testing.assert_array_equal(counts[:, pg.REAL], (logits > 0).sum(1))
  np.testing.assert_array_equal(counts.sum(1), np.full(6, 4))


def test_rank_votes_give_each_teacher_a_fixed_number_of_real_votes():
  gan = _gan(vote="rank", vote_fraction=0.4)  # initial teacher weights (differ per teacher)
  xq, yq = _data(n=6, seed=5)
  onehot = np.eye(K, dtype=np.float32)[yq]
  counts = gan._votes_fn(tf.constant(xq), tf.constant(onehot)).numpy()
  logits = gan.teachers.predict([np.repeat(xq[:, None], 4, 1), np.repeat(onehot[:, None], 4, 1)],
                                verbose=0)
  # Brute force: each teacher votes real on its ceil(0.4 * 6) = 3 highest logits.
  expected = np.zeros(6, int)
  for t in range(4):
    expected[np.argsort(-logits[:, t], kind="stable")[:3]] += 1
  np.testing.assert_array_equal(counts[:, pg.REAL], expected)
  assert counts[:, pg.REAL].sum() == 4 * 3


def test_accountant_counts_every_labelled_student_example(fitted):
  gan = fitted[0]  # 2 iterations x 1 student step x 5 queries
  assert gan.accountant.queries == 2 * 1 * 5 == gan.accountant.answered
  assert gan.history[-1]["queries"] == 10
  # The publishable epsilon is the accountant's data-independent one ...
  assert gan.epsilon() == pytest.approx(gan.accountant.data_independent_epsilon(1e-5),
                                        rel=1e-12)
  # ... and equals the exact epsilon of 10 GNMax answers: each a Gaussian mechanism of L2
  # sensitivity sqrt(2) and noise s = 2, composed into one with mu = sqrt(10) sqrt(2) / s,
  # delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2) (Balle & Wang 2018), solved
  # for delta = 1e-5 (scipy, independent of the accountant).
  mu = math.sqrt(10) * math.sqrt(2) / 2.0
  exact = optimize.brentq(
      lambda e: stats.norm.cdf(-e / mu + mu / 2) - math.exp(e) * stats.norm.cdf(-e / mu - mu / 2)
      - 1e-5, 0.0, 100.0, xtol=1e-12)
  assert gan.epsilon() == pytest.approx(exact, rel=1e-6)
  # The data-dependent (private) bound is never above it; nor is its smooth-sensitivity release
  # (capped by the data-independent epsilon), which is the accountant's own.
  assert gan.data_dependent_epsilon() <= gan.epsilon() + 1e-12
  release = gan.sanitized_epsilon(beta=0.01, sigma_ss=10.0, order=20.0, rng=0)
  assert release == gan.accountant.smooth_sensitivity_epsilon(1e-5, 0.01, 10.0, 20.0, rng=0)
  assert 0.0 <= release.epsilon <= gan.epsilon() + 1e-12


def test_noise_scale_for_budget_and_affordable_queries():
  s = pg.noise_scale_for_budget(3.0, 200, 1e-5)
  assert pg.data_independent_epsilon(200, s, 1e-5) <= 3.0
  assert pg.data_independent_epsilon(200, s / 1.002, 1e-5) > 3.0
  n = pg.affordable_queries(3.0, s, 1e-5)
  assert n >= 200 and pg.data_independent_epsilon(n + 1, s, 1e-5) > 3.0
  with pytest.raises(ValueError, match="aggregator"):
    pg.data_independent_epsilon(1, 4.0, 1e-5, "lnmax")


def test_data_independent_epsilon_composes_further_events():
  """GNMax answers (each a Gaussian mechanism of sensitivity sqrt(2): mu^2 = 2 / s^2) composed
  with a Gaussian choice of multiplier 20 (mu^2 = 1 / 400) form one Gaussian mechanism of
  mu^2 = 2 n / s^2 + 1 / 400, whose exact epsilon at delta (Balle & Wang 2018:
  delta = Phi(mu / 2 - eps / mu) - e^eps Phi(-mu / 2 - eps / mu)) is solved here by brentq;
  the accountant's exact Gaussian composition must give it."""
  from analysis import events  # pylint: disable=g-import-not-at-top

  def exact(mu, delta):
    gap = lambda e: (stats.norm.cdf(mu / 2 - e / mu)
                     - math.exp(e) * stats.norm.cdf(-mu / 2 - e / mu) - delta)
    return optimize.brentq(gap, 0.0, 100.0, xtol=1e-12)

  choice = events.GaussianEvent(20.0)
  got = pg.data_independent_epsilon(500, 30.0, 1e-5, also=[choice])
  assert got == pytest.approx(exact(math.sqrt(2 * 500 / 30.0**2 + 1 / 400.0), 1e-5), rel=1e-6)
  assert pg.data_independent_epsilon(500, 30.0, 1e-5) == pytest.approx(
      exact(math.sqrt(2 * 500 / 30.0**2), 1e-5), rel=1e-6)
  assert pg.data_independent_epsilon(0, 30.0, 1e-5, also=[choice]) == pytest.approx(
      exact(1 / 20.0, 1e-5), rel=1e-6)
  # Calibration with the choice: the answers and the choice together just meet the target.
  s = pg.noise_scale_for_budget(3.0, 200, 1e-5, also=[choice])
  assert pg.data_independent_epsilon(200, s, 1e-5, also=[choice]) <= 3.0
  assert pg.data_independent_epsilon(200, s / 1.002, 1e-5, also=[choice]) > 3.0
  assert s > pg.noise_scale_for_budget(3.0, 200, 1e-5)
  n = pg.affordable_queries(3.0, s, 1e-5, also=[choice])
  assert n >= 200 and pg.data_independent_epsilon(n + 1, s, 1e-5, also=[choice]) > 3.0
  with pytest.raises(ValueError, match="out of reach: the events in also alone spend it"):
    pg.noise_scale_for_budget(0.1, 200, 1e-5, also=[events.GaussianEvent(1.0)])
  with pytest.raises(ValueError, match="also must hold analysis.events events"):
    pg.data_independent_epsilon(10, 3.0, 1e-5, also=[0.5])
  # A one-shot iterable is read once: the answers' count still includes the choice each time.
  assert pg.affordable_queries(3.0, s, 1e-5, also=(e for e in [choice])) == n
  # When the events in also spend the budget alone, no answer is affordable.
  assert pg.affordable_queries(0.1, 30.0, 1e-5, also=[events.GaussianEvent(1.0)]) == 0
  with pytest.raises(ValueError, match="PateAccountant composes PATE queries"):
    pg.data_independent_epsilon(10, 3.0, 1e-5, also=[events.PoissonSampledEvent(
        0.1, events.GaussianEvent(1.0))])


def test_noise_key_never_written_and_aggregator_hidden(tmp_path, fitted):
  gan = fitted[0]
  gan.generator.save(tmp_path / "generator.keras")
  gan.student.save(tmp_path / "student.keras")
  (tmp_path / "config.json").write_text(repr(gan.get_config()) + repr(gan._aggregator))
  assert secret_search.files_holding(tmp_path, NOISE_KEY) == []
  control = tmp_path / "control.bin"  # positive control: the search finds a written key
  control.write_bytes(NOISE_KEY.to_bytes(8, "little"))
  assert secret_search.files_holding(tmp_path, NOISE_KEY) == [str(control)]
  assert "noise_seed" not in gan.get_config()
  with pytest.raises(TypeError):
    pickle.dumps(gan._aggregator)


def test_saved_generator_samples_without_data(tmp_path, fitted):
  gan = fitted[0]
  path = tmp_path / "generator.keras"
  gan.generator.save(path)
  loaded = keras.models.load_model(path, compile=False)
  images, labels = generative.sample(loaded, 7, seed=3)
  assert images.shape == (7, *SHAPE) and labels.tolist() == [0, 1, 2, 0, 1, 2, 0]
  assert images.min() >= 0.0 and images.max() <= 1.0
  expected, _ = generative.sample(gan.generator, 7, seed=3)
  np.testing.assert_allclose(images, expected, atol=1e-6)


def test_end_to_end_unconditional_budget_stop_and_noiseless():
  x, _ = _data(n=8)
  gan = _gan(num_classes=None, noise_scale=3.0, student_steps=2, student_batch_size=3)
  logs = []
  # Budget: training stops before the iteration that would exceed the target (6 answers per
  # iteration; the target allows 24 answers but not 30).
  target = pg.data_independent_epsilon(24, 3.0, 1e-5) + 1e-9
  assert pg.data_independent_epsilon(30, 3.0, 1e-5) > target
  out = gan.fit(x, iterations=100, target_epsilon=target, log_every=2, callback=logs.append,
                verbose=False)
  assert out["stopped_by_budget"] and out["iterations"] == 4 and out["queries"] == 24
  assert gan.accountant.queries == 24 and gan.epsilon() <= target
  assert [entry["iteration"] for entry in logs] == [2, 4]
  assert [entry["queries"] for entry in logs] == [12, 24]
  assert set(logs[0]) == {"iteration", "queries", "epsilon", "seconds",
                          "released_real_fraction", "student_loss", "generator_loss"}
  assert logs[0]["epsilon"] < logs[1]["epsilon"] == pytest.approx(out["epsilon"])
  assert out["epsilon"] == pytest.approx(gan.accountant.data_independent_epsilon(1e-5))
  with pytest.raises(ValueError, match="does not allow one more iteration"):
    gan.fit(x, iterations=1, target_epsilon=target, verbose=False)
  # No noise: noiseless majority, epsilon inf, nothing recorded.
  quiet = _gan(noise_scale=None)
  x, y = _data(n=8)
  out = quiet.fit(x, y, iterations=2, verbose=False)
  assert out["epsilon"] == math.inf and quiet.accountant.queries == 0
  xq, yq = _data(n=6, seed=9)
  onehot = np.eye(K, dtype=np.float32)[yq]
  counts = quiet._votes_fn(tf.constant(xq), tf.constant(onehot)).numpy()
  np.testing.assert_array_equal(quiet.label_queries(xq, onehot), np.argmax(counts, 1))


def test_gnmax_labels_follow_the_noisy_argmax():
  """With a huge vote gap the noisy answer is the majority; with sigma large the answers on a
  tied histogram are close to fair (fixed noise seed; 400 draws, 4.5 standard deviations)."""
  acc = pate_analysis.PateAccountant(num_teachers=4)
  agg = pg._streaming_aggregator("gnmax", 0.01, 11, acc)
  assert agg.answer(np.array([[4, 0], [0, 4]])).labels.tolist() == [0, 1]
  agg = pg._streaming_aggregator("gnmax", 50.0, 12, acc)
  labels = agg.answer(np.tile([[2, 2]], (400, 1))).labels
  assert abs(labels.mean() - 0.5) < 4.5 * 0.5 / math.sqrt(400)
  assert acc.queries == 402


def _bn_teachers():
  image = keras.Input((4, *SHAPE))
  label = keras.Input((4, K))
  h = keras.layers.Reshape((4, 16))(image)
  h = keras.layers.Concatenate()([h, label])
  h = keras.layers.BatchNormalization()(h)
  h = keras.layers.Dense(1)(h)
  return keras.Model([image, label], keras.layers.Reshape((4,))(h))


@pytest.mark.parametrize("kwargs, match", [
    ({"noise_scale": 0.0}, "noise_scale"),
    ({"noise_scale": -1.0}, "noise_scale"),
    ({"noise_scale": math.inf}, "noise_scale"),
    ({"noise_scale": math.nan}, "noise_scale"),
    ({"num_teachers": 1}, "num_teachers"),
    ({"aggregator": "confident"}, "aggregator"),
    ({"aggregator": "lnmax"}, "aggregator"),
    ({"teacher_batch_size": 0}, "teacher_batch_size"),
    ({"student_batch_size": 0}, "student_batch_size"),
    ({"student_steps": 0}, "student_steps"),
    ({"teacher_learning_rate": 0.0}, "teacher_learning_rate"),
    ({"beta_1": 1.0}, "beta_1"),
    ({"delta": 0.0}, "delta"),
    ({"latent_dim": 4}, "latent_dim"),
    ({"noise_seed": -1}, "noise_seed"),
    ({"teacher_hidden": (0,)}, "hidden"),
    ({"vote": "soft"}, "vote"),
    ({"vote_fraction": 0.0}, "vote_fraction"),
    ({"vote_fraction": 1.5}, "vote_fraction"),
])
def test_refusals_at_construction(kwargs, match):
  with pytest.raises(ValueError, match=match):
    _gan(**kwargs)


def test_refusals_of_models():
  g, s = _models()
  with pytest.raises(ValueError, match="student must be a keras.Model"):
    pg.PATEGAN(g, object(), latent_dim=LATENT, num_teachers=4, num_classes=K, noise_scale=1.0)
  with pytest.raises(ValueError, match="BatchNormalization.*teacher axis"):
    _gan(teachers=_bn_teachers())
  with pytest.raises(ValueError, match="num_classes=4 does not match"):
    pg.PATEGAN(g, s, latent_dim=LATENT, num_teachers=4, num_classes=4, noise_scale=1.0)
  with pytest.raises(ValueError, match="image input must have shape"):
    _gan(num_teachers=5, teachers=pg.teacher_ensemble_discriminator(4, K, SHAPE))
  image, label = keras.Input((4, *SHAPE)), keras.Input((4, K))
  flat = keras.layers.Concatenate()([keras.layers.Reshape((4, 16))(image), label])
  wide = keras.Model([image, label], keras.layers.Dense(2)(flat))  # [B, 4, 2]
  with pytest.raises(ValueError, match="one logit per teacher"):
    _gan(teachers=wide)
  ok = _gan(teachers=pg.teacher_ensemble_discriminator(4, K, SHAPE, hidden=()))
  assert ok.teachers.output_shape == (None, 4)


def test_refusals_in_fit():
  x, y = _data(n=8)
  gan = _gan()
  with pytest.raises(ValueError, match="num_teachers=4 is more than the N=3"):
    gan.fit(x[:3], y[:3], iterations=1, verbose=False)
  with pytest.raises(ValueError, match="y .* is required"):
    gan.fit(x, iterations=1, verbose=False)
  with pytest.raises(ValueError, match="y must hold labels"):
    gan.fit(x, y + K, iterations=1, verbose=False)
  with pytest.raises(ValueError, match="y must be an integer array"):
    gan.fit(x, y.astype(float), iterations=1, verbose=False)
  with pytest.raises(ValueError, match="x must have shape"):
    gan.fit(x[..., 0], y, iterations=1, verbose=False)
  with pytest.raises(ValueError, match="does not allow one more iteration"):
    gan.fit(x, y, iterations=1, target_epsilon=1e-3, verbose=False)
  with pytest.raises(ValueError, match="iterations"):
    gan.fit(x, y, iterations=0, verbose=False)
  with pytest.raises(ValueError, match="target_epsilon"):
    gan.fit(x, y, iterations=1, target_epsilon=-1.0, verbose=False)
  with pytest.raises(ValueError, match="callback"):
    gan.fit(x, y, iterations=1, callback=3, verbose=False)
  # Every refusal came before any step, vote or answer.
  assert gan.accountant.queries == 0 and gan.shards is None and gan._aggregator.draws == 0
  assert all(int(v.numpy()) == 0 for v in gan.teacher_optimizer.variables[:1])
  quiet = _gan(noise_scale=None)
  with pytest.raises(ValueError, match="noise_scale=None"):
    quiet.fit(x, y, iterations=1, target_epsilon=1.0, verbose=False)
  with pytest.raises(ValueError, match="sanitized_epsilon needs"):
    quiet.sanitized_epsilon(beta=0.01, sigma_ss=1.0, order=10.0)
  with pytest.raises(ValueError, match="y must be None"):
    _gan(num_classes=None).fit(x, y, iterations=1, verbose=False)



def _brightness_votes(sign):
  """A vote oracle shared by every teacher: "real" iff a query's mean pixel is above (sign=+1)
  or below (sign=-1) its batch's mean (a stand-in for teachers that agree on a ranking)."""
  def votes(self, x, y):
    del y
    m = sign * tf.reduce_mean(x, axis=[1, 2, 3])
    real = tf.cast(m > tf.reduce_mean(m), tf.int64) * self.num_teachers
    return tf.stack([self.num_teachers - real, real], axis=1)
  return votes


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_training_loop_moves_the_generator_the_way_the_labels_say(monkeypatch, sign):
  """The loop's direction end to end (noiseless, votes from :func:`_brightness_votes`): if the
  released labels reach the student aligned with the images they label, 1 means real, and the
  generator ascends the student's "real" logit on its own images, then the generator's images
  get brighter for sign=+1 and darker for sign=-1 (here: mean pixel 0.457, changed by +0.042
  and -0.042 in 60 iterations).  Checked against mutated code, each failing both runs:
  flipped released labels (changes -0.042, +0.042), labels shuffled against their images
  (+0.010, +0.015), a generator loss of the wrong sign (-0.108, -0.016)."""
  monkeypatch.setattr(pg.PATEGAN, "_teacher_votes", _brightness_votes(sign))
  gan = _gan(noise_scale=None, student_batch_size=16, generator_batch_size=16,
             student_learning_rate=3e-3, generator_learning_rate=3e-3)
  x, y = _data(n=8)
  before = generative.sample(gan.generator, 64, seed=3)[0].mean()
  gan.fit(x, y, iterations=60, verbose=False)
  after = generative.sample(gan.generator, 64, seed=3)[0].mean()
  assert sign * (after - before) > 0.02
