"""Deprecated alias of :mod:`tf_dpkit.clipping.contract`, removed in the next release.

The per-example contract (one loss and one weight per example, each computed from that example
alone) moved to ``tf_dpkit.clipping.contract``, a name that says what it holds.  Import from
there instead; the names below are the same objects.
"""
from tf_dpkit.clipping.contract import (
    check_loss_is_per_example,
    check_per_example_shape,
    isolated_per_example_losses,
    loss_is_isolated_per_example,
    map_examples,
    mark_per_example,
    per_example_loss_function,
    per_example_losses,
    per_example_weights,
    pfor_is_safe,
)

__all__ = ["check_loss_is_per_example", "check_per_example_shape", "isolated_per_example_losses",
           "loss_is_isolated_per_example", "map_examples", "mark_per_example", "pfor_is_safe",
           "per_example_loss_function", "per_example_losses", "per_example_weights"]
