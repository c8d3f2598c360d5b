"""Per-microbatch gradients and their clipped sum: the one place DP-SGD touches gradients.

``clipped_sum`` owns "per-microbatch gradients -> clipped sum"; ``per_example`` owns the ways
of getting per-microbatch gradients (Jacobian of a vector loss recorded on a tape, or
``tf.vectorized_map`` over microbatches of the inputs).  A faster per-layer path plugs in
beside them by returning the same ``ClippedSum``.
"""
from tf_dpkit.clipping.clipped_sum import ClippedSum, clip_and_sum, global_norms
from tf_dpkit.clipping.per_example import (
    clipped_sum_from_vector_loss,
    clipped_sum_vectorized,
    split_into_microbatches,
)

__all__ = [
    "ClippedSum", "clip_and_sum", "global_norms", "clipped_sum_from_vector_loss",
    "clipped_sum_vectorized", "split_into_microbatches",
]
