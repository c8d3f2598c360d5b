"""Book-keeping that makes non-private gradients impossible to apply by accident.

A DP optimizer remembers the exact tensor objects its private path produced; ``apply`` /
``apply_gradients`` accept only those.  Gradients from an ordinary ``tape.gradient`` (for
example Keras's default ``train_step`` after ``model.compile(optimizer=<DP optimizer>)``)
are refused with an error that says what to use instead.  The holder is a plain object so
that TensorFlow's checkpoint tracking never sees the tensors.
"""
from __future__ import annotations

NOT_PRIVATE_MESSAGE = (
    "{cls} received gradients that did not come from its differentially private path, so "
    "applying them would train WITHOUT privacy. Use `optimizer.minimize(vector_loss, var_list, "
    "tape=tape)` or `optimizer.compute_gradients(...)` followed by `apply_gradients`, or, for "
    "`model.fit`, build the model with `tf_dpkit.DPModel`, `tf_dpkit.DPSequential` or "
    "`tf_dpkit.make_dp_model_class(...)` instead of a plain `keras.Model`.")


STALE_MESSAGE = (
    "{cls} received private gradients that were already applied or were superseded by a later "
    "private gradient computation. Each private gradient may be applied once, right after it is "
    "computed: compute fresh private gradients for every step (re-applying one would count its "
    "privacy cost again without the accountant knowing).")

_REMEMBERED_STALE = 4


class PrivateGradientCertificate:
  """Holds the gradient tensors most recently produced by the private path."""

  __slots__ = ("_tensors", "_stale")

  def __init__(self):
    self._tensors = ()
    self._stale = ()

  def issue(self, grads):
    """Marks ``grads`` (a list of tensors/None) as private and returns it unchanged."""
    self._retire()
    self._tensors = tuple(g for g in grads if g is not None)
    return grads

  def check(self, grads, owner_name: str):
    """Raises ``ValueError`` unless every non-None entry of ``grads`` was issued last."""
    for g in grads:
      if g is None:
        continue
      if not any(g is issued for issued in self._tensors):
        stale = any(g is old for group in self._stale for old in group)
        raise ValueError((STALE_MESSAGE if stale else NOT_PRIVATE_MESSAGE).format(cls=owner_name))

  def clear(self):
    self._retire()

  def _retire(self):
    if self._tensors:
      self._stale = ((self._tensors,) + self._stale)[:_REMEMBERED_STALE]
    self._tensors = ()
