"""Per-microbatch gradients and their clipped sum: the one place DP-SGD touches gradients.

``clipped_sum`` owns "per-microbatch gradients -> clipped sum"; ``per_example`` owns the ways
of getting per-microbatch gradients (Jacobian of a vector loss recorded on a tape, or
``tf.vectorized_map`` over microbatches of the inputs).  A faster per-layer path plugs in
beside them: ``layer_registry`` (per-layer norm rules, public) and ``fast_path`` (walks a Keras
layer graph), checked by ``testing.check_layer_rule``.
"""
from tf_dpkit.clipping.clipped_sum import ClippedSum, clip_and_sum, global_norms
from tf_dpkit.clipping.fast_path import clipped_sum_fast, fast_path_available
from tf_dpkit.clipping.layer_registry import LayerTrace, lookup_rule, register_layer_rule
from tf_dpkit.clipping.per_example import (
    clipped_sum_from_vector_loss,
    clipped_sum_vectorized,
    split_into_microbatches,
)

__all__ = [
    "clipped_sum_fast", "fast_path_available", "LayerTrace", "lookup_rule", "register_layer_rule",
    "ClippedSum", "clip_and_sum", "global_norms", "clipped_sum_from_vector_loss",
    "clipped_sum_vectorized", "split_into_microbatches",
]
