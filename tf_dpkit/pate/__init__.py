"""PATE: Private Aggregation of Teacher Ensembles (Papernot et al. 2017, 2018) for Keras.

* :func:`partition_indices`: disjoint teacher shards of the private data (seeded shuffle).
* :class:`TeacherEnsemble`: all teachers in ONE batched Keras model (a teacher axis on the
  weights: grouped convolutions and batched dense layers), each trained on its own shard.
* :class:`TeacherVotes`: the sealed vote histograms ``[num_queries, num_classes]``.
* Aggregators :class:`LNMax`, :class:`GNMax`, :class:`ConfidentGNMax`,
  :class:`InteractiveGNMax`: secret keyed noise (:mod:`tf_dpkit.noise`), every outcome
  recorded in an :class:`analysis.pate.PateAccountant`.
* :func:`train_student` (supervised or FixMatch-style semi-supervised), :func:`build_student_model`,
  :func:`least_confident` (which public images to query next).

``tutorials/mnist_pate_tutorial.py`` runs the whole pipeline on MNIST.
"""
from __future__ import annotations

from tf_dpkit.pate.aggregators import (AGGREGATORS, Aggregator, Answers, ConfidentGNMax, GNMax,
                                       InteractiveGNMax, LNMax)
from tf_dpkit.pate.partition import partition_indices, shard_of
from tf_dpkit.pate.student import (build_student_model, least_confident, predict_probabilities,
                                   train_student)
from tf_dpkit.pate.teachers import TeacherEnsemble, build_teacher_model
from tf_dpkit.pate.votes import TeacherVotes

__all__ = [
    "AGGREGATORS", "Aggregator", "Answers", "ConfidentGNMax", "GNMax", "InteractiveGNMax",
    "LNMax", "TeacherEnsemble", "TeacherVotes", "build_student_model", "build_teacher_model",
    "least_confident",
    "partition_indices", "predict_probabilities", "shard_of", "train_student",
]
