"""Argument validation shared by the accounting modules.

Every check raises ``ValueError`` whose message names the argument, the allowed range and
the value received, so a bad input can never turn into a silently wrong epsilon.
"""
from __future__ import annotations

import math
import numbers

import numpy as np


def _describe(value) -> str:
  return repr(value)


def check_probability(name: str, value, *, allow_zero: bool = True) -> float:
  """Returns ``value`` as float; requires it in [0, 1] (or (0, 1] if not allow_zero)."""
  value = check_real(name, value)
  low_ok = value >= 0.0 if allow_zero else value > 0.0
  if not (low_ok and value <= 1.0):
    interval = "[0, 1]" if allow_zero else "(0, 1]"
    raise ValueError(f"{name} must be in {interval}, got {_describe(value)}.")
  return value


def check_real(name: str, value) -> float:
  """Returns ``value`` as a float; requires a real, non-NaN number (inf allowed)."""
  if isinstance(value, bool) or not isinstance(value, (numbers.Real, np.floating, np.integer)):
    if not (isinstance(value, np.ndarray) and value.ndim == 0):
      raise ValueError(f"{name} must be a real number, got {_describe(value)}.")
  value = float(value)
  if math.isnan(value):
    raise ValueError(f"{name} must not be NaN.")
  return value


def check_nonnegative(name: str, value) -> float:
  """Returns ``value`` as float; requires it in [0, inf)."""
  value = check_real(name, value)
  if value < 0.0:
    raise ValueError(f"{name} must be >= 0, got {_describe(value)}.")
  return value


def check_positive(name: str, value) -> float:
  """Returns ``value`` as float; requires it in (0, inf)."""
  value = check_real(name, value)
  if not value > 0.0:
    raise ValueError(f"{name} must be > 0, got {_describe(value)}.")
  return value


def check_delta(name: str, value) -> float:
  """Returns ``value`` as float; requires it in the open interval (0, 1)."""
  value = check_real(name, value)
  if not 0.0 < value < 1.0:
    raise ValueError(f"{name} must be in (0, 1), got {_describe(value)}.")
  return value


def check_count(name: str, value, *, minimum: int = 0) -> int:
  """Returns ``value`` as int; requires an integer (int or integral float) >= minimum."""
  if isinstance(value, bool):
    raise ValueError(f"{name} must be an integer >= {minimum}, got {_describe(value)}.")
  if isinstance(value, (numbers.Integral, np.integer)):
    result = int(value)
  elif isinstance(value, (numbers.Real, np.floating)) and float(value).is_integer():
    result = int(value)
  else:
    raise ValueError(f"{name} must be an integer >= {minimum}, got {_describe(value)}.")
  if result < minimum:
    raise ValueError(f"{name} must be an integer >= {minimum}, got {_describe(value)}.")
  return result


def check_finite_positive(name: str, value) -> float:
  """Returns ``value`` as float; requires it in (0, inf) and finite."""
  value = check_positive(name, value)
  if math.isinf(value):
    raise ValueError(f"{name} must be finite and > 0, got {_describe(value)}.")
  return value


def check_same_length(**sequences) -> int:
  """Returns the common length of the named sequences (list, tuple or 1-D array).

  Raises ``ValueError`` naming the argument if one is not such a sequence, or naming all of
  them with their lengths if the lengths differ.
  """
  lengths = {}
  for name, seq in sequences.items():
    if isinstance(seq, np.ndarray):
      if seq.ndim != 1:
        raise ValueError(f"{name} must be a 1-D sequence, got an array of shape {seq.shape}.")
    elif isinstance(seq, (str, bytes)) or not isinstance(seq, (list, tuple)):
      raise ValueError(f"{name} must be a list, tuple or 1-D array, got {_describe(seq)}.")
    lengths[name] = len(seq)
  if len(set(lengths.values())) > 1:
    described = ", ".join(f"{name} has {n}" for name, n in lengths.items())
    raise ValueError(f"Sequences must have the same length: {described}.")
  return next(iter(lengths.values()), 0)


def check_orders(name: str, orders) -> tuple[np.ndarray, bool]:
  """Returns ``(orders as a 1-D float array, whether a scalar was given)``.

  Accepts one real number or a list, tuple or 1-D array of them.  Every order must be a real,
  non-NaN number in (1, inf]: order 1 itself (the KL limit) and anything below it are rejected.
  """
  if isinstance(orders, (list, tuple)) or (isinstance(orders, np.ndarray) and orders.ndim == 1):
    values = [check_real(f"{name}[{i}]", v) for i, v in enumerate(orders)]
    scalar = False
  else:
    values = [check_real(name, orders)]
    scalar = True
  for i, v in enumerate(values):
    if not v > 1.0:
      where = name if scalar else f"{name}[{i}]"
      raise ValueError(f"{where} must be a Renyi order in (1, inf], got {_describe(v)}.")
  return np.asarray(values, dtype=np.float64), scalar


def check_choice(name: str, value, choices) -> str:
  """Returns ``value``; requires it to be one of the strings in ``choices``."""
  if not isinstance(value, str) or value not in choices:
    raise ValueError(f"{name} must be one of {sorted(choices)}, got {_describe(value)}.")
  return value
