"""The one rule for objects that hold a secret or private data: they cannot be pickled.

A pickle is bytes that leave the process (files, caches, worker processes, other machines), so
an object holding a secret (a noise key, a sampling seed, an augmentation key: knowing it
lets the noise be subtracted or the sampling be replayed) or raw private statistics (PATE vote
histograms, training data) refuses ``pickle`` with a ``TypeError`` that says what it holds and
what to do instead.  Every such class is decorated with :func:`refuse_pickling`; nothing else
in the code base defines its own refusal.

Copies inside the process (``copy.copy`` / ``copy.deepcopy``) release nothing and are allowed
for private statistics (``copies=True``: the copy holds the same data, as the original does).
Secrets refuse copies too (``copies=False``): a copy of a key draws the same noise as the
original, and two releases with the same noise let it cancel out.

No TensorFlow import (used by :mod:`analysis` and :mod:`tf_dpkit`).
"""
from __future__ import annotations

import copy as _copy

__all__ = ["refuse_pickling"]


def _state(obj) -> dict:
  """The instance's attributes: ``__dict__`` and every ``__slots__`` entry that is set."""
  state = dict(getattr(obj, "__dict__", {}))
  for klass in type(obj).__mro__:
    slots = klass.__dict__.get("__slots__", ())
    for name in ((slots,) if isinstance(slots, str) else slots):
      if name not in ("__dict__", "__weakref__") and hasattr(obj, name):
        state[name] = getattr(obj, name)
  return state


def _copied(obj, value_copy, memo=None):
  klass = type(obj)
  new = klass.__new__(klass)
  if memo is not None:
    memo[id(obj)] = new
  for name, value in _state(obj).items():
    object.__setattr__(new, name, value_copy(value))
  return new


def refuse_pickling(holds: str, *, copies: bool, instead: str = ""):
  """Class decorator: instances refuse ``pickle`` (and, unless ``copies``, copying).

  Args:
    holds: what the object holds, for the message, e.g. ``"the raw PATE vote histograms"``.
    copies: True: ``copy.copy`` / ``copy.deepcopy`` work (attribute by attribute); False: they
      raise the same ``TypeError`` as ``pickle``.
    instead: optional sentence appended to the message (what to save or send instead).

  Returns:
    The decorator; it sets ``__reduce_ex__``, ``__reduce__`` and ``__getstate__`` (and
    ``__copy__`` / ``__deepcopy__``) on the class and returns it.
  """
  def decorate(klass):
    def refuse(self, *args, **kwargs):
      action = "pickled" if copies else "pickled or copied"
      why = ("a pickle can leave the process" if copies else
             "a pickle can leave the process, and a copy would reuse the same secret")
      raise TypeError(f"{type(self).__name__} holds {holds}: it cannot be {action} ({why})."
                      + (f" {instead}" if instead else ""))

    klass.__reduce_ex__ = refuse
    klass.__reduce__ = refuse
    klass.__getstate__ = refuse
    if copies:
      def __copy__(self):
        return _copied(self, lambda value: value)

      def __deepcopy__(self, memo):
        return _copied(self, lambda value: _copy.deepcopy(value, memo), memo)

      klass.__copy__ = __copy__
      klass.__deepcopy__ = __deepcopy__
    else:
      klass.__copy__ = refuse
      klass.__deepcopy__ = refuse
    klass._refuses_pickling = holds
    return klass

  return decorate
