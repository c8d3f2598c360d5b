"""tf_dpkit.generative: what DP-GAN clips and noises, what the generator sees, accounting,
budget, secrets, refusals, and a tiny end-to-end run with evaluation helpers."""
import inspect
import json
import math
import os
import zipfile

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_dpkit import generative
from tf_dpkit.budget import PrivacyLedger
from tf_dpkit.generative import DPGAN, mlp_discriminator, mlp_generator

SHAPE = (4, 4, 1)
LATENT = 3
NOISE_KEY = 0x2F3A5B7C9D1E4F61
SAMPLING_SEED = 0x1B2C3D4E5F607182


def _models(num_classes=None, seed=0):
  keras.utils.set_random_seed(seed)
  g = mlp_generator(LATENT, num_classes, SHAPE, hidden=(8,))
  d = mlp_discriminator(num_classes, SHAPE, hidden=(8,))
  return g, d


def _gan(num_classes=None, **kwargs):
  g, d = _models(num_classes, kwargs.pop("model_seed", 0))
  settings = dict(latent_dim=LATENT, num_classes=num_classes, l2_norm_clip=0.05,
                  noise_multiplier=0.0, expected_batch_size=4.0, optimizer="sgd",
                  discriminator_learning_rate=1.0, generator_learning_rate=0.1,
                  clip_fake_examples=False, noise_seed=1)
  settings.update(kwargs)
  return DPGAN(g, d, **settings)


def _data(n=8, seed=0):
  rng = np.random.default_rng(seed)
  return rng.uniform(size=(n,) + SHAPE).astype(np.float32), rng.integers(0, 3, n)


def _weights(model):
  return [v.numpy().copy() for v in model.trainable_variables]


def _expected_discriminator_update(gan, x, weight=None):
  """(sum_i clip_C(grad of the real term of example i)) / qN + mean fake gradient."""
  d, g = gan.discriminator, gan.generator
  rng = tf.random.Generator.from_seed(gan.seed)  # the same public draws as the GAN's first
  z = rng.normal([gan.fake_batch_size, gan.latent_dim])
  x_fake = g(z, training=True)  # as DPGAN does (BatchNormalization in the generator)
  variables = d.trainable_variables
  total = [tf.zeros_like(v) for v in variables]
  weight = np.ones(len(x)) if weight is None else weight
  for xi, wi in zip(x, weight):
    with tf.GradientTape() as tape:
      loss = wi * tf.math.softplus(-d(xi[None], training=True))[0, 0]
    grads = tape.gradient(loss, variables)
    norm = tf.linalg.global_norm(grads)
    factor = tf.minimum(1.0, gan.l2_norm_clip / tf.maximum(norm, 1e-12))
    total = [t + factor * gr for t, gr in zip(total, grads)]
  with tf.GradientTape() as tape:
    fake = tf.reduce_mean(tf.math.softplus(d(x_fake, training=True)))
  fake_grads = tape.gradient(fake, variables)
  return [t / gan.expected_batch_size + f for t, f in zip(total, fake_grads)]


def test_only_real_gradients_are_clipped_and_noised():
  gan = _gan()
  x, _ = _data(5)
  before = _weights(gan.discriminator)
  expected = _expected_discriminator_update(gan, x)
  logs = gan.discriminator_step(x, dataset_size=40)
  assert float(logs["median_real_grad_norm"]) > gan.l2_norm_clip  # clipping is active
  for b, a, e in zip(before, _weights(gan.discriminator), expected):
    np.testing.assert_allclose(b - a, e.numpy(), rtol=1e-4, atol=1e-6)  # SGD, learning rate 1
  # Sensitivity: changing one real example moves the update by at most C / qN.
  gan_a, gan_b = _gan(), _gan()
  x2 = x.copy()
  x2[2] = 1.0 - x2[2]
  gan_a.discriminator_step(x, dataset_size=40)
  gan_b.discriminator_step(x2, dataset_size=40)
  diff = np.sqrt(sum(np.sum((a - b) ** 2) for a, b in zip(_weights(gan_a.discriminator),
                                                          _weights(gan_b.discriminator))))
  assert 0 < diff <= gan.l2_norm_clip / gan.expected_batch_size * (1 + 1e-5)


def test_discriminator_noise_has_the_dp_sgd_scale():
  sigma = 3.0
  quiet, noisy = _gan(), _gan(noise_multiplier=sigma, noise_seed=7)
  x, _ = _data(5)
  quiet.discriminator_step(x, dataset_size=40)
  noisy.discriminator_step(x, dataset_size=40)
  diff = np.concatenate([(a - b).ravel() for a, b in zip(_weights(quiet.discriminator),
                                                         _weights(noisy.discriminator))])
  # Noise N(0, (sigma C)^2) on the clipped sum, divided by qN, times learning rate 1.
  want = sigma * quiet.l2_norm_clip / quiet.expected_batch_size
  assert diff.std() == pytest.approx(want, rel=0.15)
  assert abs(diff.mean()) < 4 * want / math.sqrt(diff.size)


@pytest.mark.parametrize("mode_seeking", [0.0, 1.0])
def test_generator_step_never_reads_private_data(mode_seeking):
  assert list(inspect.signature(DPGAN.generator_step).parameters) == ["self"]
  gan_a = _gan(noise_multiplier=1.0, mode_seeking=mode_seeking)
  gan_b = _gan(noise_multiplier=1.0, noise_seed=2, mode_seeking=mode_seeking)
  x, _ = _data(5)
  x2 = x.copy()
  x2[0] = 1.0 - x2[0]  # neighbouring data set: one example changed
  gan_a.discriminator_step(x, dataset_size=40)
  gan_b.discriminator_step(x2, dataset_size=40)
  assert any(not np.allclose(a, b) for a, b in zip(_weights(gan_a.discriminator),
                                                   _weights(gan_b.discriminator)))
  for va, vb in zip(gan_a.discriminator.trainable_variables,
                    gan_b.discriminator.trainable_variables):
    vb.assign(va)  # the same discriminator
  gan_a.generator_step()
  gan_b.generator_step()
  for a, b in zip(_weights(gan_a.generator), _weights(gan_b.generator)):
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("decay", [0.0, 0.5, 0.999])
def test_generator_average_follows_the_recurrence_by_hand(decay):
  """a_t = d_t a_{t-1} + (1 - d_t) w_t, d_t = min(d, (1 + t) / (10 + t)), a_0 = w_0, over every
  generator weight (BatchNormalization's moving statistics too), recomputed with numpy from
  the generator's iterates; the average never changes the generator itself."""
  keras.utils.set_random_seed(0)
  g = generative.conv_generator(LATENT, 3, filters=2, image_shape=(8, 8, 1))
  d = mlp_discriminator(3, (8, 8, 1), hidden=(8,))
  gan = DPGAN(g, d, latent_dim=LATENT, num_classes=3, noise_multiplier=0.0,
              expected_batch_size=4.0, generator_ema=decay, noise_seed=1)
  assert gan.averaged_generator is not g and gan.get_config()["generator_ema"] == decay
  assert any("moving" in w.path for w in g.weights)  # non-trainable statistics are averaged
  average = [w.copy() for w in g.get_weights()]
  for t in range(1, 8):
    gan.generator_step()
    d_t = min(decay, (1.0 + t) / (10.0 + t))
    average = [d_t * a + (1.0 - d_t) * w for a, w in zip(average, g.get_weights())]
    for got, want in zip(gan.averaged_generator.get_weights(), average):
      np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  if decay == 0.0:
    for got, want in zip(gan.averaged_generator.get_weights(), g.get_weights()):
      np.testing.assert_array_equal(got, want)
  # The averaged generator samples like the generator (same inputs and outputs).
  images, labels = generative.sample(gan.averaged_generator, 6, seed=3)
  assert images.shape == (6, 8, 8, 1) and list(labels) == [0, 1, 2, 0, 1, 2]
  assert _gan().averaged_generator is None and _gan().get_config()["generator_ema"] is None


def test_mode_seeking_penalty_by_hand():
  rng = np.random.default_rng(4)
  x1, x2 = rng.uniform(size=(2, 5, 4, 4, 1)).astype(np.float32)
  z1, z2 = rng.normal(size=(2, 5, LATENT)).astype(np.float32)
  ratio = np.abs(x1 - x2).mean() / np.abs(z1 - z2).mean()
  got = float(generative.mode_seeking_penalty(x1, x2, z1, z2))
  assert got == pytest.approx(1.0 / (ratio + 1e-5), rel=1e-5)
  # A generator that ignores its noise: the penalty is 1 / eps.
  assert float(generative.mode_seeking_penalty(x1, x1, z1, z2)) == pytest.approx(1e5, rel=1e-6)


@pytest.mark.parametrize("num_classes", [None, 3])
def test_mode_seeking_generator_step_is_the_msgan_loss_by_hand(num_classes):
  """One SGD generator step with lambda = 0.7 equals the step on
  L_G + lambda / (mean|G(z1,y) - G(z2,y)| / mean|z1 - z2| + 1e-5), with z1, y and then z2
  drawn from the public generator seeded with ``seed``; D is left untouched."""
  lam, lr = 0.7, 0.1
  gan = _gan(num_classes, mode_seeking=lam, seed=11)
  ref = _gan(num_classes, seed=11)  # the same initial weights
  rng = tf.random.Generator.from_seed(11)
  z1, y = generative.dpgan.public_latent(rng, gan.fake_batch_size, LATENT, num_classes)
  z2 = rng.normal([gan.fake_batch_size, LATENT])
  inputs = lambda z: z if y is None else [z, y]
  g, d = ref.generator, ref.discriminator
  with tf.GradientTape() as tape:
    x1, x2 = g(inputs(z1), training=True), g(inputs(z2), training=True)
    adversarial = tf.reduce_mean(tf.math.softplus(-d(inputs(x1), training=False)[:, 0]))
    spread = tf.reduce_mean(tf.abs(x1 - x2)) / tf.reduce_mean(tf.abs(z1 - z2))
    total = adversarial + lam / (spread + 1e-5)
  grads = tape.gradient(total, g.trainable_variables)
  before, d_before = _weights(gan.generator), _weights(gan.discriminator)
  logs = gan.generator_step()
  assert float(logs["generator_loss"]) == pytest.approx(float(adversarial), rel=1e-5)
  for b, a, gr in zip(before, _weights(gan.generator), grads):
    # Weights near 1 with updates near 1e-7: compare the updated weights (float32 rounding of
    # w - lr g is about 6e-8 there), not the differences.
    np.testing.assert_allclose(a, b - lr * gr.numpy(), rtol=1e-5, atol=1e-6)
  moved = max(float(np.max(np.abs(lr * gr.numpy()))) for gr in grads)
  assert moved > 1e-3  # the step is far larger than the tolerance
  for b, a in zip(d_before, _weights(gan.discriminator)):
    np.testing.assert_array_equal(a, b)
  assert gan.get_config()["mode_seeking"] == lam and ref.get_config()["mode_seeking"] == 0.0


def test_mode_seeking_off_draws_nothing_extra():
  """lambda = 0 is bit for bit the DPGAN without the option over several steps (no second
  noise batch is drawn, so the public stream is unchanged); lambda > 0 moves the weights."""
  x, y = _data(24)
  runs = {}
  for name, kwargs in (("default", {}), ("zero", {"mode_seeking": 0.0}),
                       ("on", {"mode_seeking": 1.0})):
    gan = _gan(3, **kwargs)
    gan.fit(x, y, generator_steps=3, sampling_seed=1, verbose=False)
    runs[name] = _weights(gan.generator)
  for a, b in zip(runs["default"], runs["zero"]):
    np.testing.assert_array_equal(a, b)
  assert any(not np.allclose(a, b) for a, b in zip(runs["default"], runs["on"]))


@pytest.mark.parametrize("lam", [0.0, 1.0])
def test_mode_seeking_spreads_a_nearly_collapsed_generator(lam):
  """A generator whose noise weights are scaled by 1e-3 (outputs nearly independent of z;
  exact independence has a zero gradient since d|t|/dt = 0 at 0) against a constant
  discriminator (zero adversarial gradient): the term alone spreads its outputs more than
  tenfold in five steps; without it nothing moves."""
  keras.utils.set_random_seed(0)
  g = mlp_generator(LATENT, None, SHAPE, hidden=(8,), batch_norm=False)
  d = mlp_discriminator(None, SHAPE, hidden=(8,))
  gan = DPGAN(g, d, latent_dim=LATENT, noise_multiplier=0.0, expected_batch_size=16.0,
              optimizer="sgd", generator_learning_rate=1e-3, mode_seeking=lam, noise_seed=1)
  for v in d.trainable_variables:
    v.assign(tf.zeros_like(v))  # logit 0 for every image
  first = g.trainable_variables[0]
  first.assign(first * 1e-3)
  z = tf.random.Generator.from_seed(5).normal([256, LATENT])
  spread = lambda: float(np.mean(np.std(g(z, training=False).numpy(), axis=0)))
  before = spread()
  assert 0.0 < before < 1e-3
  for _ in range(5):
    gan.generator_step()
  after = spread()
  if lam:
    assert np.isfinite(after) and after > 10 * before
  else:
    assert after == pytest.approx(before, rel=1e-6)


@pytest.mark.parametrize("mode_seeking", [0.0, 2.0])
def test_accountant_counts_discriminator_steps_only(mode_seeking):
  gan = _gan(noise_multiplier=1.2, discriminator_steps=3, mode_seeking=mode_seeking)
  x, _ = _data(40)
  result = gan.fit(x, generator_steps=4, sampling_seed=1, verbose=False)
  assert gan.accountant.steps == 12 == result["discriminator_steps"]
  assert result["generator_steps"] == 4 and not result["stopped_by_budget"]
  reference = PrivacyLedger(1e-5)
  reference.record(4.0 / 40, 1.2, 12)
  assert result["epsilon"] == pytest.approx(reference.epsilon(), rel=1e-12)
  ledger = gan.discriminator_optimizer.privacy_ledger.numpy()
  assert ledger[0, 3] == 12 and ledger[0, 1] == pytest.approx(0.1)
  assert int(gan.discriminator_optimizer.iterations.numpy()) == 12
  assert int(gan.generator_optimizer.iterations.numpy()) == 4


def test_budget_stops_training():
  gan = _gan(noise_multiplier=1.0, discriminator_steps=2)
  x, _ = _data(40)
  target = 3.0
  result = gan.fit(x, generator_steps=1000, target_epsilon=target, sampling_seed=1,
                   log_every=1000, verbose=False)
  assert result["stopped_by_budget"]
  steps = gan.accountant.steps
  assert steps == 2 * result["generator_steps"] and steps < 2000
  assert result["epsilon"] <= target
  more = PrivacyLedger(1e-5)
  more.record(0.1, 1.0, steps + 2)
  assert more.epsilon() > target  # one more iteration would exceed the budget
  with pytest.raises(ValueError, match="target_epsilon"):
    gan.fit(x, generator_steps=5, target_epsilon=target, verbose=False)
  with pytest.raises(ValueError, match="noise_multiplier=0"):
    _gan().fit(x, generator_steps=1, target_epsilon=5.0, verbose=False)


def _patterns(value):
  out, v = bytearray(), value
  while True:
    byte, v = v & 0x7F, v >> 7
    out.append(byte | (0x80 if v else 0))
    if not v:
      break
  return [value.to_bytes(8, "little"), value.to_bytes(8, "big"), bytes(out), str(value).encode()]


def _all_bytes(path):
  data = [open(path, "rb").read()]
  if zipfile.is_zipfile(path):
    with zipfile.ZipFile(path) as archive:
      data += [archive.read(name) for name in archive.namelist()]
  return data


def test_noise_key_and_sampling_seed_are_not_saved(tmp_path):
  gan = _gan(num_classes=3, noise_multiplier=1.0, noise_seed=NOISE_KEY)
  x, y = _data(20)
  gan.fit(x, y, generator_steps=2, sampling_seed=SAMPLING_SEED, verbose=False)
  path = str(tmp_path / "generator.keras")
  gan.generator.save(path)
  config = json.dumps(gan.get_config()).encode()
  for secret in (NOISE_KEY, SAMPLING_SEED):
    for blob in _all_bytes(path) + [config]:
      for pattern in _patterns(secret):
        assert pattern not in blob
  control = tmp_path / "control.bin"  # positive control: the search finds a written key
  control.write_bytes(b"xx" + NOISE_KEY.to_bytes(8, "little"))
  assert any(NOISE_KEY.to_bytes(8, "little") in b for b in _all_bytes(str(control)))
  assert "noise_seed" not in gan.get_config()


def test_batch_normalization_in_discriminator_is_refused():
  g, _ = _models()
  inputs = keras.Input(SHAPE)
  h = keras.layers.Flatten()(inputs)
  h = keras.layers.BatchNormalization()(keras.layers.Dense(8)(h))
  d = keras.Model(inputs, keras.layers.Dense(1)(h))
  with pytest.raises(ValueError, match="discriminator layer .* BatchNormalization"):
    DPGAN(g, d, latent_dim=LATENT, noise_multiplier=1.0, expected_batch_size=4)


def test_gradient_penalty_is_refused():
  g, d = _models()
  with pytest.raises(ValueError, match="gradient_penalty is not supported.*mix real and fake"):
    DPGAN(g, d, latent_dim=LATENT, loss="wasserstein", noise_multiplier=1.0,
          expected_batch_size=4, gradient_penalty=10.0)


@pytest.mark.parametrize("kwargs, match", [
    ({"latent_dim": 5}, "latent_dim=5 does not match"),
    ({"latent_dim": 0}, r"latent_dim must be an integer in \[1, inf\]"),
    ({"num_classes": 1}, r"num_classes must be None or an integer in \[2, inf\]"),
    ({"loss": "hinge"}, "loss must be one of"),
    ({"l2_norm_clip": 0.0}, r"l2_norm_clip must be a finite number in \(0, inf\)"),
    ({"noise_multiplier": -1.0}, r"noise_multiplier must be a finite number in \[0, inf\)"),
    ({"expected_batch_size": 0}, r"expected_batch_size must be a finite number in \(0, inf\)"),
    ({"discriminator_steps": 0}, r"discriminator_steps must be an integer in \[1, inf\]"),
    ({"discriminator_learning_rate": float("nan")}, "discriminator_learning_rate must be"),
    ({"weight_clip": -0.1}, r"weight_clip must be a finite number in \(0, inf\)"),
    ({"optimizer": "adagrad"}, "optimizer must be one of"),
    ({"beta_1": 1.0}, r"beta_1 must be in \[0, 1\)"),
    ({"method": "magic"}, "method must be one of"),
    ({"delta": 0.0}, r"delta must be in \(0, 1\)"),
    ({"generator_ema": 1.0}, r"generator_ema must be None or a decay in \[0, 1\)"),
    ({"generator_ema": -0.1}, r"generator_ema must be None or a decay in \[0, 1\)"),
    ({"generator_ema": float("nan")}, "generator_ema must not be NaN"),
    ({"generator_ema": "0.9"}, "generator_ema must be"),
    ({"mode_seeking": -0.5}, r"mode_seeking must be a finite number in \[0, inf\)"),
    ({"mode_seeking": float("inf")}, r"mode_seeking must be a finite number in \[0, inf\)"),
    ({"mode_seeking": float("nan")}, "mode_seeking must"),
    ({"mode_seeking": "1"}, "mode_seeking must"),
])
def test_bad_settings_name_the_argument(kwargs, match):
  with pytest.raises(ValueError, match=match):
    _gan(**kwargs)


def test_models_must_match_the_conditioning():
  g, d = _models()
  with pytest.raises(ValueError, match=r"generator must take \[noise, one_hot_label\]"):
    DPGAN(g, d, latent_dim=LATENT, num_classes=3, noise_multiplier=1.0, expected_batch_size=4)
  g3, d3 = _models(3)
  with pytest.raises(ValueError, match="discriminator must take"):
    DPGAN(g3, d, latent_dim=LATENT, num_classes=3, noise_multiplier=1.0, expected_batch_size=4)
  with pytest.raises(ValueError, match="generator must be a keras.Model"):
    DPGAN("g", d, latent_dim=LATENT, noise_multiplier=1.0, expected_batch_size=4)


def test_bad_fit_arguments_name_the_argument():
  gan = _gan(num_classes=3, noise_multiplier=1.0)
  x, y = _data(8)
  for kwargs, match in [
      ({"generator_steps": 0}, r"generator_steps must be an integer in \[1, inf\]"),
      ({"generator_steps": 1, "target_epsilon": -1.0}, "target_epsilon must be > 0"),
      ({"generator_steps": 1, "log_every": 0}, "log_every must be"),
  ]:
    with pytest.raises(ValueError, match=match):
      gan.fit(x, y, verbose=False, **kwargs)
  with pytest.raises(ValueError, match="y .* is required"):
    gan.fit(x, generator_steps=1, verbose=False)
  with pytest.raises(ValueError, match=r"y must hold labels in \[0, 3\)"):
    gan.fit(x, y + 5, generator_steps=1, verbose=False)
  with pytest.raises(ValueError, match="x must have shape"):
    gan.fit(x[:, :2], y, generator_steps=1, verbose=False)
  with pytest.raises(ValueError, match=r"expected_batch_size must be in \(0, N=3\]"):
    gan.fit(x[:3], y[:3], generator_steps=1, verbose=False)


def test_wasserstein_clips_weights():
  gan = _gan(loss="wasserstein", weight_clip=0.02, noise_multiplier=1.0,
             discriminator_learning_rate=0.5)
  x, _ = _data(40)
  gan.fit(x, generator_steps=2, sampling_seed=3, verbose=False)
  assert max(np.abs(w).max() for w in _weights(gan.discriminator)) <= 0.02 + 1e-7
  assert _gan(loss="wasserstein").weight_clip == 0.01 and _gan().weight_clip is None


def test_tiny_end_to_end_conditional(tmp_path):
  gan = _gan(num_classes=3, noise_multiplier=0.8, optimizer="adam", clip_fake_examples=True,
             discriminator_learning_rate=1e-3, generator_learning_rate=1e-3,
             discriminator_steps=2, noise_seed=None)
  x, y = _data(50)
  logs = []
  result = gan.fit(x, y, generator_steps=6, target_epsilon=50.0, sampling_seed=5, log_every=3,
                   callback=logs.append, verbose=False)
  assert [entry["generator_step"] for entry in logs] == [3, 6]
  # Only public quantities are logged unless asked: nothing computed from the real batch.
  assert set(logs[-1]) == {"generator_step", "discriminator_steps", "epsilon", "seconds",
                           "generator_loss"}
  assert logs[-1]["epsilon"] == pytest.approx(result["epsilon"])
  assert 0 < result["epsilon"] <= 50.0
  path = str(tmp_path / "g.keras")
  gan.generator.save(path)
  loaded = keras.models.load_model(path, compile=False)
  images, labels = generative.sample(loaded, 7, seed=3)
  assert images.shape == (7,) + SHAPE and images.min() >= 0 and images.max() <= 1
  np.testing.assert_array_equal(labels, [0, 1, 2, 0, 1, 2, 0])
  again, _ = generative.sample(gan.generator, 7, seed=3)
  np.testing.assert_allclose(images, again, atol=1e-6)
  with pytest.raises(ValueError, match="labels must be"):
    generative.sample(loaded, 2, labels=[0, 3])
  private_logs = []
  gan.fit(x, y, generator_steps=1, sampling_seed=6, log_every=1, callback=private_logs.append,
          verbose=False, log_private_diagnostics=True)
  assert {"discriminator_real_loss", "median_real_grad_norm"} <= set(private_logs[-1])
  with pytest.raises(TypeError, match="log_private_diagnostics must be True or False"):
    gan.fit(x, y, generator_steps=1, log_private_diagnostics="yes", verbose=False)
  png = generative.save_sample_grid(images, str(tmp_path / "grid.png"), columns=3, title="t")
  assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
  accuracy = generative.tstr_accuracy(images, labels, x, y, num_classes=3, epochs=1)
  assert 0.0 <= accuracy <= 1.0


def test_save_sample_grid_draws_without_touching_matplotlibs_backend_or_pyplot(tmp_path,
                                                                             monkeypatch):
  matplotlib = pytest.importorskip("matplotlib")
  from matplotlib import image as mpl_image  # pylint: disable=g-import-not-at-top
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  backend, figures = matplotlib.get_backend(), plt.get_fignums()
  chosen = []
  monkeypatch.setattr(matplotlib, "use", lambda *args, **kwargs: chosen.append(args))
  images = np.zeros((3, 6, 6), np.float32)
  images[1] = 1.0  # one white tile among black ones, on a white background
  png = generative.save_sample_grid(images, str(tmp_path / "grid.png"), columns=2)
  assert chosen == [] and matplotlib.get_backend() == backend  # no backend selected
  assert plt.get_fignums() == figures  # no pyplot figure made or left open
  pixels = mpl_image.imread(png)
  # 2 columns and 2 rows: (2 * 0.6 + 0.2) inches at 100 dpi each way, RGBA in [0, 1].
  assert pixels.shape == (140, 140, 4)
  assert pixels[..., :3].min() == 0.0 and pixels[..., :3].max() == 1.0


def test_frechet_distance_closed_form():
  rng = np.random.default_rng(0)
  a = rng.normal(size=(20000, 3))
  shift = np.array([1.0, 0.0, 2.0])
  # Same covariance (I), means differ by `shift`: distance ||shift||^2 = 5.
  assert generative.frechet_distance_from_features(a, a + shift) == pytest.approx(5.0, rel=1e-6)
  b = rng.normal(size=(20000, 3)) * 2.0  # covariance 4I: Tr(I + 4I - 2*2I) = 3
  assert generative.frechet_distance_from_features(a, b) == pytest.approx(3.0, rel=0.05)
  with pytest.raises(ValueError, match="features_a must be"):
    generative.frechet_distance_from_features(a[:1], b)


def test_mnist_feature_extractor_is_cached_and_deterministic():
  rng = np.random.default_rng(0)
  x = rng.uniform(size=(256, 28, 28, 1)).astype(np.float32)
  y = rng.integers(0, 10, 256)
  generative.clear_feature_cache()
  first, accuracy = generative.mnist_feature_extractor(x, y, epochs=1, seed=3)
  assert accuracy is None
  assert generative.mnist_feature_extractor(x, y, epochs=1, seed=3)[0] is first  # cached
  generative.clear_feature_cache()
  second, _ = generative.mnist_feature_extractor(x, y, epochs=1, seed=3)
  assert second is not first
  f1, f2 = first.predict(x[:64], verbose=0), second.predict(x[:64], verbose=0)
  assert f1.shape == (64, 128)
  np.testing.assert_allclose(f1, f2, rtol=1e-5, atol=1e-6)
  features = first.predict(x, verbose=0)  # 256 rows > 128 features: full-rank covariance
  scale = float(np.trace(np.cov(features, rowvar=False)))
  assert generative.frechet_distance(x, x, first) <= 1e-4 * scale
  generative.clear_feature_cache()


def test_conv_models_shapes_and_checks():
  g = generative.conv_generator(LATENT, 3, (8, 12, 1), filters=2)
  d = generative.conv_discriminator(3, (8, 12, 1), filters=(2, 3))
  z, y = np.zeros((5, LATENT), np.float32), np.eye(3, dtype=np.float32)[[0, 1, 2, 0, 1]]
  images = g([z, y]).numpy()
  assert images.shape == (5, 8, 12, 1) and images.min() >= 0.0 and images.max() <= 1.0
  assert d([images, y]).shape == (5, 1)
  # Weights of the discriminator by hand: conv1 4*4*(1+3)*2 + 2, conv2 4*4*2*3 + 3, dense
  # (2*3*3) + 1 (the label tiling has none).
  assert d.count_params() == (4 * 4 * 4 * 2 + 2) + (4 * 4 * 2 * 3 + 3) + (2 * 3 * 3 + 1)
  assert generative.conv_generator(LATENT, None, (8, 8, 1), filters=2).inputs[0].shape[-1] == 3
  assert len(generative.conv_discriminator(None, (8, 8, 1), filters=(2, 2)).inputs) == 1
  with pytest.raises(ValueError, match="H and W multiples of 4"):
    generative.conv_generator(LATENT, 3, (10, 8, 1))
  with pytest.raises(ValueError, match=r"filters must hold 2 integer"):
    generative.conv_discriminator(3, (8, 8, 1), filters=(4,))
  with pytest.raises(ValueError, match=r"filters\[0\] must be an integer in \[1, inf\]"):
    generative.conv_generator(LATENT, 3, (8, 8, 1), filters=0)


def test_sequence_models_shapes_weights_and_checks():
  """1-D models: output shapes and range, the crop for lengths that are not a multiple of
  2**len(filters), weights counted by hand, and every refusal names its argument."""
  for length, filters in ((178, (4, 3, 2)), (7, (3,)), (16, (2, 2))):
    g = generative.sequence_generator(LATENT, 2, length, filters=filters, kernel_size=3)
    z, y = np.ones((4, LATENT), np.float32), np.eye(2, dtype=np.float32)[[0, 1, 1, 0]]
    rows = g([z, y]).numpy()
    assert rows.shape == (4, length) and rows.min() >= 0.0 and rows.max() <= 1.0
    # Dense to ceil(L / 2**n) * F1 positions, then n upsamplings: the crop removes the rest.
    start = -(-length // 2 ** len(filters))
    dense = [layer for layer in g.layers if isinstance(layer, keras.layers.Dense)]
    assert len(dense) == 1 and dense[0].units == start * filters[0]
    cropped = [layer for layer in g.layers if isinstance(layer, keras.layers.Cropping1D)]
    assert cropped[0].input.shape[1] == start * 2 ** len(filters)
  d = generative.sequence_discriminator(2, 178, filters=(4, 3), kernel_size=5, hidden=6)
  assert d([rows if rows.shape[1] == 178 else np.zeros((4, 178), np.float32), y]).shape == (4, 1)
  # conv1 5*1*4 + 4, conv2 5*4*3 + 3, dense (45*3 + 2)*6 + 6 (178 -> 89 -> 45), logit 6 + 1.
  assert d.count_params() == (5 * 4 + 4) + (5 * 4 * 3 + 3) + ((45 * 3 + 2) * 6 + 6) + 7
  assert len(generative.sequence_discriminator(None, 10, filters=(2,)).inputs) == 1
  assert len(generative.sequence_generator(LATENT, None, 10, filters=(2,)).inputs) == 1
  with pytest.raises(ValueError, match="kernel_size must be an odd integer"):
    generative.sequence_generator(LATENT, 2, 10, kernel_size=4)
  with pytest.raises(ValueError, match="filters must hold at least one integer"):
    generative.sequence_generator(LATENT, 2, 10, filters=())
  with pytest.raises(ValueError, match=r"filters\[1\] must be an integer in \[1, inf\]"):
    generative.sequence_discriminator(2, 10, filters=(2, 0))
  with pytest.raises(ValueError, match=r"length must be an integer in \[1, inf\]"):
    generative.sequence_generator(LATENT, 2, 0)
  with pytest.raises(ValueError, match=r"hidden must be an integer in \[1, inf\]"):
    generative.sequence_discriminator(2, 10, hidden=0)


def _row_statistics_by_hand(rows):
  """RowStatistics' definition in float64 numpy (population variances, floor 1e-6)."""
  spread = lambda v: 0.5 * np.log(np.var(v, axis=-1) + 1e-6)
  d1 = np.diff(rows, axis=-1)
  d2 = np.diff(rows, n=2, axis=-1)
  return np.stack([10.0 * (rows.mean(-1) - 0.5), spread(rows) + 3.0, spread(d1) + 4.0,
                   spread(d2) + 4.0], axis=-1)


def test_row_statistics_match_numpy_and_known_rows():
  rng = np.random.default_rng(0)
  rows = rng.uniform(size=(5, 3, 20))  # any leading axes are batch axes
  got = generative.RowStatistics()(tf.constant(rows, tf.float32)).numpy()
  assert got.shape == (5, 3, 4)
  np.testing.assert_allclose(got, _row_statistics_by_hand(rows), atol=2e-4)
  # Known rows: a constant row has level 10 (c - 1/2) and every spread at the floor; a sine of
  # amplitude a (whole periods) has standard deviation a / sqrt(2).
  const = generative.RowStatistics()(tf.fill((1, 50), 0.7)).numpy()[0]
  np.testing.assert_allclose(const, [2.0, 0.5 * math.log(1e-6) + 3, 0.5 * math.log(1e-6) + 4,
                                     0.5 * math.log(1e-6) + 4], atol=1e-4)
  t = np.arange(100)
  sine = (0.5 + 0.2 * np.sin(2 * np.pi * t / 25)).astype(np.float32)[None]
  got = generative.RowStatistics()(tf.constant(sine)).numpy()[0]
  assert abs(got[0]) < 1e-4
  assert abs(got[1] - (0.5 * math.log(0.2 ** 2 / 2 + 1e-6) + 3)) < 1e-4
  # Doubling the deviation from the mean keeps the level and adds log 2 to the spread (to
  # the difference spreads too, up to the 1e-6 floor, felt by a smooth row's 2nd differences).
  doubled = 0.5 + 2 * (sine - 0.5)
  twice = generative.RowStatistics()(tf.constant(doubled)).numpy()[0]
  assert abs(twice[0] - got[0]) < 1e-4 and abs(twice[1] - got[1] - math.log(2)) < 1e-4
  np.testing.assert_allclose(twice, _row_statistics_by_hand(doubled.astype(np.float64))[0],
                             atol=2e-4)
  with pytest.raises(ValueError, match="length >= 3"):
    generative.RowStatistics()(tf.zeros((2, 2)))
  with pytest.raises(ValueError, match="length >= 3"):  # the length must be known
    generative.RowStatistics()(keras.Input((None,)))


def test_statistics_discriminator_reads_the_row_only_through_its_statistics(tmp_path):
  keras.utils.set_random_seed(2)
  d = generative.statistics_discriminator(2, 30, hidden=(5, 4))
  # Dense (4 + 2) * 5 + 5, Dense 5 * 4 + 4, logit 4 + 1.
  assert d.count_params() == (6 * 5 + 5) + (5 * 4 + 4) + 5
  rng = np.random.default_rng(1)
  row = rng.uniform(size=(1, 30)).astype(np.float32)
  y = np.eye(2, dtype=np.float32)[[1]]
  reversed_row = row[:, ::-1].copy()  # reversal keeps all four statistics
  assert abs(float(d([row, y])[0, 0]) - float(d([reversed_row, y])[0, 0])) < 1e-5
  # ... and the logit is the MLP head applied to exactly those statistics and the label.
  stats_ = generative.RowStatistics()(tf.constant(row)).numpy()
  h = np.concatenate([stats_, y], axis=1)
  dense = [layer for layer in d.layers if isinstance(layer, keras.layers.Dense)]
  for layer in dense[:-1]:
    h = h @ layer.kernel.numpy() + layer.bias.numpy()
    h = np.where(h > 0, h, 0.2 * h)
  logit = h @ dense[-1].kernel.numpy() + dense[-1].bias.numpy()
  np.testing.assert_allclose(d([row, y]).numpy(), logit, rtol=1e-5, atol=1e-5)
  # A row with twice the spread has other statistics, hence (generically) another logit.
  wider = (row.mean() + 2 * (row - row.mean())).astype(np.float32)
  assert abs(float(d([wider, y])[0, 0]) - float(d([row, y])[0, 0])) > 1e-4
  assert len(generative.statistics_discriminator(None, 10).inputs) == 1
  with pytest.raises(ValueError, match=r"length must be an integer in \[3, inf\]"):
    generative.statistics_discriminator(2, 2)
  with pytest.raises(ValueError, match="hidden must hold at least one"):
    generative.statistics_discriminator(2, 10, hidden=())
  # Saved and reloaded without custom objects (the layer is registered).
  path = str(tmp_path / "statistics_discriminator.keras")
  d.save(path)
  again = keras.models.load_model(path, compile=False)
  np.testing.assert_allclose(again([row, y]).numpy(), d([row, y]).numpy(), atol=1e-6)


def test_projection_discriminator_logit_and_weights_by_hand():
  """logit = w . h + b + (V h) . y, h the last hidden features; weights counted by hand."""
  keras.utils.set_random_seed(2)
  k, shape = 3, (4, 4, 1)
  d = generative.mlp_discriminator(k, shape, hidden=(6, 5), conditioning="projection")
  # Dense 16->6, Dense 6->5, unconditional Dense 5->1, class map 5->3 without bias.
  assert d.count_params() == (16 * 6 + 6) + (6 * 5 + 5) + (5 + 1) + 5 * 3
  concat = generative.mlp_discriminator(k, shape, hidden=(6, 5))
  assert concat.count_params() == (19 * 6 + 6) + (6 * 5 + 5) + (5 + 1)
  rng = np.random.default_rng(0)
  x = rng.uniform(size=(4,) + shape).astype(np.float32)
  labels = np.array([0, 2, 1, 2])
  y = np.eye(k, dtype=np.float32)[labels]
  hidden = [layer for layer in d.layers if isinstance(layer, keras.layers.Dense)
            and layer.name not in ("unconditional_logit", "class_projection")]
  (w1, b1), (w2, b2) = [(layer.kernel.numpy(), layer.bias.numpy()) for layer in hidden]
  leaky = lambda a: np.where(a > 0, a, 0.2 * a)
  h = leaky(leaky(x.reshape(4, -1) @ w1 + b1) @ w2 + b2)
  head = d.get_layer("unconditional_logit")
  v = d.get_layer("class_projection").kernel.numpy()
  expected = h @ head.kernel.numpy()[:, 0] + head.bias.numpy()[0] + (h @ v)[np.arange(4), labels]
  np.testing.assert_allclose(d([x, y]).numpy()[:, 0], expected, rtol=1e-5, atol=1e-6)
  with pytest.raises(ValueError, match=r"conditioning must be one of \['concat', 'projection'\]"):
    generative.mlp_discriminator(k, shape, conditioning="product")
  # Unconditional: the conditioning argument has nothing to act on; one input, one Dense head.
  assert len(generative.mlp_discriminator(None, shape, conditioning="projection").inputs) == 1


@pytest.mark.parametrize("method", ["fast", "vectorized"])
@pytest.mark.parametrize("model", ["projection", "sequence", "statistics"])
def test_discriminator_real_term_removal_moves_the_clipped_sum_by_at_most_c(method, model):
  """Brute force over the path DPGAN's discriminator step takes (clipped_sum_for_model on the
  real term), for the projection MLP, the 1-D convolutional discriminator (strided Conv1D
  rules) and the statistics discriminator (a weightless RowStatistics layer before Dense):
  removing any one real example, row and label, moves the clipped sum by at most C, and by
  more than half of C (the gradients are large, so clipping binds)."""
  from tf_dpkit.clipping.testing import removal_sensitivity  # pylint: disable=g-import-not-at-top
  from tf_dpkit.dp_gradients import clipped_sum_for_model  # pylint: disable=g-import-not-at-top
  keras.utils.set_random_seed(4)
  k, clip = 3, 0.05
  if model == "projection":
    shape = (4, 4, 1)
    d = generative.mlp_discriminator(k, shape, hidden=(6, 4), conditioning="projection")
  elif model == "sequence":
    shape = (11,)
    d = generative.sequence_discriminator(k, 11, filters=(3, 2), kernel_size=3, hidden=4)
  else:
    shape = (11,)
    d = generative.statistics_discriminator(k, 11, hidden=(6, 4))
  rng = np.random.default_rng(9)
  x = (3.0 * rng.normal(size=(6,) + shape)).astype(np.float32)
  y = np.eye(k, dtype=np.float32)[[0, 1, 2, 2, 1, 0]]
  real = lambda y_true, logits: tf.math.softplus(-logits[..., 0])

  def clipped(keep):
    result, _ = clipped_sum_for_model(d, real, [x[keep], y[keep]], tf.zeros([len(keep)]),
                                      tf.ones([len(keep)]), clip, None, method)
    return result.grads

  moved = removal_sensitivity(clipped, len(x))
  assert 0.5 * clip < moved <= clip * (1 + 1e-5)


@pytest.mark.parametrize("discriminator", ["conv", "mlp_projection"])
def test_conditional_discriminator_update_is_the_clipped_real_sum_plus_fake_mean(discriminator):
  """The same DP-SGD step as for the MLP, checked example by example on the conditional
  models: the conv discriminator (Conv2D per-example norms, the weightless label tiling) and
  the projection MLP (the label enters through a weightless Dot after a Dense layer, so the
  real example's label changes which part of the class map receives its gradient)."""
  keras.utils.set_random_seed(1)
  k, shape = 3, (8, 8, 1)
  g = generative.conv_generator(LATENT, k, shape, filters=2)
  if discriminator == "conv":
    d = generative.conv_discriminator(k, shape, filters=(2, 3))
  else:
    d = generative.mlp_discriminator(k, shape, hidden=(6, 4), conditioning="projection")
  gan = DPGAN(g, d, latent_dim=LATENT, num_classes=k, l2_norm_clip=0.05, noise_multiplier=0.0,
              expected_batch_size=4.0, optimizer="sgd", discriminator_learning_rate=1.0,
              clip_fake_examples=False, noise_seed=1)
  rng = np.random.default_rng(3)
  x = rng.uniform(size=(5,) + shape).astype(np.float32)
  y = np.eye(k, dtype=np.float32)[[0, 2, 1, 1, 0]]
  public = tf.random.Generator.from_seed(gan.seed)  # the GAN's first public draws
  z = public.normal([gan.fake_batch_size, LATENT])
  y_fake = tf.one_hot(public.uniform([gan.fake_batch_size], 0, k, dtype=tf.int32), k)
  x_fake = g([z, y_fake], training=True)
  variables = d.trainable_variables
  expected = [tf.zeros_like(v) for v in variables]
  norms = []
  for xi, yi in zip(x, y):
    with tf.GradientTape() as tape:
      loss = tf.math.softplus(-d([xi[None], yi[None]], training=True))[0, 0]
    grads = tape.gradient(loss, variables)
    norms.append(float(tf.linalg.global_norm(grads)))
    factor = min(1.0, gan.l2_norm_clip / norms[-1])
    expected = [e + factor * gr for e, gr in zip(expected, grads)]
  with tf.GradientTape() as tape:
    fake = tf.reduce_mean(tf.math.softplus(d([x_fake, y_fake], training=True)))
  fake_grads = tape.gradient(fake, variables)
  expected = [e / gan.expected_batch_size + f for e, f in zip(expected, fake_grads)]
  assert max(norms) > gan.l2_norm_clip  # clipping is active for some example
  before = _weights(d)
  gan.discriminator_step(x, y, dataset_size=40)
  for b, a, e in zip(before, _weights(d), expected):
    np.testing.assert_allclose(b - a, e.numpy(), rtol=1e-4, atol=1e-6)


def _separable(n, seed, shape=(12, 12, 1)):
  """Three classes: a bright 4x4 square in a class-specific corner, plus uniform noise."""
  rng = np.random.default_rng(seed)
  y = rng.integers(0, 3, n)
  x = rng.uniform(0.0, 0.3, size=(n,) + shape).astype(np.float32)
  for i, label in enumerate(y):
    r, c = [(0, 0), (0, 8), (8, 4)][label]
    x[i, r:r + 4, c:c + 4] = 1.0
  return x, y


@pytest.mark.parametrize("classifier", ["mlp", "cnn"])
def test_tstr_on_real_training_data_is_the_classifiers_ordinary_test_accuracy(classifier):
  x, y = _separable(240, 0)
  xt, yt = _separable(90, 1)
  got = generative.tstr_accuracy(x, y, xt, yt, num_classes=3, epochs=2, batch_size=32,
                                 seed=4, classifier=classifier)
  # Reference: the classifier of the docstring built and trained here by hand, with the same
  # seed, and its accuracy counted with numpy.
  keras.utils.set_random_seed(4)
  if classifier == "mlp":
    layers = [keras.layers.Flatten(), keras.layers.Dense(256, activation="relu")]
  else:
    layers = [keras.layers.Conv2D(32, 3, activation="relu"), keras.layers.MaxPooling2D(2),
              keras.layers.Conv2D(64, 3, activation="relu"), keras.layers.MaxPooling2D(2),
              keras.layers.Flatten(), keras.layers.Dense(128, activation="relu")]
  model = keras.Sequential([keras.Input((12, 12, 1))] + layers + [keras.layers.Dense(3)])
  model.compile(optimizer=keras.optimizers.Adam(1e-3),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  model.fit(x, y, epochs=2, batch_size=32, verbose=0)
  want = float(np.mean(np.argmax(model.predict(xt, verbose=0), 1) == yt))
  assert got == pytest.approx(want, abs=1e-6)
  assert got > 0.9  # the classes are separable: a working classifier gets them right
  # Synthetic labels shifted by one class: the classifier learns the wrong map, accuracy ~0.
  wrong = generative.tstr_accuracy(x, (y + 1) % 3, xt, yt, num_classes=3, epochs=2,
                                   batch_size=32, seed=4, classifier=classifier)
  assert wrong < 0.1


def test_tstr_correct_is_per_record_and_its_mean_is_tstr_accuracy():
  """Each entry is the arg-max of the trained classifier on that record against its label (a
  hand-built copy of the classifier, same seed), and tstr_accuracy is their mean."""
  x, y = _separable(240, 0)
  xt, yt = _separable(60, 1)
  yt = yt.copy()
  yt[:10] = (yt[:10] + 1) % 3  # ten records with a wrong label: the classifier gets them wrong
  got = generative.tstr_correct(x, y, xt, yt, num_classes=3, epochs=2, batch_size=32, seed=4,
                                classifier="mlp")
  assert got.dtype == bool and got.shape == (60,)
  assert not got[:10].any() and got[10:].mean() > 0.9
  keras.utils.set_random_seed(4)
  model = keras.Sequential([keras.Input((12, 12, 1)), keras.layers.Flatten(),
                            keras.layers.Dense(256, activation="relu"), keras.layers.Dense(3)])
  model.compile(optimizer=keras.optimizers.Adam(1e-3),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  model.fit(x, y, epochs=2, batch_size=32, verbose=0)
  np.testing.assert_array_equal(got, np.argmax(model.predict(xt, verbose=0), 1) == yt)
  accuracy = generative.tstr_accuracy(x, y, xt, yt, num_classes=3, epochs=2, batch_size=32,
                                      seed=4, classifier="mlp")
  assert accuracy == pytest.approx(got.mean(), abs=1e-12)


def test_tstr_classifier_argument_checks():
  x, y = _separable(8, 0)
  with pytest.raises(ValueError, match="classifier must be one of"):
    generative.tstr_accuracy(x, y, x, y, num_classes=3, classifier="svm")
  with pytest.raises(ValueError, match=r"classifier='cnn' needs images \[H, W, C\]"):
    generative.tstr_accuracy(x[:, :8, :8], y, x[:, :8, :8], y, num_classes=3, classifier="cnn")


def test_direct_discriminator_steps_are_accounted_or_refused():
  # Was: discriminator_step before fit trained on real data and recorded nothing
  # (epsilon() == 0.0).  Now it needs the dataset size (or a previous fit) and records each
  # step as a Poisson-sampled Gaussian step of q = expected_batch_size / N.
  from dp_references import dp_accounting, dp_rdp  # pylint: disable=g-import-not-at-top
  from analysis.rdp_accountant import DEFAULT_ORDERS  # pylint: disable=g-import-not-at-top
  gan = _gan(noise_multiplier=1.1)
  x, _ = _data(4)
  before = _weights(gan.discriminator)
  with pytest.raises(ValueError, match="dataset_size"):
    gan.discriminator_step(x)
  for after, refused in zip(_weights(gan.discriminator), before):
    np.testing.assert_array_equal(after, refused)  # refused before touching the data
  assert gan.epsilon() == 0.0 and gan.accountant.steps == 0
  for bad in (3, 0, 2.5, True):  # N must be an integer >= expected_batch_size (4)
    with pytest.raises(ValueError, match="dataset_size"):
      gan.discriminator_step(x, dataset_size=bad)
  for _ in range(3):
    gan.discriminator_step(x, dataset_size=40)
  assert gan.accountant.steps == 3
  dpa = dp_accounting()
  reference = dp_rdp().RdpAccountant([o for o in DEFAULT_ORDERS if math.isfinite(o)])
  reference.compose(dpa.PoissonSampledDpEvent(4.0 / 40, dpa.GaussianDpEvent(1.1)), 3)
  assert gan.epsilon() > 0
  assert gan.epsilon() == pytest.approx(reference.get_epsilon(1e-5), rel=1e-6)


def test_a_dpgan_holding_its_noise_key_refuses_pickle():
  # Was: pickling a DPGAN failed only by accident (the optimizer's dynamic class), without
  # saying why.  It holds the discriminator optimizer's secret noise key.
  import pickle  # pylint: disable=g-import-not-at-top
  with pytest.raises(TypeError, match="holds the secret noise key: it cannot be pickled"):
    pickle.dumps(_gan(noise_multiplier=1.0))


def test_randomize_rows_shifts_and_rescales_by_hand():
  rng = np.random.default_rng(3)
  rows = rng.uniform(0.3, 0.7, size=(6, 9)).astype(np.float32)
  same = generative.randomize_rows(rows, shift=False, log_scale_std=0.0)
  np.testing.assert_array_equal(same, rows)
  shifted = generative.randomize_rows(rows, shift=True, seed=11)
  # The offsets are the seed's first integers draw; each row is np.roll of itself by its own.
  offsets = np.random.default_rng(11).integers(0, 9, 6)
  np.testing.assert_array_equal(shifted, np.stack([np.roll(r, o) for r, o in zip(rows, offsets)]))
  # Rescaling: same mean, deviation times exp(s e) with e the seed's normals (after the shift's
  # integers when shifting; alone here).
  s = 0.4
  scaled = generative.randomize_rows(rows, shift=False, log_scale_std=s, seed=5)
  factor = np.exp(s * np.random.default_rng(5).standard_normal(6))
  mean = rows.mean(1, keepdims=True)
  np.testing.assert_allclose(scaled, mean + (rows - mean) * factor[:, None], atol=1e-6)
  # Shift and rescaling together: the shift's integers are drawn first, then the normals.
  both = generative.randomize_rows(rows, shift=True, log_scale_std=s, seed=8)
  draw = np.random.default_rng(8)
  offsets, factor = draw.integers(0, 9, 6), np.exp(s * draw.standard_normal(6))
  rolled = np.stack([np.roll(r, o) for r, o in zip(rows, offsets)])
  mean = rolled.mean(1, keepdims=True)
  np.testing.assert_allclose(both, mean + (rolled - mean) * factor[:, None], atol=1e-6)
  # Without randomisation the rows are only clipped to [low, high].
  np.testing.assert_array_equal(
      generative.randomize_rows(np.array([[-0.5, 0.5, 1.5]], np.float32), shift=False),
      [[0.0, 0.5, 1.0]])
  # Values are clipped to [low, high].
  wide = generative.randomize_rows(np.array([[0.0, 1.0, 0.5]], np.float32), shift=False,
                                   log_scale_std=3.0, seed=0, low=0.1, high=0.9)
  assert wide.min() >= 0.1 and wide.max() <= 0.9
  # scale_about_mean on images: each example keeps its mean, its deviation scales.
  images = rng.uniform(size=(3, 4, 4, 1)).astype(np.float32)
  out = generative.scale_about_mean(images, [1.0, 2.0, 0.5]).numpy()
  m = images.mean(axis=(1, 2, 3), keepdims=True)
  np.testing.assert_allclose(out, m + (images - m) * np.array([1.0, 2.0, 0.5])[:, None, None, None],
                             atol=1e-6)


@pytest.mark.parametrize("kwargs, match", [
    (dict(rows=np.zeros((3,))), r"finite \[n, L\] array"),
    (dict(rows=np.full((2, 3), np.nan)), r"finite \[n, L\] array"),
    (dict(shift=1), "shift must be True or False"),
    (dict(log_scale_std=-0.1), "log_scale_std"),
    (dict(seed=-1), "seed"),
    (dict(low=1.0, high=0.0), "low and high"),
    (dict(high=math.inf), "low and high"),
])
def test_randomize_rows_refusals_name_the_argument(kwargs, match):
  args = dict(rows=np.zeros((2, 3), np.float32))
  args.update(kwargs)
  rows = args.pop("rows")
  with pytest.raises(ValueError, match=match):
    generative.randomize_rows(rows, **args)


def test_scale_about_mean_refusals_name_the_argument():
  with pytest.raises(ValueError, match=r"x must be a \[B, \.\.\.\] batch"):
    generative.scale_about_mean(np.zeros(4, np.float32), [1.0] * 4)
  with pytest.raises(ValueError, match=r"factor must be a \[B\] vector"):
    generative.scale_about_mean(np.zeros((2, 3), np.float32), [[1.0], [1.0]])
  with pytest.raises(ValueError, match="one value per example: 2 examples, 3 factors"):
    generative.scale_about_mean(np.zeros((2, 3), np.float32), [1.0, 1.0, 1.0])
  for bad in ([1.0, 0.0], [1.0, -2.0], [1.0, np.inf], [np.nan, 1.0]):
    with pytest.raises(ValueError, match="factor must be finite and > 0"):
      generative.scale_about_mean(np.zeros((2, 3), np.float32), bad)
