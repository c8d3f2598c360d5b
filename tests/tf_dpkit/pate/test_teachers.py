"""The batched teacher model is T independent models; a small PATE pipeline runs end to end."""
import numpy as np
import pytest
import tensorflow as tf

from analysis.pate import PateAccountant
from tf_dpkit import pate
from tf_dpkit.data import mnist


def test_each_teacher_sees_only_its_own_channels_and_gets_only_its_own_gradient():
  t = 4
  model = pate.build_teacher_model(t, (12, 12, 1), 3, conv_filters=(4, 4), hidden_units=8,
                                   dropout=0.0)
  x = np.random.default_rng(0).random((5, 12, 12, t)).astype(np.float32)
  changed = x.copy()
  changed[..., 2] += 1.0  # teacher 2's images only
  out, out2 = model(x).numpy(), model(changed).numpy()
  assert out.shape == (5, t, 3)
  diff = np.abs(out - out2).max(axis=(0, 2))
  assert diff[2] > 1e-3 and np.all(np.delete(diff, 2) == 0.0)
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(model(x)[:, 1])  # teacher 1's outputs
  grads = tape.gradient(loss, model.trainable_variables)
  for variable, grad in zip(model.trainable_variables, grads):
    g = grad.numpy()
    if variable.shape[0] == t:  # TeacherDense: [T, ...]
      per_teacher = np.abs(g).reshape(t, -1).max(axis=1)
    else:  # TeacherConv2D: teacher-major last axis
      per_teacher = np.abs(g).reshape(-1, t, g.shape[-1] // t).max(axis=(0, 2))
    assert per_teacher[1] > 0 and np.all(np.delete(per_teacher, 1) == 0.0), variable.name


def test_each_teacher_equals_a_plain_keras_cnn_holding_its_own_weights():
  # Independent reference: teacher t of the batched model is the ordinary Keras CNN
  # Conv2D -> Conv2D -> Flatten -> Dense -> Dense with teacher t's slices of the weights,
  # applied to teacher t's channels; the same for the gradient of teacher t's loss, while
  # all other teachers' weights get an exactly zero gradient.  Runs with oneDNN on and off
  # (TensorFlow's grouped convolution has no gradient on CPU without oneDNN).
  import keras
  t, c, k, (f1, f2), hidden = 3, 2, 4, (4, 5), 6
  model = pate.build_teacher_model(t, (12, 12, c), k, conv_filters=(f1, f2),
                                   hidden_units=hidden, dropout=0.0)
  rng = np.random.default_rng(1)
  for variable in model.trainable_variables:  # non-zero biases too
    variable.assign(rng.normal(size=variable.shape).astype(np.float32) * 0.3)
  x = rng.random((5, 12, 12, t * c)).astype(np.float32)
  labels = rng.integers(0, k, size=5)
  conv1, conv2, dense1, dense2 = (layer for layer in model.layers if layer.weights)
  with tf.GradientTape(persistent=True) as tape:
    out = model(x)
    losses = [tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(labels, out[:, j]))
              for j in range(t)]
  for j in range(t):
    plain = keras.Sequential([
        keras.Input((12, 12, c)),
        keras.layers.Conv2D(f1, 5, strides=2, padding="same", activation="relu"),
        keras.layers.Conv2D(f2, 5, strides=2, padding="same", activation="relu"),
        keras.layers.Flatten(),
        keras.layers.Dense(hidden, activation="relu"),
        keras.layers.Dense(k)])
    own = [conv1.kernel.numpy()[..., j * f1:(j + 1) * f1], conv1.bias.numpy()[j * f1:(j + 1) * f1],
           conv2.kernel.numpy()[..., j * f2:(j + 1) * f2], conv2.bias.numpy()[j * f2:(j + 1) * f2],
           dense1.kernel.numpy()[j], dense1.bias.numpy()[j],
           dense2.kernel.numpy()[j], dense2.bias.numpy()[j]]
    plain.set_weights(own)
    x_j = x[..., j * c:(j + 1) * c]
    with tf.GradientTape() as plain_tape:
      plain_loss = tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(
          labels, plain(x_j)))
    np.testing.assert_allclose(out[:, j].numpy(), plain(x_j).numpy(), rtol=1e-4, atol=1e-5)
    plain_grads = plain_tape.gradient(plain_loss, plain.trainable_variables)
    grads = dict(zip((v.path for v in model.trainable_variables),
                     tape.gradient(losses[j], model.trainable_variables)))
    for layer, f, offset in ((conv1, f1, 0), (conv2, f2, 2)):
      g_kernel, g_bias = grads[layer.kernel.path].numpy(), grads[layer.bias.path].numpy()
      np.testing.assert_allclose(g_kernel[..., j * f:(j + 1) * f], plain_grads[offset],
                                 rtol=1e-4, atol=1e-5)
      np.testing.assert_allclose(g_bias[j * f:(j + 1) * f], plain_grads[offset + 1],
                                 rtol=1e-4, atol=1e-5)
      others = np.delete(g_kernel.reshape(-1, t, f), j, axis=1)
      assert np.all(others == 0.0) and np.all(np.delete(g_bias.reshape(t, f), j, 0) == 0.0)
    for layer, offset in ((dense1, 4), (dense2, 6)):
      g_kernel, g_bias = grads[layer.kernel.path].numpy(), grads[layer.bias.path].numpy()
      np.testing.assert_allclose(g_kernel[j], plain_grads[offset], rtol=1e-4, atol=1e-5)
      np.testing.assert_allclose(g_bias[j], plain_grads[offset + 1], rtol=1e-4, atol=1e-5)
      assert np.all(np.delete(g_kernel, j, 0) == 0.0) and np.all(np.delete(g_bias, j, 0) == 0.0)


@pytest.mark.parametrize("length,strides,kernel_size,channels",
                         [(11, 2, 3, 1), (12, 2, 5, 2), (7, 1, 3, 1), (5, 3, 4, 2)])
def test_each_conv1d_teacher_equals_keras_conv1d_holding_its_own_weights(
    length, strides, kernel_size, channels):
  """TeacherConv1D: teacher t's output is keras.layers.Conv1D(padding='same') with kernel[t]
  and bias[t] on slice t (odd and even lengths and kernels, strides 1-3, 1-2 channels)."""
  import keras  # pylint: disable=g-import-not-at-top
  from tf_dpkit.pate import teachers  # pylint: disable=g-import-not-at-top
  num_teachers, filters = 3, 2
  layer = teachers.teacher_conv1d_layer()(num_teachers, filters, kernel_size, strides)
  x = np.random.default_rng(0).normal(size=(4, num_teachers, length, channels)).astype(np.float32)
  out = layer(tf.constant(x)).numpy()
  assert out.shape == (4, num_teachers, -(-length // strides), filters)
  assert tuple(layer.compute_output_shape((None, num_teachers, length, channels)))[1:] == out.shape[1:]
  for t in range(num_teachers):
    reference = keras.layers.Conv1D(filters, kernel_size, strides=strides, padding="same")
    reference.build((None, length, channels))
    reference.set_weights([layer.kernel.numpy()[t], layer.bias.numpy()[t]])
    np.testing.assert_allclose(out[:, t], reference(x[:, t]).numpy(), rtol=1e-5, atol=1e-5)


def test_conv1d_teacher_ensemble_checks_its_arguments():
  from tf_dpkit.generative import pategan  # pylint: disable=g-import-not-at-top
  with pytest.raises(ValueError, match=r"conv_filters needs rows, image_shape=\(L,\)"):
    pategan.teacher_ensemble_discriminator(3, 2, (4, 4, 1), conv_filters=(2,))
  with pytest.raises(ValueError, match=r"conv_filters\[0\] must be an integer in \[1, inf\]"):
    pategan.teacher_ensemble_discriminator(3, 2, (8,), conv_filters=(0,))
  with pytest.raises(ValueError, match=r"kernel_size must be an integer in \[1, inf\]"):
    pategan.teacher_ensemble_discriminator(3, 2, (8,), conv_filters=(2,), kernel_size=0)
  model = pategan.teacher_ensemble_discriminator(3, None, (8,), hidden=(), conv_filters=(2, 2))
  assert model.output_shape == (None, 3)


def test_fit_refuses_overlapping_or_wrong_shards():
  ensemble = pate.TeacherEnsemble(2, (8, 8, 1), 3, conv_filters=(2,), hidden_units=0)
  x, y = np.zeros((10, 8, 8, 1), np.float32), np.zeros(10, np.int64)
  with pytest.raises(ValueError, match="shards must be disjoint"):
    ensemble.fit(x, y, [np.arange(5), np.arange(4, 10)], epochs=1)
  with pytest.raises(ValueError, match="shards must hold num_teachers=2"):
    ensemble.fit(x, y, [np.arange(10)], epochs=1)
  with pytest.raises(ValueError, match=r"shards must hold indices in \[0, 10\)"):
    ensemble.fit(x, y, [np.arange(5), np.arange(5, 11)], epochs=1)
  with pytest.raises(ValueError, match=r"epochs must be an integer in \[1, inf\]"):
    ensemble.fit(x, y, [np.arange(5), np.arange(5, 10)], epochs=0)
  with pytest.raises(ValueError, match=r"y must hold classes in \[0, 3\)"):
    ensemble.fit(x, y + 3, [np.arange(5), np.arange(5, 10)], epochs=1)
  with pytest.raises(ValueError, match=r"dropout must be in \[0, 1\)"):
    pate.TeacherEnsemble(2, dropout=1.0)


def test_small_pate_pipeline_end_to_end():
  # 8 teachers on 2,400 MNIST training images (300 each), 300 public queries, Confident GNMax
  # with a threshold that 8 voters can reach, then a supervised student.  About 15 s.
  (x_train, y_train), (x_test, y_test) = mnist.load()
  shards = pate.partition_indices(2400, 8, seed=0)
  ensemble = pate.TeacherEnsemble(8, seed=0)
  losses = ensemble.fit(x_train[:2400], y_train[:2400], shards, epochs=8)
  assert losses[-1] < 0.6 * losses[0]
  accuracy = ensemble.accuracy(x_test[-500:], y_test[-500:])
  assert accuracy.shape == (8,) and accuracy.mean() > 0.75  # chance is 0.1
  public = x_test[:300]
  votes = ensemble.votes(public)
  assert votes.shape == (300, 10) and votes.num_teachers == 8 and "hidden" in repr(votes)
  accountant = PateAccountant(num_teachers=8)
  agg = pate.ConfidentGNMax(votes, threshold=6, sigma1=1.5, sigma2=1.0, seed=0,
                            accountant=accountant)
  answers = agg.query(np.arange(300))
  assert accountant.queries == 300 and accountant.answered == answers.answered.sum()
  assert 150 < answers.answered.sum() < 300
  assert np.mean(answers.labels[answers.answered] == y_test[:300][answers.answered]) > 0.9
  eps_dep = accountant.private_data_dependent_epsilon(1e-5)
  eps_ind = accountant.data_independent_epsilon(1e-5)
  assert 0 < eps_dep <= eps_ind
  student = pate.train_student(public[answers.answered], answers.labels[answers.answered],
                               method="supervised", steps=150, seed=0)
  assert pate.student.accuracy(student, x_test[-500:], y_test[-500:]) > 0.75
  # The semi-supervised path runs and keeps the model usable.
  student = pate.train_student(public[answers.answered], answers.labels[answers.answered],
                               public, method="fixmatch", steps=20, seed=0, model=student)
  assert pate.student.accuracy(student, x_test[-500:], y_test[-500:]) > 0.7


@pytest.mark.parametrize("kwargs, match", [
    ({"method": "mixup"}, r"method must be one of \['fixmatch', 'supervised'\]"),
    ({"steps": 0}, r"steps must be an integer in \[1, inf\]"),
    ({"confidence": 1.5}, r"confidence must be in \[0, 1\]"),
    ({"unlabeled_weight": -1.0}, r"unlabeled_weight must be a finite number in \[0, inf\)"),
    ({"method": "fixmatch"}, "x_unlabeled must hold public images"),
])
def test_student_arguments_are_checked(kwargs, match):
  with pytest.raises(ValueError, match=match):
    pate.train_student(np.zeros((4, 8, 8)), np.zeros(4, np.int64), **kwargs)


def test_teachers_trained_without_privacy_refuse_pickle_but_copy_in_process():
  # Was: pickle.dumps(ensemble) wrote the non-private teachers (their weights) to bytes.
  import copy  # pylint: disable=g-import-not-at-top
  import pickle  # pylint: disable=g-import-not-at-top
  ensemble = pate.TeacherEnsemble(2, (8, 8, 1), 3, conv_filters=(2,), hidden_units=0)
  with pytest.raises(TypeError, match="TeacherEnsemble holds teachers trained without privacy"):
    pickle.dumps(ensemble)
  assert copy.copy(ensemble).num_teachers == 2


def test_teacher_predictions_are_traced_once_per_model_not_once_per_call():
  ensemble = pate.TeacherEnsemble(2, (8, 8, 1), 3, conv_filters=(2,), hidden_units=0)
  x = np.random.default_rng(0).random((6, 8, 8)).astype(np.float32)
  first = ensemble.predict_logits(x, batch_size=3)
  model, predict = ensemble._predict  # pylint: disable=protected-access
  again = ensemble.predict_logits(x, batch_size=3)  # same batch shape: no new trace
  assert ensemble._predict[1] is predict  # pylint: disable=protected-access
  assert predict.experimental_get_tracing_count() == 1
  np.testing.assert_array_equal(first, again)
  assert ensemble.predict_logits(x[:0]).shape == (0, 2, 3)
  # A replaced model gets its own function: predictions follow the model in use.
  ensemble.model = pate.build_teacher_model(2, (8, 8, 1), 3, conv_filters=(2,), hidden_units=0)
  assert model is not ensemble.model
  np.testing.assert_allclose(ensemble.predict_logits(x),
                             ensemble.model(np.tile(x[..., None], (1, 1, 1, 2))).numpy(),
                             rtol=1e-5, atol=1e-6)
  assert ensemble._predict[0] is ensemble.model  # pylint: disable=protected-access
