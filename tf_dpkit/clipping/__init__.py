"""Per-microbatch gradients and their clipped sum: the one place DP-SGD touches gradients.

``clipped_sum`` owns "per-microbatch gradients -> clipped sum" and the ``ClippedSum`` value that
DP optimizers accept; ``contract`` owns the per-example contract (one loss and one weight per
example, each computed from that example alone); ``per_example`` owns the general ways of getting
per-microbatch gradients (Jacobian of a vector loss recorded on a tape, or a map over
microbatches of the inputs).  The faster per-layer path is ``fast_path`` (walks a Keras layer
graph) with ``rules`` (one file per layer, registered on the exact layer class), checked by
``testing.check_layer_rule``.  ``groups`` holds per-layer (group-wise) clip norms.
``_keras_internals`` holds every private Keras API they use.
"""
import importlib

from tf_dpkit.clipping.clipped_sum import ClippedSum, clip_and_sum, global_norms
from tf_dpkit.clipping.contract import per_example_losses, per_example_weights
from tf_dpkit.clipping.fast_path import clipped_sum_fast, fast_path_available
from tf_dpkit.clipping.groups import LayerClipNorms
from tf_dpkit.clipping.per_example import (
    clipped_sum_from_vector_loss,
    clipped_sum_vectorized,
    split_into_microbatches,
)
from tf_dpkit.clipping.rules import LayerTrace, lookup_rule, register_layer_rule

__all__ = [
    "clipped_sum_fast", "fast_path_available", "LayerTrace", "lookup_rule", "register_layer_rule",
    "ClippedSum", "clip_and_sum", "global_norms", "clipped_sum_from_vector_loss",
    "clipped_sum_vectorized", "split_into_microbatches", "per_example_losses",
    "per_example_weights", "LayerClipNorms",
]


def __getattr__(name):
  """Loads a renamed module's deprecated alias (examples) on first attribute access."""
  if name in ("examples",):
    return importlib.import_module(f"{__name__}.{name}")
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
