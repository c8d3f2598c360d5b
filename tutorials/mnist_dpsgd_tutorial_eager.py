"""DP-SGD on MNIST in a custom ``tf.GradientTape`` loop: the one-line optimizer swap.

    python tutorials/mnist_dpsgd_tutorial_eager.py --epochs=15 --learning_rate=0.001

The non-private loop (``--nodpsgd``) uses ``keras.optimizers.Adam`` and a scalar loss; the
private loop swaps in ``tf_dpkit.DPAdamGaussianOptimizer``, builds the same layers as a
``tf_dpkit.DPSequential`` and passes the *vector* loss (one entry per example) to
``optimizer.minimize(vector_loss, model.trainable_variables, tape=tape)``.  The DP model records
its layers' inputs during the forward pass under the tape, so the optimizer clips on the
per-layer fast path (about the cost of a non-private step; ``tf_dpkit.clipping.swap``).
``--plain_keras_model`` keeps a plain ``keras.Sequential``, which the optimizer cannot trace: it
falls back to the exact Jacobian path (one backward pass per example over the whole batch, far
slower; the optimizer warns once).  ``--fast_clipping`` shows the other fast custom loop,
``tf_dpkit.private_gradients(optimizer, model, per_example_loss_fn, x, y)`` then
``optimizer.apply``.
"""
from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from absl import app, flags  # noqa: E402

import common  # noqa: E402
import tf_dpkit  # noqa: E402

FLAGS = common.FLAGS
common.define_flags(default_learning_rate=0.001)
flags.DEFINE_boolean("fast_clipping", False,
                     "Use tf_dpkit.private_gradients (model + per-example loss) and "
                     "optimizer.apply instead of optimizer.minimize on the tape.")
flags.DEFINE_boolean("plain_keras_model", False,
                     "Private run with a plain keras.Sequential: minimize cannot trace it and "
                     "takes the exact Jacobian path (slow; shown for comparison).")


def main(argv):
  del argv
  (x_train, y_train), (x_test, y_test), n, steps = common.setup()
  if FLAGS.dpsgd and not FLAGS.plain_keras_model:
    model = tf_dpkit.DPSequential(common.cnn_layers(keras))  # the swap's one other change
  else:
    model = keras.Sequential(common.cnn_layers(keras))
  vector_loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
  accountant = None
  if FLAGS.dpsgd:
    sigma = common.noise_multiplier(n)
    optimizer = tf_dpkit.DPAdamGaussianOptimizer(
        l2_norm_clip=FLAGS.l2_norm_clip, noise_multiplier=sigma,
        num_microbatches=FLAGS.microbatches, learning_rate=FLAGS.learning_rate,
        expected_batch_size=FLAGS.batch_size if FLAGS.sampling == "poisson" else None)
    accountant = common.ledger()
  else:
    optimizer = keras.optimizers.Adam(FLAGS.learning_rate)

  @tf.function(reduce_retracing=True)  # Poisson batches vary in size: trace once for all sizes
  def train_step(images, labels, mask):
    with tf.GradientTape() as tape:
      vector_loss = vector_loss_fn(labels, model(images, training=True)) * mask
      loss = vector_loss if FLAGS.dpsgd else tf.reduce_mean(vector_loss)
    if FLAGS.dpsgd and FLAGS.fast_clipping:
      del tape
      grads = tf_dpkit.private_gradients(optimizer, model, vector_loss_fn, images, labels, mask)
      optimizer.apply(grads, model.trainable_variables)
    elif FLAGS.dpsgd:
      optimizer.minimize(vector_loss, model.trainable_variables, tape=tape)
    else:
      grads = tape.gradient(loss, model.trainable_variables)
      optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return tf.reduce_sum(vector_loss) / tf.maximum(tf.reduce_sum(mask), 1.0)

  train = common.train_batches((x_train, y_train), steps * FLAGS.epochs)
  iterator = iter(train.prefetch(2))
  start = time.time()
  accuracy = 0.0
  for epoch in range(1, FLAGS.epochs + 1):
    losses = [float(train_step(*next(iterator))) for _ in range(steps)]
    logits = model.predict(x_test, batch_size=1024, verbose=0)
    accuracy = float(np.mean(np.argmax(logits, axis=1) == y_test))
    eps_text = ""
    if accountant is not None:
      common.record_steps(accountant, n, optimizer.noise_multiplier, steps)
      eps_text = f" epsilon={accountant.epsilon():.4f}"
    print(f"epoch {epoch}: loss={np.mean(losses):.4f} first_loss={losses[0]:.4f} "
          f"test_accuracy={accuracy:.4f}{eps_text} elapsed={time.time() - start:.1f}s", flush=True)
  if accountant is not None:
    common.print_final_report(accountant, accuracy)


if __name__ == "__main__":
  app.run(main)
