"""Deprecated alias of :mod:`tf_dpkit.dp_gradients`, removed in the next release.

The one call from (model, per-example loss, batch) to private gradients moved to
``tf_dpkit.dp_gradients``, so that the name tells it apart from the DP Keras models
(``tf_dpkit.dp_models``).  Use ``tf_dpkit.private_gradients`` or import from
``tf_dpkit.dp_gradients``; the names below are the same objects.
"""
from tf_dpkit.dp_gradients import METHODS, clipped_sum_for_model, private_gradients, resolve_method

__all__ = ["METHODS", "clipped_sum_for_model", "private_gradients", "resolve_method"]
