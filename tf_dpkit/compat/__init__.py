"""Compatibility layers for code written against other DP libraries.

``tf_dpkit.compat.tf_privacy`` gives TensorFlow Privacy's Keras names and signatures
(``DPKerasSGDOptimizer``, ``DPSequential(l2_norm_clip=..., noise_multiplier=..., layers=...)``,
``compute_dp_sgd_privacy_statement``, ...) on top of tf_dpkit's own implementation; nothing in
it adds, scales or accounts noise by a rule of its own.  See ``docs/migration_from_tf_privacy.md``.
"""
from tf_dpkit.compat import tf_privacy

__all__ = ["tf_privacy"]
