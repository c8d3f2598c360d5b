"""PATE on MNIST: 250 teachers, Confident GNMax (or GNMax / LNMax / Interactive GNMax), and a
semi-supervised student.

    python tutorials/mnist_pate_tutorial.py --output_dir=/tmp/pate

1. The 60,000 MNIST training images are the private data, split into ``--num_teachers``
   disjoint shards (``tf_dpkit.pate.partition_indices``); all teachers train at once in one
   batched Keras model (``tf_dpkit.pate.TeacherEnsemble``).
2. The first 9,000 test images are public and unlabelled; ``--queries`` of them (drawn with
   ``--seed``) are sent to the aggregator, which answers with noisy teacher votes and records
   each outcome in an ``analysis.pate.PateAccountant``.  The last 1,000 test images evaluate.
   ``--selection=margin`` asks in rounds instead: after a random first round, each round
   queries the public images a student trained on the labels so far is least sure about
   (``tf_dpkit.pate.least_confident``; post-processing of released labels and public images).
3. The student trains on the released labels, and with ``--student=fixmatch`` also on all 9,000
   public images without labels (post-processing: no privacy cost).  ``--validation_size=N``
   holds the last N of them out (never queried or trained on) and scores each student on them,
   for choosing settings without the evaluation images.

Defaults are PATE 2018's MNIST setting (Papernot et al., "Scalable Private Learning with
PATE"): Confident GNMax with threshold 200, sigma1 150, sigma2 40, 640 queries, delta 1e-5.

Epsilons reported: ``epsilon_data_dependent`` (PATE 2018's data-dependent bound; computed from
the votes, so NOT itself private to publish), ``epsilon_data_independent`` (holds for every
data set; publishable) and ``epsilon_smooth_sensitivity`` (the data-dependent value released
through the smooth-sensitivity GNSS mechanism at ``--ss_order``, ``--ss_beta``,
``--ss_sigma``, fixed in advance; publishable).  Writes ``results.json``, ``student.keras`` and
two plots into ``--output_dir``.
"""
from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_enum("aggregator", "confident_gnmax",
                  ["confident_gnmax", "gnmax", "lnmax", "interactive_gnmax"],
                  "How teacher votes are released.")
flags.DEFINE_integer("seed", 0, "Public randomness: partition, teacher/student initialisation, "
                     "augmentation and which public images are queried.")
flags.DEFINE_integer("noise_seed", None,
                     "Seed of the aggregation noise (and of the smooth-sensitivity release). "
                     "Default: a secret key from the OS entropy source, as the privacy analysis "
                     "needs; set it only to reproduce an experiment.")
flags.DEFINE_integer("num_teachers", 250, "Number of teachers (disjoint shards).")
flags.DEFINE_integer("teacher_epochs", 15, "Passes over each teacher's shard.")
flags.DEFINE_integer("teacher_batch_size", 16, "Images per teacher per step.")
flags.DEFINE_float("teacher_learning_rate", 5e-3, "Adam learning rate of the teachers.")
flags.DEFINE_integer("queries", 640, "Public images sent to the aggregator.")
flags.DEFINE_enum("selection", "random", ["random", "margin"],
                  "Which public images are queried. random: drawn with --seed. margin: in "
                  "--selection_rounds rounds; the first is random, each later one takes the "
                  "unqueried images on which a student trained on the labels so far is least "
                  "sure (pate.least_confident; post-processing, no privacy cost).")
flags.DEFINE_integer("selection_rounds", 2, "With --selection=margin: rounds the queries are "
                     "split into (>= 2).")
flags.DEFINE_integer("selection_student_steps", 1500, "With --selection=margin: steps of each "
                     "round's selecting student.")
flags.DEFINE_float("threshold", 200.0, "Confident/Interactive GNMax threshold T (votes).")
flags.DEFINE_float("sigma1", 150.0, "Std of the threshold check's noise (votes).")
flags.DEFINE_float("sigma2", 40.0, "Std of the answer's noise (votes), also GNMax's sigma.")
flags.DEFINE_float("laplace_scale", 20.0, "LNMax Laplace scale b (votes); PATE 2017: 1/0.05.")
flags.DEFINE_float("alpha", None, "Interactive GNMax: weight of the student's probabilities "
                   "(default: the number of teachers).")
flags.DEFINE_float("gamma", 0.9, "Interactive GNMax: the student's confidence level.")
flags.DEFINE_float("delta", 1e-5, "Delta at which epsilon is reported.")
flags.DEFINE_enum("student", "fixmatch", ["fixmatch", "supervised"],
                  "fixmatch: also learn from all public images without labels; supervised: the "
                  "released labels only.")
flags.DEFINE_integer("student_steps", 1500, "Student optimiser steps.")
flags.DEFINE_enum("student_model", "cnn", ["cnn", "cnn_bn"],
                  "The student's network (pate.build_student_model): cnn, or cnn_bn with batch "
                  "normalisation (about 1.5x the time; every student of the run uses it and then "
                  "needs >= 1000 steps).")
flags.DEFINE_float("student_label_drop", 0.0,
                   "Fraction in [0, 0.9] of each labelled batch the student leaves out after a "
                   "warm-up of 20% of its steps: the highest-loss examples, likely wrong labels "
                   "(train_student's label_drop, the small-loss rule). Also used by the true-label "
                   "diagnostic; --selection=margin's selecting students train without it.")
flags.DEFINE_integer("supervised_baseline_steps", 500,
                     "With --student=fixmatch, also train a supervised-only student on the same "
                     "labels for this many steps, for comparison (0: skip).")
flags.DEFINE_integer("true_label_baseline_steps", 0,
                     "Diagnostic (0: skip): also train a student with the same method on the TRUE "
                     "labels of the queries that received a label, for this many steps; its "
                     "accuracy, student_accuracy_true_labels, separates label noise from the "
                     "student's own limits.  MNIST's public labels are known; PATE's setting "
                     "assumes they are not, so this is never a release.")
flags.DEFINE_list("curve_points", ["160", "320", "480"],
                  "Query counts at which an extra student is trained for the accuracy-vs-"
                  "epsilon plot (besides --queries); empty for none.")
flags.DEFINE_float("ss_order", 15.0, "Renyi order of the smooth-sensitivity release.")
flags.DEFINE_float("ss_beta", None, "Smoothness beta (default 0.4 / ss_order).")
flags.DEFINE_float("ss_sigma", 20.0, "Std multiplier sigma_ss of the GNSS release.")
flags.DEFINE_string("output_dir", None, "Where results.json, student.keras and plots go.")
flags.DEFINE_integer("train_size", None, "Use only the first N private images (tests).")
flags.DEFINE_integer("public_size", 9000, "Public images: the first N test images.")
flags.DEFINE_integer("eval_size", 1000, "Evaluation images: the last N test images.")
flags.DEFINE_integer("validation_size", 0,
                     "Hold out the last N public images for choosing settings: never queried, "
                     "not in the student's unlabelled pool, only scored (validation_accuracy).")
flags.DEFINE_integer("chunk", 32, "Queries per aggregator call (epsilon curve resolution).")
flags.mark_flag_as_required("output_dir")


def _load():
  from tf_dpkit.data import mnist  # pylint: disable=g-import-not-at-top
  (x_train, y_train), (x_test, y_test) = mnist.load()
  if not (0 < FLAGS.public_size and 0 < FLAGS.eval_size and
          FLAGS.public_size + FLAGS.eval_size <= len(x_test)):
    raise flags.ValidationError("--public_size and --eval_size must be >= 1 with a sum of at "
                                "most 10000.")
  if not 0 <= FLAGS.validation_size < FLAGS.public_size:
    raise flags.ValidationError(f"--validation_size must be in [0, {FLAGS.public_size - 1}] "
                                "(fewer than --public_size).")
  private = (x_train[:FLAGS.train_size], y_train[:FLAGS.train_size].astype(np.int64))
  cut = FLAGS.public_size - FLAGS.validation_size
  public = (x_test[:cut], y_test[:cut].astype(np.int64))
  validation = (x_test[cut:FLAGS.public_size], y_test[cut:FLAGS.public_size].astype(np.int64))
  evaluation = (x_test[-FLAGS.eval_size:], y_test[-FLAGS.eval_size:].astype(np.int64))
  return private, public, validation, evaluation


def _make(name, votes, accountant, noise_seed):
  from tf_dpkit import pate  # pylint: disable=g-import-not-at-top
  if name == "lnmax":
    return pate.LNMax(votes, FLAGS.laplace_scale, seed=noise_seed, accountant=accountant)
  if name == "gnmax":
    return pate.GNMax(votes, FLAGS.sigma2, seed=noise_seed, accountant=accountant)
  if name == "confident_gnmax":
    return pate.ConfidentGNMax(votes, FLAGS.threshold, FLAGS.sigma1, FLAGS.sigma2,
                               seed=noise_seed, accountant=accountant)
  return pate.InteractiveGNMax(votes, FLAGS.threshold, FLAGS.sigma1, FLAGS.sigma2,
                               alpha=FLAGS.alpha, gamma=FLAGS.gamma, seed=noise_seed,
                               accountant=accountant)


def _train_student(labels, query_idx, public, seed_offset=0, steps=None, label_drop=None):
  """A student on the queries with a label (``labels >= 0``; -1: none), or None if there is
  none; ``steps`` defaults to ``--student_steps``, ``label_drop`` to ``--student_label_drop``."""
  from tf_dpkit.pate import student  # pylint: disable=g-import-not-at-top
  have = labels >= 0
  if not np.any(have):
    return None
  return student.train_student(
      public[0][query_idx[have]], labels[have], public[0], method=FLAGS.student,
      steps=FLAGS.student_steps if steps is None else steps, seed=FLAGS.seed + seed_offset,
      label_drop=FLAGS.student_label_drop if label_drop is None else label_drop,
      architecture=FLAGS.student_model)


def _plots(out, curve, accuracy_points, name):
  try:
    import matplotlib  # pylint: disable=g-import-not-at-top
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  except ImportError:
    print("matplotlib is not installed: no plots (pip install matplotlib).")
    return []
  q = [c["queries"] for c in curve]
  fig, ax = plt.subplots(figsize=(5, 3.6))
  ax.plot(q, [c["epsilon_data_dependent"] for c in curve], label="data-dependent")
  ax.plot(q, [c["epsilon_data_independent"] for c in curve], label="data-independent")
  ax.set_xlabel("queries")
  ax.set_ylabel(f"epsilon (delta={FLAGS.delta:g})")
  ax.set_title(f"PATE MNIST, {name}, seed {FLAGS.seed}")
  ax.legend()
  fig.tight_layout()
  paths = [os.path.join(out, "epsilon_vs_queries.png")]
  fig.savefig(paths[-1], dpi=120)
  plt.close(fig)
  fig, ax = plt.subplots(figsize=(5, 3.6))
  ax.plot([p["epsilon_data_dependent"] for p in accuracy_points],
          [100 * p["student_accuracy"] for p in accuracy_points], "o-", label="data-dependent")
  ax.plot([p["epsilon_data_independent"] for p in accuracy_points],
          [100 * p["student_accuracy"] for p in accuracy_points], "s--",
          label="data-independent")
  for p in accuracy_points:
    ax.annotate(str(p["queries"]), (p["epsilon_data_dependent"], 100 * p["student_accuracy"]),
                fontsize=7)
  ax.set_xlabel(f"epsilon (delta={FLAGS.delta:g})")
  ax.set_ylabel("student test accuracy (%)")
  ax.set_title(f"student ({FLAGS.student}) vs epsilon (points: queries asked)")
  ax.legend()
  fig.tight_layout()
  paths.append(os.path.join(out, "student_accuracy_vs_epsilon.png"))
  fig.savefig(paths[-1], dpi=120)
  plt.close(fig)
  return paths


def main(argv):
  del argv
  import analysis.pate  # pylint: disable=g-import-not-at-top
  from tf_dpkit import pate  # pylint: disable=g-import-not-at-top
  from tf_dpkit.pate import student  # pylint: disable=g-import-not-at-top
  start = time.time()
  out = FLAGS.output_dir
  os.makedirs(out, exist_ok=True)
  (x_priv, y_priv), public, validation, evaluation = _load()
  if not 1 <= FLAGS.queries <= len(public[0]):
    raise flags.ValidationError(f"--queries must be in [1, {len(public[0])}].")
  if not 0.0 <= FLAGS.student_label_drop <= 0.9:
    raise flags.ValidationError("--student_label_drop must be in [0, 0.9].")
  if FLAGS.student_model == "cnn_bn":  # every student the run trains uses this network
    step_flags = {"--student_steps": FLAGS.student_steps}  # flag -> steps, for the students run
    if FLAGS.selection == "margin":
      step_flags["--selection_student_steps"] = FLAGS.selection_student_steps
    if FLAGS.student == "fixmatch" and FLAGS.supervised_baseline_steps:
      step_flags["--supervised_baseline_steps"] = FLAGS.supervised_baseline_steps
    if FLAGS.true_label_baseline_steps:
      step_flags["--true_label_baseline_steps"] = FLAGS.true_label_baseline_steps
    for name, value in step_flags.items():
      if value < student.MIN_BN_STEPS:
        raise flags.ValidationError(
            f"{name} must be >= {student.MIN_BN_STEPS} with --student_model=cnn_bn"
            + (" (or 0 to skip that student)." if "baseline" in name else "."))
  rounds = 1
  if FLAGS.selection == "margin":
    if FLAGS.aggregator == "interactive_gnmax":
      raise flags.ValidationError("--selection=margin works with --aggregator=confident_gnmax, "
                                  "gnmax or lnmax (interactive_gnmax has its own two rounds).")
    if not 2 <= FLAGS.selection_rounds <= FLAGS.queries:
      raise flags.ValidationError(f"--selection_rounds must be in [2, {FLAGS.queries}] "
                                  "(at most --queries).")
    if FLAGS.selection_student_steps < 1:
      raise flags.ValidationError("--selection_student_steps must be >= 1.")
    rounds = FLAGS.selection_rounds

  # 1. Teachers on disjoint shards.
  shards = pate.partition_indices(len(x_priv), FLAGS.num_teachers, seed=FLAGS.seed)
  ensemble = pate.TeacherEnsemble(FLAGS.num_teachers, seed=FLAGS.seed)
  ensemble.fit(x_priv, y_priv, shards, epochs=FLAGS.teacher_epochs,
               batch_size=FLAGS.teacher_batch_size, learning_rate=FLAGS.teacher_learning_rate,
               verbose=True)
  teacher_seconds = time.time() - start
  teacher_acc = ensemble.accuracy(*evaluation)
  teacher_val_acc = ensemble.accuracy(*validation) if len(validation[0]) else None
  print(f"teachers: num_teachers={FLAGS.num_teachers} "
        f"shard_size={len(x_priv) // FLAGS.num_teachers} "
        f"mean_accuracy={teacher_acc.mean():.4f} min={teacher_acc.min():.4f} "
        f"max={teacher_acc.max():.4f} train_seconds={teacher_seconds:.1f}"
        + ("" if teacher_val_acc is None
           else f" mean_validation_accuracy={teacher_val_acc.mean():.4f}"), flush=True)

  # 2. Votes on the public queries, sealed; noisy answers, accounted per query.
  # Round r asks sizes[r] queries; the first round's images are drawn at random.
  sizes = np.diff(np.linspace(0, FLAGS.queries, rounds + 1).round().astype(np.int64))
  query_idx = np.zeros(FLAGS.queries, np.int64)
  query_idx[:sizes[0]] = np.sort(np.random.default_rng(FLAGS.seed).choice(
      len(public[0]), sizes[0], replace=False))
  accountant = analysis.pate.PateAccountant(num_teachers=FLAGS.num_teachers)
  labels = np.full(FLAGS.queries, -1, np.int64)
  answered = np.zeros(FLAGS.queries, bool)
  student_labeled = np.zeros(FLAGS.queries, bool)
  curve = []

  def ask(aggregator, positions, *extra, offset=0):
    # positions index the whole query list; the aggregator's own votes start at `offset`.
    for lo in range(0, len(positions), FLAGS.chunk):
      part = positions[lo:lo + FLAGS.chunk]
      result = aggregator.query(part - offset, *(e[lo:lo + FLAGS.chunk] for e in extra))
      labels[part] = result.labels
      answered[part] = result.answered
      student_labeled[part] = result.student_labeled
      curve.append({
          "queries": accountant.queries, "answered": accountant.answered,
          "epsilon_data_dependent": accountant.private_data_dependent_epsilon(FLAGS.delta),
          "epsilon_data_independent": accountant.data_independent_epsilon(FLAGS.delta)})
      print(f"queries={curve[-1]['queries']} answered={curve[-1]['answered']} "
            f"epsilon_data_dependent={curve[-1]['epsilon_data_dependent']:.4f} "
            f"epsilon_data_independent={curve[-1]['epsilon_data_independent']:.4f}", flush=True)

  positions = np.arange(FLAGS.queries)
  if rounds > 1:
    lo = 0
    for r, size in enumerate(sizes):
      if r:  # labels[lo:] are still -1, so the selector learns from the rounds so far
        selector = _train_student(labels, query_idx, public, seed_offset=50 + r,
                                  steps=FLAGS.selection_student_steps, label_drop=0.0)
        if selector is not None:
          query_idx[lo:lo + size] = student.least_confident(selector, public[0], size,
                                                            exclude=query_idx[:lo])
        else:  # nothing released yet: nothing to learn from, so draw at random
          rest = np.setdiff1d(np.arange(len(public[0])), query_idx[:lo])
          query_idx[lo:lo + size] = np.sort(np.random.default_rng(FLAGS.seed + r).choice(
              rest, size, replace=False))
        print(f"selection round {r + 1}/{rounds}: {size} queries chosen by "
              f"{'random draw (no labels yet)' if selector is None else 'margin'}", flush=True)
      round_seed = None if FLAGS.noise_seed is None else FLAGS.noise_seed + r
      ask(_make(FLAGS.aggregator, ensemble.votes(public[0][query_idx[lo:lo + size]]),
                accountant, round_seed), positions[lo:lo + size], offset=lo)
      lo += size
  elif FLAGS.aggregator == "interactive_gnmax":
    votes = ensemble.votes(public[0][query_idx])
    # Round 1: Confident GNMax on the first half; a student learns from it.  Round 2: the
    # interactive aggregator on the rest, with that student's probabilities as baseline.
    half = FLAGS.queries // 2
    ask(_make("confident_gnmax", votes, accountant, FLAGS.noise_seed), positions[:half])
    first = _train_student(labels, query_idx, public, seed_offset=1)
    probs = (student.predict_probabilities(first, public[0][query_idx[half:]])
             if first is not None
             else np.full((FLAGS.queries - half, 10), 0.1))
    second_seed = None if FLAGS.noise_seed is None else FLAGS.noise_seed + 1
    ask(_make("interactive_gnmax", votes, accountant, second_seed), positions[half:], probs)
  else:
    ask(_make(FLAGS.aggregator, ensemble.votes(public[0][query_idx]), accountant,
              FLAGS.noise_seed), positions)

  truth = public[1][query_idx]
  answered_acc = float(np.mean(labels[answered] == truth[answered])) if answered.any() else 0.0
  labeled = labels >= 0
  labeled_acc = float(np.mean(labels[labeled] == truth[labeled])) if labeled.any() else 0.0

  # 3. Students: the final one, and extra ones on prefixes of the queries for the plot.
  accuracy_points = []
  points = sorted({int(p) for p in FLAGS.curve_points if p} | {FLAGS.queries})
  if FLAGS.aggregator == "interactive_gnmax":
    points = [FLAGS.queries]
  final_model = None
  for k in points:
    if k > FLAGS.queries:
      continue
    prefix = np.where(np.arange(FLAGS.queries) < k, labels, -1)
    model = _train_student(prefix, query_idx, public)
    acc = student.accuracy(model, *evaluation) if model is not None else 0.0
    val_acc = (student.accuracy(model, *validation)
               if model is not None and len(validation[0]) else None)
    at = next(c for c in curve if c["queries"] >= k)
    accuracy_points.append({"queries": k, "labels": int(np.sum(prefix >= 0)),
                            "student_accuracy": acc, "validation_accuracy": val_acc,
                            "epsilon_data_dependent": at["epsilon_data_dependent"],
                            "epsilon_data_independent": at["epsilon_data_independent"],
                            "epsilon_at_queries": at["queries"]})
    print(f"student: queries={k} labels={accuracy_points[-1]['labels']} "
          f"test_accuracy={acc:.4f}"
          + ("" if val_acc is None else f" validation_accuracy={val_acc:.4f}"), flush=True)
    final_model = model
  if final_model is not None:
    final_model.save(os.path.join(out, "student.keras"))
  supervised_acc = None
  if (FLAGS.student == "fixmatch" and FLAGS.supervised_baseline_steps and
      np.any(labels >= 0)):
    have = labels >= 0
    baseline = student.train_student(public[0][query_idx[have]], labels[have],
                                     method="supervised", steps=FLAGS.supervised_baseline_steps,
                                     seed=FLAGS.seed, architecture=FLAGS.student_model)
    supervised_acc = student.accuracy(baseline, *evaluation)
    print(f"supervised-only student: labels={int(have.sum())} test_accuracy={supervised_acc:.4f}",
          flush=True)

  true_label_acc = None
  oracle = (_train_student(np.where(labels >= 0, truth, -1), query_idx, public,
                           steps=FLAGS.true_label_baseline_steps)
            if FLAGS.true_label_baseline_steps else None)
  if oracle is not None:
    true_label_acc = student.accuracy(oracle, *evaluation)
    print(f"true-label student (diagnostic): labels={int(np.sum(labels >= 0))} "
          f"test_accuracy={true_label_acc:.4f}", flush=True)

  # 4. Privacy.
  beta = FLAGS.ss_beta if FLAGS.ss_beta is not None else 0.4 / FLAGS.ss_order
  ss = accountant.smooth_sensitivity_epsilon(FLAGS.delta, beta, FLAGS.ss_sigma, FLAGS.ss_order,
                                             rng=FLAGS.noise_seed)
  results = {
      "aggregator": FLAGS.aggregator, "seed": FLAGS.seed,
      "noise_seed": FLAGS.noise_seed, "num_teachers": FLAGS.num_teachers,
      "private_examples": int(len(x_priv)), "public_examples": int(len(public[0])),
      "eval_examples": int(len(evaluation[0])),
      "validation_examples": int(len(validation[0])),
      "teacher_accuracy_mean": float(teacher_acc.mean()),
      "teacher_accuracy_min": float(teacher_acc.min()),
      "teacher_accuracy_max": float(teacher_acc.max()),
      "teacher_validation_accuracy_mean": (None if teacher_val_acc is None
                                           else float(teacher_val_acc.mean())),
      "queries": int(accountant.queries), "answered": int(accountant.answered),
      "selection": FLAGS.selection, "selection_rounds": rounds,
      "selection_student_steps": FLAGS.selection_student_steps if rounds > 1 else None,
      "student_labeled": int(student_labeled.sum()),
      "answered_label_accuracy": answered_acc, "released_label_accuracy": labeled_acc,
      "student": FLAGS.student, "student_model": FLAGS.student_model,
      "student_steps": FLAGS.student_steps,
      "student_label_drop": FLAGS.student_label_drop,
      "student_accuracy_supervised_only": supervised_acc,
      "student_accuracy_true_labels": true_label_acc,
      "true_label_baseline_steps": FLAGS.true_label_baseline_steps,
      "student_accuracy": accuracy_points[-1]["student_accuracy"] if accuracy_points else 0.0,
      "validation_accuracy": (accuracy_points[-1]["validation_accuracy"] if accuracy_points
                              else None),
      "epsilon_data_dependent": accountant.private_data_dependent_epsilon(FLAGS.delta),
      "epsilon_data_independent": accountant.data_independent_epsilon(FLAGS.delta),
      "epsilon_smooth_sensitivity": ss.epsilon,
      "smooth_sensitivity": {"order": ss.order, "beta": ss.beta, "sigma_ss": ss.sigma_ss,
                             "sanitized_rdp": ss.sanitized_rdp, "release_rdp": ss.release_rdp},
      "delta": FLAGS.delta,
      "parameters": {"threshold": FLAGS.threshold, "sigma1": FLAGS.sigma1,
                     "sigma2": FLAGS.sigma2, "laplace_scale": FLAGS.laplace_scale,
                     "alpha": FLAGS.alpha, "gamma": FLAGS.gamma,
                     "teacher_epochs": FLAGS.teacher_epochs},
      "epsilon_curve": curve, "accuracy_points": accuracy_points,
      "teacher_train_seconds": teacher_seconds, "total_seconds": time.time() - start,
  }
  results["plots"] = [os.path.basename(p) for p in _plots(out, curve, accuracy_points,
                                                          FLAGS.aggregator)]
  with open(os.path.join(out, "results.json"), "w") as f:
    json.dump(results, f, indent=1)
  print(f"final: aggregator={FLAGS.aggregator} queries={results['queries']} "
        f"answered={results['answered']} answered_label_accuracy={answered_acc:.4f} "
        f"student_accuracy={results['student_accuracy']:.4f} "
        f"epsilon_data_dependent={results['epsilon_data_dependent']:.4f} "
        f"epsilon_data_independent={results['epsilon_data_independent']:.4f} "
        f"epsilon_smooth_sensitivity={results['epsilon_smooth_sensitivity']:.4f} "
        f"delta={FLAGS.delta:g} total_seconds={results['total_seconds']:.1f}")
  print(f"publishable: epsilon_data_independent={results['epsilon_data_independent']:.4f} or "
        f"epsilon_smooth_sensitivity={results['epsilon_smooth_sensitivity']:.4f} at "
        f"delta={FLAGS.delta:g}; epsilon_data_dependent is computed from the private votes and "
        "is NOT publishable (its release would leak them).")


if __name__ == "__main__":
  app.run(main)
