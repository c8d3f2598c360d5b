"""Virtual batches (gradient_accumulation_steps): k micro-steps against one step on the logical
batch, noise once per logical step, sensitivity of the split logical sum, logical-step
accounting against analysis.rdp_accountant, and every refusal."""
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import scipy.stats
import tensorflow as tf

import tf_dpkit
from analysis import rdp_accountant
from tf_dpkit import make_gaussian_optimizer_class
from tf_dpkit.budget import PrivacyBudget
from tf_dpkit.clipping.testing import removal_sensitivity
from tf_dpkit.data import poisson_batches, shuffled_batches
from tf_dpkit.data.poisson import pipeline_of
from tf_dpkit.data import poisson_batches_for_memory
from tf_dpkit.optimizers.accumulation import accumulation_steps_for_memory

RNG = np.random.default_rng(0)
X = RNG.normal(size=(12, 5)).astype(np.float32)
Y = (3.0 * RNG.normal(size=(12, 1))).astype(np.float32)
W0 = RNG.normal(size=(5, 1)).astype(np.float32)
CHUNKS = [slice(0, 4), slice(4, 9), slice(9, 12)]  # k = 3 micro-batches of one logical batch
CLIP = 0.7


def _train(base, k, chunks, *, logical_steps=2, mode="eager", noise=0.0, seed=0, **kwargs):
  """Custom loop: ``logical_steps`` times the micro-batches ``chunks``; returns (w, optimizer,
  weights after every micro-step)."""
  optimizer = make_gaussian_optimizer_class(base)(
      CLIP, noise, learning_rate=0.1, seed=seed, gradient_accumulation_steps=k, **kwargs)
  w = keras.Variable(W0, name="w")

  def step(x, y):
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(tf.square(tf.matmul(x, w) - y), axis=1)
    optimizer.minimize(loss, [w], tape=tape)

  if mode == "function":
    step = tf.function(step, reduce_retracing=True)
  trace = []
  for _ in range(logical_steps):
    for c in chunks:
      step(X[c], Y[c])
      trace.append(w.numpy().copy())
  return w.numpy(), optimizer, trace


@pytest.mark.parametrize("base,mode,expected_batch_size", [
    (keras.optimizers.Adam, "function", None),
    (keras.optimizers.SGD, "eager", 10.0),
    pytest.param(keras.optimizers.SGD, "function", None, marks=pytest.mark.slow),
    pytest.param(keras.optimizers.SGD, "function", 10.0, marks=pytest.mark.slow),
    pytest.param(keras.optimizers.Adam, "function", 10.0, marks=pytest.mark.slow),
    pytest.param(keras.optimizers.Adam, "eager", None, marks=pytest.mark.slow),
], ids=lambda v: getattr(v, "__name__", str(v)))
def test_k_micro_steps_equal_one_step_on_the_logical_batch(base, mode, expected_batch_size):
  # Traced steps get chunks of one size (one trace); eager ones of three sizes.
  chunks = CHUNKS if mode == "eager" else [slice(0, 4), slice(4, 8), slice(8, 12)]
  w_acc, opt_acc, trace = _train(base, 3, chunks, mode=mode,
                                 expected_batch_size=expected_batch_size)
  w_one, opt_one, _ = _train(base, None, [slice(0, 12)], mode=mode,
                             expected_batch_size=expected_batch_size)
  np.testing.assert_allclose(w_acc, w_one, rtol=0, atol=1e-6)
  assert not np.allclose(w_acc, W0, atol=1e-3)  # the steps did move the weights
  # Nothing moves before the k-th micro-step; iterations (and Adam's moments) count logical
  # steps: two, not six.
  np.testing.assert_array_equal(trace[0], W0)
  np.testing.assert_array_equal(trace[1], W0)
  assert not np.array_equal(trace[2], W0)
  np.testing.assert_array_equal(trace[3], trace[2])
  assert int(opt_acc.iterations.numpy()) == int(opt_one.iterations.numpy()) == 2
  for a, b in zip(opt_acc.variables, opt_one.variables):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-6,
                               err_msg=a.name)


def test_noisy_k_micro_steps_equal_the_noisy_logical_step_for_a_fixed_seed():
  # The release is keyed by the logical step, so with one seed the noise is the very noise the
  # logical step draws without accumulation: equal in distribution because equal.
  w_acc, _, _ = _train(keras.optimizers.SGD, 3, CHUNKS, noise=1.3, seed=7)
  w_one, _, _ = _train(keras.optimizers.SGD, None, [slice(0, 12)], noise=1.3, seed=7)
  np.testing.assert_allclose(w_acc, w_one, rtol=0, atol=1e-6)


@pytest.mark.parametrize("expected_batch_size",
                         [None, pytest.param(10.0, marks=pytest.mark.slow)])
def test_noise_std_is_sigma_c_over_the_logical_normaliser_once_per_logical_step(
    expected_batch_size):
  # d = 4000 coordinates, zero clipped sum (loss 0 * w): the update is -lr * noise / n.
  # The std estimate of 4000 normal draws has relative standard error 1/sqrt(2 * 4000) = 1.1%:
  # a 5% tolerance is 4.5 standard errors.  Noise per micro-step would give sqrt(3) times it.
  d, k, sigma, lr = 4000, 3, 1.7, 1.0
  optimizer = tf_dpkit.DPGradientDescentGaussianOptimizer(
      CLIP, sigma, learning_rate=lr, seed=11, gradient_accumulation_steps=k,
      expected_batch_size=expected_batch_size)
  w = tf.Variable(tf.zeros([d]))
  updates, before = [], w.numpy()
  for _ in range(2):
    for size in (2, 3, 4):
      with tf.GradientTape() as tape:
        loss = 0.0 * tf.reduce_sum(w) * tf.ones([size])
      optimizer.minimize(loss, [w], tape=tape)
      updates.append(w.numpy() - before)
      before = w.numpy()
  n = expected_batch_size or 9.0  # 2 + 3 + 4 microbatches per logical batch
  expected_std = lr * sigma * CLIP / n
  for j in (0, 1, 3, 4):
    np.testing.assert_array_equal(updates[j], 0.0)
  first, second = updates[2], updates[5]
  for u in (first, second):
    assert abs(np.std(u) / expected_std - 1) < 0.05
    assert abs(np.mean(u)) < 5 * expected_std / np.sqrt(d)
  # Fresh noise for every logical step (key, iterations, draw): uncorrelated releases.
  assert abs(np.corrcoef(first, second)[0, 1]) < 5 / np.sqrt(d)
  assert int(optimizer.iterations.numpy()) == 2


class _LogicalSum:
  """Clipped sums of a logical batch as the optimizer accumulates them: noise 0, SGD with
  learning rate 1 and normaliser 1, so one release moves ``w`` by minus the logical sum.  One
  optimizer and one traced step serve every call (SGD keeps no state that noise 0 changes)."""

  def __init__(self, k):
    self.k = k
    self.optimizer = tf_dpkit.DPGradientDescentGaussianOptimizer(
        CLIP, 0.0, learning_rate=1.0, seed=0, gradient_accumulation_steps=k,
        expected_batch_size=1.0)
    self.w = tf.Variable(W0)

    @tf.function(input_signature=[tf.TensorSpec([None, 5], tf.float32),
                                  tf.TensorSpec([None, 1], tf.float32),
                                  tf.TensorSpec([None], tf.float32)])
    def step(xb, yb, weight):  # one trace for every chunk size
      with tf.GradientTape() as tape:
        loss = weight * tf.reduce_sum(tf.square(tf.matmul(xb, self.w) - yb), axis=1)
      self.optimizer.minimize(loss, [self.w], tape=tape)
    self.step = step

  def __call__(self, micro_batches):
    self.w.assign(W0)
    before = int(self.optimizer.iterations.numpy())
    for xb, yb, weight in micro_batches:
      self.step(xb, yb, weight)
    assert int(self.optimizer.iterations.numpy()) == before + 1  # one release per logical batch
    return [W0 - self.w.numpy()]


def test_removal_sensitivity_of_the_split_logical_sum_is_at_most_c():
  # The BatchMemoryManager path: one Poisson batch (q = 1: everyone) split into k = 3 chunks
  # by the pipeline, accumulated and released once.
  x, y = X[:5], 50.0 * Y[:5]  # gradients far above C: every example is clipped
  logical_sum = _LogicalSum(3)

  def clipped_sum(keep):
    return logical_sum(poisson_batches((x[keep], y[keep]), sampling_probability=1.0, steps=1,
                                       seed=0, gradient_accumulation_steps=3))
  sensitivity = removal_sensitivity(clipped_sum, 5)
  # Removing an example re-splits the chunks; the sum still moves by its clipped gradient only.
  assert sensitivity <= CLIP * (1 + 1e-5)
  assert sensitivity >= CLIP * (1 - 1e-4)  # all clipped: exactly C (the check is not vacuous)


def test_an_example_in_two_micro_batches_moves_the_sum_by_2c():
  # Why k independent Poisson micro-batches are not one Poisson batch: the same example drawn
  # into two of them counts twice.  The measurement that bounds the split path by C sees 2C.
  logical_sum = _LogicalSum(2)

  def duplicated(keep):
    batch = (X[:3][keep], 50.0 * Y[:3][keep], np.ones(len(keep), np.float32))
    return logical_sum([batch, batch])  # the same micro-batch twice
  assert removal_sensitivity(duplicated, 3) == pytest.approx(2 * CLIP, rel=1e-4)


def test_poisson_chunks_are_a_disjoint_split_of_the_same_logical_batch():
  x = np.arange(60, dtype=np.float32)[:, None]
  y = np.arange(60)
  plain = list(poisson_batches((x, y), expected_batch_size=6, steps=3, seed=3))
  split = poisson_batches((x, y), expected_batch_size=6, steps=3, seed=3,
                          gradient_accumulation_steps=4)
  chunks = list(split)
  assert len(chunks) == 12
  assert min(len(b[1]) for b in plain) < 4  # some chunk is empty (weight-0 placeholder)
  for t in range(3):
    batch = plain[t][1].numpy()[plain[t][2].numpy() > 0]
    parts = [c[1].numpy()[c[2].numpy() > 0] for c in chunks[4 * t:4 * t + 4]]
    np.testing.assert_array_equal(np.concatenate(parts), batch)  # disjoint, union = batch
    sizes = sorted(len(p) for p in parts)
    assert sizes[-1] - sizes[0] <= 1 and sizes[-1] == -(-len(batch) // 4)
    for c in chunks[4 * t:4 * t + 4]:  # an empty chunk is one example of weight 0
      assert c[2].shape[0] >= 1
  tag = pipeline_of(split)
  assert tag.accumulation_steps == 4 and tag.batch_size == pytest.approx(6.0)


def test_shuffled_chunks_split_each_epoch_batch():
  x = np.arange(20, dtype=np.float32)[:, None]
  y = np.arange(20)
  plain = [b[1].numpy() for b in shuffled_batches((x, y), 6, 2, seed=3)]
  chunks = [b[1].numpy() for b in shuffled_batches((x, y), 6, 2, seed=3,
                                                   gradient_accumulation_steps=3)]
  assert len(chunks) == 3 * len(plain)
  for t, batch in enumerate(plain):
    np.testing.assert_array_equal(np.concatenate(chunks[3 * t:3 * t + 3]), batch)


def _fit(k, steps, *, budget, spe=1, data=None, **fit_kwargs):
  rng = np.random.default_rng(1)
  x = rng.normal(size=(200, 4)).astype(np.float32)
  y = (x[:, 0] > 0).astype(np.int32)
  keras.utils.set_random_seed(1)
  model = tf_dpkit.DPSequential([keras.Input((4,)), keras.layers.Dense(2)])
  optimizer = tf_dpkit.DPAdamGaussianOptimizer(
      1.0, 1.1, learning_rate=0.01, seed=0, expected_batch_size=20.0,
      gradient_accumulation_steps=k)
  model.compile(optimizer=optimizer, steps_per_execution=spe,
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  if data is None:
    data = poisson_batches((x, y), expected_batch_size=20, steps=steps, seed=4,
                           gradient_accumulation_steps=k)
  model.fit(data, callbacks=[budget], verbose=0, **fit_kwargs)
  return model, optimizer


@pytest.mark.parametrize("spe", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_ledger_counts_logical_steps_and_matches_the_rdp_accountant(spe):
  k, steps = 3, 4
  budget = PrivacyBudget(0.1, 1e-5)
  _, optimizer = _fit(k, steps, budget=budget, spe=spe, epochs=1, steps_per_epoch=k * steps)
  assert int(optimizer.iterations.numpy()) == steps
  assert budget.accountant.steps == steps  # not k * steps micro-steps
  orders = rdp_accountant.DEFAULT_ORDERS
  rdp = rdp_accountant.compute_rdp(0.1, 1.1, steps, orders)
  reference = rdp_accountant.get_privacy_spent(orders, rdp, target_delta=1e-5)[0]
  assert budget.accountant.epsilon() == pytest.approx(reference, rel=1e-12)


@pytest.mark.slow
def test_make_private_runs_k_micro_steps_per_logical_step_and_accounts_logical_steps():
  rng = np.random.default_rng(2)
  x = rng.normal(size=(120, 4)).astype(np.float32)
  y = (x[:, 0] > 0).astype(np.int32)
  private = tf_dpkit.make_private((x, y), batch_size=30, epochs=1, noise_multiplier=1.0,
                                  l2_norm_clip=1.0, delta=1e-4, gradient_accumulation_steps=2)
  keras.utils.set_random_seed(1)
  model = tf_dpkit.DPSequential([keras.Input((4,)), keras.layers.Dense(2)])
  optimizer = private.optimizer(keras.optimizers.SGD, learning_rate=0.1)
  assert optimizer.accumulation_steps == 2 and optimizer.expected_batch_size == 30.0
  model.compile(optimizer=optimizer,
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  arguments = private.fit_arguments(seed=1, verbose=False)
  assert arguments["steps_per_epoch"] == 2 * private.steps_per_epoch == 8
  model.fit(**arguments, verbose=0)
  budget = arguments["callbacks"][0]
  assert int(optimizer.iterations.numpy()) == budget.accountant.steps == private.steps == 4
  orders = rdp_accountant.DEFAULT_ORDERS
  reference = rdp_accountant.get_privacy_spent(
      orders, rdp_accountant.compute_rdp(0.25, 1.0, 4, orders), target_delta=1e-4)[0]
  assert budget.accountant.epsilon() == pytest.approx(reference, rel=1e-12)
  assert private.epsilon == pytest.approx(reference, rel=1e-12)


def test_accumulators_are_not_optimizer_state_and_config_round_trips():
  _, optimizer, _ = _train(keras.optimizers.SGD, 3, CHUNKS[:2], logical_steps=1)
  # Mid-logical-batch: the un-noised sum is held, but in no variable a checkpoint saves.
  assert int(optimizer._dp_accumulation.position.numpy()) == 2  # pylint: disable=protected-access
  names = [v.name for v in optimizer.variables]
  assert not any("accumulat" in name for name in names), names
  assert optimizer.gradient_accumulation_steps is None  # Keras's own accumulation stays off
  config = optimizer.get_config()
  assert config["gradient_accumulation_steps"] == 3
  again = type(optimizer).from_config(config)
  assert again.accumulation_steps == 3 and again.gradient_accumulation_steps is None


@pytest.mark.slow
def test_fit_discards_a_partial_logical_batch():
  # A logical batch never mixes chunks of two fits: what an earlier run left is dropped.
  budget = PrivacyBudget(0.1, 1e-5)
  model, optimizer = _fit(3, 2, budget=budget, epochs=1, steps_per_epoch=4)
  assert int(optimizer.iterations.numpy()) == 1
  assert int(optimizer._dp_accumulation.position.numpy()) == 1  # pylint: disable=protected-access
  data = poisson_batches((np.zeros((200, 4), np.float32), np.zeros(200, np.int32)),
                         expected_batch_size=20, steps=1, seed=9, gradient_accumulation_steps=3)
  budget2 = PrivacyBudget(0.1, 1e-5)
  model.fit(data, callbacks=[budget2], verbose=0, epochs=1, steps_per_epoch=3)
  assert int(optimizer.iterations.numpy()) == 2
  assert budget2.accountant.steps == 2


# -- refusals -----------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [0, -1, 1.5, 2.0, True, "2"])
def test_bad_gradient_accumulation_steps_are_refused_everywhere(bad):
  message = "gradient_accumulation_steps must be an integer in [1, inf]"
  with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
    tf_dpkit.DPGradientDescentGaussianOptimizer(1.0, 1.0, learning_rate=0.1,
                                                gradient_accumulation_steps=bad)
  with pytest.raises(ValueError, match="gradient_accumulation_steps must be"):
    poisson_batches((X, Y), expected_batch_size=4, steps=1, gradient_accumulation_steps=bad)
  with pytest.raises(ValueError, match="gradient_accumulation_steps must be"):
    shuffled_batches((X, Y), 4, 1, gradient_accumulation_steps=bad)
  with pytest.raises(ValueError, match="gradient_accumulation_steps must be"):
    tf_dpkit.make_private((X, Y), batch_size=4, epochs=1, noise_multiplier=1.0,
                          l2_norm_clip=1.0, delta=1e-5, gradient_accumulation_steps=bad)


def test_shuffled_split_needs_full_non_empty_chunks():
  with pytest.raises(ValueError, match="drop_remainder=True and batch_size >= 3"):
    shuffled_batches((X, Y), 4, 1, drop_remainder=False, gradient_accumulation_steps=3)
  with pytest.raises(ValueError, match="drop_remainder=True and batch_size >= 5"):
    shuffled_batches((X, Y), 4, 1, gradient_accumulation_steps=5)
  with pytest.raises(ValueError, match="needs batch_size >= 5"):
    tf_dpkit.make_private((X, Y), batch_size=4, epochs=1, noise_multiplier=1.0, l2_norm_clip=1.0,
                          delta=1e-5, sampling="shuffle", gradient_accumulation_steps=5)


def test_make_private_refuses_microbatches_with_accumulation_and_overrides():
  with pytest.raises(ValueError, match="with num_microbatches is not supported"):
    tf_dpkit.make_private((X, Y), batch_size=4, epochs=1, noise_multiplier=1.0, l2_norm_clip=1.0,
                          delta=1e-5, sampling="shuffle", num_microbatches=2,
                          gradient_accumulation_steps=2)
  private = tf_dpkit.make_private((X, Y), batch_size=4, epochs=1, noise_multiplier=1.0,
                                  l2_norm_clip=1.0, delta=1e-5, gradient_accumulation_steps=2)
  with pytest.raises(ValueError, match="gradient_accumulation_steps.*are set by the DPTraining"):
    private.optimizer(keras.optimizers.SGD, learning_rate=0.1, gradient_accumulation_steps=3)


def test_micro_steps_must_train_the_same_variables():
  optimizer = tf_dpkit.DPGradientDescentGaussianOptimizer(1.0, 0.0, learning_rate=0.1,
                                                          gradient_accumulation_steps=2)
  a, b = tf.Variable(tf.ones([3])), tf.Variable(tf.ones([]))
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(a) * tf.ones([2])
  optimizer.minimize(loss, [a], tape=tape)
  with tf.GradientTape() as tape:
    loss = b * tf.ones([2])
  with pytest.raises(ValueError, match="do not match the variables of the earlier micro-steps"):
    optimizer.minimize(loss, [b], tape=tape)


def test_fit_refuses_a_pipeline_split_another_number_of_ways():
  budget = PrivacyBudget(0.1, 1e-5)
  x = np.zeros((50, 4), np.float32)
  y = np.zeros(50, np.int32)
  split_in_3 = poisson_batches((x, y), expected_batch_size=5, steps=1, seed=0,
                               gradient_accumulation_steps=3)
  with pytest.raises(ValueError, match=r"split into 3 chunk\(s\) per logical batch .* the "
                                       "optimizer has gradient_accumulation_steps=2"):
    _fit(2, 1, budget=budget, data=split_in_3, epochs=1, steps_per_epoch=3)
  with pytest.raises(ValueError, match="each chunk would be noised and applied as a step"):
    _fit(1, 1, budget=budget, data=split_in_3, epochs=1, steps_per_epoch=3)


def test_budget_refuses_poisson_micro_batches_that_are_not_one_split_batch():
  x = np.zeros((50, 4), np.float32)
  y = np.zeros(50, np.int32)
  tagged = poisson_batches((x, y), expected_batch_size=5, steps=3, seed=0)
  # Re-emitted by a generator, the batches carry no pipeline tag: the budget's own check.
  untagged = tf.data.Dataset.from_generator(tagged.as_numpy_iterator,
                                            output_signature=tagged.element_spec)
  with pytest.raises(ValueError, match="Independent Poisson micro-batches can hold one "
                                       "example twice"):
    _fit(3, 1, budget=PrivacyBudget(0.1, 1e-5), data=untagged, epochs=1, steps_per_epoch=3)
  # Derived by prefetch, they keep the tag and are refused before the budget is asked.
  with pytest.raises(ValueError, match="split into 1 chunk"):
    _fit(3, 1, budget=PrivacyBudget(0.1, 1e-5), data=tagged.prefetch(1), epochs=1,
         steps_per_epoch=3)


def test_budget_refuses_fixed_size_micro_batches_that_straddle_epochs_or_miscount():
  x = np.zeros((40, 4), np.float32)
  y = np.zeros(40, np.int32)
  arrays = tf.data.Dataset.from_tensor_slices((x, y)).batch(4)  # 10 micro-batches per epoch
  with pytest.raises(ValueError, match="10 micro-batches per epoch, not a multiple of "
                                       "gradient_accumulation_steps=3"):
    _fit(3, 1, budget=PrivacyBudget(0.1, 1e-5, sampling="shuffle", steps_per_epoch=3),
         data=arrays, epochs=1)
  with pytest.raises(ValueError, match="steps_per_epoch counts logical steps"):
    _fit(2, 1, budget=PrivacyBudget(0.1, 1e-5, sampling="shuffle", steps_per_epoch=10),
         data=arrays, epochs=1)


def test_accumulation_steps_for_memory_against_the_binomial_tail():
  n, b, p = 10_000, 512.0, 128
  k = accumulation_steps_for_memory(n, b, p, 1e-6)
  tail = scipy.stats.binom.sf  # P(X > m)
  assert tail(k * p, n, b / n) <= 1e-6 < tail((k - 1) * p, n, b / n)
  assert accumulation_steps_for_memory(100, 100.0, 30) == 4  # q = 1: ceil(N / P)
  x = np.zeros((n, 1), np.float32)
  dataset, chunks = poisson_batches_for_memory((x,), expected_batch_size=b, steps=1, seed=0,
                                               max_physical_batch_size=p)
  assert chunks == k and pipeline_of(dataset).accumulation_steps == k
  assert len(list(dataset)) == k
  for args, name in [((0, 1.0, 1), "num_examples"), ((10, 11.0, 1), "expected_batch_size"),
                     ((10, 1.0, 0), "max_physical_batch_size"),
                     ((10, 1.0, 1, 1.0), "overflow_probability"),
                     ((10, 1.0, 1, 0.0), "overflow_probability")]:
    with pytest.raises(ValueError, match=name):
      accumulation_steps_for_memory(*args)


@pytest.mark.slow
def test_accumulation_under_several_replicas_is_refused_before_any_step():
  script = textwrap.dedent("""
      import tensorflow as tf
      cpu = tf.config.list_physical_devices("CPU")[0]
      tf.config.set_logical_device_configuration(
          cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
      import keras, numpy as np, tf_dpkit
      strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
      with strategy.scope():
        model = tf_dpkit.DPSequential([keras.Input((4,)), keras.layers.Dense(2)])
        opt = tf_dpkit.DPGradientDescentGaussianOptimizer(1.0, 1.0, learning_rate=0.1,
                                                          gradient_accumulation_steps=2)
        model.compile(optimizer=opt, loss="sparse_categorical_crossentropy")
      w = [v.numpy() for v in model.weights]
      try:
        model.fit(np.zeros((8, 4), np.float32), np.zeros(8, np.int32), batch_size=4, verbose=0)
      except NotImplementedError as e:
        assert all((a == v.numpy()).all() for a, v in zip(w, model.weights))
        print("REFUSED:", e)
  """)
  out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=300, check=False)
  assert "REFUSED: gradient_accumulation_steps=2 is not supported under MirroredStrategy " \
         "(2 replica(s))" in out.stdout, out.stdout + out.stderr


def test_mirrored_strategy_is_refused_before_any_step_and_one_device_works():
  x = np.zeros((40, 4), np.float32)
  y = np.zeros(40, np.int32)
  for strategy, works in [(tf.distribute.OneDeviceStrategy("/cpu:0"), True),
                          (tf.distribute.MirroredStrategy(["/cpu:0"]), False)]:
    with strategy.scope():
      model = tf_dpkit.DPSequential([keras.Input((4,)), keras.layers.Dense(2)])
      optimizer = tf_dpkit.DPGradientDescentGaussianOptimizer(
          1.0, 1.0, learning_rate=0.1, expected_batch_size=4.0, gradient_accumulation_steps=2)
      model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy")
    data = poisson_batches((x, y), expected_batch_size=4, steps=2, seed=0,
                           gradient_accumulation_steps=2)
    if works:
      model.fit(data, epochs=1, steps_per_epoch=4, verbose=0)
      assert int(optimizer.iterations.numpy()) == 2
      continue
    before = [w.numpy() for w in model.weights]
    with pytest.raises(NotImplementedError, match=r"not supported under MirroredStrategy \(1 "):
      model.fit(data, epochs=1, steps_per_epoch=4, verbose=0)
    for a, w in zip(before, model.weights):
      np.testing.assert_array_equal(a, w.numpy())


@pytest.mark.slow
@pytest.mark.parametrize("spe", [1, 3])
def test_budget_stops_at_the_last_affordable_logical_step(spe):
  # The target allows exactly 3 logical steps (reference: compute_rdp); fit offers 6.
  orders = rdp_accountant.DEFAULT_ORDERS

  def epsilon(steps):
    return rdp_accountant.get_privacy_spent(
        orders, rdp_accountant.compute_rdp(0.1, 1.1, steps, orders), target_delta=1e-5)[0]
  target = (epsilon(3) + epsilon(4)) / 2
  budget = PrivacyBudget(0.1, 1e-5, target_epsilon=target, verbose=False)
  _, optimizer = _fit(3, 6, budget=budget, spe=spe, epochs=1, steps_per_epoch=18)
  assert budget.accountant.steps == int(optimizer.iterations.numpy()) == 3
  assert budget.accountant.epsilon() == pytest.approx(epsilon(3), rel=1e-12)
  assert budget.accountant.epsilon() <= target


def _array_fit_releases(n, batch_size, k, epochs):
  """Noise-free fit on in-memory arrays (Keras shuffles each epoch) of a model whose example
  i has the gradient e_i (norm 1 = C): each release's clipped sum, read back from the weight
  changes, is then the vector of how many times each example is in that release."""
  keras.utils.set_random_seed(7)
  model = tf_dpkit.DPSequential([keras.Input((n,)), keras.layers.Dense(1, use_bias=False)])
  optimizer = tf_dpkit.DPGradientDescentGaussianOptimizer(
      1.0, 0.0, learning_rate=1.0, gradient_accumulation_steps=k)
  model.compile(optimizer=optimizer, loss=lambda y_true, y_pred: y_pred[:, 0])
  kernels = [model.get_weights()[0][:, 0].copy()]
  record = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs=None: (
      kernels.append(model.get_weights()[0][:, 0].copy())))
  model.fit(np.eye(n, dtype=np.float32), np.zeros(n, np.float32), batch_size=batch_size,
            epochs=epochs, shuffle=True, verbose=0, callbacks=[record])
  steps = np.diff(np.array(kernels), axis=0)
  releases = [-s for s in steps if np.any(s != 0)]
  return releases, int(optimizer.iterations.numpy())


def test_array_fit_releases_hold_each_example_at_most_once():
  # N=6 in batches of 2: 3 batches per epoch = one logical batch of k = 3 per epoch.
  releases, iterations = _array_fit_releases(6, 2, 3, epochs=4)
  assert iterations == 4 == len(releases)
  for release in releases:  # normaliser n = 6 microbatches of the logical batch
    multiplicity = 6.0 * release
    np.testing.assert_allclose(multiplicity, np.ones(6), atol=1e-5)
    # Brute force: removing example i moves this release's clipped sum by multiplicity_i * C.
    assert max(np.abs(multiplicity)) * 1.0 <= 1.0 + 1e-5


def test_array_fit_whose_epochs_k_does_not_divide_is_refused():
  # Was: N=2, batch 1, k=3 released clip(x0) + clip(x1) + clip(x0'): one example twice (2 C).
  for n, batch_size, k, extra in ((2, 1, 3, {}), (7, 2, 3, {}), (6, 2, 3,
                                                                  {"steps_per_epoch": 2})):
    model = tf_dpkit.DPSequential([keras.Input((n,)), keras.layers.Dense(1, use_bias=False)])
    model.compile(optimizer=tf_dpkit.DPGradientDescentGaussianOptimizer(
        1.0, 0.0, learning_rate=1.0, gradient_accumulation_steps=k),
                  loss=lambda y_true, y_pred: y_pred[:, 0])
    before = model.get_weights()[0].copy()
    with pytest.raises(ValueError, match=f"not a multiple of gradient_accumulation_steps={k}"
                                         ".*straddle two epochs"):
      model.fit(np.eye(n, dtype=np.float32), np.zeros(n, np.float32), batch_size=batch_size,
                epochs=3, verbose=0, **extra)
    np.testing.assert_array_equal(model.get_weights()[0], before)
