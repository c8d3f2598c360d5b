"""Checks made before the first step of a DP run: callbacks deciding from the (unaccounted)
training logs, batches num_microbatches cannot split, inputs of the wrong shape, losses that
mix examples, oversized schedules, mismatched apply calls, and errors naming the user's class."""
import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_dpkit
from analysis.schedules import PiecewiseConstant
from tf_dpkit.optimizers import DPAdamGaussianOptimizer, DPGradientDescentGaussianOptimizer

LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def _data(n=32, features=3, seed=0):
  x = np.random.default_rng(seed).normal(size=(n, features)).astype("float32")
  return x, (x[:, 0] > 0).astype("int32")


def _model(num_microbatches=None, features=3):
  model = tf_dpkit.DPSequential([keras.Input((features,)), keras.layers.Dense(2)])
  model.compile(optimizer=DPGradientDescentGaussianOptimizer(
      1.0, 0.5, num_microbatches, learning_rate=0.1, seed=0), loss=LOSS, metrics=["accuracy"])
  return model


# -- item 5: the training logs are not covered by the epsilon ----------------------------------

@pytest.mark.parametrize("callback, name, monitor", [
    (keras.callbacks.EarlyStopping(monitor="loss"), "EarlyStopping", "loss"),
    (keras.callbacks.ReduceLROnPlateau(monitor="accuracy"), "ReduceLROnPlateau", "accuracy"),
    (keras.callbacks.ModelCheckpoint("/tmp/never.keras", monitor="loss", save_best_only=True),
     "ModelCheckpoint", "loss"),
    (keras.callbacks.TerminateOnNaN(), "TerminateOnNaN", "loss"),
])
def test_callbacks_deciding_from_training_metrics_are_refused_before_any_step(
    callback, name, monitor):
  model = _model()
  x, y = _data()
  with pytest.raises(ValueError, match=(
      f"callbacks: {name} decides from '{monitor}'.*not cover.*monitor='val_{monitor}'.*"
      "allow_unaccounted_training_metrics=True")):
    model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[callback])
  assert int(model.optimizer.iterations.numpy()) == 0
  # Positionally (fit(x, y, batch_size, epochs, verbose, callbacks)) too.
  with pytest.raises(ValueError, match=f"{name} decides from"):
    model.fit(x, y, 8, 2, 0, [callback])


def test_the_opt_in_and_validation_monitors_are_accepted():
  x, y = _data()
  model = _model()
  model.fit(x, y, batch_size=8, epochs=2, verbose=0, allow_unaccounted_training_metrics=True,
            callbacks=[keras.callbacks.EarlyStopping(monitor="loss"),
                       keras.callbacks.TerminateOnNaN()])
  assert int(model.optimizer.iterations.numpy()) > 0
  model = _model()
  history = model.fit(
      x, y, batch_size=8, epochs=2, verbose=0, validation_data=_data(16, seed=1),
      callbacks=[keras.callbacks.EarlyStopping(monitor="val_loss", patience=5),
                 keras.callbacks.ReduceLROnPlateau(monitor="val_accuracy"),
                 keras.callbacks.ModelCheckpoint("/tmp/unused.keras", monitor="loss")])
  assert len(history.history["val_loss"]) == 2 and int(model.optimizer.iterations.numpy()) == 8


def test_fit_arguments_and_own_callbacks_go_together():
  x, y = _data(64)
  private = tf_dpkit.make_private((x, y), batch_size=16, epochs=2, l2_norm_clip=1.0,
                                  noise_multiplier=1.0, delta=1e-3)
  model = tf_dpkit.DPSequential([keras.Input((3,)), keras.layers.Dense(2)])
  model.compile(optimizer=private.optimizer(learning_rate=0.1), loss=LOSS)
  arguments = private.fit_arguments(seed=1, verbose=False)
  stopper = keras.callbacks.EarlyStopping(monitor="val_loss", patience=5)
  history = model.fit(**arguments, callbacks=[stopper], validation_data=_data(16, seed=2),
                      verbose=0)
  budget = arguments["callbacks"][0]
  assert isinstance(budget, tf_dpkit.budget.PrivacyBudget) and "callbacks" in arguments
  assert budget.accountant.steps == int(model.optimizer.iterations.numpy()) == private.steps
  assert history.history["epsilon"][-1] == pytest.approx(private.epsilon, rel=1e-9)
  assert stopper.model is model  # the user's callback ran too
  # The rule on training metrics holds on this path as well.
  with pytest.raises(ValueError, match="EarlyStopping decides from 'loss'"):
    model.fit(**private.fit_arguments(seed=1, verbose=False),
              callbacks=[keras.callbacks.EarlyStopping(monitor="loss")], verbose=0)


# -- issue 34 friction 6: arrays that num_microbatches cannot split ----------------------------

def test_arrays_whose_last_batch_num_microbatches_cannot_split_are_refused_before_training():
  model = _model(num_microbatches=5)
  x, y = _data(58)  # batches of 10: the last one holds 8, not a multiple of 5
  with pytest.raises(ValueError, match=(
      r"N=58 training examples.*batch_size=10.*holds 8 examples.*num_microbatches=5.*"
      r"Trim N to a multiple of the batch size \(e.g. the first 50 examples\) or pick a batch "
      "size that divides N")):
    model.fit(x, y, batch_size=10, verbose=0)
  with pytest.raises(ValueError, match="batch_size=8 is not a multiple of the DP optimizer's "
                                       "num_microbatches=5"):
    model.fit(x[:40], y[:40], batch_size=8, verbose=0)
  assert int(model.optimizer.iterations.numpy()) == 0
  model.fit(x[:50], y[:50], batch_size=10, verbose=0)
  assert int(model.optimizer.iterations.numpy()) == 5


# -- item 7: shapes, losses, schedules, apply -----------------------------------------------

def test_a_wrong_feature_size_is_refused_naming_both_shapes():
  model = _model(features=3)
  x, y = _data(16, features=5)
  with pytest.raises(ValueError, match=r"input 0 takes examples of shape \(3,\), but the "
                                       r"training batches hold examples of shape \(5,\)"):
    model.fit(x, y, batch_size=8, verbose=0)
  assert int(model.optimizer.iterations.numpy()) == 0


def test_an_augmentation_crop_that_does_not_fit_the_input_is_refused():
  def crop(image, seed):
    return tf.image.stateless_random_crop(image, (6, 6, 1), seed)
  model = tf_dpkit.DPSequential([keras.Input((8, 8, 1)), keras.layers.Flatten(),
                                 keras.layers.Dense(2)])
  model.compile(optimizer=DPGradientDescentGaussianOptimizer(1.0, 0.5, learning_rate=0.1, seed=0),
                loss=LOSS, augmentation=tf_dpkit.AugmentationMultiplicity(crop, 2, seed=0))
  x = np.random.default_rng(0).normal(size=(16, 8, 8, 1)).astype("float32")
  y = np.zeros(16, np.int32)
  with pytest.raises(ValueError, match=(
      r"takes examples of shape \(8, 8, 1\), but augment_fn .* returns examples of shape "
      r"\(6, 6, 1\); build the model with keras.Input\(shape=\(6, 6, 1\)\)")):
    model.fit(x, y, batch_size=8, verbose=0)
  assert int(model.optimizer.iterations.numpy()) == 0


def test_the_bound_call_of_a_batch_mixing_loss_is_refused():
  model = tf_dpkit.DPSequential([keras.Input((3,)), keras.layers.Dense(4)])
  for loss in (keras.losses.Circle().call, keras.losses.Circle().__call__):
    with pytest.raises(ValueError, match="compares examples within a batch"):
      model.compile(optimizer=DPGradientDescentGaussianOptimizer(1.0, 0.5, learning_rate=0.1),
                    loss=loss)


def test_schedules_with_more_than_64_pieces_are_refused_naming_the_argument():
  def pieces(k):
    return PiecewiseConstant(list(range(1, k)), [1.0 + 0.01 * i for i in range(k)])
  for name in ("l2_norm_clip", "noise_multiplier"):
    settings = {"l2_norm_clip": 1.0, "noise_multiplier": 1.0, name: pieces(65)}
    with pytest.raises(ValueError, match=f"{name}: the schedule has 65 pieces.*between 1 and 64"):
      DPGradientDescentGaussianOptimizer(learning_rate=0.1, **settings)
    settings[name] = pieces(64)
    optimizer = DPGradientDescentGaussianOptimizer(learning_rate=0.1, **settings)
    assert getattr(optimizer.dp_settings, "clip_schedule" if name == "l2_norm_clip"
                   else "noise_schedule").num_pieces == 64


def test_a_refused_apply_leaves_the_optimizer_usable():
  optimizer = DPGradientDescentGaussianOptimizer(1.0, 0.0, learning_rate=0.5, seed=0)
  w = keras.Variable(np.ones(3, np.float32))
  other = keras.Variable(np.ones((2, 2), np.float32))
  grads = [g for g, _ in optimizer.compute_gradients(
      lambda: tf.reduce_sum(w * tf.ones((4, 3)), axis=1), [w])]
  with pytest.raises(ValueError, match=r"gradient 0 has shape \(3,\), but "
                                       r"trainable_variables\[0\] .* has shape \(2, 2\)"):
    optimizer.apply(grads, [other])
  with pytest.raises(ValueError, match="got 1 gradients for 2 trainable_variables"):
    optimizer.apply(grads, [w, other])
  assert not optimizer.built
  # The certified gradients were not spent: applied to their variables they train.
  optimizer.apply(grads, [w])
  # Per-example gradient (1, 1, 1) clipped to 1, summed over 4 and averaged: 1/sqrt(3) each.
  np.testing.assert_allclose(w.numpy(), 1.0 - 0.5 / np.sqrt(3.0), rtol=1e-6)
  optimizer.minimize(lambda: tf.reduce_sum(w * tf.ones((4, 3)), axis=1), [w])
  assert int(optimizer.iterations.numpy()) == 2


@pytest.mark.parametrize("cls", [DPGradientDescentGaussianOptimizer, DPAdamGaussianOptimizer])
def test_errors_name_the_class_the_user_built_and_saving_still_works(cls):
  optimizer = cls(1.0, 0.5, learning_rate=0.1, seed=0)
  w = keras.Variable(np.ones(3, np.float32))
  with pytest.raises(ValueError, match=f"^{cls.__name__} received gradients that did not "):
    optimizer.apply([tf.ones(3)], [w])
  assert cls.__name__ in ("DPGradientDescentGaussianOptimizer", "DPAdamGaussianOptimizer")
  restored = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
  assert type(restored) is cls and restored.noise_multiplier == 0.5
  # A config saved under the registered name (.keras files) still loads.
  registered = "DPSGD" if cls is DPGradientDescentGaussianOptimizer else "DPAdam"
  old = {"module": None, "class_name": registered, "registered_name": f"tf_dpkit>{registered}",
         "config": optimizer.get_config()}
  assert type(keras.optimizers.deserialize(old)) is cls


def _three_class_model(optimizer):
  model = tf_dpkit.DPSequential([keras.Input((4,)), keras.layers.Dense(3)])
  model.compile(optimizer=optimizer,
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  return model


def test_class_ids_outside_the_models_classes_are_refused_before_training():
  # Issue 31: a label 7 with 3 classes used to fail deep inside TensorFlow's loss op.
  x = np.zeros((16, 4), np.float32)
  y = np.array([0, 1, 2, 7] * 4)
  model = _three_class_model(tf_dpkit.DPGradientDescentGaussianOptimizer(
      1.0, 1.0, learning_rate=0.1, seed=0))
  with pytest.raises(ValueError, match=r"y must be class ids in \[0, 3\).*first 7 in example 3"):
    model.fit(x, y, batch_size=8, verbose=0)
  assert int(model.optimizer.iterations.numpy()) == 0
  model.fit(x, np.minimum(y, 2), batch_size=8, verbose=0)  # valid ids train


def test_make_private_labels_outside_the_models_classes_are_refused_before_training():
  x = np.zeros((32, 4), np.float32)
  y = np.array([0, 1, 2, 3] * 8)
  private = tf_dpkit.make_private((x, y), batch_size=8, epochs=1, l2_norm_clip=1.0,
                                  noise_multiplier=1.0, delta=1e-3)
  model = _three_class_model(private.optimizer(keras.optimizers.SGD, learning_rate=0.1))
  with pytest.raises(ValueError, match=r"y must be class ids in \[0, 3\)"):
    model.fit(**private.fit_arguments(seed=0, verbose=False), verbose=0)
