"""Conditional DP-GAN on MNIST (tf_dpkit.generative.DPGAN): train, save, sample, evaluate.

    python tutorials/mnist_dpgan_tutorial.py --target_epsilon=10 --output_dir=/tmp/dpgan
    python tutorials/mnist_dpgan_tutorial.py --target_epsilon=inf --output_dir=/tmp/gan
    python tutorials/mnist_dpgan_tutorial.py --discriminator=conv --discriminator_steps=5 ...

The discriminator is trained with DP-SGD (per-example clipping of its real-data gradients,
Gaussian noise, Poisson batches of expected size --batch_size); the generator only sees the
discriminator, so it is private by post-processing (tf_dpkit/generative/dpgan.py says exactly
what is clipped).  The noise multiplier is calibrated so that --generator_steps iterations of
--discriminator_steps discriminator steps meet (--target_epsilon, --delta); training also stops
at the budget.  --target_epsilon=inf trains without noise (per-example clipping kept; no
privacy guarantee).  --generator and --discriminator pick the networks
(tf_dpkit/generative/networks.py).  Defaults: a DCGAN-style conv generator with
--generator_filters (32) and an MLP discriminator with a projection label head
(--discriminator_conditioning=projection; "concat" appends the label to the image instead).
"--generator=mlp" is an MLP generator with BatchNormalization; "--discriminator=conv" a
two-layer strided-conv discriminator with --discriminator_filters, the label tiled into image
channels.

Writes to --output_dir:
  generator.keras  the conditional generator: inputs [noise [B, latent_dim], one_hot_label
                   [B, 10]], output images [B, 28, 28, 1] in [0, 1]; it holds no data, no
                   optimizer, no noise key (sample it with tf_dpkit.generative.sample).
  results.json     epsilon, delta, tstr_accuracy (MLP classifier), tstr_accuracy_cnn (CNN
                   classifier), frechet_distance, latent_dim, settings.
  samples.png      10 x 10 grid, row r = digit r.
Evaluation (TSTR on the real test set; Frechet distance between generated and real test
images in the features of a CNN trained on the real training set) is not part of the DP
release.
"""
from __future__ import annotations

import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

from analysis import calibration  # noqa: E402
from tf_dpkit import generative  # noqa: E402
from tutorials import generative_common  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_float("target_epsilon", 10.0, "Privacy budget (nats) at --delta; inf: no noise.")
flags.DEFINE_float("delta", 1e-5, "Delta of the privacy guarantee.")
flags.DEFINE_string("output_dir", None, "Where generator.keras, results.json, samples.png go.")
flags.DEFINE_integer("generator_steps", 3000, "Generator steps (iterations).")
flags.DEFINE_integer("discriminator_steps", 1, "Discriminator steps per generator step.")
flags.DEFINE_integer("batch_size", 600, "Expected Poisson batch size qN (and fake batch size).")
flags.DEFINE_float("l2_norm_clip", 1.0, "Per-example clip norm of the discriminator gradient.")
flags.DEFINE_float("discriminator_learning_rate", 2e-4, "Adam learning rate of D.")
flags.DEFINE_float("generator_learning_rate", 2e-4, "Adam learning rate of G.")
flags.DEFINE_float("beta_1", 0.5, "Adam's beta_1 (both networks).")
flags.DEFINE_enum("loss", "standard", ["standard", "wasserstein"], "GAN loss.")
flags.DEFINE_enum("generator", "conv", ["mlp", "conv"], "Generator builder (models.py).")
flags.DEFINE_enum("discriminator", "mlp", ["mlp", "conv"], "Discriminator builder (models.py).")
flags.DEFINE_enum("discriminator_conditioning", "projection", ["concat", "projection"],
                  "mlp discriminator: how the label enters (models.mlp_discriminator).")
flags.DEFINE_integer("generator_filters", 32, "conv generator: F (channels 2F, then F).")
flags.DEFINE_list("discriminator_filters", ["16", "32"], "conv discriminator: (F1, F2).")
flags.DEFINE_bool("clip_fake_examples", True,
                  "Clip each fake example's discriminator gradient to the clip norm too.")
flags.DEFINE_integer("latent_dim", 64, "Noise dimensions.")
flags.DEFINE_integer("train_size", None, "Use only the first N training examples (tests).")
flags.DEFINE_integer("test_size", None, "Use only the first N test examples (tests).")
flags.DEFINE_integer("tstr_samples", 10000, "Synthetic examples for TSTR (balanced classes).")
flags.DEFINE_integer("tstr_epochs", 10, "Epochs of the TSTR classifiers.")
flags.DEFINE_list("tstr_classifiers", ["mlp", "cnn"], "TSTR classifiers (mlp, cnn).")
flags.DEFINE_integer("fd_samples", 2000, "Images per side of the Frechet distance.")
flags.DEFINE_integer("feature_epochs", 2, "Epochs of the feature CNN (on real training data).")
flags.DEFINE_integer("log_every", 200, "Log every this many generator steps.")
flags.DEFINE_integer("seed", 0, "Public seed: weights, latent noise, evaluation.")
flags.DEFINE_integer("sampling_seed", None,
                     "Poisson sampling seed. Default: secret (as the analysis needs).")
flags.mark_flag_as_required("output_dir")


def build_models():
  generator = generative_common.build_generator(FLAGS.generator, FLAGS.latent_dim,
                                                FLAGS.generator_filters)
  if FLAGS.discriminator == "conv":
    discriminator = generative.conv_discriminator(
        10, filters=tuple(int(f) for f in FLAGS.discriminator_filters))
  else:
    discriminator = generative.mlp_discriminator(
        10, conditioning=FLAGS.discriminator_conditioning)
  return generator, discriminator


def main(argv):
  del argv
  start = time.time()
  os.makedirs(FLAGS.output_dir, exist_ok=True)
  keras.utils.set_random_seed(FLAGS.seed)
  (x, y), (xt, yt) = generative_common.load_mnist(FLAGS.train_size, FLAGS.test_size)
  n = len(x)
  q = FLAGS.batch_size / n
  steps = FLAGS.generator_steps * FLAGS.discriminator_steps
  private = FLAGS.target_epsilon != math.inf
  sigma = (calibration.compute_noise_multiplier(FLAGS.target_epsilon, FLAGS.delta, q, steps)
           if private else 0.0)
  print(f"N={n} q={q:.5f} discriminator steps={steps} noise_multiplier={sigma:.4f} "
        f"(target epsilon={FLAGS.target_epsilon} at delta={FLAGS.delta})", flush=True)
  generator, discriminator = build_models()
  gan = generative.DPGAN(
      generator, discriminator, latent_dim=FLAGS.latent_dim, num_classes=10, loss=FLAGS.loss,
      l2_norm_clip=FLAGS.l2_norm_clip, noise_multiplier=sigma,
      expected_batch_size=FLAGS.batch_size, discriminator_steps=FLAGS.discriminator_steps,
      discriminator_learning_rate=FLAGS.discriminator_learning_rate,
      generator_learning_rate=FLAGS.generator_learning_rate, beta_1=FLAGS.beta_1,
      clip_fake_examples=FLAGS.clip_fake_examples, seed=FLAGS.seed, delta=FLAGS.delta)
  run = gan.fit(x, y, generator_steps=FLAGS.generator_steps,
                target_epsilon=FLAGS.target_epsilon if private else None,
                sampling_seed=FLAGS.sampling_seed, log_every=FLAGS.log_every)
  train_seconds = time.time() - start
  path = os.path.join(FLAGS.output_dir, "generator.keras")
  generator.save(path)

  # Everything below uses only the saved generator (and, for evaluation, real data).
  metrics = generative_common.evaluate_generator(
      path, FLAGS.output_dir, (x, y), (xt, yt),
      title=f"DP-GAN, epsilon={run['epsilon']:.2f}" if private else "GAN, no noise",
      tstr_samples=FLAGS.tstr_samples, tstr_epochs=FLAGS.tstr_epochs,
      fd_samples=FLAGS.fd_samples, feature_epochs=FLAGS.feature_epochs, seed=FLAGS.seed,
      full_train_set=not FLAGS.train_size, tstr_classifiers=tuple(FLAGS.tstr_classifiers))
  results = {
      "epsilon": run["epsilon"] if private else math.inf, "delta": FLAGS.delta,
      **metrics,
      "latent_dim": FLAGS.latent_dim, "num_classes": 10,
      "generator_inputs": ["noise [B, latent_dim] ~ N(0, I)", "one_hot_label [B, 10]"],
      "generator_output": "images [B, 28, 28, 1] in [0, 1]",
      "target_epsilon": FLAGS.target_epsilon, "noise_multiplier": sigma,
      "sampling_probability": q, "train_size": n, "test_size": len(xt),
      "generator_steps_done": run["generator_steps"],
      "discriminator_steps_done": run["discriminator_steps"],
      "stopped_by_budget": run["stopped_by_budget"],
      "train_seconds": round(train_seconds, 1),
      "total_seconds": round(time.time() - start, 1),
      "config": gan.get_config(),
      "flags": {name: FLAGS[name].value for name in (
          "generator_steps", "discriminator_steps", "batch_size", "l2_norm_clip",
          "discriminator_learning_rate", "generator_learning_rate", "beta_1", "loss",
          "generator", "discriminator", "discriminator_conditioning", "generator_filters",
          "discriminator_filters",
          "clip_fake_examples", "tstr_samples", "tstr_epochs",
          "tstr_classifiers", "fd_samples", "feature_epochs", "seed")},
  }
  with open(os.path.join(FLAGS.output_dir, "results.json"), "w", encoding="utf-8") as handle:
    json.dump(results, handle, indent=2)
  tstr = " ".join(f"{key}={metrics[key]:.4f}" for key in ("tstr_accuracy", "tstr_accuracy_cnn")
                  if metrics.get(key) is not None)
  print(f"final: epsilon={results['epsilon']:.4f} delta={FLAGS.delta:g} {tstr} "
        f"frechet_distance={metrics['frechet_distance']:.3f} (real train vs test: "
        f"{metrics['frechet_distance_real_train_vs_test']:.3f}) "
        f"train_seconds={train_seconds:.0f} total_seconds={results['total_seconds']:.0f}",
        flush=True)


if __name__ == "__main__":
  app.run(main)
