"""Step time of the card's loop: the optimizer swap against private_gradients and Adam.

    python benchmarks/swap_path.py                       # MNIST CNN, batch 256, 12 reps
    python benchmarks/swap_path.py --batch_size=1024 --reps=10
    TF_ENABLE_ONEDNN_OPTS=1 python benchmarks/swap_path.py

Three ``tf.function`` steps of the same model (the tutorials' MNIST CNN; ``keras.Sequential``
for the non-private step, ``tf_dpkit.DPSequential`` for the DP ones) on the same batch, timed interleaved rep by rep in one process:

* ``non_private``: ``keras.optimizers.Adam``; ``tape.gradient`` of the mean loss and ``apply``;
* ``swap``: the card's loop, ``tf_dpkit.DPAdamGaussianOptimizer`` and
  ``optimizer.minimize(vector_loss, model.trainable_variables, tape=tape)``
  (``tf_dpkit.clipping.swap``);
* ``private_gradients``: ``tf_dpkit.private_gradients(optimizer, model, loss_fn, x, y)`` then
  ``optimizer.apply(grads, model.trainable_variables)``.

Prints the median and best milliseconds per step and each one's ratio to ``non_private``.
"""
from __future__ import annotations

import os
import platform
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from absl import app, flags  # noqa: E402

import models as bench_models  # noqa: E402
import tf_dpkit  # noqa: E402

flags.DEFINE_integer("batch_size", 256, "Batch size.")
flags.DEFINE_integer("reps", 12, "Timed steps per method (interleaved).")
flags.DEFINE_integer("warmup", 3, "Untimed steps per method after tracing.")
FLAGS = flags.FLAGS

LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)


def _model(cls=tf_dpkit.DPSequential):
  keras.utils.set_random_seed(0)
  return cls(bench_models.cnn_layers(keras))


def _steps():
  steps = {}

  model = _model(keras.Sequential)  # a plain Keras model: nothing traced
  adam = keras.optimizers.Adam(1e-3)

  @tf.function
  def non_private(x, y):
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(LOSS(y, model(x, training=True)))
    adam.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
  steps["non_private"] = non_private

  swap_model = _model()
  swap_opt = tf_dpkit.DPAdamGaussianOptimizer(l2_norm_clip=1.0, noise_multiplier=1.1,
                                              learning_rate=1e-3)

  @tf.function
  def swap(x, y):
    with tf.GradientTape() as tape:
      loss = LOSS(y, swap_model(x, training=True))
    swap_opt.minimize(loss, swap_model.trainable_variables, tape=tape)
  steps["swap"] = swap

  pg_model = _model()
  pg_opt = tf_dpkit.DPAdamGaussianOptimizer(l2_norm_clip=1.0, noise_multiplier=1.1,
                                            learning_rate=1e-3)

  @tf.function
  def private_gradients(x, y):
    grads = tf_dpkit.private_gradients(pg_opt, pg_model, LOSS, x, y)
    pg_opt.apply(grads, pg_model.trainable_variables)
  steps["private_gradients"] = private_gradients
  return steps


def main(_):
  x, y = bench_models.batch_for("mnist_cnn", FLAGS.batch_size)
  x, y = tf.constant(x), tf.constant(y)
  steps = _steps()
  for step in steps.values():
    for _ in range(1 + FLAGS.warmup):
      step(x, y)
  times = {name: [] for name in steps}
  for _ in range(FLAGS.reps):
    for name, step in steps.items():
      start = time.perf_counter()
      step(x, y)
      times[name].append(time.perf_counter() - start)
  base = np.median(times["non_private"])
  print(f"TensorFlow {tf.__version__}, Keras {keras.__version__}, {platform.processor() or ''} "
        f"{os.cpu_count()} CPUs, TF_ENABLE_ONEDNN_OPTS="
        f"{os.environ.get('TF_ENABLE_ONEDNN_OPTS', '(unset)')}, batch {FLAGS.batch_size}, "
        f"{FLAGS.reps} reps")
  print("| method | median ms/step | best ms/step | median / non_private |")
  print("|---|---|---|---|")
  for name, values in times.items():
    print(f"| {name} | {1e3 * np.median(values):.1f} | {1e3 * np.min(values):.1f} | "
          f"{np.median(values) / base:.2f}x |")


if __name__ == "__main__":
  app.run(main)
