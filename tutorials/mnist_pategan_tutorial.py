"""Conditional PATE-GAN on MNIST (tf_dpkit.generative.PATEGAN): train, save, sample, evaluate.

    python tutorials/mnist_pategan_tutorial.py --target_epsilon=10 --output_dir=/tmp/pategan
    python tutorials/mnist_pategan_tutorial.py --target_epsilon=inf --output_dir=/tmp/pg_inf

--num_teachers teacher discriminators are trained on disjoint shards of the private training
set; a student discriminator is trained only on generated images labelled real/fake by a
noisy (GNMax, secret key) vote of the teachers; the generator is trained against the student
(tf_dpkit/generative/pategan.py says what is private and why).  The GNMax noise is calibrated
so that --iterations iterations of --student_steps x --student_batch_size answers meet
(--target_epsilon, --delta) DATA-INDEPENDENTLY; training also stops at that budget.  The
reported epsilon is this data-independent one (publishable).  --smooth_sensitivity also
reports the smooth-sensitivity release of the data-dependent bound (PATE 2018, Section 4.2;
publishable, a noisy estimate).  --target_epsilon=inf: noiseless teacher majority (no
privacy).  Networks: --generator=mlp (default; MLP with BatchNorm) or conv (DCGAN-style,
--generator_filters), and an MLP student with --student_conditioning=concat (default) or
projection (tf_dpkit/generative/networks.py); the teachers are small batched MLPs.

Writes to --output_dir:
  generator.keras  the conditional generator: inputs [noise [B, latent_dim] ~ N(0, I),
                   one_hot_label [B, 10]], output images [B, 28, 28, 1] in [0, 1]; it holds no
                   data, no teacher, no noise key (sample it with tf_dpkit.generative.sample).
  results.json     epsilon, delta, tstr_accuracy, frechet_distance, latent_dim, settings.
  samples.png      10 x 10 grid, row r = digit r.
Evaluation (tutorials/generative_common.py: TSTR on the real test set; Frechet distance in the
features of a CNN trained on the real training set) is not part of the DP release.
"""
from __future__ import annotations

import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras  # noqa: E402
from absl import app, flags  # noqa: E402

from tf_dpkit import generative  # noqa: E402
from tutorials import generative_common  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_float("target_epsilon", 10.0, "Privacy budget (nats) at --delta; inf: no noise.")
flags.DEFINE_float("delta", 1e-5, "Delta of the privacy guarantee.")
flags.DEFINE_string("output_dir", None, "Where generator.keras, results.json, samples.png go.")
flags.DEFINE_integer("iterations", 3000, "Iterations (teacher, student, generator steps).")
flags.DEFINE_integer("num_teachers", 500, "Teacher discriminators (disjoint shards).")
flags.DEFINE_list("teacher_hidden", ["32"], "Hidden widths of each teacher MLP.")
flags.DEFINE_integer("teacher_batch_size", 16, "Real (and fake) examples per teacher step.")
flags.DEFINE_integer("teacher_steps", 1, "Teacher steps per iteration.")
flags.DEFINE_integer("student_steps", 1, "Student steps per iteration.")
flags.DEFINE_integer("student_batch_size", 16, "Teacher-labelled examples per student step.")
flags.DEFINE_integer("generator_batch_size", 64, "Examples per generator step.")
flags.DEFINE_float("teacher_learning_rate", 2e-4, "Adam learning rate of the teachers.")
flags.DEFINE_float("student_learning_rate", 2e-4, "Adam learning rate of the student.")
flags.DEFINE_float("generator_learning_rate", 2e-4, "Adam learning rate of G.")
flags.DEFINE_integer("latent_dim", 64, "Noise dimensions.")
flags.DEFINE_enum("generator", "mlp", ["mlp", "conv"],
                  "Generator: MLP with BatchNorm, or the DCGAN-style conv_generator.")
flags.DEFINE_integer("generator_filters", 32, "conv generator: F (channels 2F, then F).")
flags.DEFINE_enum("student_conditioning", "concat", ["concat", "projection"],
                  "How the label enters the MLP student (models.mlp_discriminator).")
flags.DEFINE_enum("vote", "threshold", ["threshold", "rank"], "How teachers vote (PATEGAN).")
flags.DEFINE_float("vote_fraction", 0.5, "Fraction of a query batch voted real (vote=rank).")
flags.DEFINE_boolean("smooth_sensitivity", False,
                     "Also release the smooth-sensitivity-sanitised data-dependent epsilon.")
flags.DEFINE_integer("train_size", None, "Use only the first N training examples (tests).")
flags.DEFINE_integer("test_size", None, "Use only the first N test examples (tests).")
flags.DEFINE_integer("tstr_samples", 10000, "Synthetic examples for TSTR (balanced classes).")
flags.DEFINE_integer("tstr_epochs", 10, "Epochs of the TSTR classifier.")
flags.DEFINE_integer("fd_samples", 2000, "Images per side of the Frechet distance.")
flags.DEFINE_integer("feature_epochs", 2, "Epochs of the feature CNN (on real training data).")
flags.DEFINE_integer("log_every", 100, "Log every this many iterations.")
flags.DEFINE_integer("seed", 0, "Public seed: weights, latent noise, partition, evaluation.")
flags.mark_flag_as_required("output_dir")

# Smooth-sensitivity release parameters, fixed in advance (never chosen from the data).
SS_ORDER, SS_BETA, SS_SIGMA = 20.0, 0.01, 10.0


def main(argv):
  del argv
  start = time.time()
  os.makedirs(FLAGS.output_dir, exist_ok=True)
  keras.utils.set_random_seed(FLAGS.seed)
  (x, y), (xt, yt) = generative_common.load_mnist(FLAGS.train_size, FLAGS.test_size)
  queries = FLAGS.iterations * FLAGS.student_steps * FLAGS.student_batch_size
  private = FLAGS.target_epsilon != math.inf
  noise = (generative.noise_scale_for_budget(FLAGS.target_epsilon, queries, FLAGS.delta)
           if private else None)
  print(f"N={len(x)} teachers={FLAGS.num_teachers} (shards of ~{len(x) // FLAGS.num_teachers}) "
        f"PATE answers planned={queries} GNMax sigma={noise} votes (target epsilon="
        f"{FLAGS.target_epsilon} at delta={FLAGS.delta}, data-independent)", flush=True)
  generator = generative_common.build_generator(FLAGS.generator, FLAGS.latent_dim,
                                                FLAGS.generator_filters)
  student = generative.mlp_discriminator(10, conditioning=FLAGS.student_conditioning)
  gan = generative.PATEGAN(
      generator, student, latent_dim=FLAGS.latent_dim, num_teachers=FLAGS.num_teachers,
      num_classes=10, noise_scale=noise,
      teacher_hidden=tuple(int(h) for h in FLAGS.teacher_hidden),
      teacher_batch_size=FLAGS.teacher_batch_size, teacher_steps=FLAGS.teacher_steps,
      student_steps=FLAGS.student_steps, student_batch_size=FLAGS.student_batch_size,
      generator_batch_size=FLAGS.generator_batch_size,
      teacher_learning_rate=FLAGS.teacher_learning_rate,
      student_learning_rate=FLAGS.student_learning_rate,
      generator_learning_rate=FLAGS.generator_learning_rate, seed=FLAGS.seed,
      partition_seed=FLAGS.seed, vote=FLAGS.vote, vote_fraction=FLAGS.vote_fraction,
      delta=FLAGS.delta)
  run = gan.fit(x, y, iterations=FLAGS.iterations,
                target_epsilon=FLAGS.target_epsilon if private else None,
                log_every=FLAGS.log_every)
  sanitized = None
  if private and FLAGS.smooth_sensitivity:
    release = gan.sanitized_epsilon(beta=SS_BETA, sigma_ss=SS_SIGMA, order=SS_ORDER)
    sanitized = {"epsilon": release.epsilon, "order": SS_ORDER, "beta": SS_BETA,
                 "sigma_ss": SS_SIGMA}
  train_seconds = time.time() - start
  path = os.path.join(FLAGS.output_dir, "generator.keras")
  generator.save(path)
  del gan  # teachers and the noise key are dropped here; nothing below reads private data

  # Everything below uses only the saved generator (and, for evaluation, real data).
  metrics = generative_common.evaluate_generator(
      path, FLAGS.output_dir, (x, y), (xt, yt),
      title=f"PATE-GAN, epsilon={run['epsilon']:.2f}", tstr_samples=FLAGS.tstr_samples,
      tstr_epochs=FLAGS.tstr_epochs, fd_samples=FLAGS.fd_samples,
      feature_epochs=FLAGS.feature_epochs, seed=FLAGS.seed,
      full_train_set=FLAGS.train_size is None)
  results = {
      "epsilon": run["epsilon"], "epsilon_kind": (
          "data-independent (PateAccountant.data_independent_epsilon; publishable)"
          if private else "inf (no noise)"),
      "delta": FLAGS.delta, **metrics,
      "smooth_sensitivity_release": sanitized,
      "latent_dim": FLAGS.latent_dim, "num_classes": 10,
      "generator_inputs": ["noise [B, latent_dim] ~ N(0, I)", "one_hot_label [B, 10]"],
      "generator_output": "images [B, 28, 28, 1] in [0, 1]",
      "target_epsilon": FLAGS.target_epsilon, "gnmax_sigma": noise,
      "num_teachers": FLAGS.num_teachers, "train_size": len(x), "test_size": len(xt),
      "pate_answers": run["queries"], "iterations_done": run["iterations"],
      "stopped_by_budget": run["stopped_by_budget"],
      "train_seconds": round(train_seconds, 1),
      "total_seconds": round(time.time() - start, 1),
      "flags": {name: FLAGS[name].value for name in (
          "iterations", "num_teachers", "teacher_hidden", "teacher_batch_size",
          "teacher_steps", "student_steps", "student_batch_size", "generator_batch_size",
          "teacher_learning_rate", "student_learning_rate", "generator_learning_rate",
          "vote", "vote_fraction", "tstr_samples", "tstr_epochs", "fd_samples",
          "feature_epochs", "seed", "generator", "generator_filters", "student_conditioning")},
  }
  with open(os.path.join(FLAGS.output_dir, "results.json"), "w", encoding="utf-8") as handle:
    json.dump(results, handle, indent=2)
  print(f"final: epsilon={results['epsilon']:.4f} ({results['epsilon_kind']}) "
        f"delta={FLAGS.delta:g} tstr_accuracy={metrics['tstr_accuracy']:.4f} "
        f"frechet_distance={metrics['frechet_distance']:.3f} (real train vs test: "
        f"{metrics['frechet_distance_real_train_vs_test']:.3f}) train_seconds="
        f"{train_seconds:.0f} total_seconds={results['total_seconds']:.0f}", flush=True)


if __name__ == "__main__":
  app.run(main)
