"""DP-SGD on MNIST with Keras ``fit`` under a ``tf.distribute`` strategy.

Several devices of one host (GPUs; here logical CPU devices stand in for them):

    python tutorials/mnist_dpsgd_tutorial_distributed.py --strategy=mirrored --replicas=2 \
        --epochs=2

Several workers (one process per host; here two on localhost), each with its ``TF_CONFIG``:

    python tutorials/mnist_dpsgd_tutorial_distributed.py --strategy=multiworker \
        --workers=localhost:12345,localhost:12346 --worker_index=0 --epochs=2 &
    python tutorials/mnist_dpsgd_tutorial_distributed.py --strategy=multiworker \
        --workers=localhost:12345,localhost:12346 --worker_index=1 --epochs=2

(``--workers``/``--worker_index`` only write ``TF_CONFIG``; set it yourself on a real cluster.)
Batches are Poisson-sampled (``--sampling=poisson``, the default:
``tf_dpkit.data.distributed_poisson_batches`` gives each replica its own part of every Poisson
batch, whose union is a Poisson sample of the whole data set) or shuffled fixed-size global
batches (``--sampling=shuffle``, accounted without amplification by sampling); every replica
clips its share of the global batch and adds its share of the noise, so the step is DP-SGD
over the global batch and the epsilon is the single-device one (``tf_dpkit.distribute``).
"""
from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from absl import app, flags  # noqa: E402

import common  # noqa: E402

FLAGS = common.FLAGS
common.define_flags()
flags.DEFINE_enum("strategy", "mirrored", ["none", "mirrored", "multiworker"],
                  "none: one device; mirrored: --replicas devices of this host; multiworker: "
                  "one worker of the cluster in TF_CONFIG (or --workers).")
flags.DEFINE_integer("replicas", 2, "Devices for --strategy=mirrored (GPUs if there are that "
                     "many, else logical CPU devices).")
flags.DEFINE_list("workers", None, "host:port of every worker (writes TF_CONFIG).")
flags.DEFINE_integer("worker_index", 0, "This worker's index in --workers.")


def _strategy(tf):
  if FLAGS.strategy == "multiworker":
    if FLAGS.workers:
      os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": FLAGS.workers},
                                            "task": {"type": "worker",
                                                     "index": FLAGS.worker_index}})
    return tf.distribute.MultiWorkerMirroredStrategy()
  if FLAGS.strategy == "mirrored":
    gpus = tf.config.list_physical_devices("GPU")
    if len(gpus) >= FLAGS.replicas:
      return tf.distribute.MirroredStrategy([f"/gpu:{i}" for i in range(FLAGS.replicas)])
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * FLAGS.replicas)
    return tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(FLAGS.replicas)])
  return tf.distribute.get_strategy()


def main(argv):
  del argv
  if FLAGS.strategy == "multiworker" and FLAGS.workers:
    os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": FLAGS.workers},
                                          "task": {"type": "worker", "index": FLAGS.worker_index}})
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  strategy = _strategy(tf)
  import keras  # pylint: disable=g-import-not-at-top
  import tf_dpkit  # pylint: disable=g-import-not-at-top
  from tf_dpkit.budget import PrivacyBudget  # pylint: disable=g-import-not-at-top

  (x_train, y_train), (x_test, y_test), n, steps = common.setup()
  sigma = common.noise_multiplier(n)
  poisson = FLAGS.sampling == "poisson"
  with strategy.scope():
    model = tf_dpkit.DPSequential(common.cnn_layers(keras))
    model.compile(optimizer=tf_dpkit.DPGradientDescentGaussianOptimizer(
        l2_norm_clip=FLAGS.l2_norm_clip, noise_multiplier=sigma,
        num_microbatches=FLAGS.microbatches, learning_rate=FLAGS.learning_rate,
        expected_batch_size=FLAGS.batch_size if poisson else None),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
  budget = PrivacyBudget(FLAGS.batch_size / n, target_epsilon=FLAGS.target_epsilon,
                         sampling=FLAGS.sampling, steps_per_epoch=steps,
                         batch_size=FLAGS.batch_size, accountant=common.ledger(), verbose=False)
  options = tf.data.Options()
  # Every worker reads the same global batches; tf.distribute splits each across the replicas.
  options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
  if poisson:  # every replica gets its own part of each Poisson batch
    train = tf_dpkit.data.distributed_poisson_batches(
        strategy, (x_train, y_train), expected_batch_size=FLAGS.batch_size,
        steps=steps * FLAGS.epochs, seed=FLAGS.sampling_seed)
  else:
    train = common.train_batches((x_train, y_train), steps * FLAGS.epochs).with_options(options)
  test = tf.data.Dataset.from_tensor_slices((x_test, y_test)).batch(1024)
  start = time.time()
  history = model.fit(train, epochs=FLAGS.epochs, steps_per_epoch=steps,
                      validation_data=test.with_options(options), callbacks=[budget],
                      verbose=0)
  for epoch, (eps, accuracy) in enumerate(zip(history.history["epsilon"],
                                              history.history["val_accuracy"])):
    print(f"epoch {epoch + 1}: test_accuracy={accuracy:.4f} epsilon={eps:.4f}", flush=True)
  print(f"strategy={FLAGS.strategy} replicas={strategy.num_replicas_in_sync} "
        f"elapsed={time.time() - start:.1f}s")
  common.print_final_report(budget.accountant, history.history["val_accuracy"][-1])


if __name__ == "__main__":
  app.run(main)
