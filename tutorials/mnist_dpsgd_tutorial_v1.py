"""DP-SGD on MNIST in ``tf.compat.v1`` graph mode with a Session.

    python tutorials/mnist_dpsgd_tutorial_v1.py --epochs=15 --noise_multiplier=1.3 \
        --l2_norm_clip=1.5 --learning_rate=0.25

The graph-mode change is the seed tutorial's: ``tf_dpkit.v1.DPGradientDescentGaussianOptimizer``
replaces ``GradientDescentOptimizer`` and ``minimize`` gets the vector loss (no tape needed in a
graph).  The CNN is written with v1 variables and ``tf.nn`` ops because Keras 3 layers do not
build in v1 graphs.  ``minimize`` replays the ops between the iterator's outputs and the vector
loss on each example (``tf_dpkit.clipping.graph_replay``), so each example's gradient comes from
that example alone at about twice the cost of a non-private step; every step checks that the
replay reproduces the loss (a loss that mixes examples stops with an error), and a graph the
replay cannot rebuild takes the exact Jacobian path, far slower, with one warning.
"""
from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from absl import app  # noqa: E402

import common  # noqa: E402
import tf_dpkit  # noqa: E402

V1 = tf.compat.v1
FLAGS = common.FLAGS
common.define_flags()


def cnn_logits(images):
  """The seed tutorial's CNN with v1 variables (Glorot-uniform kernels, zero biases)."""
  init = V1.glorot_uniform_initializer()

  def conv(x, filters, size, stride, padding, name):
    kernel = V1.get_variable(f"{name}/kernel", [size, size, x.shape[-1], filters], initializer=init)
    bias = V1.get_variable(f"{name}/bias", [filters], initializer=V1.zeros_initializer())
    return tf.nn.relu(tf.nn.conv2d(x, kernel, stride, padding) + bias)

  def dense(x, units, name):
    kernel = V1.get_variable(f"{name}/kernel", [x.shape[-1], units], initializer=init)
    bias = V1.get_variable(f"{name}/bias", [units], initializer=V1.zeros_initializer())
    return tf.matmul(x, kernel) + bias

  y = conv(images, 16, 8, 2, "SAME", "conv1")
  y = tf.nn.max_pool2d(y, 2, 1, "VALID")
  y = conv(y, 32, 4, 2, "VALID", "conv2")
  y = tf.nn.max_pool2d(y, 2, 1, "VALID")
  y = tf.reshape(y, [-1, 4 * 4 * 32])
  return dense(tf.nn.relu(dense(y, 32, "dense1")), 10, "dense2")


def main(argv):
  del argv
  (x_train, y_train), (x_test, y_test), n, steps = common.setup()
  graph = tf.Graph()
  with graph.as_default():
    V1.set_random_seed(FLAGS.seed)
    train = common.train_batches((x_train, y_train), steps * FLAGS.epochs)
    images, labels, mask = V1.data.make_one_shot_iterator(train.prefetch(2)).get_next()
    with V1.variable_scope("cnn"):
      logits = cnn_logits(images)
    vector_loss = tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=labels, logits=logits) * mask
    mean_loss = tf.reduce_sum(vector_loss) / tf.maximum(tf.reduce_sum(mask), 1.0)
    accountant = None
    if FLAGS.dpsgd:
      sigma = common.noise_multiplier(n)
      optimizer = tf_dpkit.v1.DPGradientDescentGaussianOptimizer(
          l2_norm_clip=FLAGS.l2_norm_clip, noise_multiplier=sigma,
          num_microbatches=FLAGS.microbatches, learning_rate=FLAGS.learning_rate,
          expected_batch_size=FLAGS.batch_size if FLAGS.sampling == "poisson" else None)
      train_op = optimizer.minimize(loss=vector_loss)
      accountant = common.ledger()
    else:
      optimizer = V1.train.GradientDescentOptimizer(FLAGS.learning_rate)
      train_op = optimizer.minimize(loss=mean_loss)
    test_images = V1.placeholder(tf.float32, [None, 28, 28, 1])
    with V1.variable_scope("cnn", reuse=True):
      test_predictions = tf.argmax(cnn_logits(test_images), axis=1)

    start = time.time()
    accuracy = 0.0
    with V1.Session(graph=graph) as sess:
      sess.run(V1.global_variables_initializer())
      for epoch in range(1, FLAGS.epochs + 1):
        losses = [sess.run([train_op, mean_loss])[1] for _ in range(steps)]
        predictions = np.concatenate([
            sess.run(test_predictions, {test_images: x_test[i:i + 1024]})
            for i in range(0, len(x_test), 1024)])
        accuracy = float(np.mean(predictions == y_test))
        eps_text = ""
        if accountant is not None:
          common.record_steps(accountant, n, sigma, steps)
          eps_text = f" epsilon={accountant.epsilon():.4f}"
        print(f"epoch {epoch}: loss={np.mean(losses):.4f} first_loss={losses[0]:.4f} "
              f"test_accuracy={accuracy:.4f}{eps_text} elapsed={time.time() - start:.1f}s",
              flush=True)
  if accountant is not None:
    common.print_final_report(accountant, accuracy)


if __name__ == "__main__":
  app.run(main)
