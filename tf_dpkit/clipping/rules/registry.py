"""The rule registry: ``register_layer_rule`` and ``lookup_rule`` (exact class only).

A rule tells the fast path how to run one layer so that its per-microbatch weight-gradient
norms come from quantities the ordinary backward pass already has:

    rule(layer, inputs) -> LayerTrace(outputs, watched, squared_norms, clipped_sum=None)

* ``outputs``: the layer's output (what the next layer consumes), computed with the layer's own
  variables inside the caller's ``GradientTape``;
* ``watched``: the tensor ``z`` (usually the pre-activation), or a list of tensors, that
  depends on the layer's trainable variables directly, each with the batch as its leading axis;
  the caller obtains ``g = dL_i/dz`` (the same structure) for every example from one backward
  pass of the summed loss;
* ``squared_norms(g, num_groups) -> [M]``: the squared L2 norms of the per-microbatch gradients
  of the layer's trainable variables, where microbatch ``j`` holds examples ``j*k..(j+1)*k-1``
  (``k = B / M``) and ``g`` already carries each example's weight (``1/k`` for a mean);
* ``clipped_sum(factors)`` (optional): ``sum_j c_j grad_j`` from per-microbatch gradients that
  ``squared_norms`` already formed, or None; without it the fast path forms the clipped sum as
  one vector-Jacobian product ``dz/dW^T (c * g)``.  A rule keeps per-microbatch gradients
  only where ``_linear.keeping_costs_no_memory`` allows (or they are [M, C]-sized) and
  contracts them with ``clipped_sum.scaled_row_sum``.  Either way the sum is a linear function of
  the same ``g`` the norms were computed from, so each microbatch's share has exactly the norm
  that was clipped.

Rules are looked up by the layer's EXACT class: a subclass may override ``call`` or add
weights, so it gets the safe per-layer fallback unless its own rule is registered.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import keras
import tensorflow as tf


class LayerTrace(NamedTuple):
  """What a rule returns for one layer call (see the module docstring).

  ``clipped_sum(factors)`` is optional: called after ``squared_norms`` with the [M] clip factors,
  it may return the clipped sums for ``layer.trainable_variables`` from per-microbatch gradients
  that ``squared_norms`` already formed (book-keeping), or None to let the caller use the VJP.
  """
  outputs: tf.Tensor
  watched: tf.Tensor
  squared_norms: Callable[[tf.Tensor, int], tf.Tensor]
  clipped_sum: Callable[[tf.Tensor], list | None] | None = None




_RULES: dict[type, Callable] = {}


def register_layer_rule(layer_class: type, rule: Callable | None = None):
  """Registers ``rule(layer, inputs) -> LayerTrace`` for instances of exactly ``layer_class``.

  Use as a function, ``register_layer_rule(MyLayer, my_rule)``, or as a decorator,
  ``@register_layer_rule(MyLayer)``.  Only layers whose class is ``layer_class`` itself use the
  rule (subclasses need their own registration).  A rule may return ``None`` to decline a
  configuration; the fast path then replays the layer's exact call per example.  Check a rule
  with ``tf_dpkit.clipping.testing.check_layer_rule``.
  """
  if not (isinstance(layer_class, type) and issubclass(layer_class, keras.layers.Layer)):
    raise TypeError(f"layer_class must be a keras.layers.Layer subclass, got {layer_class!r}.")

  def register(fn):
    if not callable(fn):
      raise TypeError(f"rule must be callable, got {fn!r}.")
    _RULES[layer_class] = fn
    return fn
  return register if rule is None else register(rule)


def lookup_rule(layer) -> Callable | None:
  """Returns the rule registered for exactly ``type(layer)``, else None."""
  return _RULES.get(type(layer))
