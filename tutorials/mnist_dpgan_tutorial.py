"""Conditional DP-GAN on MNIST (tf_dpkit.generative.DPGAN): train, save, sample, evaluate.

    python tutorials/mnist_dpgan_tutorial.py --target_epsilon=10 --output_dir=/tmp/dpgan
    python tutorials/mnist_dpgan_tutorial.py --target_epsilon=inf --output_dir=/tmp/gan

The discriminator is trained with DP-SGD (per-example clipping of its real-data gradients,
Gaussian noise, Poisson batches of expected size --batch_size); the generator only sees the
discriminator, so it is private by post-processing (tf_dpkit/generative/dpgan.py says exactly
what is clipped).  The noise multiplier is calibrated so that --generator_steps iterations of
--discriminator_steps discriminator steps meet (--target_epsilon, --delta); training also stops
at the budget.  --target_epsilon=inf trains without noise (per-example clipping kept; no
privacy guarantee).

Writes to --output_dir:
  generator.keras  the conditional generator: inputs [noise [B, latent_dim], one_hot_label
                   [B, 10]], output images [B, 28, 28, 1] in [0, 1]; it holds no data, no
                   optimizer, no noise key (sample it with tf_dpkit.generative.sample).
  results.json     epsilon, delta, tstr_accuracy, frechet_distance, latent_dim, settings.
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
from tf_dpkit.data import mnist  # noqa: E402
from tf_dpkit import generative  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_float("target_epsilon", 10.0, "Privacy budget (nats) at --delta; inf: no noise.")
flags.DEFINE_float("delta", 1e-5, "Delta of the privacy guarantee.")
flags.DEFINE_string("output_dir", None, "Where generator.keras, results.json, samples.png go.")
flags.DEFINE_integer("generator_steps", 15000, "Generator steps (iterations).")
flags.DEFINE_integer("discriminator_steps", 1, "Discriminator steps per generator step.")
flags.DEFINE_integer("batch_size", 600, "Expected Poisson batch size qN (and fake batch size).")
flags.DEFINE_float("l2_norm_clip", 1.0, "Per-example clip norm of the discriminator gradient.")
flags.DEFINE_float("discriminator_learning_rate", 2e-4, "Adam learning rate of D.")
flags.DEFINE_float("generator_learning_rate", 2e-4, "Adam learning rate of G.")
flags.DEFINE_enum("loss", "standard", ["standard", "wasserstein"], "GAN loss.")
flags.DEFINE_integer("latent_dim", 64, "Noise dimensions.")
flags.DEFINE_integer("train_size", None, "Use only the first N training examples (tests).")
flags.DEFINE_integer("test_size", None, "Use only the first N test examples (tests).")
flags.DEFINE_integer("tstr_samples", 10000, "Synthetic examples for TSTR (balanced classes).")
flags.DEFINE_integer("tstr_epochs", 10, "Epochs of the TSTR classifier.")
flags.DEFINE_integer("fd_samples", 2000, "Images per side of the Frechet distance.")
flags.DEFINE_integer("feature_epochs", 2, "Epochs of the feature CNN (on real training data).")
flags.DEFINE_integer("log_every", 200, "Log every this many generator steps.")
flags.DEFINE_integer("seed", 0, "Public seed: weights, latent noise, evaluation.")
flags.DEFINE_integer("sampling_seed", None,
                     "Poisson sampling seed. Default: secret (as the analysis needs).")
flags.mark_flag_as_required("output_dir")


def load():
  (x, y), (xt, yt) = mnist.load()
  prep = lambda a: (a.astype(np.float32) / 255.0)[..., None]
  x, y = prep(x[:FLAGS.train_size]), y[:FLAGS.train_size].astype(np.int64)
  xt, yt = prep(xt[:FLAGS.test_size]), yt[:FLAGS.test_size].astype(np.int64)
  return (x, y), (xt, yt)


def main(argv):
  del argv
  start = time.time()
  os.makedirs(FLAGS.output_dir, exist_ok=True)
  keras.utils.set_random_seed(FLAGS.seed)
  (x, y), (xt, yt) = load()
  n = len(x)
  q = FLAGS.batch_size / n
  steps = FLAGS.generator_steps * FLAGS.discriminator_steps
  private = FLAGS.target_epsilon != math.inf
  sigma = (calibration.compute_noise_multiplier(FLAGS.target_epsilon, FLAGS.delta, q, steps)
           if private else 0.0)
  print(f"N={n} q={q:.5f} discriminator steps={steps} noise_multiplier={sigma:.4f} "
        f"(target epsilon={FLAGS.target_epsilon} at delta={FLAGS.delta})", flush=True)
  generator = generative.mlp_generator(FLAGS.latent_dim, 10)
  discriminator = generative.mlp_discriminator(10)
  gan = generative.DPGAN(
      generator, discriminator, latent_dim=FLAGS.latent_dim, num_classes=10, loss=FLAGS.loss,
      l2_norm_clip=FLAGS.l2_norm_clip, noise_multiplier=sigma,
      expected_batch_size=FLAGS.batch_size, discriminator_steps=FLAGS.discriminator_steps,
      discriminator_learning_rate=FLAGS.discriminator_learning_rate,
      generator_learning_rate=FLAGS.generator_learning_rate, seed=FLAGS.seed,
      delta=FLAGS.delta)
  run = gan.fit(x, y, generator_steps=FLAGS.generator_steps,
                target_epsilon=FLAGS.target_epsilon if private else None,
                sampling_seed=FLAGS.sampling_seed, log_every=FLAGS.log_every)
  train_seconds = time.time() - start
  path = os.path.join(FLAGS.output_dir, "generator.keras")
  generator.save(path)

  # Everything below uses only the saved generator (and, for evaluation, real test data).
  saved = keras.models.load_model(path, compile=False)
  grid, _ = generative.sample(saved, 100, labels=np.repeat(np.arange(10), 10), seed=1)
  generative.save_sample_grid(grid, os.path.join(FLAGS.output_dir, "samples.png"),
                              title=f"DP-GAN, epsilon={run['epsilon']:.2f}")
  xs, ys = generative.sample(saved, FLAGS.tstr_samples, seed=2)
  tstr = generative.tstr_accuracy(xs, ys, xt, yt, epochs=FLAGS.tstr_epochs, seed=FLAGS.seed)
  features, feature_accuracy = generative.mnist_feature_extractor(
      x if FLAGS.train_size else None, y if FLAGS.train_size else None,
      epochs=FLAGS.feature_epochs, seed=FLAGS.seed)
  m = min(FLAGS.fd_samples, len(xt))
  fd = generative.frechet_distance(xs[:m], xt[:m], features)
  fd_real = generative.frechet_distance(x[:m], xt[:m], features)
  results = {
      "epsilon": run["epsilon"] if private else math.inf, "delta": FLAGS.delta,
      "tstr_accuracy": tstr, "frechet_distance": fd,
      "frechet_distance_real_train_vs_test": fd_real,
      "feature_classifier_test_accuracy": feature_accuracy,
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
          "discriminator_learning_rate", "generator_learning_rate", "loss", "tstr_samples",
          "tstr_epochs", "fd_samples", "feature_epochs", "seed")},
  }
  with open(os.path.join(FLAGS.output_dir, "results.json"), "w", encoding="utf-8") as handle:
    json.dump(results, handle, indent=2)
  print(f"final: epsilon={results['epsilon']:.4f} delta={FLAGS.delta:g} tstr_accuracy={tstr:.4f} "
        f"frechet_distance={fd:.3f} (real train vs test: {fd_real:.3f}) "
        f"train_seconds={train_seconds:.0f} total_seconds={results['total_seconds']:.0f}",
        flush=True)


if __name__ == "__main__":
  app.run(main)
