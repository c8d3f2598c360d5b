"""Audit DP-SGD: empirical lower bounds on epsilon, in one training run or in many.

    python tutorials/audit_tutorial.py --output_dir=/tmp/audit          # default audits, minutes
    python tutorials/audit_tutorial.py --output_dir=/tmp/audit --audits=mnist

``--audits`` picks any of (default ``dirac,many_run``):

* ``dirac``: the ONE-RUN WHITE-BOX audit.  A small MLP (784-32-10) on ``--dirac_train_size``
  MNIST images plus a Dirac canary head (tf_dpkit.auditing.dirac_canary_model): each of
  ``--dirac_canaries`` canaries has the gradient ``-scale e_j`` in its own coordinate of the
  head (no real example touches it), is included w.p. 1/2, and is clipped to ``C`` by the
  toolkit's own DP optimizer.  Full-batch DP-SGD (every step sees every example) for
  ``--dirac_steps`` steps with the noise calibrated to each of ``--dirac_epsilons`` exactly
  (analysis.gaussian: each canary's inclusion is then a Gaussian mechanism with
  mu = sqrt(T) / sigma, and the claim is tight).  The auditor sees the final model and scores
  canary j by ``w_T[j] - w_0[j]`` (the inner product of the total update with e_j, the
  likelihood-ratio statistic here), guesses the ``--dirac_guesses / 2`` highest "in" and as
  many lowest "out", and reports the Steinke et al. bound and the f-DP (mu-GDP) bound of
  Mahloujifar et al.  Rows ``noise_off`` and ``averaged_clipping`` (tf_dpkit.auditing.broken)
  run the same audit on broken pipelines claiming ``--dirac_broken_epsilon``.
* ``many_run``: the MANY-RUN WHITE-BOX audit.  ``--many_runs`` runs of ``--many_run_steps``
  full-batch DP-SGD steps on a tiny MLP (``--many_run_train_size`` images), each run with the
  one Dirac canary (w.p. 1/2) in every step or in none; the adversary observes every noisy
  update and applies the Gaussian likelihood-ratio test (the sum of the canary coordinate's
  updates above half its expected shift, fixed in advance from the claim).  The runs' TPR and
  FPR become Clopper-Pearson 95% bounds, read through mu-GDP (analysis.auditing.gdp_lower_bound)
  and through (eps, delta) (analysis.auditing.epsilon_lower_bound).  The runs are consecutive
  segments of one fit: the canary coordinate's updates do not depend on the rest of the model,
  so the segments are independent runs of the mechanism on that coordinate.
* ``mnist``: the one-run audits of DP-SGD with Poisson sampling on MNIST with the older canary
  head (a logit row per canary): DP rows calibrated to ``--target_epsilons`` (RDP), a
  non-private row and the broken pipelines at the first target.

Every score, threshold and guess count is fixed per row before the inclusion bits are looked
at, so each bound holds on its own at 95%.  Writes ``DIR/results.json`` (one record per row)
and ``DIR/results.md`` (the tables).  A bound above the claimed epsilon means the run is not
the mechanism that was accounted.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import keras  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

import tf_dpkit  # noqa: E402
from analysis import auditing as audit_stats  # noqa: E402
from analysis import calibration, gaussian, rdp_accountant  # noqa: E402
from tf_dpkit import auditing  # noqa: E402
from tf_dpkit.auditing import broken  # noqa: E402
from tf_dpkit.data import mnist, poisson_batches  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("output_dir", None, "Where results.json and results.md go.")
flags.DEFINE_list("audits", ["dirac", "many_run"], "Audits to run: dirac, many_run, mnist.")
flags.DEFINE_list("dirac_epsilons", ["4"], "Claimed epsilons of the one-run white-box audit.")
flags.DEFINE_integer("dirac_canaries", 10000, "Dirac canaries m (each included w.p. 1/2).")
flags.DEFINE_integer("dirac_guesses", 400, "Guesses r of the Dirac audit (half in, half out).")
flags.DEFINE_integer("dirac_steps", 10, "Full-batch DP-SGD steps T of the Dirac audit.")
flags.DEFINE_integer("dirac_train_size", 1000, "Real MNIST images in the Dirac audit.")
flags.DEFINE_float("dirac_broken_epsilon", 1.0, "Claimed epsilon of the broken Dirac rows.")
flags.DEFINE_list("dirac_rows", ["dp", "noise_off", "averaged_clipping"],
                  "Dirac rows: dp (one per --dirac_epsilons) and broken kinds.")
flags.DEFINE_list("many_run_epsilons", ["1", "4"], "Claimed epsilons of the many-run audit.")
flags.DEFINE_list("many_runs", ["40000", "4000"], "Runs R per claimed epsilon (same order).")
flags.DEFINE_integer("many_run_steps", 1, "Full-batch DP-SGD steps T per run.")
flags.DEFINE_integer("many_run_train_size", 16, "Real MNIST images in each many-run run.")
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


def _mnist_images(size):
  (x_train, y_train), (x_test, y_test) = mnist.load()
  prep = lambda x: x.reshape(len(x), -1).astype(np.float32) / 255.0
  return ((prep(x_train[:size]), y_train[:size].astype(np.int32)),
          (prep(x_test), y_test.astype(np.int32)))


def _fdp_bounds(m, r, v):
  mu = audit_stats.one_run_gdp_lower_bound(m, r, v)
  eps = 0.0 if mu == 0.0 else gaussian.epsilon_for_delta(1.0 / mu, FLAGS.delta)
  return mu, eps


def _mnist_audit():
  """The one-run audits with Poisson sampling and the logit-row canary head (module doc)."""
  (x_train, y_train), test = _mnist_images(FLAGS.train_size)
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
    mu_lb, fdp_eps = _fdp_bounds(audit.num_canaries, audit.num_guesses, audit.num_correct)
    record = {"audit": "mnist", "pipeline": kind, "score": score, "noise_multiplier": sigma,
              "claimed_epsilon": claimed, "epsilon_lower_bound": audit.epsilon_lower_bound,
              "fdp_epsilon_lower_bound": fdp_eps, "gdp_mu_lower_bound": mu_lb,
              "max_epsilon_lower_bound": audit.max_epsilon_lower_bound,
              "canaries": audit.num_canaries, "guesses": audit.num_guesses,
              "correct": audit.num_correct, "steps": steps, "test_accuracy": accuracy,
              "train_seconds": seconds, "delta": FLAGS.delta, "num_examples": len(data[1])}
    records.append(record)
    print(json.dumps(record), flush=True)
  lines = ["| pipeline | score | sigma | claimed eps | Steinke bound | f-DP bound | max (Steinke) | "
           "correct / guesses | canaries | test acc |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
  for r in records:
    lines.append(f"| {r['pipeline']} | {r['score']} | {r['noise_multiplier']:.3f} | "
                 f"{r['claimed_epsilon']:.2f} | {r['epsilon_lower_bound']:.2f} | "
                 f"{r['fdp_epsilon_lower_bound']:.2f} | {r['max_epsilon_lower_bound']:.2f} | "
                 f"{r['correct']} / {r['guesses']} | {r['canaries']} | "
                 f"{r['test_accuracy']:.4f} |")
  return records, ["One run, Poisson sampling, logit-row canaries (MNIST MLP 784-64-10):", ""] + lines


def _small_mlp():
  return keras.Sequential([keras.Input((784,)), keras.layers.Dense(32, activation="relu"),
                           keras.layers.Dense(10)])


def _dirac_fit(kind, sigma, x, y, canaries, steps, normaliser, weights=None):
  """Full-batch DP-SGD (or a broken kind) on the Dirac canary model; returns the recorder's
  trajectory ``[steps + 1, m]`` in units of ``lr C / normaliser`` and the seconds taken.
  ``weights``: per-step weight of the canary rows (``[steps]``, 0 or 1), or None."""
  clip, lr = FLAGS.l2_norm_clip, FLAGS.learning_rate
  keras.utils.set_random_seed(FLAGS.seed)
  if kind == "dp":
    optimizer = tf_dpkit.DPGradientDescentGaussianOptimizer(
        clip, sigma, learning_rate=lr, expected_batch_size=normaliser, seed=FLAGS.seed)
    model_class = tf_dpkit.DPModel
  else:
    optimizer, model_class = broken.broken_training(
        kind, l2_norm_clip=clip, noise_multiplier=sigma, expected_batch_size=normaliser,
        learning_rate=lr, seed=FLAGS.seed)
  model = auditing.dirac_canary_model(_small_mlp(), canaries.num_canaries,
                                      model_class=model_class)
  model.compile(optimizer, loss=auditing.dirac_loss(scale=10.0 * clip))
  recorder = auditing.DiracRecorder()
  (x_all, index), y_all = auditing.dirac_training_data(x, y, canaries)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  batch = ((tf.constant(x_all), tf.constant(index)), tf.constant(y_all))
  is_canary = tf.constant(y_all < 0)
  if weights is None:
    dataset = tf.data.Dataset.from_tensors(batch).repeat(steps)
  else:
    def with_weight(w):
      return batch + (tf.where(is_canary, w, 1.0),)
    dataset = tf.data.Dataset.from_tensor_slices(np.asarray(weights, np.float32)).map(with_weight)
  start = time.time()
  model.fit(dataset, epochs=1, steps_per_epoch=steps, verbose=0, callbacks=[recorder])
  return recorder.trajectory * normaliser / (lr * clip), time.time() - start


def _dirac_audit():
  """The one-run white-box audit with Dirac canaries, full batch (module doc)."""
  (x, y), _ = _mnist_images(FLAGS.dirac_train_size)
  canaries = auditing.make_canaries(FLAGS.dirac_canaries, 10, seed=FLAGS.seed)
  steps, m, r = FLAGS.dirac_steps, FLAGS.dirac_canaries, FLAGS.dirac_guesses
  normaliser = float(len(y) + m // 2)  # public: the expected number of examples
  plan = []
  if "dp" in FLAGS.dirac_rows:
    plan += [("dp", float(e)) for e in FLAGS.dirac_epsilons]
  plan += [(kind, FLAGS.dirac_broken_epsilon) for kind in FLAGS.dirac_rows if kind != "dp"]
  records = []
  for kind, target in plan:
    sigma = gaussian.noise_multiplier_for_epsilon(target, FLAGS.delta, count=steps)
    claimed = gaussian.composed_epsilon([sigma], [steps], FLAGS.delta)
    trajectory, seconds = _dirac_fit(kind, sigma, x, y, canaries, steps, normaliser)
    audit = auditing.one_run_audit(auditing.canary_scores(trajectory, "sum"), canaries.included,
                                   r, delta=FLAGS.delta)
    mu_lb, fdp_eps = _fdp_bounds(m, r, audit.num_correct)
    record = {"audit": "dirac", "pipeline": kind, "score": "sum", "noise_multiplier": sigma,
              "claimed_epsilon": claimed, "claimed_mu": math.sqrt(steps) / sigma,
              "epsilon_lower_bound": audit.epsilon_lower_bound,
              "fdp_epsilon_lower_bound": fdp_eps, "gdp_mu_lower_bound": mu_lb,
              "max_epsilon_lower_bound": audit.max_epsilon_lower_bound, "canaries": m,
              "guesses": r, "correct": audit.num_correct, "steps": steps,
              "train_seconds": seconds, "delta": FLAGS.delta, "num_real_examples": len(y)}
    records.append(record)
    print(json.dumps(record), flush=True)
  lines = ["| pipeline | sigma | steps | claimed eps (mu) | Steinke bound | f-DP bound (mu) | "
           "correct / guesses | canaries |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
  for r_ in records:
    lines.append(f"| {r_['pipeline']} | {r_['noise_multiplier']:.3f} | {r_['steps']} | "
                 f"{r_['claimed_epsilon']:.2f} ({r_['claimed_mu']:.3f}) | "
                 f"{r_['epsilon_lower_bound']:.2f} | {r_['fdp_epsilon_lower_bound']:.2f} "
                 f"({r_['gdp_mu_lower_bound']:.3f}) | {r_['correct']} / {r_['guesses']} | "
                 f"{r_['canaries']} |")
  return records, ["One run, white box, Dirac canaries, full batch (MLP 784-32-10):", ""] + lines


def _many_run_audit():
  """The many-run white-box audit (module doc)."""
  (x, y), _ = _mnist_images(FLAGS.many_run_train_size)
  canaries = auditing.make_canaries(2, 10, seed=FLAGS.seed)  # canary 0 audited, 1 never in
  canaries = dataclasses.replace(canaries, included=np.array([True, False]))
  steps = FLAGS.many_run_steps
  normaliser = float(len(y) + 1)
  records = []
  for target, runs in zip(FLAGS.many_run_epsilons, FLAGS.many_runs):
    target, runs = float(target), int(runs)
    sigma = gaussian.noise_multiplier_for_epsilon(target, FLAGS.delta, count=steps)
    claimed = gaussian.composed_epsilon([sigma], [steps], FLAGS.delta)
    rng = np.random.default_rng([FLAGS.seed, runs])
    bits = rng.random(runs) < 0.5  # the auditor's secret: canary in run i
    trajectory, seconds = _dirac_fit("dp", sigma, x, y, canaries, runs * steps, normaliser,
                                     weights=np.repeat(bits, steps).astype(np.float32))
    per_run = np.diff(trajectory[::steps, 0])  # run i's total shift of the canary coordinate
    # Gaussian LR test, fixed from the claim: "in" iff the shift exceeds steps / 2 (the
    # midpoint of N(0, steps sigma^2) and N(steps, steps sigma^2)).
    said_in = per_run > steps / 2.0
    tp, pos = int(np.sum(said_in & bits)), int(np.sum(bits))
    fp, neg = int(np.sum(said_in & ~bits)), int(np.sum(~bits))
    mu_lb = audit_stats.gdp_lower_bound(tp, pos, fp, neg)
    gdp_eps = 0.0 if mu_lb == 0.0 else gaussian.epsilon_for_delta(1.0 / mu_lb, FLAGS.delta)
    dp_eps = audit_stats.epsilon_lower_bound(tp, pos, fp, neg, delta=FLAGS.delta)
    record = {"audit": "many_run", "pipeline": "dp", "noise_multiplier": sigma,
              "claimed_epsilon": claimed, "claimed_mu": math.sqrt(steps) / sigma,
              "runs": runs, "steps_per_run": steps, "true_positives": tp, "positives": pos,
              "false_positives": fp, "negatives": neg, "gdp_mu_lower_bound": mu_lb,
              "gdp_epsilon_lower_bound": gdp_eps, "epsilon_lower_bound": dp_eps,
              "fraction_of_claim": gdp_eps / claimed, "train_seconds": seconds,
              "delta": FLAGS.delta, "num_real_examples": len(y)}
    records.append(record)
    print(json.dumps(record), flush=True)
  lines = ["| claimed eps (mu) | runs x steps | TP / pos | FP / neg | GDP bound (mu) | "
           "fraction of claim | (eps, delta) bound | seconds |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|"]
  for r in records:
    lines.append(f"| {r['claimed_epsilon']:.2f} ({r['claimed_mu']:.3f}) | {r['runs']} x "
                 f"{r['steps_per_run']} | {r['true_positives']} / {r['positives']} | "
                 f"{r['false_positives']} / {r['negatives']} | {r['gdp_epsilon_lower_bound']:.2f} "
                 f"({r['gdp_mu_lower_bound']:.3f}) | {r['fraction_of_claim']:.2f} | "
                 f"{r['epsilon_lower_bound']:.2f} | {r['train_seconds']:.0f} |")
  return records, ["Many runs, white box, one Dirac canary, every update observed:", ""] + lines


_AUDITS = {"dirac": _dirac_audit, "many_run": _many_run_audit, "mnist": _mnist_audit}


def main(argv):
  del argv
  if not FLAGS.output_dir:
    raise app.UsageError("--output_dir is required.")
  unknown = sorted(set(FLAGS.audits) - set(_AUDITS))
  if unknown:
    raise app.UsageError(f"--audits: unknown {unknown}; choose from {sorted(_AUDITS)}.")
  if len(FLAGS.many_runs) != len(FLAGS.many_run_epsilons):
    raise app.UsageError("--many_runs needs one count per --many_run_epsilons entry.")
  os.makedirs(FLAGS.output_dir, exist_ok=True)
  records, lines = [], []
  for name in FLAGS.audits:
    new_records, new_lines = _AUDITS[name]()
    records += new_records
    lines += new_lines + [""]
  with open(os.path.join(FLAGS.output_dir, "results.json"), "w", encoding="utf-8") as handle:
    json.dump(records, handle, indent=1)
  with open(os.path.join(FLAGS.output_dir, "results.md"), "w", encoding="utf-8") as handle:
    handle.write("\n".join(lines))
  print("\n".join(lines))


if __name__ == "__main__":
  app.run(main)
