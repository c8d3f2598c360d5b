"""tf_dpkit's TensorFlow code is graph code: autograph does not rewrite it.

Autograph rewrites every Python function that a function it converts calls, unless the callee's
module is on TensorFlow's list (``tensorflow``, ``keras``, ``numpy``, ...) or the callee is
marked as one of autograph's own artifacts.  tf_dpkit is not on the list, so a user's
``@tf.function`` step calling ``optimizer.minimize`` once made autograph transpile a few hundred
of tf_dpkit's functions at its first trace.  The rule, kept here only:

* entry points a user calls inside their own ``tf.function`` are :func:`graph_code`: autograph
  calls them as written (and so everything they call), leaving the user's autograph setting as
  it is, exactly as it calls TensorFlow's and Keras's functions;
* tf_dpkit's own ``tf.function`` steps are made by :func:`function` (``autograph=False``);
* a callable the user hands in (a zero-argument loss, TF Privacy's callable ``var_list``) is
  converted when the user's own code is (:func:`user_function`, TensorFlow's ``tf_convert``
  contract for functions that take user code), so its ``if``/``for`` on tensors work as in the
  user's ``tf.function``.

Library code therefore branches on tensors with ``tf.cond`` / ``tf.while_loop`` only (a Python
``if`` on a symbolic tensor raises at trace time; it cannot silently change a step).  Design:
``docs/design/autograph.md``.
"""
from __future__ import annotations

import functools
import inspect
import types

import tensorflow as tf
from tensorflow.python.autograph.impl import api as _autograph_api  # pylint: disable=g-direct-tensorflow-import

__all__ = ["function", "graph_code", "user_function"]

_USER_CODE_EXCLUDED = ("tf_dpkit", "tensorflow", "keras", "builtins")


def graph_code(fn):
  """Marks ``fn`` (a function, or a class: its instances when called, and its constructor) so
  that autograph calls it as written from converted code; returns ``fn``.

  The mark is the one autograph puts on its own generated functions; it changes nothing else
  (no wrapper: names, docstrings, signatures and warning stack levels stay ``fn``'s).  On a
  class it is inherited, so a user's subclass of a DP model is called as written too, as
  Keras's own models are.
  """
  return _autograph_api.autograph_artifact(fn)


def function(fn=None, **kwargs):
  """``tf.function(fn, autograph=False, **kwargs)``: a tf_dpkit step traced as written."""
  if "autograph" in kwargs:
    raise TypeError("tf_dpkit's steps are traced without autograph; do not pass autograph=.")
  if fn is None:
    return lambda f: tf.function(f, autograph=False, **kwargs)
  return tf.function(fn, autograph=False, **kwargs)


def _defining_module(fn) -> str:
  """Top-level package that defines ``fn`` (a function, method, ``functools.partial`` or callable
  object)."""
  target = fn
  while isinstance(target, functools.partial):
    target = target.func
  if inspect.ismethod(target):
    target = target.__func__
  if not isinstance(target, types.FunctionType):
    target = type(target)
  return (getattr(target, "__module__", None) or "").split(".")[0]


def user_function(fn):
  """``fn`` converted by autograph if the code calling tf_dpkit is (a user's ``tf.function`` with
  autograph on), else ``fn`` as written.  Functions, lambdas, methods, ``functools.partial``
  objects and callable objects are converted, except those defined by TensorFlow, Keras,
  tf_dpkit or Python's builtins (returned unchanged, as are classes and non-callables).

  A function autograph cannot convert (no source, e.g. defined in an interactive session) runs
  as written, with autograph's usual warning.
  """
  if not callable(fn) or isinstance(fn, type) or _defining_module(fn) in _USER_CODE_EXCLUDED:
    return fn
  return tf.__internal__.autograph.tf_convert(
      fn, tf.__internal__.autograph.control_status_ctx(), convert_by_default=False)
