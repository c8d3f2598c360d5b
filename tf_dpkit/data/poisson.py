"""Batch pipelines for DP-SGD: Poisson sampling (what the accountants assume) and shuffle-and-batch.

Every batch of :func:`poisson_batches` includes each of the ``N`` examples independently with
probability ``q`` (keyed by a secret seed and the step; every pass over the dataset draws fresh
batches), so the RDP and PLD accountants' Poisson-subsampled Gaussian analysis holds; normalise
the noisy sum by the expected batch size ``qN``.  :func:`shuffled_batches` cuts a fresh
permutation per epoch and is accounted without amplification by subsampling.
:func:`distributed_poisson_batches` gives each replica its part of every global Poisson batch;
:func:`poisson_batches_for_memory` splits each batch into chunks for gradient accumulation;
:func:`pipeline_of` tells what a dataset made here is.  The construction, the accepted
``data`` and the element structure, and why each rule keeps the accounted epsilon:
``docs/design/data_pipelines.md``.

This module gathers the public names of ``_poisson``, ``shuffle``, ``distributed``,
``memory``, ``pipelines`` and ``_structure`` (where they are defined).
"""
from __future__ import annotations

from tf_dpkit.data._batching import Passes as _Passes  # noqa: F401 (tests count passes)
from tf_dpkit.data._batching import secret_seed
from tf_dpkit.data._poisson import PoissonSampling, poisson_batches
from tf_dpkit.data._structure import check_class_labels, check_finite_features
from tf_dpkit.data.distributed import distributed_poisson_batches  # noqa: F401 (tf_dpkit.data)
from tf_dpkit.data.memory import accumulation_steps_for_memory, poisson_batches_for_memory
from tf_dpkit.data.pipelines import Pipeline, pipeline_of
from tf_dpkit.data.shuffle import shuffled_batches

__all__ = ["Pipeline", "PoissonSampling", "accumulation_steps_for_memory", "check_class_labels",
           "check_finite_features", "pipeline_of", "poisson_batches", "poisson_batches_for_memory",
           "secret_seed", "shuffled_batches"]

