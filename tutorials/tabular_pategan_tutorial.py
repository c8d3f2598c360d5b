"""Private synthetic tables: PATE-GAN (and DP-GAN) on UCI Epileptic Seizure, evaluated by TSTR.

    python tutorials/tabular_pategan_tutorial.py --target_epsilon=1 --output_dir=/tmp/pg1
    python tutorials/tabular_pategan_tutorial.py --target_epsilon=10 --output_dir=/tmp/pg10
    python tutorials/tabular_pategan_tutorial.py --method=dpgan --target_epsilon=1 ...
    python tutorials/tabular_pategan_tutorial.py --method=real --output_dir=/tmp/real

Protocol (PATE-GAN paper, Jordon, Yoon & van der Schaar, ICLR 2019, and the 2024 reproduction
study of Ganev et al.): binary label ``y == 1`` (seizure), stratified 80/20 train/test split
with a fixed public seed (tutorials/data/epileptic_seizure.py), the 178 features mapped to
[0, 1] by a FIXED public function (clip to the 12-bit converter range, asinh companding; no
statistic of the data), a conditional generator whose training labels are drawn uniformly
(public randomness: never the private label counts).  The released table has as many rows as
the training split, labels drawn uniformly (``--positive_fraction``, a public number), values
mapped back to the input's units (integer converter counts).

``--method``:
  pategan  tf_dpkit.generative.PATEGAN: ``--num_teachers`` teacher discriminators on disjoint
           shards, a student trained only on generated rows labelled by a GNMax vote of the
           teachers, the generator trained against the student.  The GNMax noise is calibrated
           so that ``--iterations`` x ``--student_batch_size`` answers meet (--target_epsilon,
           --delta) DATA-INDEPENDENTLY (publishable; replace-one adjacency).
  dpgan    tf_dpkit.generative.DPGAN on the same data and budget: the discriminator trained by
           DP-SGD, the noise calibrated for ``--dpgan_steps`` x ``--discriminator_steps``
           steps (RDP accountant; add-or-remove-one adjacency, the DP-SGD convention).
  real     no generator: the real training split itself (the TSTR ceiling).
``--target_epsilon=inf``: no noise (no privacy; the "no noise" row).
``--checkpoint_every=S`` (PATE-GAN): keep the generator every S iterations (and the last one)
and release the one chosen by a private choice (tf_dpkit.selection.select_privately, noise
multiplier ``--selection_noise_multiplier``) on the TSTR record scores of the training rows
(generative.tstr_tabular_record_scores); the GNMax noise is calibrated so that the answers and
the choice together meet --target_epsilon (data-independent, replace-one adjacency).
``--validation``: tune without the test split: hold out a stratified 20% of the TRAINING split
(public seed), train on the rest and report TSTR on the held-out part.

Writes to --output_dir:
  synthetic.csv.gz  columns X1..X178 (integer counts) and y (0/1); one row per training row.
  results.json      epsilon, delta, epsilon_kind, TSTR AUROC/AUPRC per classifier and their
                    means (tf_dpkit.generative.tstr_tabular: logistic regression, random
                    forest, gradient boosting, MLP), settings; with --checkpoint_every the
                    choice's release (chosen_iteration, candidate_iterations,
                    noisy_mean_record_scores, selection_noise_stddev) and, with
                    --evaluate_candidates, candidate_tstr_auroc_mean: every candidate's TSTR
                    on the evaluation split, a study of the choice that the choice never reads.
                    The per-iteration log lines' epsilon counts the PATE answers only; the
                    final line's includes the choice.
  generator.keras   the generator (no data, no teacher, no noise key), not for --method=real.
The evaluation reads the real test split (or the validation part) and is not part of the DP
release.
"""
from __future__ import annotations

import gzip
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

from analysis import calibration, events  # noqa: E402
from tf_dpkit import generative, selection  # noqa: E402
from tutorials import generative_common  # noqa: E402
from tutorials.data import epileptic_seizure as data  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_enum("method", "pategan", ["pategan", "dpgan", "real"], "Which generator.")
flags.DEFINE_float("target_epsilon", 1.0, "Privacy budget (nats) at --delta; inf: no noise.")
flags.DEFINE_float("delta", 1e-5, "Delta of the privacy guarantee.")
flags.DEFINE_integer("seed", 0, "Public seed: weights, latent noise, partition, evaluation.")
flags.DEFINE_string("output_dir", None, "Where synthetic.csv.gz and results.json go.")
flags.DEFINE_boolean("validation", False,
                     "Train on 80% of the training split, evaluate on its other 20%.")
flags.DEFINE_float("positive_fraction", 0.5,
                   "Public fraction of label-1 rows in the released table (not from the data).")
flags.DEFINE_boolean("release_shift", False,
                     "Released rows: a public uniform cyclic shift per row "
                     "(generative.randomize_rows; post-processing, no privacy cost).")
flags.DEFINE_float("release_scale_noise", 0.0,
                   "Released rows: std of the log of a public rescaling factor of each row's "
                   "deviation from its mean (generative.randomize_rows); 0: none.")
flags.DEFINE_enum("network", "mlp", ["mlp", "sequence"],
                  "Generator, PATE-GAN student and DP-GAN discriminator: MLPs "
                  "(--generator_hidden, --student_hidden, --discriminator_hidden) or 1-D "
                  "convolutional (generative.sequence_generator / sequence_discriminator: a "
                  "row is 178 consecutive EEG samples; the better DP-GAN, see the tutorials "
                  "README).  PATE-GAN's teachers are MLPs either way.")
flags.DEFINE_integer("latent_dim", 32, "Noise dimensions.")
flags.DEFINE_list("generator_hidden", ["128", "128"], "Hidden widths of the MLP generator.")
# PATE-GAN
flags.DEFINE_integer("iterations", 2000, "PATE-GAN iterations.")
flags.DEFINE_integer("num_teachers", 200, "Teacher discriminators (disjoint shards).")
flags.DEFINE_list("teacher_hidden", ["16"], "Hidden widths of each teacher MLP.")
flags.DEFINE_enum("teacher_input", "rows", ["rows", "row_statistics"],
                  "What each teacher reads: the raw row (MLP or --teacher_conv_filters) or only "
                  "its level, spread and roughness (generative.RowStatistics; "
                  "teacher_ensemble_discriminator(row_statistics=True)).")
flags.DEFINE_enum("student", "network", ["network", "statistics"],
                  "PATE-GAN student: the --network discriminator, or "
                  "generative.statistics_discriminator (reads RowStatistics only; "
                  "--student_hidden widths).")
flags.DEFINE_enum("dpgan_discriminator", "network", ["network", "statistics"],
                  "DP-GAN discriminator: the --network one, or "
                  "generative.statistics_discriminator (--discriminator_hidden widths).")
flags.DEFINE_list("teacher_conv_filters", [],
                  "Per-teacher 1-D convolutions before the hidden layers (filters of each, "
                  "stride 2, width 5; generative.teacher_ensemble_discriminator); empty: MLP "
                  "teachers.")
flags.DEFINE_integer("teacher_batch_size", 16, "Real (and fake) rows per teacher step.")
flags.DEFINE_integer("teacher_steps", 1, "Teacher steps per iteration.")
flags.DEFINE_integer("student_steps", 1, "Student steps per iteration.")
flags.DEFINE_integer("student_batch_size", 32, "Teacher-labelled rows per student step.")
flags.DEFINE_list("student_hidden", ["64"], "Hidden widths of the MLP student.")
flags.DEFINE_integer("generator_batch_size", 64, "Rows per generator step.")
flags.DEFINE_float("teacher_learning_rate", 1e-3, "Adam learning rate of the teachers.")
flags.DEFINE_float("student_learning_rate", 1e-3, "Adam learning rate of the student.")
flags.DEFINE_float("generator_learning_rate", 1e-3, "Adam learning rate of the generator.")
flags.DEFINE_enum("vote", "rank", ["threshold", "rank"], "How teachers vote (PATEGAN).")
flags.DEFINE_float("vote_fraction", 0.5, "Fraction of a query batch voted real (vote=rank).")
flags.DEFINE_float("query_noise", 0.0, "Std of public noise added to the student's queries.")
flags.DEFINE_float("query_scale_noise", 0.0,
                   "Std s of the public log-normal rescaling exp(s e) of each query's deviation "
                   "from its mean (PATEGAN query_scale_noise).")
flags.DEFINE_integer("checkpoint_every", 0,
                     "PATE-GAN: keep the generator every this many iterations (a multiple of "
                     "--log_every; the last iteration is always kept) and release the one a "
                     "private choice on the training rows prefers; 0: release the last one.")
flags.DEFINE_float("selection_noise_multiplier", 20.0,
                   "Noise multiplier of the private choice among the kept generators (> 0).")
flags.DEFINE_list("selection_class_weights", ["1", "1"],
                  "Public weights (w0, w1) in [0, 1] of the per-record scores of the choice "
                  "(generative.tstr_tabular_record_scores); never computed from the data.")
flags.DEFINE_boolean("evaluate_candidates", False,
                     "Also report the TSTR of every kept generator on the evaluation split "
                     "(for studying the choice; not part of the release, does not change it).")
flags.DEFINE_boolean("teacher_class_balance", True,
                     "Class-balanced teacher minibatches, each from the teacher's own shard.")
# DP-GAN
flags.DEFINE_integer("dpgan_steps", 2000, "DP-GAN generator steps.")
flags.DEFINE_integer("discriminator_steps", 1, "DP-GAN discriminator steps per generator step.")
flags.DEFINE_float("batch_size", 64.0, "DP-GAN expected Poisson batch size.")
flags.DEFINE_float("l2_norm_clip", 1.0, "DP-GAN per-example clipping norm.")
flags.DEFINE_list("discriminator_hidden", ["64"], "Hidden widths of the DP-GAN discriminator.")
flags.DEFINE_float("discriminator_learning_rate", 1e-3, "DP-GAN discriminator learning rate.")
flags.DEFINE_integer("log_every", 200, "Log every this many iterations.")
flags.mark_flag_as_required("output_dir")


def _widths(values):
  return tuple(int(v) for v in values)


def _split():
  """``(train, evaluation)``: the training split and the test split, or (--validation) 80%
  and 20% of the training split (the test split is then never read)."""
  x, y = data.load()
  train, test = data.split(x, y)
  if FLAGS.validation:
    return data.split(*train, seed=data.SPLIT_SEED + 1)
  return train, test


def _generator():
  if FLAGS.network == "sequence":
    return generative.sequence_generator(FLAGS.latent_dim, 2, data.NUM_FEATURES)
  return generative.mlp_generator(FLAGS.latent_dim, 2, (data.NUM_FEATURES,),
                                  hidden=_widths(FLAGS.generator_hidden))


def _discriminator(hidden, kind="network"):
  """The PATE-GAN student or the DP-GAN discriminator (``hidden``: the MLP's widths; ``kind``
  "statistics": generative.statistics_discriminator, else the --network one)."""
  if kind == "statistics":
    return generative.statistics_discriminator(2, data.NUM_FEATURES, hidden=_widths(hidden))
  if FLAGS.network == "sequence":
    return generative.sequence_discriminator(2, data.NUM_FEATURES)
  return generative.mlp_discriminator(2, (data.NUM_FEATURES,), hidden=_widths(hidden))


def _choice_events():
  """The events composed with the training: the private choice's, when there is one."""
  if not FLAGS.checkpoint_every:
    return ()
  return (events.GaussianEvent(FLAGS.selection_noise_multiplier),)


def _train_pategan(u, y, private, generator, callback=None):
  queries = FLAGS.iterations * FLAGS.student_steps * FLAGS.student_batch_size
  noise = (generative.noise_scale_for_budget(FLAGS.target_epsilon, queries, FLAGS.delta,
                                             also=_choice_events())
           if private else None)
  print(f"PATE-GAN: N={len(u)} teachers={FLAGS.num_teachers} (shards of ~"
        f"{len(u) // FLAGS.num_teachers}) answers planned={queries} GNMax sigma={noise} votes",
        flush=True)
  student = _discriminator(FLAGS.student_hidden, FLAGS.student)
  teachers = None
  if FLAGS.teacher_conv_filters or FLAGS.teacher_input == "row_statistics":
    teachers = generative.teacher_ensemble_discriminator(
        FLAGS.num_teachers, 2, (data.NUM_FEATURES,), hidden=_widths(FLAGS.teacher_hidden),
        conv_filters=_widths(FLAGS.teacher_conv_filters),
        row_statistics=FLAGS.teacher_input == "row_statistics")
  gan = generative.PATEGAN(
      generator, student, latent_dim=FLAGS.latent_dim, num_teachers=FLAGS.num_teachers,
      num_classes=2, noise_scale=noise, teacher_hidden=_widths(FLAGS.teacher_hidden),
      teachers=teachers,
      teacher_batch_size=FLAGS.teacher_batch_size, teacher_steps=FLAGS.teacher_steps,
      student_steps=FLAGS.student_steps, student_batch_size=FLAGS.student_batch_size,
      generator_batch_size=FLAGS.generator_batch_size,
      teacher_learning_rate=FLAGS.teacher_learning_rate,
      student_learning_rate=FLAGS.student_learning_rate,
      generator_learning_rate=FLAGS.generator_learning_rate, seed=FLAGS.seed,
      partition_seed=FLAGS.seed, vote=FLAGS.vote, vote_fraction=FLAGS.vote_fraction,
      teacher_class_balance=FLAGS.teacher_class_balance, query_noise=FLAGS.query_noise,
      query_scale_noise=FLAGS.query_scale_noise, delta=FLAGS.delta)
  run = gan.fit(u, y, iterations=FLAGS.iterations,
                target_epsilon=FLAGS.target_epsilon if private else None,
                log_every=FLAGS.log_every, callback=callback)
  info = {"epsilon_kind": ("data-independent (PateAccountant.data_independent_epsilon, "
                           "replace-one adjacency; publishable)" if private else
                           "inf (no noise)"),
          "gnmax_sigma": noise, "pate_answers": run["queries"],
          "iterations_done": run["iterations"], "stopped_by_budget": run["stopped_by_budget"]}
  return generator, run["epsilon"], info


def _train_dpgan(u, y, private, generator, callback=None):
  del callback  # the private choice is offered for PATE-GAN only (check_flags)
  n = len(u)
  q = FLAGS.batch_size / n
  steps = FLAGS.dpgan_steps * FLAGS.discriminator_steps
  sigma = (calibration.compute_noise_multiplier(FLAGS.target_epsilon, FLAGS.delta, q, steps)
           if private else 0.0)
  print(f"DP-GAN: N={n} q={q:.5f} discriminator steps={steps} noise_multiplier={sigma:.4f}",
        flush=True)
  discriminator = _discriminator(FLAGS.discriminator_hidden, FLAGS.dpgan_discriminator)
  gan = generative.DPGAN(
      generator, discriminator, latent_dim=FLAGS.latent_dim, num_classes=2,
      l2_norm_clip=FLAGS.l2_norm_clip, noise_multiplier=sigma,
      expected_batch_size=FLAGS.batch_size, discriminator_steps=FLAGS.discriminator_steps,
      discriminator_learning_rate=FLAGS.discriminator_learning_rate,
      generator_learning_rate=FLAGS.generator_learning_rate, seed=FLAGS.seed,
      delta=FLAGS.delta)
  run = gan.fit(u, y, generator_steps=FLAGS.dpgan_steps,
                target_epsilon=FLAGS.target_epsilon if private else None,
                log_every=FLAGS.log_every)
  info = {"epsilon_kind": ("DP-SGD RDP accountant (add-or-remove-one adjacency; publishable)"
                           if private else "inf (no noise)"),
          "noise_multiplier": sigma, "discriminator_steps_done": run["discriminator_steps"],
          "stopped_by_budget": run["stopped_by_budget"]}
  return generator, run["epsilon"], info


def release(generator, num_rows, positive_fraction, seed, shift=False, scale_noise=0.0):
  """The released table from the generator alone: ``(x counts [n, 178], y [n])``.

  Labels: ``y_i = 1`` for the first ``round(positive_fraction * n)`` rows, then shuffled by
  ``seed`` (public; never the private label counts).  Features: generator output in [0, 1],
  then (``shift``, ``scale_noise``) :func:`generative.randomize_rows` with public seed
  ``seed + 1``, mapped back to counts (:func:`data.from_unit`).
  """
  rng = np.random.default_rng(seed)
  y = (np.arange(num_rows) < round(positive_fraction * num_rows)).astype(np.int64)
  rng.shuffle(y)
  u, _ = generative.sample(generator, num_rows, labels=y, seed=seed)
  if shift or scale_noise:
    u = generative.randomize_rows(u, shift=shift, log_scale_std=scale_noise, seed=seed + 1)
  return data.from_unit(u), y


def choose_generator(generator, candidates, x, y, evaluation):
  """Private choice among ``candidates`` ([(iteration, weights)]) on the training rows
  ``(x, y)``: each candidate's table is released as the final one would be, the four TSTR
  classifiers are fitted on it and score every training row
  (generative.tstr_tabular_record_scores), and tf_dpkit.selection.select_privately picks one.
  Sets ``generator`` to the chosen weights; returns (what is released about the choice, its
  event, the per-candidate evaluation TSTR when --evaluate_candidates)."""
  weights = tuple(float(w) for w in FLAGS.selection_class_weights)
  columns, studied = [], []
  for iteration, candidate in candidates:
    generator.set_weights(candidate)
    x_syn, y_syn = release(generator, len(x), FLAGS.positive_fraction, FLAGS.seed,
                           FLAGS.release_shift, FLAGS.release_scale_noise)
    columns.append(generative.tstr_tabular_record_scores(
        x_syn, y_syn, x, y, class_weights=weights, seed=FLAGS.seed))
    if FLAGS.evaluate_candidates:
      studied.append(round(generative.tstr_tabular(x_syn, y_syn, *evaluation,
                                                   seed=FLAGS.seed)["auroc_mean"], 4))
    print(f"candidate at iteration {iteration}: scored", flush=True)
  chosen = selection.select_privately(np.stack(columns, axis=1),
                                      FLAGS.selection_noise_multiplier)
  generator.set_weights(candidates[chosen.index][1])
  noisy = [round(float(v) / len(x), 4) for v in chosen.noisy_scores]
  print(f"private choice: iteration {candidates[chosen.index][0]} (noisy mean record scores "
        f"{noisy}, noise std {chosen.noise_stddev / len(x):.4f})", flush=True)
  released = {"chosen_iteration": candidates[chosen.index][0],
              "candidate_iterations": [iteration for iteration, _ in candidates],
              "noisy_mean_record_scores": noisy,
              "selection_noise_stddev": chosen.noise_stddev / len(x)}
  return released, chosen.event, studied


def check_flags():
  """Refuses bad flags before any training."""
  if not 0.0 <= FLAGS.positive_fraction <= 1.0:
    raise app.UsageError(f"--positive_fraction must be in [0, 1], got {FLAGS.positive_fraction}.")
  if not (math.isfinite(FLAGS.release_scale_noise) and FLAGS.release_scale_noise >= 0.0):
    raise app.UsageError("--release_scale_noise must be finite and >= 0, got "
                         f"{FLAGS.release_scale_noise}.")
  generative_common.check_choice_flags(FLAGS.checkpoint_every, FLAGS.log_every,
                                       FLAGS.iterations, "--iterations",
                                       FLAGS.selection_noise_multiplier)
  if FLAGS.checkpoint_every and FLAGS.method != "pategan":
    raise app.UsageError("--checkpoint_every (the private choice) is offered for "
                         f"--method=pategan only, got --method={FLAGS.method}.")
  sigma = FLAGS.selection_noise_multiplier
  try:
    weights = [float(w) for w in FLAGS.selection_class_weights]
  except ValueError as error:
    raise app.UsageError(f"--selection_class_weights must be two numbers in [0, 1], got "
                         f"{FLAGS.selection_class_weights}.") from error
  if len(weights) != 2 or not all(0.0 <= w <= 1.0 for w in weights):
    raise app.UsageError(f"--selection_class_weights must be two numbers in [0, 1], got "
                         f"{FLAGS.selection_class_weights}.")
  if (FLAGS.checkpoint_every and FLAGS.target_epsilon != math.inf and
      generative.data_independent_epsilon(0, 1.0, FLAGS.delta, also=_choice_events())
      >= FLAGS.target_epsilon):
    raise app.UsageError(
        f"--selection_noise_multiplier={sigma} alone spends --target_epsilon="
        f"{FLAGS.target_epsilon} at --delta={FLAGS.delta}: raise either, or drop "
        "--checkpoint_every.")


def write_csv(path, x, y):
  with gzip.open(path, "wt", encoding="ascii", compresslevel=6) as handle:
    handle.write(",".join((*data.COLUMNS, "y")) + "\n")
    for row, label in zip(x.astype(np.int64), y):
      handle.write(",".join(map(str, row)) + f",{int(label)}\n")


def main(argv):
  del argv
  start = time.time()
  check_flags()  # before training, not after
  os.makedirs(FLAGS.output_dir, exist_ok=True)
  keras.utils.set_random_seed(FLAGS.seed)
  (x, y), (x_eval, y_eval) = _split()
  private = FLAGS.target_epsilon != math.inf
  generator, info, choice, studied = None, {}, {}, []
  if FLAGS.method == "real":
    x_syn, y_syn, epsilon = x, y, math.inf
    info = {"epsilon_kind": "inf (the real training rows themselves)"}
  else:
    u = data.to_unit(x)  # public, data-independent map: no privacy cost
    train = _train_pategan if FLAGS.method == "pategan" else _train_dpgan
    candidates = []

    def keep(logs):
      if FLAGS.checkpoint_every and logs["iteration"] % FLAGS.checkpoint_every == 0:
        candidates.append((logs["iteration"], generator.get_weights()))

    generator = _generator()
    generator, epsilon, info = train(u, y, private, generator, callback=keep)
    if FLAGS.checkpoint_every:
      if not candidates or candidates[-1][0] != info["iterations_done"]:
        candidates.append((info["iterations_done"], generator.get_weights()))  # the last
      if private:  # the choice's event is fixed in advance: check before it runs
        epsilon = generative.data_independent_epsilon(
            info["pate_answers"], info["gnmax_sigma"], FLAGS.delta, also=_choice_events())
        if epsilon > FLAGS.target_epsilon * (1 + 1e-9):
          raise RuntimeError(f"epsilon {epsilon} would exceed --target_epsilon.")
        info["epsilon_kind"] += "; composed with the private choice of the generator"
      choice, event, studied = choose_generator(generator, candidates, x, y, (x_eval, y_eval))
      if (event,) != _choice_events():
        raise RuntimeError(f"the choice ran as {event}, accounted as {_choice_events()}.")
    path = os.path.join(FLAGS.output_dir, "generator.keras")
    generator.save(path)
    # Below: only the saved generator is used for the release.
    x_syn, y_syn = release(keras.models.load_model(path, compile=False), len(x),
                           FLAGS.positive_fraction, FLAGS.seed, FLAGS.release_shift,
                           FLAGS.release_scale_noise)
  train_seconds = time.time() - start
  write_csv(os.path.join(FLAGS.output_dir, "synthetic.csv.gz"), x_syn, y_syn)
  tstr = generative.tstr_tabular(x_syn, y_syn, x_eval, y_eval, seed=FLAGS.seed)
  frechet = generative.frechet_distance_from_features(data.to_unit(x_syn),
                                                      data.to_unit(x_eval))
  results = {
      "method": FLAGS.method, "epsilon": epsilon, "delta": FLAGS.delta, **info, **choice,
      **({"candidate_tstr_auroc_mean": studied} if studied else {}),
      "evaluated_on": "validation (20% of the training split)" if FLAGS.validation
                      else "test split",
      "tstr_auroc_mean": tstr["auroc_mean"], "tstr_auprc_mean": tstr["auprc_mean"],
      "tstr_auroc": tstr["auroc"], "tstr_auprc": tstr["auprc"],
      "frechet_distance_unit_scale": frechet,
      "train_rows": len(x), "evaluation_rows": len(x_eval), "synthetic_rows": len(x_syn),
      "train_seconds": round(train_seconds, 1),
      "total_seconds": round(time.time() - start, 1),
      "flags": {name: FLAGS[name].value for name in (
          "method", "target_epsilon", "seed", "validation", "positive_fraction", "network",
          "latent_dim",
          "generator_hidden", "iterations", "num_teachers", "teacher_hidden", "teacher_conv_filters",
          "teacher_input", "student", "dpgan_discriminator", "query_scale_noise",
          "release_shift", "release_scale_noise", "checkpoint_every",
          "selection_noise_multiplier", "selection_class_weights", "evaluate_candidates",
          "teacher_batch_size", "teacher_steps", "student_steps", "student_batch_size",
          "student_hidden", "generator_batch_size", "teacher_learning_rate",
          "student_learning_rate", "generator_learning_rate", "vote", "vote_fraction",
          "teacher_class_balance", "query_noise",
          "dpgan_steps", "discriminator_steps", "batch_size", "l2_norm_clip",
          "discriminator_hidden", "discriminator_learning_rate")},
  }
  with open(os.path.join(FLAGS.output_dir, "results.json"), "w", encoding="utf-8") as handle:
    json.dump(results, handle, indent=2)
  print(f"final: method={FLAGS.method} epsilon={epsilon:.4f} ({info['epsilon_kind']}) "
        f"delta={FLAGS.delta:g} TSTR AUROC={tstr['auroc_mean']:.4f} "
        f"AUPRC={tstr['auprc_mean']:.4f} per classifier AUROC="
        f"{json.dumps({k: round(v, 4) for k, v in tstr['auroc'].items()})} "
        f"train_seconds={train_seconds:.0f} total_seconds={results['total_seconds']:.0f}",
        flush=True)


if __name__ == "__main__":
  app.run(main)
