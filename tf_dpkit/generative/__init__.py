"""Differentially private generative models: DP-GAN, PATE-GAN and their evaluation.

* :class:`DPGAN` (:mod:`tf_dpkit.generative.dpgan`): trains any Keras generator and
  discriminator (conditional on labels or not; standard or Wasserstein loss) so that the
  discriminator's real-data gradients are clipped per example and noised (DP-SGD with Poisson
  batches); the generator is post-processing (optionally with MSGAN's mode-seeking term,
  :func:`mode_seeking_penalty`).  :func:`sample` draws from a saved generator.
* :class:`PATEGAN` (:mod:`tf_dpkit.generative.pategan`): teacher discriminators on disjoint
  shards, a student discriminator trained only on generated examples labelled by noisy teacher
  votes (tf_dpkit.pate aggregators, analysis.pate.PateAccountant), the generator trained
  against the student.
* :mod:`tf_dpkit.generative.networks`: small MLP and convolutional generator/discriminator
  builders for MNIST, 1-D convolutional ones for rows that are sequences, and a fixed summary
  of such rows (:class:`RowStatistics`) with a discriminator that reads only it.
* :mod:`tf_dpkit.generative.release`: public randomisation of generated rows before release
  (cyclic shift, rescaling about the mean): post-processing, no privacy cost.
* :mod:`tf_dpkit.generative.evaluation`: TSTR for images (accuracy) and tables (AUROC / AUPRC
  over a fixed set of scikit-learn classifiers), Frechet distance, sample grids (evaluation
  uses real data and is not private).
"""
import importlib

from tf_dpkit.generative.dpgan import (DPGAN, GRADIENT_PENALTY_REFUSED, LOSSES,
                                       check_discriminator_examples_independent,
                                       mode_seeking_penalty, sample)
from tf_dpkit.generative.evaluation import (TABULAR_CLASSIFIERS, binary_auprc, binary_auroc,
                                            clear_feature_cache, frechet_distance,
                                            frechet_distance_from_features,
                                            mnist_feature_extractor, save_sample_grid,
                                            tabular_classifier, tstr_accuracy, tstr_classifier,
                                            tstr_correct, tstr_tabular,
                                            tstr_tabular_record_scores)
from tf_dpkit.generative.networks import (ROW_STATISTICS, RowStatistics, conv_discriminator,
                                          conv_generator, mlp_discriminator, mlp_generator,
                                          sequence_discriminator, sequence_generator,
                                          statistics_discriminator)
from tf_dpkit.generative.release import randomize_rows, scale_about_mean
from tf_dpkit.generative.pategan import (PATE_AGGREGATORS, PATEGAN, affordable_queries,
                                         data_independent_epsilon, noise_scale_for_budget,
                                         teacher_ensemble_discriminator)

__all__ = [
    "DPGAN", "GRADIENT_PENALTY_REFUSED", "LOSSES", "check_discriminator_examples_independent",
    "mode_seeking_penalty", "sample", "clear_feature_cache", "frechet_distance",
    "frechet_distance_from_features",
    "mnist_feature_extractor", "save_sample_grid", "tstr_accuracy", "tstr_classifier",
    "tstr_correct",
    "TABULAR_CLASSIFIERS", "binary_auroc", "binary_auprc", "tabular_classifier", "tstr_tabular",
    "tstr_tabular_record_scores",
    "mlp_discriminator", "mlp_generator", "conv_discriminator", "conv_generator",
    "sequence_discriminator", "sequence_generator", "ROW_STATISTICS", "RowStatistics",
    "statistics_discriminator", "randomize_rows", "scale_about_mean", "PATEGAN",
    "PATE_AGGREGATORS", "affordable_queries",
    "data_independent_epsilon", "noise_scale_for_budget", "teacher_ensemble_discriminator",
]


def __getattr__(name):
  """Loads a renamed module's deprecated alias (models) on first attribute access."""
  if name in ("models",):
    return importlib.import_module(f"{__name__}.{name}")
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
