"""Private model.fit: DPSequential / DPModel against non-private and NumPy references."""
import numpy as np
import pytest
import keras
import tensorflow as tf

import tf_dpkit
from tf_dpkit.dp_gradients import resolve_method

RNG = np.random.default_rng(2)
X = RNG.normal(size=(16, 3)).astype(np.float32)
Y = RNG.integers(0, 2, size=16)


def _layers():
  return [keras.Input((3,)), keras.layers.Dense(4, activation="tanh", name="hidden"),
          keras.layers.Dense(2, name="out")]


def _twin_models(dp_cls=tf_dpkit.DPSequential):
  plain = keras.Sequential(_layers())
  private = dp_cls(_layers())
  private.set_weights(plain.get_weights())
  return plain, private


LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


METHODS = ["fast", "vectorized"]


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("steps_per_execution", [1, 2])
def test_fit_without_noise_or_clipping_equals_keras_fit(steps_per_execution, method):
  plain, private = _twin_models()
  private.per_example_method = method
  plain.compile(keras.optimizers.SGD(0.1), loss=LOSS, steps_per_execution=steps_per_execution)
  private.compile(tf_dpkit.DPGradientDescentGaussianOptimizer(1e9, 0.0, learning_rate=0.1, seed=0),
                  loss=LOSS, steps_per_execution=steps_per_execution)
  h_plain = plain.fit(X, Y, batch_size=8, epochs=2, shuffle=False, verbose=0)
  h_private = private.fit(X, Y, batch_size=8, epochs=2, shuffle=False, verbose=0)
  for a, b in zip(plain.get_weights(), private.get_weights()):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(h_plain.history["loss"], h_private.history["loss"], rtol=1e-5)


def _per_example_grads(model, x, y):
  grads = []
  for i in range(len(x)):
    with tf.GradientTape() as tape:
      loss = LOSS(y[i:i + 1], model(x[i:i + 1]))
    grads.append([g.numpy() for g in tape.gradient(loss, model.trainable_variables)])
  return grads


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("num_microbatches", [None, 4])
def test_one_fit_step_matches_explicit_clipping_reference(num_microbatches, method):
  _, private = _twin_models()
  private.per_example_method = method
  before = [w.numpy() for w in private.trainable_variables]
  per_example = _per_example_grads(private, X[:8], Y[:8])
  clip = 0.05
  private.compile(tf_dpkit.DPGradientDescentGaussianOptimizer(clip, 0.0, num_microbatches,
                                                              learning_rate=1.0, seed=0), loss=LOSS)
  private.fit(X[:8], Y[:8], batch_size=8, epochs=1, shuffle=False, verbose=0)
  m = 8 if num_microbatches is None else num_microbatches
  k = 8 // m
  total = [np.zeros_like(b) for b in before]
  for j in range(m):
    group = [np.mean([per_example[i][v] for i in range(j * k, (j + 1) * k)], axis=0)
             for v in range(len(before))]
    norm = np.sqrt(sum(np.sum(g ** 2) for g in group))
    for v, g in enumerate(group):
      total[v] += g * min(1.0, clip / norm)
  for b, t, w in zip(before, total, private.trainable_variables):
    np.testing.assert_allclose(w.numpy(), b - t / m, rtol=1e-4, atol=1e-6)


def test_sample_weight_zero_removes_an_example():
  _, a = _twin_models()
  _, b = _twin_models()
  b.set_weights(a.get_weights())
  for model in (a, b):
    model.compile(tf_dpkit.DPGradientDescentGaussianOptimizer(0.1, 0.0, learning_rate=1.0,
                                                              expected_batch_size=4.0, seed=0),
                  loss=LOSS)
  weights = np.array([1, 1, 1, 0], np.float32)
  a.fit(X[:4], Y[:4], sample_weight=weights, batch_size=4, verbose=0, shuffle=False)
  b.fit(X[:3], Y[:3], batch_size=3, verbose=0, shuffle=False)
  for wa, wb in zip(a.get_weights(), b.get_weights()):
    np.testing.assert_allclose(wa, wb, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("loss_scale_factor", [None, 8.0])
def test_regularization_is_added_after_clipping(loss_scale_factor):
  reg = 0.5
  layers = [keras.Input((3,)), keras.layers.Dense(2, kernel_regularizer=keras.regularizers.L2(reg))]
  model = tf_dpkit.DPSequential(layers)
  kernel0 = model.layers[0].kernel.numpy().copy()
  bias0 = model.layers[0].bias.numpy().copy()
  model.compile(tf_dpkit.DPGradientDescentGaussianOptimizer(
      1e-6, 0.0, learning_rate=1.0, seed=0, loss_scale_factor=loss_scale_factor), loss=LOSS)
  model.fit(X[:4], Y[:4], batch_size=4, verbose=0, shuffle=False)
  # Clipped data gradients are at most 1e-6 in norm; the L2 gradient 2*reg*W passes unclipped.
  np.testing.assert_allclose(model.layers[0].kernel.numpy(), kernel0 - 2 * reg * kernel0, atol=1e-5)
  np.testing.assert_allclose(model.layers[0].bias.numpy(), bias0, atol=1e-5)


def test_functional_dp_model_metrics_validation_and_callbacks():
  inputs = keras.Input((3,))
  outputs = keras.layers.Dense(2)(keras.layers.Dense(8, activation="relu")(inputs))
  model = tf_dpkit.DPModel(inputs, outputs)
  model.compile(tf_dpkit.DPAdamGaussianOptimizer(1.0, 0.5, learning_rate=0.01, seed=1), loss=LOSS,
                metrics=["accuracy"])
  seen = []
  callback = keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: seen.append(logs))
  history = model.fit(X, Y, batch_size=4, epochs=2, validation_data=(X, Y), callbacks=[callback],
                      verbose=0)
  assert set(history.history) >= {"loss", "accuracy", "val_loss", "val_accuracy"}
  assert len(seen) == 2 and np.isfinite(history.history["loss"]).all()


def test_keras_save_and_load_round_trip(tmp_path):
  _, model = _twin_models()
  model.compile(tf_dpkit.DPAdamGaussianOptimizer(1.2, 0.9, 4, learning_rate=0.01), loss=LOSS)
  model.fit(X, Y, batch_size=8, verbose=0)
  path = str(tmp_path / "model.keras")
  model.save(path)
  loaded = keras.saving.load_model(path)
  assert type(loaded) is tf_dpkit.DPSequential
  assert type(loaded.optimizer) is tf_dpkit.DPAdamGaussianOptimizer
  assert (loaded.optimizer.l2_norm_clip, loaded.optimizer.noise_multiplier,
          loaded.optimizer.num_microbatches) == (1.2, 0.9, 4)
  np.testing.assert_allclose(loaded.predict(X, verbose=0), model.predict(X, verbose=0), rtol=1e-6)
  loaded.fit(X, Y, batch_size=8, verbose=0)  # training continues privately


def test_plain_model_with_dp_optimizer_refuses_to_fit():
  model = keras.Sequential(_layers())
  model.compile(tf_dpkit.DPGradientDescentGaussianOptimizer(1.0, 1.0, learning_rate=0.1), loss=LOSS)
  with pytest.raises(ValueError, match="WITHOUT privacy.*DPSequential"):
    model.fit(X, Y, batch_size=8, verbose=0)


def test_dp_model_refuses_non_dp_optimizer_and_losses_that_do_not_match_the_outputs():
  model = tf_dpkit.DPSequential(_layers())
  with pytest.raises(TypeError, match="needs a tf_dpkit DP optimizer"):
    model.compile(keras.optimizers.SGD(0.1), loss=LOSS)
  with pytest.raises(ValueError, match=r"loss has 2 entries for the model's 1 outputs"):
    model.compile(tf_dpkit.DPGradientDescentGaussianOptimizer(1.0, 1.0), loss=[LOSS, LOSS])
  with pytest.raises(ValueError, match=r"loss names unknown outputs \['nope'\]"):
    model.compile(tf_dpkit.DPGradientDescentGaussianOptimizer(1.0, 1.0), loss={"nope": LOSS})
  with pytest.raises(ValueError, match="need `loss=`"):
    model.compile(tf_dpkit.DPGradientDescentGaussianOptimizer(1.0, 1.0))


def test_activity_regularizer_is_refused():
  model = tf_dpkit.DPSequential([keras.Input((3,)), keras.layers.Dense(2, activity_regularizer="l2")])
  model.compile(tf_dpkit.DPGradientDescentGaussianOptimizer(1.0, 1.0), loss=LOSS)
  with pytest.raises(ValueError, match="activity_regularizer"):
    model.fit(X, Y, verbose=0)


def test_indivisible_last_batch_names_the_fix():
  model = tf_dpkit.DPSequential(_layers())
  model.compile(tf_dpkit.DPGradientDescentGaussianOptimizer(1.0, 1.0, 4), loss=LOSS)
  # Refused before training (not at the end of the epoch, deep in the graph).
  with pytest.raises(ValueError, match=r"last batch of every epoch holds 2 examples, which "
                                       r"num_microbatches=4 does not divide.*Trim N to a "
                                       "multiple of the batch size"):
    model.fit(X[:10], Y[:10], batch_size=8, verbose=0)
  assert int(model.optimizer.iterations.numpy()) == 0


def test_make_dp_model_class_validates_and_caches():
  assert tf_dpkit.make_dp_model_class(keras.Sequential) is tf_dpkit.DPSequential
  with pytest.raises(TypeError, match="subclass of keras.Model"):
    tf_dpkit.make_dp_model_class(dict)


class SubclassedNet(keras.Model):
  def __init__(self):
    super().__init__()
    self.hidden = keras.layers.Dense(4, activation="tanh")
    self.out = keras.layers.Dense(2)

  def call(self, x):
    return self.out(self.hidden(x) * 2.0)


DPSubclassed = tf_dpkit.make_dp_model_class(SubclassedNet)


def test_subclassed_model_uses_vectorized_path_and_matches_keras():
  plain, private = SubclassedNet(), DPSubclassed()
  plain(X[:1]), private(X[:1])
  private.set_weights(plain.get_weights())
  plain.compile(keras.optimizers.SGD(0.1), loss=LOSS)
  private.compile(tf_dpkit.DPGradientDescentGaussianOptimizer(1e9, 0.0, learning_rate=0.1, seed=0),
                  loss=LOSS)
  assert resolve_method(private, "auto") == "vectorized"
  with pytest.raises(ValueError, match="method='fast' needs a Keras functional or Sequential"):
    resolve_method(private, "fast")
  plain.fit(X, Y, batch_size=8, shuffle=False, verbose=0)
  private.fit(X, Y, batch_size=8, shuffle=False, verbose=0)
  for a, b in zip(plain.get_weights(), private.get_weights()):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_batch_normalization_is_refused_with_a_suggestion():
  model = tf_dpkit.DPSequential([keras.Input((3,)), keras.layers.Dense(2),
                                 keras.layers.BatchNormalization()])
  model.compile(tf_dpkit.DPGradientDescentGaussianOptimizer(1.0, 1.0), loss=LOSS)
  with pytest.raises(ValueError, match="BatchNormalization.*GroupNormalization"):
    model.fit(X, Y, verbose=0)


def test_private_gradients_in_a_custom_loop_matches_fit():
  _, a = _twin_models()
  _, b = _twin_models()
  b.set_weights(a.get_weights())
  opt_a = tf_dpkit.DPGradientDescentGaussianOptimizer(0.1, 0.7, learning_rate=0.5, seed=4)
  opt_b = tf_dpkit.DPGradientDescentGaussianOptimizer(0.1, 0.7, learning_rate=0.5, seed=4)
  a.compile(opt_a, loss=LOSS)
  a.fit(X[:8], Y[:8], batch_size=8, shuffle=False, verbose=0)
  per_example = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)

  @tf.function
  def step(x, y):
    grads = tf_dpkit.private_gradients(opt_b, b, per_example, x, y)
    opt_b.apply(grads, b.trainable_variables)
  step(X[:8], Y[:8])
  for wa, wb in zip(a.get_weights(), b.get_weights()):
    np.testing.assert_allclose(wa, wb, rtol=1e-5, atol=1e-6)


ALL_KERAS_OPTIMIZERS = [
    keras.optimizers.SGD, keras.optimizers.Adam, keras.optimizers.AdamW, keras.optimizers.Adagrad,
    keras.optimizers.RMSprop, keras.optimizers.Nadam, keras.optimizers.Adamax, keras.optimizers.Lion,
    keras.optimizers.Adafactor, keras.optimizers.Ftrl, keras.optimizers.Adadelta, keras.optimizers.Lamb,
]


@pytest.mark.parametrize("base", ALL_KERAS_OPTIMIZERS, ids=lambda c: c.__name__)
def test_fit_with_every_keras_optimizer_equals_its_non_private_fit(base):
  plain, private = _twin_models()
  plain.compile(base(learning_rate=0.05), loss=LOSS)
  private.compile(tf_dpkit.make_gaussian_optimizer_class(base)(1e9, 0.0, learning_rate=0.05, seed=0),
                  loss=LOSS)
  plain.fit(X, Y, batch_size=8, epochs=1, shuffle=False, verbose=0)
  private.fit(X, Y, batch_size=8, epochs=1, shuffle=False, verbose=0)
  for a, b in zip(plain.get_weights(), private.get_weights()):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("method", METHODS)
def test_jit_compiled_fit_matches_graph_fit(method):
  # Noise 0: XLA's stateless normal kernel draws a different (equally valid) stream, so the
  # comparison is of everything else (clipping, averaging, the update).
  rng = np.random.default_rng(0)
  x = rng.normal(size=(16, 6, 6, 2)).astype(np.float32)
  y = rng.integers(0, 3, 16)
  weights = []
  for jit in (False, True):
    keras.utils.set_random_seed(1)
    model = tf_dpkit.DPSequential([keras.Input((6, 6, 2)), keras.layers.Conv2D(3, 3, activation="relu"),
                                   keras.layers.Flatten(), keras.layers.Dense(3)])
    model.per_example_method = method
    model.compile(tf_dpkit.DPGradientDescentGaussianOptimizer(0.5, 0.0, learning_rate=0.1, seed=3),
                  loss=LOSS, jit_compile=jit)
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    weights.append(model.get_weights())
  for a, b in zip(*weights):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("method", METHODS)
def test_fit_on_variable_size_poisson_batches_traces_once(method):
  from tf_dpkit.data import poisson_batches
  traces = []

  def counting_loss(y_true, y_pred):
    traces.append(1)  # Python side effect: runs only while tracing
    return keras.losses.sparse_categorical_crossentropy(y_true, y_pred, from_logits=True)

  model = tf_dpkit.DPSequential(_layers())
  model.per_example_method = method
  model.compile(tf_dpkit.DPGradientDescentGaussianOptimizer(1.0, 1.0, learning_rate=0.1,
                                                            expected_batch_size=4.0, seed=0),
                loss=counting_loss)
  data = poisson_batches((X, Y), expected_batch_size=4, steps=30, seed=5)
  sizes = {int(w.shape[0]) for _, _, w in data}
  assert len(sizes) >= 3  # the batches really vary in size
  model.fit(data, epochs=1, steps_per_epoch=30, verbose=0)
  assert int(model.optimizer.iterations.numpy()) == 30
  assert len(traces) == 1


class _AddsBatchLoss(keras.layers.Layer):
  def call(self, inputs):
    self.add_loss(tf.reduce_mean(tf.square(inputs)))
    return inputs


@pytest.mark.parametrize("method", METHODS)
def test_add_loss_is_refused(method):
  model = tf_dpkit.DPSequential([keras.Input((3,)), _AddsBatchLoss(name="penalty"),
                                 keras.layers.Dense(2)])
  model.per_example_method = method
  model.compile(tf_dpkit.DPGradientDescentGaussianOptimizer(1.0, 0.0, learning_rate=0.1), loss=LOSS)
  with pytest.raises(ValueError, match="penalty.*add_loss"):
    model.fit(X, Y, batch_size=4, verbose=0)


@pytest.mark.parametrize("method", METHODS)
def test_masked_sequence_loss_is_the_mean_over_unmasked_positions(method):
  from tf_dpkit.dp_gradients import clipped_sum_for_model
  model = keras.Sequential([keras.Input((5,), dtype="int32"),
                            keras.layers.Embedding(6, 4, mask_zero=True), keras.layers.Dense(3)])
  ids = np.array([[1, 2, 0, 0, 0], [3, 4, 5, 1, 0], [2, 0, 0, 0, 0], [0, 0, 0, 0, 0]], np.int32)
  labels = RNG.integers(0, 3, size=ids.shape)
  xent = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
  clipped, _ = clipped_sum_for_model(model, xent.call, tf.constant(ids), tf.constant(labels),
                                     None, 100.0, method=method)
  logits = model(ids).numpy().astype(np.float64)
  log_softmax = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  token_loss = -np.take_along_axis(log_softmax, labels[..., None], axis=-1)[..., 0]
  mask = ids != 0
  expected = (token_loss * mask).sum(1) / np.maximum(mask.sum(1), 1)
  np.testing.assert_allclose(clipped.losses.numpy(), expected, rtol=1e-5)


def test_mixed_float16_compiles_with_a_static_loss_scale_not_a_dynamic_one():
  policy = keras.config.dtype_policy()
  keras.config.set_dtype_policy("mixed_float16")
  try:
    model = tf_dpkit.DPSequential(_layers())
    optimizer = tf_dpkit.DPGradientDescentGaussianOptimizer(1.0, 0.0, learning_rate=0.1)
    model.compile(optimizer, loss=LOSS)
    # Keras would wrap it in a dynamic LossScaleOptimizer (batch-dependent skipped steps).
    assert model.optimizer is optimizer
    assert not isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    assert optimizer.static_loss_scale(model) == 2.0 ** 10
    with pytest.raises(ValueError, match="auto_scale_loss=True.*static loss scale"):
      model.compile(optimizer, loss=LOSS, auto_scale_loss=True)
  finally:
    keras.config.set_dtype_policy(policy)


def _two_output_model(dp=True):
  keras.utils.set_random_seed(7)
  inputs = keras.Input((3,))
  hidden = keras.layers.Dense(4, activation="tanh", name="hidden")(inputs)
  outputs = [keras.layers.Dense(2, name="cls")(hidden), keras.layers.Dense(1, name="reg")(hidden)]
  return (tf_dpkit.DPModel if dp else keras.Model)(inputs, outputs)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("as_dict", [False, True])
def test_two_output_model_step_matches_weighted_per_example_reference(method, as_dict):
  model = _two_output_model()
  model.per_example_method = method
  reference = _two_output_model(dp=False)
  reference.set_weights(model.get_weights())
  clip, lr, weights = 0.5, 0.1, (1.0, 0.3)
  losses = [LOSS, keras.losses.MeanSquaredError()]
  kwargs = (dict(loss=dict(zip(["cls", "reg"], losses)), loss_weights=dict(zip(["cls", "reg"], weights)))
            if as_dict else dict(loss=losses, loss_weights=list(weights)))
  model.compile(tf_dpkit.DPGradientDescentGaussianOptimizer(clip, 0.0, learning_rate=lr, seed=0),
                **kwargs)
  x, y1, y2 = X[:8], Y[:8], X[:8, :1] * 2.0
  model.fit(x, (y1, y2), batch_size=8, epochs=1, shuffle=False, verbose=0)
  total = None
  for i in range(8):
    with tf.GradientTape() as tape:
      p1, p2 = reference(x[i:i + 1])
      loss = weights[0] * LOSS(y1[i:i + 1], p1) + weights[1] * tf.reduce_mean((p2 - y2[i:i + 1]) ** 2)
    grads = tape.gradient(loss, reference.trainable_variables)
    norm = np.sqrt(sum(np.sum(g.numpy() ** 2) for g in grads))
    clipped = [g.numpy() * min(1.0, clip / norm) for g in grads]
    total = clipped if total is None else [a + b for a, b in zip(total, clipped)]
  for w, w0, g in zip(model.get_weights(), reference.get_weights(), total):
    np.testing.assert_allclose(w, w0 - lr * g / 8, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("method", METHODS)
def test_sequential_without_input_builds_on_the_first_batch_and_trains_like_its_twin(method):
  keras.utils.set_random_seed(8)
  lazy = tf_dpkit.DPSequential([keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(2)])
  lazy.per_example_method = method
  twin = tf_dpkit.DPSequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"),
                                keras.layers.Dense(2)])
  twin.per_example_method = method
  lazy.build((None, 3))
  twin.set_weights(lazy.get_weights())
  lazy = tf_dpkit.DPSequential([keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(2)])
  lazy.per_example_method = method
  for model in (lazy, twin):
    model.compile(tf_dpkit.DPGradientDescentGaussianOptimizer(0.5, 0.0, learning_rate=0.1, seed=0),
                  loss=LOSS)
  lazy.fit(X[:8], Y[:8], batch_size=8, epochs=1, shuffle=False, verbose=0)  # builds, then trains
  assert lazy.built and len(lazy.trainable_variables) == 4
  # Same start, same batch: the lazily built model took the same DP step as its twin.
  start = [w.copy() for w in lazy.get_weights()]
  lazy_after = None
  twin.set_weights(start)
  lazy.fit(X[:8], Y[:8], batch_size=8, epochs=1, shuffle=False, verbose=0)
  lazy_after = lazy.get_weights()
  twin.fit(X[:8], Y[:8], batch_size=8, epochs=1, shuffle=False, verbose=0)
  for a, b in zip(lazy_after, twin.get_weights()):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("method", METHODS)
def test_keepdims_loss_trains(method):
  model = tf_dpkit.DPSequential([keras.Input((3,)), keras.layers.Dense(1)])
  model.per_example_method = method
  model.compile(tf_dpkit.DPGradientDescentGaussianOptimizer(1.0, 0.0, learning_rate=0.1, seed=0),
                loss=lambda y, p: tf.reduce_mean(tf.square(p - y), axis=-1, keepdims=True))
  history = model.fit(X, X[:, :1], batch_size=8, epochs=2, verbose=0)
  assert history.history["loss"][1] < history.history["loss"][0]
