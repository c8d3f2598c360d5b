"""Differentially private generative models: DP-GAN and its evaluation.

* :class:`DPGAN` (:mod:`tf_dpkit.generative.dpgan`): trains any Keras generator and
  discriminator (conditional on labels or not; standard or Wasserstein loss) so that the
  discriminator's real-data gradients are clipped per example and noised (DP-SGD with Poisson
  batches); the generator is post-processing.  :func:`sample` draws from a saved generator.
* :mod:`tf_dpkit.generative.models`: small MLP generator/discriminator builders for MNIST.
* :mod:`tf_dpkit.generative.evaluation`: TSTR accuracy, Frechet distance on MNIST-classifier
  features, sample grids (evaluation uses real data and is not private).
"""
from tf_dpkit.generative.dpgan import (DPGAN, GRADIENT_PENALTY_REFUSED, LOSSES,
                                       check_discriminator_examples_independent, sample)
from tf_dpkit.generative.evaluation import (clear_feature_cache, frechet_distance,
                                            frechet_distance_from_features,
                                            mnist_feature_extractor, save_sample_grid,
                                            tstr_accuracy)
from tf_dpkit.generative.models import mlp_discriminator, mlp_generator

__all__ = [
    "DPGAN", "GRADIENT_PENALTY_REFUSED", "LOSSES", "check_discriminator_examples_independent",
    "sample", "clear_feature_cache", "frechet_distance", "frechet_distance_from_features",
    "mnist_feature_extractor", "save_sample_grid", "tstr_accuracy", "mlp_discriminator",
    "mlp_generator",
]
