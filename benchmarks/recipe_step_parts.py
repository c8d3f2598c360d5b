"""Where a ``--recipe=best`` step's time goes: forward pass, non-private step, DP step.

    python benchmarks/recipe_step_parts.py
    TF_ENABLE_ONEDNN_OPTS=1 python benchmarks/recipe_step_parts.py

The recipe's model (the tutorials' MNIST CNN with tanh, ``tutorials/mnist_cnn.py``) at a fixed
batch (default 2048, the recipe's expected batch) of random images, each configuration a
``tf.function`` timed interleaved rep by rep in one process:

* ``forward``: the mean loss of one training-mode forward pass;
* ``non_private``: ``keras.optimizers.SGD`` (momentum 0.8) on the mean loss;
* ``dp``: ``tf_dpkit.private_gradients`` with ``DPGradientDescentGaussianOptimizer`` (clip
  0.1, noise 1.929, momentum 0.8, expected batch as the batch), then ``apply``;
* ``dp_no_noise``: the same with noise multiplier 0 (clipping without the Gaussian draw);
* ``eval_1024``: an inference-mode forward pass of 1,024 images (the tutorial's evaluation).

Run it with oneDNN off and on (two processes) to see which part of a step the oneDNN setting
changes; the header states the build (``build_info``).
"""
from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "tutorials"))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from absl import app, flags  # noqa: E402

import build_info  # noqa: E402
import tf_dpkit  # noqa: E402
from mnist_cnn import cnn_layers  # noqa: E402

flags.DEFINE_integer("batch_size", 2048, "Examples per step.")
flags.DEFINE_integer("reps", 8, "Timed calls per configuration (interleaved).")
flags.DEFINE_integer("warmup", 2, "Untimed calls per configuration after tracing.")
flags.DEFINE_string("out", None, "Markdown file to write the table to (default: print only).")
FLAGS = flags.FLAGS

LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)


def _model(dp):
  cls = tf_dpkit.DPSequential if dp else keras.Sequential
  model = cls(cnn_layers(keras, activation="tanh"))
  model.build((None, 28, 28, 1))
  return model


def _dp_step(noise, batch):
  model = _model(dp=True)
  opt = tf_dpkit.DPGradientDescentGaussianOptimizer(
      l2_norm_clip=0.1, noise_multiplier=noise, learning_rate=1.0, momentum=0.8,
      expected_batch_size=batch)

  @tf.function
  def step(x, y):
    grads = tf_dpkit.private_gradients(opt, model, LOSS, x, y)
    opt.apply(grads, model.trainable_variables)
  return step


def main(_):
  batch = FLAGS.batch_size
  rng = np.random.default_rng(0)
  x = tf.constant(rng.random((batch, 28, 28, 1), dtype=np.float32))
  y = tf.constant(rng.integers(0, 10, batch).astype(np.int32))
  x_eval = tf.constant(rng.random((1024, 28, 28, 1), dtype=np.float32))
  plain = _model(dp=False)
  sgd = keras.optimizers.SGD(1.0, momentum=0.8)

  @tf.function
  def forward(x, y):
    return tf.reduce_mean(LOSS(y, plain(x, training=True)))

  @tf.function
  def non_private(x, y):
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(LOSS(y, plain(x, training=True)))
    sgd.apply(tape.gradient(loss, plain.trainable_variables), plain.trainable_variables)

  @tf.function
  def evaluate(x):
    return plain(x, training=False)

  dp, dp_no_noise = _dp_step(1.929, batch), _dp_step(0.0, batch)
  calls = {"forward": lambda: forward(x, y), "non_private": lambda: non_private(x, y),
           "dp": lambda: dp(x, y), "dp_no_noise": lambda: dp_no_noise(x, y),
           "eval_1024": lambda: evaluate(x_eval)}
  for call in calls.values():
    for _ in range(1 + FLAGS.warmup):
      call()
  times = {name: [] for name in calls}
  for _ in range(FLAGS.reps):
    for name, call in calls.items():
      start = time.perf_counter()
      result = call()
      if result is not None:
        result.numpy()
      times[name].append(time.perf_counter() - start)
  lines = ["| part | ms (median / best) |", "|---|---|"]
  lines += [f"| {name} | {1e3 * np.median(t):.1f} / {1e3 * np.min(t):.1f} |"
            for name, t in times.items()]
  build_info.report(f"Batch {batch}, {FLAGS.reps} timed calls per part after {FLAGS.warmup} "
                    "warm-up calls, interleaved.", lines, FLAGS.out)


if __name__ == "__main__":
  app.run(main)
