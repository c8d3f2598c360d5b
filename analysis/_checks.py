"""Argument validation shared by the accounting modules.

Every check raises ``ValueError`` whose message names the argument, the allowed range and
the value received, so a bad input can never turn into a silently wrong epsilon.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

#: Largest step count accepted by the accountants: 2**53, the largest integer up to which every
#: integer is exactly a float64 (RDP and the PLD exponents multiply by ``steps`` in float64).
MAX_STEPS = 2**53


def _describe(value) -> str:
  if isinstance(value, numbers.Integral) and not isinstance(value, bool) and abs(value) >= 10**18:
    digits = str(abs(int(value)))
    sign = "-" if value < 0 else ""
    return f"{sign}{digits[0]}.{digits[1:4]}e+{len(digits) - 1} (an integer of {len(digits)} digits)"
  return repr(value)


def check_probability(name: str, value, *, allow_zero: bool = True) -> float:
  """Returns ``value`` as float; requires it in [0, 1] (or (0, 1] if not allow_zero)."""
  value = check_real(name, value, allow_nan=True)
  low_ok = value >= 0.0 if allow_zero else value > 0.0
  if not (low_ok and value <= 1.0):
    interval = "[0, 1]" if allow_zero else "(0, 1]"
    raise ValueError(f"{name} must be in {interval}, got {_describe(value)}.")
  return value


def check_real(name: str, value, *, allow_nan: bool = False) -> float:
  """Returns ``value`` as a float; requires a real number (inf allowed; NaN only if
  ``allow_nan``, for callers whose range check then names the allowed interval)."""
  if isinstance(value, bool) or not isinstance(value, (numbers.Real, np.floating, np.integer)):
    if not (isinstance(value, np.ndarray) and value.ndim == 0):
      raise ValueError(f"{name} must be a real number, got {_describe(value)}.")
  value = float(value)
  if math.isnan(value) and not allow_nan:
    raise ValueError(f"{name} must not be NaN.")
  return value


def check_nonnegative(name: str, value) -> float:
  """Returns ``value`` as float; requires it in [0, inf]."""
  value = check_real(name, value, allow_nan=True)
  if not value >= 0.0:
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
  value = check_real(name, value, allow_nan=True)
  if not 0.0 < value < 1.0:
    raise ValueError(f"{name} must be in (0, 1), got {_describe(value)}.")
  return value


def delta_warning(delta: float, num_examples: int) -> str | None:
  """The warning for a ``delta`` that is not below ``1/N`` (None when it is).

  A mechanism that publishes one random example outright is ``(0, 1/N)``-DP, so a guarantee
  with ``delta >= 1/N`` says almost nothing; ``delta`` should be well below ``1/N``.
  """
  if delta < 1.0 / num_examples:
    return None
  return (f"delta={delta:g} is not below 1/N = {1.0 / num_examples:g}: a mechanism that "
          "publishes one random example outright meets it. Use a delta well below 1/N.")


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


def check_steps(name: str, value, *, maximum: int = MAX_STEPS, why: str = "") -> int:
  """Returns ``value`` as int; requires an integer (int or integral float) in [0, maximum].

  A non-integer or negative value gets :func:`check_count`'s message; a value above
  ``maximum`` (default :data:`MAX_STEPS` = 2**53) names the supported range, e.g. for
  ``steps=10**400``, instead of overflowing later.
  """
  result = check_count(name, value, minimum=0)
  if result > maximum:
    limit = "2**53 = 9007199254740992" if maximum == MAX_STEPS else f"{maximum}"
    reason = f" ({why})" if why else ""
    raise ValueError(f"{name} must be an integer in [0, {limit}]{reason}, got "
                     f"{_describe(result)}.")
  return result


def check_finite_positive(name: str, value) -> float:
  """Returns ``value`` as float; requires a finite number in (0, inf)."""
  return _check_finite_from(name, value, low_open=True)


def _check_finite_from(name: str, value, *, low_open: bool) -> float:
  interval = "(0, inf)" if low_open else "[0, inf)"
  try:
    number = check_real(name, value)
  except ValueError:
    number = math.nan
  if not (math.isfinite(number) and (number > 0.0 if low_open else number >= 0.0)):
    raise ValueError(f"{name} must be a finite number in {interval}, got {_describe(value)}.")
  return number


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


def check_orders(name: str, orders, *, max_finite: float = math.inf) -> tuple[np.ndarray, bool]:
  """Returns ``(orders as a 1-D float array, whether a scalar was given)``.

  Accepts one real number or a non-empty list, tuple or 1-D array of them.  Every order must
  be a real, non-NaN number in (1, inf]: order 1 itself (the KL limit) and anything below it
  are rejected; finite orders above ``max_finite`` (where given) are rejected too.  An empty
  sequence is rejected: with no order there is nothing to minimise over.
  """
  if isinstance(orders, (list, tuple)) or (isinstance(orders, np.ndarray) and orders.ndim == 1):
    if len(orders) == 0:
      raise ValueError(f"{name} must not be empty: give at least one Renyi order in (1, inf].")
    values = [check_real(f"{name}[{i}]", v) for i, v in enumerate(orders)]
    scalar = False
  else:
    values = [check_real(name, orders)]
    scalar = True
  for i, v in enumerate(values):
    where = name if scalar else f"{name}[{i}]"
    if not v > 1.0:
      raise ValueError(f"{where} must be a Renyi order in (1, inf], got {_describe(v)}.")
    if max_finite < v < math.inf:
      limit = f"{max_finite:.0e}".replace("e+0", "e").replace("e+", "e")
      raise ValueError(f"{where} must be a Renyi order in (1, {limit}] or inf, got "
                       f"{_describe(v)}.")
  return np.asarray(values, dtype=np.float64), scalar


def check_choice(name: str, value, choices) -> str:
  """Returns ``value``; requires it to be one of the strings in ``choices``."""
  if not isinstance(value, str) or value not in choices:
    raise ValueError(f"{name} must be one of {sorted(choices)}, got {_describe(value)}.")
  return value


def check_finite_nonnegative(name: str, value) -> float:
  """Returns ``value`` as float; requires a finite number in [0, inf)."""
  return _check_finite_from(name, value, low_open=False)


def check_integer(name: str, value, *, minimum: int, maximum: int | None = None,
                  none_allowed: bool = False) -> int:
  """Returns ``value`` as int; requires a Python/NumPy integer (not bool, not a float) in
  ``[minimum, maximum]`` (no upper bound when ``maximum`` is None)."""
  if (isinstance(value, bool) or not isinstance(value, (numbers.Integral, np.integer))
      or value < minimum or (maximum is not None and value > maximum)):
    also = "None or " if none_allowed else ""
    top = "inf" if maximum is None else maximum
    raise ValueError(f"{name} must be {also}an integer in [{minimum}, {top}], got "
                     f"{_describe(value)}.")
  return int(value)
