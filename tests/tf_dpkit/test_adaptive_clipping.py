"""Adaptive clipping in the Keras DP optimizers (tf_dpkit.optimizers.adaptive_clipping).

The models here have known per-example gradient norms: a bias-free ``Dense(1)`` whose
per-example "loss" is its output has the gradient ``x_i`` for example ``i``, so the norms are
the rows' norms, drawn from a known distribution.  References: the norms' quantiles (tracking),
the formula of the update computed here in NumPy (noise-free runs), the noise stds the split
prescribes (sample stds over many steps), brute-force removal sensitivity.
"""
import json
import math
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from scipy import stats

import tf_dpkit
from analysis import adaptive_clipping as maths
from secret_search import files_holding
from tf_dpkit.clipping import clipped_sum_vectorized
from tf_dpkit.clipping.fast_path import clipped_sum_fast
from tf_dpkit.clipping.testing import removal_sensitivity
from tf_dpkit.optimizers import DPGradientDescentGaussianOptimizer as DPSGD

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DIM = 4


def _output_as_loss(y_true, y_pred):
  del y_true
  return y_pred[:, 0]


def _linear_model():
  """DPSequential whose per-example gradient is the example's input row."""
  model = tf_dpkit.DPSequential([keras.Input((DIM,)), keras.layers.Dense(1, use_bias=False)])
  return model


def _rows_with_norms(norms, rng):
  directions = rng.normal(size=(len(norms), DIM))
  directions /= np.linalg.norm(directions, axis=1, keepdims=True)
  return (directions * np.asarray(norms)[:, None]).astype(np.float32)


def _optimizer(**kwargs):
  args = dict(l2_norm_clip=10.0, noise_multiplier=1.0, expected_batch_size=64,
              learning_rate=1e-3, seed=3,
              adaptive_clipping=tf_dpkit.AdaptiveClipping(0.5, 0.2))
  args.update(kwargs)
  return DPSGD(**args)


def _clip(optimizer):
  return float(optimizer.l2_norm_clip_for_step().numpy())


def test_fit_with_make_private_tracks_the_median_logs_the_clip_and_keeps_the_epsilon():
  """make_private(adaptive_clipping=True) on Poisson batches (expected 64 of N = 1,280, 15
  epochs x 20 steps), fast path; norms ~ LogNormal(0, 0.5), gamma 0.5, eta 0.2, sigma_b =
  64 / 20, C_0 = 3.  Simulated over 300 seeds (NumPy, same settings and Poisson batch sizes):
  F(geometric mean of the last 8 logged C_t) - gamma has std 0.008 and |mean| < 0.001;
  tolerance 0.045 (over 5 standard deviations).  The epsilon is that of fixed clipping."""
  rng = np.random.default_rng(0)
  x = _rows_with_norms(rng.lognormal(0.0, 0.5, 1280), rng)
  y = np.zeros(1280, np.float32)
  common = dict(batch_size=64, l2_norm_clip=3.0, delta=1e-5, epochs=15, noise_multiplier=1.0)
  private = tf_dpkit.make_private((x, y), adaptive_clipping=True, **common)
  assert private.adaptive_clipping.count_noise_stddev == 64 / 20
  assert private.epsilon == tf_dpkit.make_private((x, y), **common).epsilon
  model = _linear_model()
  assert tf_dpkit.clipping.fast_path_available(model)
  model.compile(optimizer=private.optimizer(learning_rate=1e-3), loss=_output_as_loss)
  assert model.optimizer.adaptive_clipping.count_noise_stddev == 64 / 20
  assert model.optimizer.noise_multiplier == 1.0  # what the accountant reads: z, unchanged
  history = model.fit(**private.fit_arguments(seed=1, verbose=False), verbose=0).history
  assert history["epsilon"][-1] == pytest.approx(private.epsilon, rel=1e-12)
  logged = np.array(history[tf_dpkit.optimizers.adaptive_clipping.LOG_NAME])
  assert logged.shape == (15,)
  assert logged[-1] == pytest.approx(_clip(model.optimizer))
  tracked = math.exp(np.mean(np.log(logged[7:])))
  assert stats.lognorm.cdf(tracked, 0.5) == pytest.approx(0.5, abs=0.045)


def test_make_private_resolves_and_checks_the_count_noise():
  x, y = np.zeros((256, DIM), np.float32), np.zeros(256, np.float32)
  common = dict(batch_size=32, l2_norm_clip=3.0, delta=1e-5, epochs=1, noise_multiplier=1.0)
  shuffled = tf_dpkit.make_private((x, y), adaptive_clipping=dict(target_quantile=0.7),
                                   sampling="shuffle", num_microbatches=32,
                                   **dict(common, batch_size=64))
  assert shuffled.adaptive_clipping.count_noise_stddev == 32 / 20  # microbatches per step / 20
  assert shuffled.adaptive_clipping.target_quantile == 0.7
  with pytest.raises(ValueError, match="adaptive_clipping"):
    shuffled.optimizer(adaptive_clipping=None)
  with pytest.raises(ValueError, match="count_noise_stddev > noise_multiplier / 2"):
    tf_dpkit.make_private((x, y), adaptive_clipping=dict(count_noise_stddev=0.4), **common)
  # The default n / 20 is too small for few microbatches per step: refused, not weakened.
  with pytest.raises(ValueError, match="count_noise_stddev > noise_multiplier / 2"):
    tf_dpkit.make_private((x, y), adaptive_clipping=True, sampling="shuffle",
                          num_microbatches=8, **common)
  with pytest.raises(ValueError, match="gradient_accumulation_steps"):
    tf_dpkit.make_private((x, y), adaptive_clipping=True, gradient_accumulation_steps=2,
                          **common)


def test_custom_loop_minimize_tracks_the_80th_percentile():
  """``optimizer.minimize(vector_loss)`` (Jacobian path): gamma 0.8, 300 steps; the same
  simulation as above gives std 0.006; tolerance 0.04."""
  rng = np.random.default_rng(1)
  x = tf.constant(_rows_with_norms(rng.lognormal(0.0, 0.5, 64 * 300), rng))
  w = tf.Variable(tf.zeros([DIM]))
  optimizer = _optimizer(adaptive_clipping=dict(target_quantile=0.8, learning_rate=0.2))

  @tf.function
  def run():
    clips = tf.TensorArray(tf.float32, size=300)
    for t in tf.range(300):
      batch = x[t * 64:(t + 1) * 64]
      with tf.GradientTape() as tape:
        loss = tf.linalg.matvec(batch, w)
      optimizer.minimize(loss, [w], tape=tape)
      clips = clips.write(t, tf.convert_to_tensor(optimizer.l2_norm_clip_for_step()))
    return clips.stack()

  clips = run().numpy()
  tracked = math.exp(np.mean(np.log(clips[150::10])))
  assert stats.lognorm.cdf(tracked, 0.5) == pytest.approx(0.8, abs=0.04)


def _noise_free_reference(x_batches, clip, n, gamma, eta):
  clips = []
  for batch in x_batches:
    norms = np.linalg.norm(batch.astype(np.float64), axis=1)
    recentred = np.sum(norms <= clip) - len(norms) / 2
    fraction = min(1.0, max(0.0, recentred / n + 0.5))
    clip = clip * math.exp(-eta * (fraction - gamma))
    clips.append(clip)
  return np.array(clips)


@pytest.mark.parametrize("method", ["fast", pytest.param("vectorized", marks=pytest.mark.slow)])
def test_noise_free_updates_equal_the_formula_and_survive_a_keras_file(tmp_path, method):
  """z = 0 and sigma_b = 0 (allowed only together): each C_t+1 is the update of the exact
  count of rows with norm <= C_t; a .keras file restores C_t and training continues from it."""
  rng = np.random.default_rng(2)
  x = _rows_with_norms(rng.lognormal(0.0, 1.0, 8 * 16), rng)
  batches = [x[i * 16:(i + 1) * 16] for i in range(8)]
  optimizer = _optimizer(noise_multiplier=0.0, expected_batch_size=20, learning_rate=0.5, seed=None,
                         l2_norm_clip=0.3, adaptive_clipping=dict(
                             target_quantile=0.3, learning_rate=0.7, count_noise_stddev=0.0))
  model = _linear_model()
  model.per_example_method = method
  model.compile(optimizer=optimizer, loss=_output_as_loss)
  wanted = _noise_free_reference(batches, 0.3, 20, 0.3, 0.7)
  got = []
  for batch in batches[:5]:
    model.train_on_batch(batch, np.zeros(16, np.float32))
    got.append(_clip(optimizer))
  np.testing.assert_allclose(got, wanted[:5], rtol=2e-6)
  path = str(tmp_path / "model.keras")
  model.save(path)
  restored = keras.models.load_model(path, custom_objects={"_output_as_loss": _output_as_loss})
  settings = restored.optimizer.adaptive_clipping
  assert settings.get_config() == optimizer.adaptive_clipping.get_config()
  assert _clip(restored.optimizer) == got[-1]
  restored.per_example_method = method
  for batch, want in zip(batches[5:], wanted[5:]):
    restored.train_on_batch(batch, np.zeros(16, np.float32))
    assert _clip(restored.optimizer) == pytest.approx(want, rel=2e-6)
  # The key (secret here: no seed) is in no file; C_t is.
  assert files_holding(tmp_path, int(optimizer.dp_settings.noise_key)) == []


def test_noise_stds_match_the_split_and_the_count_noise_is_independent():
  """A custom loop (clipped_sum_vectorized, privatize, apply).  Zero inputs: every gradient is
  0, all 10 examples unclipped, so with C_t reset to 2 before each step the update is
  -(sum noise) / n and C_t+1 reveals B~ = 5 + count noise.  Expected:
  sum noise std z_Delta * 2 (z = 1, sigma_b = 50: z_Delta = 1.0000500), count noise std 50.
  1,500 steps: 12,000 sum draws (relative standard error of the std 0.65%, tolerance 4%) and
  1,500 count draws (1.8%, tolerance 9%, 5 of them)."""
  steps, n, clip = 1500, 1000.0, 2.0
  w = tf.Variable(tf.zeros([8]))
  optimizer = _optimizer(expected_batch_size=n, learning_rate=1.0, adaptive_clipping=dict(
      target_quantile=0.5, learning_rate=0.2, count_noise_stddev=50.0))
  optimizer.build([w])
  z_delta = optimizer._dp_adaptive.sum_noise_multiplier  # pylint: disable=protected-access
  assert z_delta == pytest.approx(1.0 / math.sqrt(1.0 - 1.0 / 100**2), rel=1e-12)
  variable = optimizer.l2_norm_clip_for_step()
  x = tf.zeros([10, 8])

  @tf.function
  def run():
    sums = tf.TensorArray(tf.float32, size=steps)
    counts = tf.TensorArray(tf.float32, size=steps)
    for t in tf.range(steps):
      variable.assign(clip)
      w.assign(tf.zeros([8]))
      clipped, _ = clipped_sum_vectorized(lambda b: (tf.linalg.matvec(b[0], w), ()), (x,), [w],
                                          optimizer.l2_norm_clip_for_step())
      optimizer.apply(optimizer.privatize(clipped), [w])
      fraction = 0.5 - tf.math.log(tf.convert_to_tensor(variable) / clip) / 0.2
      sums = sums.write(t, -tf.convert_to_tensor(w) * n)
      counts = counts.write(t, (fraction - 0.5) * n - 5.0)
    return sums.stack(), counts.stack()

  sums, counts = (a.numpy().astype(np.float64) for a in run())
  assert np.std(sums) / (z_delta * clip) == pytest.approx(1.0, abs=0.04)
  assert np.std(counts) / 50.0 == pytest.approx(1.0, abs=0.09)
  assert abs(np.mean(sums)) < 5 * z_delta * clip / math.sqrt(sums.size)
  assert abs(np.mean(counts)) < 5 * 50.0 / math.sqrt(steps)
  # Independent streams: no correlation with any coordinate, and never the same draw.
  for k in range(8):
    assert abs(np.corrcoef(sums[:, k], counts)[0, 1]) < 5 / math.sqrt(steps)
  standardised = sums / (z_delta * clip)
  assert not np.any(np.isclose(standardised, (counts / 50.0)[:, None], rtol=0, atol=1e-6))


@pytest.mark.parametrize("paths", ["fast", pytest.param("both", marks=pytest.mark.slow)])
def test_removing_one_example_moves_the_clipped_sum_by_at_most_the_current_clip(paths):
  """Brute force (tf_dpkit.clipping.testing.removal_sensitivity) at C_t of every step of an
  adaptive run on a small MLP, on the fast path (and the vectorized one, slow)."""
  rng = np.random.default_rng(4)
  x = (rng.normal(size=(6, 3)) * rng.lognormal(0, 1, (6, 1))).astype(np.float32)
  y = rng.integers(0, 3, 6)
  inputs = keras.Input((3,))
  outputs = keras.layers.Dense(3)(keras.layers.Dense(5, activation="tanh")(inputs))
  model = tf_dpkit.DPModel(inputs, outputs)
  loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
  optimizer = _optimizer(l2_norm_clip=0.5, expected_batch_size=6, learning_rate=0.1,
                         adaptive_clipping=dict(target_quantile=0.5, learning_rate=1.0,
                                                count_noise_stddev=1.0), noise_multiplier=0.5)
  model.compile(optimizer=optimizer, loss=loss)

  def fast(keep):
    clipped, _ = clipped_sum_fast(model, loss.call, (x[keep], y[keep], None),
                                  optimizer.l2_norm_clip_for_step())
    return clipped.grads

  def vectorized(keep):
    def loss_fn(batch):
      xb, yb = batch
      return loss(yb, model(xb)), ()
    clipped, _ = clipped_sum_vectorized(loss_fn, (x[keep], y[keep]), model.trainable_variables,
                                        optimizer.l2_norm_clip_for_step())
    return clipped.grads

  clips, reached = [], False
  for _ in range(3):
    clip = _clip(optimizer)
    clips.append(clip)
    for path in (fast, vectorized) if paths == "both" else (fast,):
      moved = removal_sensitivity(path, len(x))
      assert moved <= clip * (1 + 1e-5)
      reached |= moved >= clip * (1 - 1e-5)  # a clipped example moves it by exactly C_t
    model.train_on_batch(x, y)
  assert len(set(clips)) == 3  # the clip did move
  assert reached


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(adaptive_clipping=dict(count_noise_stddev=0.5)), ValueError,
     r"count_noise_stddev > noise_multiplier / 2 = 0.5"),
    (dict(adaptive_clipping=dict(count_noise_stddev=0.55)), ValueError, "more than 2x"),
    (dict(expected_batch_size=None, adaptive_clipping=True), ValueError,
     "needs count_noise_stddev"),
    (dict(adaptive_clipping="median"), TypeError, "adaptive_clipping must be"),
    (dict(adaptive_clipping=dict(quantile=0.5)), ValueError, "unknown settings"),
    (dict(adaptive_clipping=dict(target_quantile=1.0)), ValueError, "target_quantile"),
    (dict(adaptive_clipping=dict(learning_rate=-0.1)), ValueError, "learning_rate"),
    (dict(adaptive_clipping=dict(count_noise_stddev=float("nan"))), ValueError,
     "count_noise_stddev"),
    (dict(gradient_accumulation_steps=2), ValueError, "gradient_accumulation_steps"),
    (dict(l2_norm_clip=tf_dpkit.clipping.groups.LayerClipNorms({"dense": 1.0})), ValueError,
     "per-layer clip norms"),
])
def test_bad_adaptive_settings_are_refused_at_construction(kwargs, error, match):
  with pytest.raises(error, match=match):
    _optimizer(**kwargs)


def test_v1_optimizers_refuse_adaptive_clipping():
  with pytest.raises(ValueError, match="Keras 3 DP optimizers only"):
    tf_dpkit.v1.DPGradientDescentGaussianOptimizer(
        1.0, 1.0, adaptive_clipping=True, learning_rate=0.1)


def test_privatize_refuses_a_sum_clipped_at_another_norm_before_any_noise():
  w = tf.Variable(tf.ones([DIM]))
  x = tf.ones([4, DIM])

  def loss_fn(batch):
    return tf.linalg.matvec(batch[0], w), ()

  adaptive = _optimizer()
  clipped, _ = clipped_sum_vectorized(loss_fn, (x,), [w], adaptive.l2_norm_clip)  # C_0, a float
  draws = adaptive.dp_settings._noise_draw_counter().numpy()  # pylint: disable=protected-access
  with pytest.raises(ValueError, match="not at the optimizer's current clip norm"):
    adaptive.privatize(clipped)
  counter = adaptive.dp_settings._noise_draw_counter()  # pylint: disable=protected-access
  assert counter.numpy() == draws
  assert _clip(adaptive) == 10.0
  fixed = DPSGD(1.0, 1.0, learning_rate=0.1)
  clipped, _ = clipped_sum_vectorized(loss_fn, (x,), [w], 2.0)
  with pytest.raises(ValueError, match="above the optimizer's l2_norm_clip=1.0"):
    fixed.privatize(clipped)


_REPLICAS_SCRIPT = """
import json, math
import numpy as np
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import tf_dpkit
from tf_dpkit.clipping import clipped_sum_vectorized
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
rows = np.array(json.loads(ROWS), np.float32)

def train(optimizer, w, parts, steps, reset_clip=None):
  def step(x):
    clipped, _ = clipped_sum_vectorized(lambda b: (tf.linalg.matvec(b[0], w), ()), (x,), [w],
                                        optimizer.l2_norm_clip_for_step())
    optimizer.apply(optimizer.privatize(clipped), [w])

  @tf.function
  def run(x):
    if reset_clip is not None:
      optimizer.l2_norm_clip_for_step().assign(reset_clip)
      w.assign(tf.zeros_like(w))
    strategy.run(step, (x,))
    return tf.convert_to_tensor(optimizer.l2_norm_clip_for_step()), tf.convert_to_tensor(w)
  out = []
  for t in range(steps):
    x = strategy.experimental_distribute_values_from_function(
        lambda ctx: tf.constant(parts(t)[ctx.replica_id_in_sync_group]))
    clip, weights = run(x)
    out.append((float(clip), weights.numpy().tolist()))
  return out

with strategy.scope():
  exact = tf_dpkit.DPGradientDescentGaussianOptimizer(
      0.3, 0.0, expected_batch_size=20, learning_rate=0.5, adaptive_clipping=dict(
          target_quantile=0.3, learning_rate=0.7, count_noise_stddev=0.0))
  w1 = tf.Variable(tf.zeros([4]))
  noisy = tf_dpkit.DPGradientDescentGaussianOptimizer(
      1.0, 1.0, expected_batch_size=1000, learning_rate=1.0, seed=5, adaptive_clipping=dict(
          target_quantile=0.5, learning_rate=0.2, count_noise_stddev=50.0))
  w2 = tf.Variable(tf.zeros([8]))
clips = [c for c, _ in train(exact, w1, lambda t: (rows[16 * t:16 * t + 8],
                                                    rows[16 * t + 8:16 * t + 16]), 5)]
zeros = np.zeros((5, 8), np.float32)
noise = train(noisy, w2, lambda t: (zeros, zeros), 400, reset_clip=2.0)
print("RESULT " + json.dumps({"clips": clips, "noise": noise}))
"""


@pytest.mark.slow
def test_two_replicas_release_the_one_device_count_and_noise():
  """MirroredStrategy with 2 replicas (a subprocess with 2 logical CPUs), custom loop.  Noise
  free: the clip follows the update of the GLOBAL batch's exact count (16 rows, 8 per
  replica).  Noisy (zero inputs, C_t reset to 2, n = 1,000, sigma_b = 50, z = 1): the count
  noise of the all-reduced shares has std sigma_b (400 draws: relative standard error 3.5%,
  tolerance 18%) and the sum noise std z_Delta * 2 (3,200 draws: 1.25%, tolerance 7%)."""
  rng = np.random.default_rng(2)
  x = _rows_with_norms(rng.lognormal(0.0, 1.0, 5 * 16), rng)
  code = _REPLICAS_SCRIPT.replace("json.loads(ROWS)", f"json.loads({json.dumps(x.tolist())!r})")
  env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3")
  proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                        timeout=600, env=env, cwd=ROOT)
  line = next((l for l in proc.stdout.splitlines() if l.startswith("RESULT ")), None)
  assert line is not None, proc.stdout[-3000:] + proc.stderr[-3000:]
  result = json.loads(line[len("RESULT "):])
  wanted = _noise_free_reference([x[16 * t:16 * (t + 1)] for t in range(5)], 0.3, 20, 0.3, 0.7)
  np.testing.assert_allclose(result["clips"], wanted, rtol=2e-6)
  clips = np.array([c for c, _ in result["noise"]], np.float64)
  counts = ((0.5 - np.log(clips / 2.0) / 0.2) - 0.5) * 1000.0 - 5.0
  sums = -np.array([w for _, w in result["noise"]], np.float64) * 1000.0
  z_delta = maths.sum_noise_multiplier(1.0, 50.0)
  assert np.std(counts) / 50.0 == pytest.approx(1.0, abs=0.18)
  assert np.std(sums) / (z_delta * 2.0) == pytest.approx(1.0, abs=0.07)


def test_the_split_in_the_optimizer_is_the_analysis_one():
  optimizer = _optimizer(noise_multiplier=1.1)
  state = optimizer._dp_adaptive  # pylint: disable=protected-access
  assert state.count_noise_stddev == 64 / 20
  assert state.sum_noise_multiplier == maths.sum_noise_multiplier(1.1, 64 / 20)
  assert optimizer.get_config()["adaptive_clipping"] == {
      "target_quantile": 0.5, "learning_rate": 0.2, "count_noise_stddev": 3.2}
  assert optimizer.noise_multiplier == 1.1


@pytest.mark.parametrize("method", ["fast", pytest.param("vectorized", marks=pytest.mark.slow)])
def test_a_weight_0_placeholder_adds_nothing_to_the_unclipped_count(method):
  """The Poisson pipeline's empty draw is example 0 with weight 0.  It must release the count
  of the empty batch (0 plus noise), and next to real rows the count of the real rows only;
  noise-free (z = 0, sigma_b = 0), so C_1 is the update formula of that exact count.
  Was: the placeholder's zero gradient counted as unclipped (+1/2): removing the one example
  of a batch moved the count by 1 where the noise split assumes 1/2."""
  rng = np.random.default_rng(5)
  real = _rows_with_norms(rng.lognormal(0.0, 1.0, 16), rng)
  placeholder = _rows_with_norms([50.0], rng)  # its weight is 0: its gradient is 0
  gamma, eta, n, clip0 = 0.3, 0.7, 20, 0.9
  for rows, weights, reference_rows in (
      (placeholder, [0.0], real[:0]),
      (np.concatenate([real, placeholder]), [1.0] * 16 + [0.0], real)):
    optimizer = _optimizer(noise_multiplier=0.0, expected_batch_size=n, seed=None,
                           l2_norm_clip=clip0, adaptive_clipping=dict(
                               target_quantile=gamma, learning_rate=eta,
                               count_noise_stddev=0.0))
    model = _linear_model()
    model.per_example_method = method
    model.compile(optimizer=optimizer, loss=_output_as_loss)
    model.train_on_batch(rows, np.zeros(len(rows), np.float32),
                         sample_weight=np.array(weights, np.float32))
    norms = np.linalg.norm(reference_rows.astype(np.float64), axis=1)
    count = np.sum(norms <= clip0) - len(norms) / 2  # 0 for the empty batch
    want = clip0 * math.exp(-eta * (min(1.0, max(0.0, count / n + 0.5)) - gamma))
    assert _clip(optimizer) == pytest.approx(want, rel=2e-6)


@pytest.mark.parametrize("combination, match", [
    (dict(layer_clip_norms=True), "cannot be combined with per-layer clip norms.*global clip"),
    (dict(gradient_accumulation_steps=2), "cannot be combined with gradient_accumulation_steps=2"
                                          ".*once per k micro-batches")])
def test_adaptive_clipping_combinations_are_refused_for_what_they_are(combination, match):
  # Was: without expected_batch_size the refusal spoke of a missing count_noise_stddev.
  from tf_dpkit.clipping.groups import LayerClipNorms  # pylint: disable=g-import-not-at-top
  args = dict(l2_norm_clip=1.0, noise_multiplier=1.0, learning_rate=0.1,
              adaptive_clipping=True)
  if combination.pop("layer_clip_norms", False):
    args["l2_norm_clip"] = LayerClipNorms({"a": 1.0})
  args.update(combination)
  for extra in ({}, {"expected_batch_size": 100.0}):
    with pytest.raises(ValueError, match=match) as info:
      DPSGD(**args, **extra)
    assert "count_noise_stddev" not in str(info.value)
