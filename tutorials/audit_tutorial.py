"""Audit DP-SGD on MNIST in one training run: an empirical lower bound on epsilon.

    python tutorials/audit_tutorial.py --output_dir=/tmp/audit      # all rows, ~minutes

Each row trains a small MLP (784-64-10) with a canary head (tf_dpkit.auditing) on
``--train_size`` real MNIST images plus the included half of ``--canaries`` white-box gradient
canaries, for ``--epochs`` epochs of Poisson batches (expected size ``--batch_size``), then runs
the one-run audit (Steinke, Nasr & Jagielski 2023) with ``--guesses`` guesses at delta 1e-5
and 95% confidence.  Rows:

* DP-SGD with the noise multiplier calibrated (analysis.calibration) to each of
  ``--target_epsilons`` (default 1, 4, 16), audited with the "sum" score;
* non-private training (plain SGD on the mean loss, no clipping, no noise);
* the broken pipelines of tf_dpkit.auditing.broken at the first target's settings: noise off
  ("sum"), the same noise on every step ("step_range"), clipping of the averaged gradient
  ("sum").  Each score is fixed per row in advance, so each bound is valid on its own.

Writes ``DIR/results.json`` (one record per row) and ``DIR/results.md`` (the table).  A bound
above the claimed epsilon means the run is not the mechanism that was accounted.
"""
from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import keras  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

import tf_dpkit  # noqa: E402
from analysis import calibration, rdp_accountant  # noqa: E402
from tf_dpkit import auditing  # noqa: E402
from tf_dpkit.auditing import broken  # noqa: E402
from tf_dpkit.data import mnist, poisson_batches  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("output_dir", None, "Where results.json and results.md go.")
flags.DEFINE_list("target_epsilons", ["1", "4", "16"], "Claimed epsilons of the DP rows.")
flags.DEFINE_list("rows", ["dp", "nonprivate", "noise_off", "same_noise_every_step",
                           "averaged_clipping"], "Which rows to run.")
flags.DEFINE_integer("train_size", 10000, "Real MNIST training images used.")
flags.DEFINE_integer("canaries", 1000, "Number of canaries m (each included w.p. 1/2).")
flags.DEFINE_integer("guesses", 100, "Number of guesses r (half 'in', half 'out'); even.")
flags.DEFINE_integer("batch_size", 256, "Expected batch size qN.")
flags.DEFINE_integer("epochs", 5, "Epochs: ceil(epochs N / batch_size) steps in all.")
flags.DEFINE_float("l2_norm_clip", 1.0, "Clip norm C.")
flags.DEFINE_float("learning_rate", 0.5, "SGD learning rate.")
flags.DEFINE_float("delta", 1e-5, "Delta of the claim and of the audit.")
flags.DEFINE_integer("seed", 0, "Seed of weights, canaries, sampling and noise (an audit "
                     "experiment: nothing here is meant to stay secret).")

_LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)


def _base():
  return keras.Sequential([keras.Input((784,)), keras.layers.Dense(64, activation="relu"),
                           keras.layers.Dense(10)])


def _claimed_epsilon(q, sigma, steps):
  orders = rdp_accountant.DEFAULT_ORDERS
  rdp = rdp_accountant.compute_rdp(q, sigma, steps, orders)
  return float(rdp_accountant.get_privacy_spent(orders, rdp, target_delta=FLAGS.delta)[0])


def _run_row(kind, sigma, data, canaries, test):
  """Trains one row; returns (trajectory, test accuracy, seconds)."""
  (x_all, codes), y_all = data
  n = len(y_all)
  steps = calibration.steps_for_training(n, FLAGS.batch_size, FLAGS.epochs)
  keras.utils.set_random_seed(FLAGS.seed)
  clip, lr, batch = FLAGS.l2_norm_clip, FLAGS.learning_rate, float(FLAGS.batch_size)
  if kind == "dp":
    optimizer = tf_dpkit.DPGradientDescentGaussianOptimizer(
        clip, sigma, learning_rate=lr, expected_batch_size=batch, seed=FLAGS.seed)
    model_class, loss = tf_dpkit.DPModel, _LOSS
  elif kind == "nonprivate":
    optimizer, model_class = keras.optimizers.SGD(lr), keras.Model
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
  else:
    optimizer, model_class = broken.broken_training(
        kind, l2_norm_clip=clip, noise_multiplier=sigma, expected_batch_size=batch,
        learning_rate=lr, seed=FLAGS.seed)
    loss = _LOSS
  model = auditing.canary_model(_base(), canaries.num_canaries, model_class=model_class)
  model.compile(optimizer, loss=loss)
  recorder = auditing.CanaryRecorder(canaries)
  start = time.time()
  model.fit(poisson_batches(((x_all, codes), y_all), expected_batch_size=batch, steps=steps,
                            seed=FLAGS.seed), epochs=1, steps_per_epoch=steps, verbose=0,
            callbacks=[recorder])
  seconds = time.time() - start
  x_test, y_test = test
  logits = model.predict([x_test, np.zeros((len(y_test), canaries.num_canaries), np.float32)],
                         batch_size=1024, verbose=0)
  return recorder.trajectory, float(np.mean(np.argmax(logits, 1) == y_test)), seconds, steps


def main(argv):
  del argv
  if not FLAGS.output_dir:
    raise app.UsageError("--output_dir is required.")
  os.makedirs(FLAGS.output_dir, exist_ok=True)
  (x_train, y_train), (x_test, y_test) = mnist.load()
  prep = lambda x: x.reshape(len(x), -1).astype(np.float32) / 255.0
  x_train, y_train = prep(x_train[:FLAGS.train_size]), y_train[:FLAGS.train_size].astype(np.int32)
  test = (prep(x_test), y_test.astype(np.int32))
  canaries = auditing.make_canaries(FLAGS.canaries, 10, seed=FLAGS.seed)
  data = auditing.training_data(x_train, y_train, canaries)
  n = len(data[1])
  q = FLAGS.batch_size / n
  targets = [float(e) for e in FLAGS.target_epsilons]
  sigmas = [calibration.compute_noise_multiplier_for_training(
      e, FLAGS.delta, n, FLAGS.batch_size, FLAGS.epochs) for e in targets]
  plan = []
  if "dp" in FLAGS.rows:
    plan += [("dp", s, "sum") for s in sigmas]
  if "nonprivate" in FLAGS.rows:
    plan.append(("nonprivate", 0.0, "sum"))
  for kind, score in (("noise_off", "sum"), ("same_noise_every_step", "step_range"),
                      ("averaged_clipping", "sum")):
    if kind in FLAGS.rows:
      plan.append((kind, sigmas[0], score))
  records = []
  for kind, sigma, score in plan:
    trajectory, accuracy, seconds, steps = _run_row(kind, sigma, data, canaries, test)
    audit = auditing.one_run_audit(auditing.canary_scores(trajectory, score), canaries.included,
                                   FLAGS.guesses, delta=FLAGS.delta)
    claimed = float("inf") if kind == "nonprivate" else _claimed_epsilon(q, sigma, steps)
    record = {"pipeline": kind, "score": score, "noise_multiplier": sigma,
              "claimed_epsilon": claimed, "epsilon_lower_bound": audit.epsilon_lower_bound,
              "max_epsilon_lower_bound": audit.max_epsilon_lower_bound,
              "canaries": audit.num_canaries, "guesses": audit.num_guesses,
              "correct": audit.num_correct, "steps": steps, "test_accuracy": accuracy,
              "train_seconds": seconds, "delta": FLAGS.delta, "num_examples": len(data[1])}
    records.append(record)
    print(json.dumps(record), flush=True)
  with open(os.path.join(FLAGS.output_dir, "results.json"), "w", encoding="utf-8") as handle:
    json.dump(records, handle, indent=1)
  lines = ["| pipeline | score | sigma | claimed eps | audited lower bound | max possible | "
           "correct / guesses | canaries | test acc |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
  for r in records:
    lines.append(f"| {r['pipeline']} | {r['score']} | {r['noise_multiplier']:.3f} | "
                 f"{r['claimed_epsilon']:.2f} | {r['epsilon_lower_bound']:.2f} | "
                 f"{r['max_epsilon_lower_bound']:.2f} | {r['correct']} / {r['guesses']} | "
                 f"{r['canaries']} | {r['test_accuracy']:.4f} |")
  with open(os.path.join(FLAGS.output_dir, "results.md"), "w", encoding="utf-8") as handle:
    handle.write("\n".join(lines) + "\n")
  print("\n".join(lines))


if __name__ == "__main__":
  app.run(main)
