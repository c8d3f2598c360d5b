"""No secret (noise key, sampling seed) reaches a file: graphs, checkpoints, models, summaries.

The secrets are fixed to distinctive 62-bit values and every byte written is searched for them
in each encoding TensorFlow uses (little-/big-endian int64, protobuf varint, decimal text).
Positive controls write the same value on purpose and must be found, so the search can fail.
"""
import os

import numpy as np
import pytest
import keras
import tensorflow as tf

import tf_dpkit
from tf_dpkit.data import poisson_batches
from secret_search import files_holding, written_bytes

NOISE_KEY = 0x2F3A5B7C9D1E4F61
SAMPLING_SEED = 0x1B2C3D4E5F607182


def test_search_finds_a_constant_in_a_v1_meta_graph_and_a_variable_in_a_checkpoint(tmp_path):
  """Positive control for the v1 search."""
  with tf.Graph().as_default():
    tf.constant(NOISE_KEY, tf.int64, name="control_constant")
    v = tf.compat.v1.get_variable("control_variable", initializer=tf.constant(1, tf.int64))
    assign = v.assign(SAMPLING_SEED)
    saver = tf.compat.v1.train.Saver()
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      sess.run(assign)
      saver.save(sess, str(tmp_path / "ckpt"))
  assert any(p.endswith(".meta") for p in files_holding(tmp_path, NOISE_KEY))
  assert any(".data" in p for p in files_holding(tmp_path, SAMPLING_SEED))


def test_v1_saver_meta_graph_and_checkpoints_hold_no_noise_key(tmp_path):
  # Was: the .meta held the key as a graph constant and the checkpoint the step counter, so
  # the noise of every step could be recomputed and subtracted.
  x = np.random.default_rng(0).normal(size=(8, 3)).astype(np.float32)
  with tf.Graph().as_default():
    w = tf.compat.v1.get_variable("w", initializer=tf.zeros([3, 1]))
    loss = tf.reduce_sum(tf.square(tf.matmul(x, w) - 1.0), axis=1)
    optimizer = tf_dpkit.v1.DPGradientDescentGaussianOptimizer(
        l2_norm_clip=1.0, noise_multiplier=1.0, learning_rate=0.1, seed=NOISE_KEY)
    train_op = optimizer.minimize(loss)
    saver = tf.compat.v1.train.Saver()
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      for step in range(2):
        sess.run(train_op)
        saver.save(sess, str(tmp_path / "model"), global_step=step)
      trained = sess.run(w)
    tf.io.write_graph(tf.compat.v1.get_default_graph(), str(tmp_path), "graph.pbtxt")
  assert np.all(np.isfinite(trained)) and np.any(trained != 0)
  assert len(os.listdir(tmp_path)) >= 5
  assert files_holding(tmp_path, NOISE_KEY) == []


def test_v1_noise_is_reproducible_from_the_seed_and_fresh_per_run():
  def run_twice(seed):
    with tf.Graph().as_default():
      w = tf.compat.v1.get_variable("w", initializer=tf.zeros([4]))
      loss = tf.reduce_sum(w[None, :] * tf.ones([2, 4]), axis=1)
      optimizer = tf_dpkit.v1.DPGradientDescentGaussianOptimizer(
          l2_norm_clip=1.0, noise_multiplier=1.0, learning_rate=1.0, seed=seed)
      grads = optimizer.compute_gradients(loss, var_list=[w])[0][0]
      with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        return sess.run(grads), sess.run(grads)
  first, second = run_twice(NOISE_KEY)
  again, _ = run_twice(NOISE_KEY)
  np.testing.assert_array_equal(first, again)
  assert np.all(first != second)


def _fitted_model(tmp_path):
  rng = np.random.default_rng(1)
  x = rng.normal(size=(32, 3)).astype(np.float32)
  y = rng.integers(0, 2, 32)
  model = tf_dpkit.DPSequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"),
                                 keras.layers.Dense(2)])
  model.compile(tf_dpkit.DPGradientDescentGaussianOptimizer(
      1.0, 1.0, learning_rate=0.1, expected_batch_size=8.0, seed=NOISE_KEY),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  data = poisson_batches((x, y), expected_batch_size=8, steps=8, seed=SAMPLING_SEED)
  backup = keras.callbacks.BackupAndRestore(str(tmp_path / "backup"), delete_checkpoint=False)
  model.fit(data, epochs=2, steps_per_epoch=4, verbose=0, callbacks=[backup])
  return model, x, y


def _save_model_everywhere(model, tmp_path, augmentation=None):
  """Writes ``model`` as a .keras file, a TF checkpoint with its optimizer and a SavedModel,
  and the graph of a ``private_gradients`` custom-loop step; returns that step."""
  model.save(str(tmp_path / "model.keras"))
  tf.train.Checkpoint(model=model, optimizer=model.optimizer).save(str(tmp_path / "ckpt" / "c"))
  tf.saved_model.save(model, str(tmp_path / "saved_model"))
  loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)

  @tf.function
  def train_step(xb, yb):
    grads = tf_dpkit.private_gradients(model.optimizer, model, loss_fn, xb, yb,
                                       augmentation=augmentation)
    model.optimizer.apply(grads, model.trainable_variables)

  concrete = train_step.get_concrete_function(tf.TensorSpec([None, 3]),
                                              tf.TensorSpec([None], tf.int64))
  (tmp_path / "graph_def.pb").write_bytes(concrete.graph.as_graph_def().SerializeToString())
  return train_step


def test_tf2_checkpoints_models_and_traces_hold_no_noise_key_or_sampling_seed(tmp_path):
  model, x, y = _fitted_model(tmp_path)
  train_step = _save_model_everywhere(model, tmp_path)
  writer = tf.summary.create_file_writer(str(tmp_path / "trace"))
  tf.summary.trace_on(graph=True)
  train_step(x[:8], y[:8])
  with writer.as_default():
    tf.summary.trace_export("train_step", step=0)
  writer.flush()
  assert len(list(written_bytes(tmp_path))) > 10
  assert files_holding(tmp_path, NOISE_KEY) == []
  assert files_holding(tmp_path, SAMPLING_SEED) == []


def test_tf2_search_finds_a_traced_constant_and_a_checkpointed_variable(tmp_path):
  """Positive control for the TF2 search."""
  @tf.function
  def leaky(v):
    return v + tf.constant(NOISE_KEY, tf.int64)

  writer = tf.summary.create_file_writer(str(tmp_path / "trace"))
  tf.summary.trace_on(graph=True)
  leaky(tf.constant(1, tf.int64))
  with writer.as_default():
    tf.summary.trace_export("leaky", step=0)
  writer.flush()
  tf.train.Checkpoint(v=tf.Variable(SAMPLING_SEED, dtype=tf.int64)).save(str(tmp_path / "c"))
  assert files_holding(tmp_path / "trace", NOISE_KEY)
  assert files_holding(tmp_path, SAMPLING_SEED)


def test_secrets_do_not_show_in_reprs_or_configs():
  optimizer = tf_dpkit.DPAdamGaussianOptimizer(1.0, 1.0, learning_rate=0.1, seed=NOISE_KEY)
  shown = repr(optimizer.get_config()) + repr(optimizer.dp_settings.noise_key)
  assert str(NOISE_KEY) not in shown and "hidden" in repr(optimizer.dp_settings.noise_key)
  from tf_dpkit.data.poisson import PoissonSampling
  assert str(SAMPLING_SEED) not in repr(PoissonSampling(10, 0.5, 3, SAMPLING_SEED))



def test_checkpointed_pipeline_iterators_hold_no_sampling_seed(tmp_path):
  # tf.data writes an iterator's state into a checkpoint.  The shuffle pipeline's iterator
  # saves without its seed; the Poisson pipeline, whose seed is read from a variable at every
  # step, cannot be saved at all (a stateful read), so the seed never reaches the file either
  # way.  Positive control: a value held in an iterator's state (a shuffle buffer) is found.
  from tf_dpkit.data import shuffled_batches  # pylint: disable=g-import-not-at-top
  x = np.arange(50)
  leaky = tf.data.Dataset.from_tensors(tf.constant(SAMPLING_SEED, tf.int64)).repeat().shuffle(4)
  shuffle = shuffled_batches((x,), 5, 2, seed=SAMPLING_SEED)
  for name, dataset in (("leaky", leaky), ("shuffle", shuffle)):
    iterator = iter(dataset)
    next(iterator)
    tf.train.Checkpoint(iterator=iterator).save(str(tmp_path / name / "ckpt"))
  assert files_holding(tmp_path / "leaky", SAMPLING_SEED)
  assert files_holding(tmp_path / "shuffle", SAMPLING_SEED) == []
  iterator = iter(poisson_batches((x,), expected_batch_size=5, steps=3, seed=SAMPLING_SEED))
  next(iterator)
  with pytest.raises(tf.errors.FailedPreconditionError, match="stateful"):
    tf.train.Checkpoint(iterator=iterator).save(str(tmp_path / "poisson" / "ckpt"))
  assert files_holding(tmp_path / "poisson", SAMPLING_SEED) == []


AUGMENTATION_KEY = 0x3C4D5E6F70819203


def test_augmentation_key_reaches_no_file(tmp_path):
  """Augmentation multiplicity draws each copy from a secret key (knowing it would let one
  example's removal be traced through the others' augmentations): no model file, checkpoint,
  SavedModel or traced graph holds it.  Positive control: the key written on purpose is found."""
  rng = np.random.default_rng(2)
  x = rng.normal(size=(32, 3)).astype(np.float32)
  y = rng.integers(0, 2, 32)
  flip = lambda example, seed: example * tf.sign(  # noqa: E731
      tf.random.stateless_uniform([], seed=seed, minval=-1.0, maxval=1.0))
  augmentation = tf_dpkit.AugmentationMultiplicity(flip, 3, seed=AUGMENTATION_KEY)
  model = tf_dpkit.DPSequential([keras.Input((3,)), keras.layers.Dense(2)])
  model.compile(tf_dpkit.DPGradientDescentGaussianOptimizer(
      1.0, 1.0, learning_rate=0.1, expected_batch_size=8.0),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                augmentation=augmentation)
  data = poisson_batches((x, y), expected_batch_size=8, steps=4)
  model.fit(data, epochs=1, steps_per_epoch=4, verbose=0)
  assert int(model.optimizer.iterations.numpy()) == 4
  _save_model_everywhere(model, tmp_path, augmentation)
  assert len(list(written_bytes(tmp_path))) > 5
  assert files_holding(tmp_path, AUGMENTATION_KEY) == []
  (tmp_path / "control.txt").write_text(str(AUGMENTATION_KEY))
  assert files_holding(tmp_path, AUGMENTATION_KEY) == [str(tmp_path / "control.txt")]


# -- Pickles: an object holding a secret or private data refuses pickle (analysis._secrecy) --

def _secret_holders():
  """(the class named in the error, object, copies refused)."""
  from tf_dpkit.data.poisson import PoissonSampling  # pylint: disable=g-import-not-at-top
  from tf_dpkit import noise as noise_lib  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(3)
  x = rng.normal(size=(20, 3)).astype(np.float32)
  y = rng.integers(0, 2, 20)
  flip = lambda example, seed: -example  # noqa: E731
  optimizer = tf_dpkit.DPGradientDescentGaussianOptimizer(1.0, 1.0, learning_rate=0.1,
                                                          seed=NOISE_KEY)
  training = tf_dpkit.make_private((x, y), batch_size=5, l2_norm_clip=1.0, delta=1e-3,
                                   epochs=1, noise_multiplier=1.0,
                                   augmentation=tf_dpkit.AugmentationMultiplicity(
                                       flip, 2, seed=AUGMENTATION_KEY))
  return [
      ("SecretInt", noise_lib.fresh_key(NOISE_KEY), True),
      ("DPSettings", optimizer.dp_settings, True),
      ("DPGradientDescentGaussianOptimizer", optimizer, True),
      ("AugmentationMultiplicity",
       tf_dpkit.AugmentationMultiplicity(flip, 2, seed=AUGMENTATION_KEY), True),
      ("PoissonSampling", PoissonSampling(20, 0.25, 3, SAMPLING_SEED), True),
      # Holds the data (copies allowed) and an augmentation key (deep copies refused).
      ("DPTraining", training, False),
  ]


def test_objects_holding_a_secret_refuse_pickle_and_copy():
  # Was: pickle.dumps(AugmentationMultiplicity / DPTraining / PoissonSampling / DPSettings)
  # wrote the key or seed (the SecretInt's value and its variable); copies drew the same
  # noise as the original.
  import copy  # pylint: disable=g-import-not-at-top
  import pickle  # pylint: disable=g-import-not-at-top
  for name, holder, copies_refused in _secret_holders():
    with pytest.raises(TypeError, match=f"{name} holds .*: it cannot be pickled"):
      pickle.dumps(holder)
    with pytest.raises(TypeError, match="holds .*secret.*cannot be pickled or copied"):
      copy.deepcopy(holder)
    if copies_refused:
      with pytest.raises(TypeError, match=f"{name} holds .*cannot be pickled or copied"):
        copy.copy(holder)


def test_make_private_training_data_refuses_pickle_but_copies(tmp_path):
  import copy  # pylint: disable=g-import-not-at-top
  import pickle  # pylint: disable=g-import-not-at-top
  x = np.full((20, 3), 123457.0, np.float32)  # a value the search can find
  training = tf_dpkit.make_private((x, np.zeros(20, np.int64)), batch_size=5, l2_norm_clip=1.0,
                                   delta=1e-3, epochs=1, noise_multiplier=1.0)
  with pytest.raises(TypeError, match="DPTraining holds the private training data"):
    pickle.dumps(training)
  twin = copy.deepcopy(training)
  assert repr(twin) == repr(training) and twin is not training
  (tmp_path / "repr.txt").write_text(repr(training))
  assert files_holding(tmp_path, 123457) == []


def test_a_pickled_dp_model_holds_no_noise_key():
  # What does serialise (Keras pickles a model as its .keras file) holds no key.
  import pickle  # pylint: disable=g-import-not-at-top
  model, _, _ = _fitted_model_no_backup()
  data = pickle.dumps(model)
  assert len(data) > 1000
  assert not any(pattern in data for pattern in __import__("secret_search").byte_patterns(
      NOISE_KEY))


def _fitted_model_no_backup():
  rng = np.random.default_rng(1)
  x = rng.normal(size=(16, 3)).astype(np.float32)
  y = rng.integers(0, 2, 16)
  model = tf_dpkit.DPSequential([keras.Input((3,)), keras.layers.Dense(2)])
  model.compile(tf_dpkit.DPGradientDescentGaussianOptimizer(
      1.0, 1.0, learning_rate=0.1, expected_batch_size=4.0, seed=NOISE_KEY),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  model.fit(poisson_batches((x, y), expected_batch_size=4, steps=2), epochs=1, verbose=0)
  return model, x, y
