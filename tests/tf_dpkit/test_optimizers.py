"""Keras 3 DP optimizers: numbers against non-private and NumPy references, and error paths."""
import numpy as np
import pytest
import keras
import tensorflow as tf

import tf_dpkit
from tf_dpkit import make_gaussian_optimizer_class

KERAS_CLASSES = [
    keras.optimizers.SGD, keras.optimizers.Adam, keras.optimizers.AdamW,
    keras.optimizers.Adagrad, keras.optimizers.RMSprop, keras.optimizers.Nadam,
    keras.optimizers.Adamax, keras.optimizers.Lion, keras.optimizers.Adafactor,
    keras.optimizers.Ftrl, keras.optimizers.Adadelta, keras.optimizers.Lamb,
]

RNG = np.random.default_rng(0)
X = RNG.normal(size=(8, 5)).astype(np.float32)
Y = RNG.normal(size=(8, 1)).astype(np.float32)
W0 = RNG.normal(size=(5, 1)).astype(np.float32)


def _vector_loss(w):
  return tf.reduce_sum(tf.square(tf.matmul(X, w) - Y), axis=1)  # [8]


def _run(optimizer, dp, mode, steps=3):
  w = keras.Variable(W0, name="w")  # Keras variables: some optimizers (Adafactor) need names

  def step():
    with tf.GradientTape() as tape:
      loss = _vector_loss(w)
      if not dp:
        loss = tf.reduce_mean(loss)
    if dp:
      optimizer.minimize(loss, [w], tape=tape)
    else:
      optimizer.apply_gradients(zip(tape.gradient(loss, [w]), [w]))

  if mode == "function":
    step = tf.function(step)
  for _ in range(steps):
    step()
  return w.numpy()


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("base", KERAS_CLASSES, ids=lambda c: c.__name__)
def test_no_noise_huge_clip_equals_non_private(base, mode):
  dp_cls = make_gaussian_optimizer_class(base)
  private = _run(dp_cls(1e9, 0.0, None, learning_rate=0.01, seed=0), True, mode)
  plain = _run(base(learning_rate=0.01), False, mode)
  np.testing.assert_allclose(private, plain, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("num_microbatches", [None, 1, 2, 4, 8])
def test_clipping_matches_numpy_reference_per_microbatch(num_microbatches):
  clip = 0.5
  opt = tf_dpkit.DPGradientDescentGaussianOptimizer(clip, 0.0, num_microbatches,
                                                    learning_rate=1.0, seed=0)
  w = tf.Variable(W0)
  with tf.GradientTape() as tape:
    loss = _vector_loss(w)
  opt.minimize(loss, [w], tape=tape)
  # Reference: per-example gradient of (x.w - y)^2 is 2 (x.w - y) x.
  per_example = 2 * (X @ W0 - Y) * X  # [8, 5]
  m = 8 if num_microbatches is None else num_microbatches
  groups = per_example.reshape(m, -1, 5).mean(axis=1)
  norms = np.linalg.norm(groups, axis=1, keepdims=True)
  clipped = groups * np.minimum(1.0, clip / norms)
  expected = W0 - clipped.sum(axis=0).reshape(5, 1) / m
  np.testing.assert_allclose(w.numpy(), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("num_microbatches", [None, 4])
def test_noise_std_matches_noise_multiplier_times_clip_over_microbatches(num_microbatches):
  # Zero gradients: the update is pure noise / M.  20,000 coordinates -> the sample std has a
  # relative standard error of 1/sqrt(2n) = 0.5%; we allow 3% (6 standard errors).
  sigma, clip, batch = 1.3, 0.7, 8
  opt = tf_dpkit.DPGradientDescentGaussianOptimizer(clip, sigma, num_microbatches,
                                                    learning_rate=1.0, seed=123)
  w = tf.Variable(tf.zeros([20000]))
  with tf.GradientTape() as tape:
    loss = tf.zeros([batch]) * tf.reduce_sum(w)
  opt.minimize(loss, [w], tape=tape)
  m = batch if num_microbatches is None else num_microbatches
  update = -w.numpy()
  assert abs(update.std() / (sigma * clip / m) - 1) < 0.03
  assert abs(update.mean()) < 4 * sigma * clip / m / np.sqrt(update.size)


@pytest.mark.parametrize("noise_multiplier", [0.0, 1.0])
def test_unconnected_variable_gets_zero_gradient_plus_noise(noise_multiplier):
  # The analysis assumes every coordinate of the released sum is noised, reached or not.
  opt = tf_dpkit.DPGradientDescentGaussianOptimizer(1.0, noise_multiplier, learning_rate=1.0,
                                                    seed=0)
  w, unused = tf.Variable(W0), tf.Variable(tf.zeros([4000]))
  with tf.GradientTape() as tape:
    loss = _vector_loss(w)
  grads_and_vars = opt.compute_gradients(loss, [w, unused], tape=tape)
  grad = grads_and_vars[1][0].numpy()
  batch = int(loss.shape[0])
  if noise_multiplier == 0:
    np.testing.assert_array_equal(grad, np.zeros(4000))
  else:  # N(0, (sigma C)^2) / B per coordinate; std within 5 standard errors (1/sqrt(2n))
    assert abs(grad.std() * batch / noise_multiplier - 1) < 5 / np.sqrt(2 * grad.size)


def test_seeded_noise_is_reproducible_and_changes_per_step():
  def draws(seed):
    opt = tf_dpkit.DPGradientDescentGaussianOptimizer(1.0, 1.0, learning_rate=1.0, seed=seed)
    w = tf.Variable(tf.zeros([4]))
    out = []
    for _ in range(2):
      with tf.GradientTape() as tape:
        loss = tf.zeros([2]) * tf.reduce_sum(w)
      out.append(opt.compute_gradients(loss, [w], tape=tape)[0][0].numpy())
      opt.iterations.assign_add(1)  # what apply_gradients does after each step
    return out
  a, b, c = draws(7), draws(7), draws(8)
  np.testing.assert_array_equal(a[0], b[0])
  assert not np.allclose(a[0], a[1])
  assert not np.allclose(a[0], c[0])


def test_two_private_gradients_at_one_step_get_independent_noise():
  # Equal noise on two batches at one step would cancel in their difference and leak it.
  opt = tf_dpkit.DPGradientDescentGaussianOptimizer(1.0, 1.0, learning_rate=1.0, seed=3)
  w = tf.Variable(tf.zeros([20000]))

  @tf.function
  def private_gradient():
    with tf.GradientTape() as tape:
      loss = tf.zeros([2]) * tf.reduce_sum(w)
    return opt.compute_gradients(loss, [w], tape=tape)[0][0]

  eager = []
  for _ in range(2):
    with tf.GradientTape() as tape:
      loss = tf.zeros([2]) * tf.reduce_sum(w)
    eager.append(opt.compute_gradients(loss, [w], tape=tape)[0][0].numpy())
  traced = [private_gradient().numpy(), private_gradient().numpy()]
  assert int(opt.iterations.numpy()) == 0
  draws = eager + traced
  for i in range(len(draws)):
    for j in range(i):
      assert abs(np.corrcoef(draws[i], draws[j])[0, 1]) < 5 / np.sqrt(w.shape[0])


def test_unseeded_optimizers_draw_different_noise_and_key_stays_out_of_config():
  o1 = tf_dpkit.DPAdamGaussianOptimizer(1.0, 1.0, learning_rate=0.1)
  o2 = tf_dpkit.DPAdamGaussianOptimizer(1.0, 1.0, learning_rate=0.1)
  assert o1.dp_settings.noise_key != o2.dp_settings.noise_key
  config = o1.get_config()
  assert str(int(o1.dp_settings.noise_key)) not in repr(config)
  assert config["l2_norm_clip"] == 1.0 and config["noise_multiplier"] == 1.0


def test_loss_scale_factor_does_not_change_clipping():
  def final(scale):
    opt = tf_dpkit.DPGradientDescentGaussianOptimizer(0.3, 0.0, learning_rate=1.0, seed=0,
                                                      loss_scale_factor=scale)
    return _run(opt, True, "eager", steps=1)
  np.testing.assert_allclose(final(1024.0), final(None), rtol=1e-5)


def test_callable_loss_without_tape():
  opt = tf_dpkit.DPGradientDescentGaussianOptimizer(1e9, 0.0, learning_rate=0.01, seed=0)
  w = tf.Variable(W0)
  opt.minimize(lambda: _vector_loss(w), [w])
  expected = W0 - 0.01 * (2 * (X @ W0 - Y) * X).mean(axis=0).reshape(5, 1)
  np.testing.assert_allclose(w.numpy(), expected, rtol=1e-5)


def test_jit_compiled_step_matches_eager():
  def make():
    return tf_dpkit.DPGradientDescentGaussianOptimizer(0.5, 0.0, 4, learning_rate=0.1, seed=0)
  w = tf.Variable(W0)
  opt = make()

  @tf.function(jit_compile=True)
  def step():
    with tf.GradientTape() as tape:
      loss = _vector_loss(w)
    opt.minimize(loss, [w], tape=tape)
  step()
  np.testing.assert_allclose(w.numpy(), _run(make(), True, "eager", steps=1), rtol=1e-5)


def test_serialization_round_trip():
  opt = tf_dpkit.DPAdamGaussianOptimizer(1.5, 1.1, 4, learning_rate=0.01)
  restored = keras.optimizers.deserialize(keras.optimizers.serialize(opt))
  assert type(restored) is type(opt)
  assert (restored.l2_norm_clip, restored.noise_multiplier, restored.num_microbatches) == (1.5, 1.1, 4)
  assert restored.dp_settings.noise_key != opt.dp_settings.noise_key


def test_factory_is_cached_and_subclasses_the_base():
  cls = make_gaussian_optimizer_class(keras.optimizers.Adam)
  assert cls is tf_dpkit.DPAdamGaussianOptimizer
  assert issubclass(cls, keras.optimizers.Adam)

  class MyOptimizer(keras.optimizers.SGD):
    pass
  assert issubclass(make_gaussian_optimizer_class(MyOptimizer), MyOptimizer)


@pytest.mark.parametrize("bad", [object, 3, keras.optimizers.Optimizer, tf.compat.v1.train.Optimizer,
                                 tf_dpkit.DPAdamGaussianOptimizer])
def test_factory_rejects_non_optimizer_classes(bad):
  with pytest.raises(TypeError, match="keras.optimizers.Optimizer|already differentially private|abstract"):
    make_gaussian_optimizer_class(bad)


@pytest.mark.parametrize("kwargs, match", [
    (dict(l2_norm_clip=-1.0, noise_multiplier=1.0), r"l2_norm_clip must be a finite number in \(0, inf\)"),
    (dict(l2_norm_clip=0.0, noise_multiplier=1.0), r"l2_norm_clip"),
    (dict(l2_norm_clip=float("nan"), noise_multiplier=1.0), r"l2_norm_clip"),
    (dict(l2_norm_clip=1.0, noise_multiplier=-0.5), r"noise_multiplier must be a finite number in \[0, inf\)"),
    (dict(l2_norm_clip=1.0, noise_multiplier=float("nan")), r"noise_multiplier"),
    (dict(l2_norm_clip=1.0, noise_multiplier=1.0, num_microbatches=0), r"num_microbatches must be None or an integer in \[1, inf\]"),
    (dict(l2_norm_clip=1.0, noise_multiplier=1.0, num_microbatches=2.5), r"num_microbatches"),
    (dict(l2_norm_clip=1.0, noise_multiplier=1.0, seed=-3), r"seed must be None or an integer"),
    (dict(l2_norm_clip=1.0, noise_multiplier=1.0, expected_batch_size=-2), r"expected_batch_size"),
    (dict(l2_norm_clip=1.0, noise_multiplier=1.0, num_microbatches=4, expected_batch_size=64), r"needs num_microbatches=None"),
    (dict(l2_norm_clip=1.0, noise_multiplier=1.0, gradient_accumulation_steps=0), r"gradient_accumulation_steps must be an integer in \[1, inf\]"),
])
def test_constructor_rejects_bad_settings(kwargs, match):
  with pytest.raises(ValueError, match=match):
    tf_dpkit.DPGradientDescentGaussianOptimizer(learning_rate=0.1, **kwargs)


def test_scalar_loss_is_rejected():
  opt = tf_dpkit.DPGradientDescentGaussianOptimizer(1.0, 1.0, learning_rate=0.1)
  w = tf.Variable(W0)
  with tf.GradientTape() as tape:
    loss = tf.reduce_mean(_vector_loss(w))
  with pytest.raises(ValueError, match="vector loss"):
    opt.minimize(loss, [w], tape=tape)


def test_indivisible_batch_is_rejected():
  opt = tf_dpkit.DPGradientDescentGaussianOptimizer(1.0, 1.0, 3, learning_rate=0.1)
  w = tf.Variable(W0)
  with tf.GradientTape() as tape:
    loss = _vector_loss(w)
  with pytest.raises(ValueError, match="num_microbatches=3 must divide the batch size \\(8\\)"):
    opt.minimize(loss, [w], tape=tape)


def test_missing_tape_in_eager_is_rejected():
  opt = tf_dpkit.DPGradientDescentGaussianOptimizer(1.0, 1.0, learning_rate=0.1)
  w = tf.Variable(W0)
  with pytest.raises(ValueError, match="needs `tape=`"):
    opt.minimize(_vector_loss(w), [w])


def test_non_private_gradients_are_refused():
  opt = tf_dpkit.DPGradientDescentGaussianOptimizer(1.0, 1.0, learning_rate=0.1)
  w = tf.Variable(W0)
  with tf.GradientTape() as tape:
    loss = tf.reduce_mean(_vector_loss(w))
  with pytest.raises(ValueError, match="WITHOUT privacy"):
    opt.apply_gradients(zip(tape.gradient(loss, [w]), [w]))


_REPLICAS_SCRIPT = """
import numpy as np, tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import tf_dpkit
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with strategy.scope():
  opt = tf_dpkit.v1.DPGradientDescentGaussianOptimizer(1.0, 1.0, learning_rate=0.1)
  w = tf.Variable(tf.ones([3, 1]))

def step():
  loss = lambda: tf.reduce_sum(tf.matmul(tf.ones([2, 3]), w), axis=1)
  opt.minimize(loss, var_list=[w])
try:
  strategy.run(tf.function(step))
  print("NOT REFUSED")
except NotImplementedError as error:
  print("REFUSED:", error)
"""


def test_v1_optimizers_refuse_several_replicas():
  # The Keras DP optimizers train over the global batch under tf.distribute
  # (tests/tf_dpkit/test_distribute.py); the tf.compat.v1 ones refuse several replicas.
  import subprocess
  import sys
  out = subprocess.run([sys.executable, "-c", _REPLICAS_SCRIPT], capture_output=True, text=True,
                       timeout=300, check=True).stdout
  assert "REFUSED:" in out, out
  assert ("DPGradientDescentOptimizer runs under MirroredStrategy with 2 replicas; the "
          "tf.compat.v1 optimizers train on one replica") in out, out
