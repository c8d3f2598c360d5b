"""Shared pieces of the generative-model tutorials: MNIST loading and the evaluation of a saved
conditional generator (sample grid, TSTR on the real test set, Frechet distance in the
features of a CNN trained on the real training set).

The evaluation uses real data and is not part of any differentially private release.
"""
from __future__ import annotations

import math
import os

import keras
import numpy as np

from tf_dpkit import generative
from tf_dpkit.data import mnist


def check_choice_flags(checkpoint_every, log_every, total, total_flag,
                       selection_noise_multiplier):
  """Raises ``absl.app.UsageError`` naming the flag when the private checkpoint choice's flags
  are out of range: ``--log_every`` >= 1, ``--checkpoint_every`` 0 or a positive multiple of
  it and at most ``total`` (the value of ``total_flag``), ``--selection_noise_multiplier``
  finite and > 0."""
  from absl import app  # pylint: disable=g-import-not-at-top
  if log_every < 1:
    raise app.UsageError(f"--log_every must be >= 1, got {log_every}.")
  if checkpoint_every < 0 or (checkpoint_every and checkpoint_every % log_every):
    raise app.UsageError(f"--checkpoint_every must be 0 or a positive multiple of --log_every="
                         f"{log_every}, got {checkpoint_every}.")
  if checkpoint_every > total:
    raise app.UsageError(f"--checkpoint_every must be <= {total_flag}={total}, got "
                         f"{checkpoint_every}.")
  if not (selection_noise_multiplier > 0 and math.isfinite(selection_noise_multiplier)):
    raise app.UsageError(f"--selection_noise_multiplier must be finite and > 0, got "
                         f"{selection_noise_multiplier}.")


def load_mnist(train_size=None, test_size=None):
  """``((x, y), (x_test, y_test))``: float32 images ``[n, 28, 28, 1]`` in [0, 1], int64 labels;
  only the first ``train_size`` / ``test_size`` examples when given."""
  (x, y), (xt, yt) = mnist.load()
  prep = lambda a: (a.astype(np.float32) / 255.0)[..., None]
  x, y = prep(x[:train_size]), y[:train_size].astype(np.int64)
  xt, yt = prep(xt[:test_size]), yt[:test_size].astype(np.int64)
  return (x, y), (xt, yt)


def build_generator(kind, latent_dim, filters):
  """The tutorials' conditional MNIST generator: ``"conv"`` (``generative.conv_generator`` with
  ``filters``) or ``"mlp"`` (``generative.mlp_generator``); inputs ``[noise, one_hot_label]``."""
  if kind == "conv":
    return generative.conv_generator(latent_dim, 10, filters=filters)
  if kind == "mlp":
    return generative.mlp_generator(latent_dim, 10)
  raise ValueError(f"generator must be 'mlp' or 'conv', got {kind!r}.")


def evaluate_generator(path, output_dir, train, test, *, title, tstr_samples, tstr_epochs,
                       fd_samples, feature_epochs, seed, full_train_set,
                       tstr_classifiers=("mlp",)):
  """Loads the generator saved at ``path`` and evaluates it (module docstring).

  Writes ``output_dir/samples.png`` (10 x 10 grid, row r = digit r).  ``full_train_set``: the
  feature CNN is trained on the whole real MNIST training set (else on ``train``).
  ``tstr_classifiers``: which TSTR classifiers to train (``"mlp"`` and/or ``"cnn"``,
  ``tf_dpkit.generative.tstr_classifier``), each on the same ``tstr_samples`` generated images.
  Returns a dict: ``tstr_accuracy`` (the MLP's; None if ``"mlp"`` is not asked for),
  ``tstr_accuracy_cnn`` (only when ``"cnn"`` is asked for), ``frechet_distance``,
  ``frechet_distance_real_train_vs_test``, ``feature_classifier_test_accuracy``.
  """
  (x, y), (xt, yt) = train, test
  saved = keras.models.load_model(path, compile=False)
  grid, _ = generative.sample(saved, 100, labels=np.repeat(np.arange(10), 10), seed=1)
  generative.save_sample_grid(grid, os.path.join(output_dir, "samples.png"), title=title)
  xs, ys = generative.sample(saved, tstr_samples, seed=2)
  tstr = {kind: generative.tstr_accuracy(xs, ys, xt, yt, epochs=tstr_epochs, seed=seed,
                                         classifier=kind)
          for kind in tstr_classifiers}
  features, feature_accuracy = generative.mnist_feature_extractor(
      None if full_train_set else x, None if full_train_set else y, epochs=feature_epochs,
      seed=seed)
  m = min(fd_samples, len(xt), len(xs), len(x))
  extra = {"tstr_accuracy_cnn": tstr["cnn"]} if "cnn" in tstr else {}
  return {
      "tstr_accuracy": tstr.get("mlp"), **extra,
      "frechet_distance": generative.frechet_distance(xs[:m], xt[:m], features),
      "frechet_distance_real_train_vs_test": generative.frechet_distance(x[:m], xt[:m],
                                                                         features),
      "feature_classifier_test_accuracy": feature_accuracy,
  }
