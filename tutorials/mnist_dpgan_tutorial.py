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

--generator_ema=d keeps a moving average of the generator's weights and releases it
(post-processing).  --validation_size=V --checkpoint_every=S hold V training images out of
training (a public split) and keep a candidate generator every S steps; the released one is
chosen by tf_dpkit.selection on those records (each candidate's CNN TSTR classifier labels them
right or wrong), a Gaussian mechanism with --selection_noise_multiplier whose cost is composed
with training: the training noise is calibrated so that both meet --target_epsilon.

Writes to --output_dir:
  generator.keras  the conditional generator: inputs [noise [B, latent_dim], one_hot_label
                   [B, 10]], output images [B, 28, 28, 1] in [0, 1]; it holds no data, no
                   optimizer, no noise key (sample it with tf_dpkit.generative.sample).
  results.json     epsilon, delta, tstr_accuracy (MLP classifier), tstr_accuracy_cnn (CNN
                   classifier), frechet_distance, latent_dim, settings; with the private
                   choice also the chosen step and the noisy validation accuracies.
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

from analysis import calibration, dp_sgd, events  # noqa: E402
from tf_dpkit import generative, selection  # noqa: E402
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
flags.DEFINE_float("generator_ema", None,
                   "Decay in [0, 1) of a moving average of the generator's weights "
                   "(DPGAN's generator_ema); the average is what is kept and released. "
                   "Default: none, the last iterate.")
flags.DEFINE_float("mode_seeking", 0.0,
                   "Weight lambda >= 0 of MSGAN's mode-seeking term in the generator loss "
                   "(DPGAN's mode_seeking; no privacy cost). Default 0: off.")
flags.DEFINE_integer("validation_size", 0,
                     "Hold out this many training images (a public permutation) as private "
                     "validation records for the private checkpoint choice; 0: none.")
flags.DEFINE_integer("checkpoint_every", 0,
                     "Keep a candidate generator every this many generator steps (a multiple "
                     "of --log_every); with --validation_size the released one is chosen "
                     "among them by tf_dpkit.selection (accounted). 0: release the last.")
flags.DEFINE_float("selection_noise_multiplier", 20.0,
                   "Noise multiplier of the private checkpoint choice (> 0).")
flags.DEFINE_integer("selection_samples", 10000,
                     "Synthetic images per candidate for the checkpoint choice.")
flags.DEFINE_integer("selection_epochs", 5, "Epochs of each candidate's CNN classifier.")
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


def check_flags():
  """Refuses inconsistent selection flags before anything is trained."""
  if FLAGS.validation_size < 0:
    raise app.UsageError(f"--validation_size must be >= 0, got {FLAGS.validation_size}.")
  generative_common.check_choice_flags(FLAGS.checkpoint_every, FLAGS.log_every,
                                       FLAGS.generator_steps, "--generator_steps",
                                       FLAGS.selection_noise_multiplier)
  if not (math.isfinite(FLAGS.mode_seeking) and FLAGS.mode_seeking >= 0):
    raise app.UsageError(f"--mode_seeking must be a finite number >= 0, got "
                         f"{FLAGS.mode_seeking}.")
  if bool(FLAGS.validation_size) != bool(FLAGS.checkpoint_every):
    raise app.UsageError("--validation_size and --checkpoint_every go together: the private "
                         "checkpoint choice needs both (or neither).")
  for name in ("selection_samples", "selection_epochs"):
    if FLAGS[name].value < 1:
      raise app.UsageError(f"--{name} must be >= 1, got {FLAGS[name].value}.")


def split_validation(x, y, size):
  """A public split: a fixed permutation (seed 0, not --seed) of the training images; the
  last ``size`` are the private validation records, the rest train the GAN."""
  if not 0 <= size < len(x):
    raise app.UsageError(f"--validation_size must be in [0, {len(x)}), got {size}.")
  order = np.random.default_rng(0).permutation(len(x))
  train, held = order[:len(x) - size], order[len(x) - size:]
  return (x[train], y[train]), (x[held], y[held])


def noise_multiplier_for(q, steps):
  """DP-SGD sigma meeting --target_epsilon for the training steps composed with the private
  checkpoint choice (one Gaussian mechanism), when there is one."""
  if FLAGS.target_epsilon == math.inf:
    return 0.0
  if not FLAGS.validation_size:
    return calibration.compute_noise_multiplier(FLAGS.target_epsilon, FLAGS.delta, q, steps)
  choice = events.GaussianEvent(FLAGS.selection_noise_multiplier)
  return calibration.calibrate(
      lambda sigma: events.ComposedEvent(
          [dp_sgd.dp_sgd_event(sigma, steps, sampling_probability=q), choice]),
      FLAGS.target_epsilon, FLAGS.delta,
      context=f"with q={q!r} over {steps} steps and the checkpoint choice")


def choose_checkpoint(gan, source, candidates, validation):
  """Private choice among ``candidates`` ([(step, weights)]) by TSTR on the validation
  records (tf_dpkit.selection); sets ``source`` to the chosen weights and returns a dict of
  what is released (the chosen step, the noisy validation accuracies)."""
  xv, yv = validation
  columns = []
  for step, weights in candidates:
    source.set_weights(weights)
    xs, ys = generative.sample(source, FLAGS.selection_samples, seed=3)
    columns.append(generative.tstr_correct(xs, ys, xv, yv, epochs=FLAGS.selection_epochs,
                                           seed=FLAGS.seed, classifier="cnn"))
    print(f"candidate at generator step {step}: scored", flush=True)
  chosen = selection.select_privately(np.stack(columns, axis=1).astype(np.float64),
                                      FLAGS.selection_noise_multiplier, ledger=gan.accountant)
  source.set_weights(candidates[chosen.index][1])
  noisy = [round(float(v) / len(xv), 4) for v in chosen.noisy_scores]
  print(f"private checkpoint choice: generator step {candidates[chosen.index][0]} "
        f"(noisy validation accuracies {noisy}, noise std {chosen.noise_stddev / len(xv):.4f}; "
        f"epsilon with the choice {gan.epsilon():.4f})", flush=True)
  return {"chosen_generator_step": candidates[chosen.index][0],
          "candidate_generator_steps": [step for step, _ in candidates],
          "noisy_validation_accuracies": noisy,
          "selection_noise_stddev": chosen.noise_stddev / len(xv)}


def main(argv):
  del argv
  start = time.time()
  check_flags()
  os.makedirs(FLAGS.output_dir, exist_ok=True)
  keras.utils.set_random_seed(FLAGS.seed)
  (x, y), (xt, yt) = generative_common.load_mnist(FLAGS.train_size, FLAGS.test_size)
  (x, y), validation = split_validation(x, y, FLAGS.validation_size)
  n = len(x)
  q = FLAGS.batch_size / n
  steps = FLAGS.generator_steps * FLAGS.discriminator_steps
  private = FLAGS.target_epsilon != math.inf
  sigma = noise_multiplier_for(q, steps)
  print(f"N={n} q={q:.5f} discriminator steps={steps} noise_multiplier={sigma:.4f} "
        f"(target epsilon={FLAGS.target_epsilon} at delta={FLAGS.delta}"
        f"{', with the checkpoint choice' if FLAGS.validation_size else ''}) "
        f"validation records={FLAGS.validation_size}", flush=True)
  generator, discriminator = build_models()
  gan = generative.DPGAN(
      generator, discriminator, latent_dim=FLAGS.latent_dim, num_classes=10, loss=FLAGS.loss,
      l2_norm_clip=FLAGS.l2_norm_clip, noise_multiplier=sigma,
      expected_batch_size=FLAGS.batch_size, discriminator_steps=FLAGS.discriminator_steps,
      discriminator_learning_rate=FLAGS.discriminator_learning_rate,
      generator_learning_rate=FLAGS.generator_learning_rate, beta_1=FLAGS.beta_1,
      clip_fake_examples=FLAGS.clip_fake_examples, seed=FLAGS.seed, delta=FLAGS.delta,
      generator_ema=FLAGS.generator_ema, mode_seeking=FLAGS.mode_seeking)
  source = generator if gan.averaged_generator is None else gan.averaged_generator
  candidates = []

  def keep(logs):
    if FLAGS.checkpoint_every and logs["generator_step"] % FLAGS.checkpoint_every == 0:
      candidates.append((logs["generator_step"], source.get_weights()))

  run = gan.fit(x, y, generator_steps=FLAGS.generator_steps,
                target_epsilon=FLAGS.target_epsilon if private else None,
                sampling_seed=FLAGS.sampling_seed, log_every=FLAGS.log_every, callback=keep)
  choice = {}
  if FLAGS.checkpoint_every and (not candidates or
                                 candidates[-1][0] != run["generator_steps"]):
    candidates.append((run["generator_steps"], source.get_weights()))  # the last is a candidate
  if FLAGS.validation_size:
    choice = choose_checkpoint(gan, source, candidates, validation)
    if private and gan.epsilon() > FLAGS.target_epsilon * (1 + 1e-9):
      raise RuntimeError(f"epsilon {gan.epsilon()} exceeds --target_epsilon.")
  train_seconds = time.time() - start
  path = os.path.join(FLAGS.output_dir, "generator.keras")
  source.save(path)

  # Everything below uses only the saved generator (and, for evaluation, real data).
  metrics = generative_common.evaluate_generator(
      path, FLAGS.output_dir, (x, y), (xt, yt),
      title=f"DP-GAN, epsilon={gan.epsilon():.2f}" if private else "GAN, no noise",
      tstr_samples=FLAGS.tstr_samples, tstr_epochs=FLAGS.tstr_epochs,
      fd_samples=FLAGS.fd_samples, feature_epochs=FLAGS.feature_epochs, seed=FLAGS.seed,
      full_train_set=not FLAGS.train_size, tstr_classifiers=tuple(FLAGS.tstr_classifiers))
  results = {
      "epsilon": gan.epsilon() if private else math.inf, "delta": FLAGS.delta,
      **metrics, **choice,
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
          "clip_fake_examples", "tstr_samples", "tstr_epochs", "generator_ema", "mode_seeking",
          "validation_size", "checkpoint_every", "selection_noise_multiplier",
          "selection_samples", "selection_epochs",
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
