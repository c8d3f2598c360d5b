"""Piecewise-constant schedules of DP-SGD settings, and the event of a scheduled run.

A :class:`PiecewiseConstant` schedule with ``boundaries = [b_1 < ... < b_k]`` and ``values =
[v_0, ..., v_k]`` takes the value ``v_i`` at the (0-based) steps ``b_i <= t < b_{i+1}`` (with
``b_0 = 0``, ``b_{k+1} = inf``): step ``t`` is the one that moves the optimizer's step counter
from ``t`` to ``t + 1``.

Privacy of a schedule:

* a **clip-norm** schedule costs nothing: DP-SGD's noise is ``sigma C_t`` for the sum clipped at
  ``C_t``, so each step is the Gaussian of noise multiplier ``sigma`` whatever ``C_t`` is (the
  schedule is fixed in advance, independent of the data);
* a **noise-multiplier** schedule makes the run a composition of different events: the steps
  with ``sigma = v_i`` are ``analysis.dp_sgd.dp_sgd_event(v_i, n_i, ...)`` and the run is their
  :class:`analysis.events.ComposedEvent` (:func:`scheduled_dp_sgd_event`), the event every
  accountant composes.

No TensorFlow import.
"""
from __future__ import annotations

import bisect
import math

from analysis import _checks, dp_sgd, events

__all__ = ["PiecewiseConstant", "as_schedule", "scheduled_dp_sgd_event"]


class PiecewiseConstant:
  """A piecewise-constant function of the step (see the module docstring).

  Args:
    boundaries: strictly increasing integers >= 1 (the steps at which the value changes); may
      be empty (a constant).
    values: ``len(boundaries) + 1`` finite numbers >= 0 (or > 0 with ``positive=True``).
    name: the argument name used in error messages (``"noise_multiplier"``, ``"l2_norm_clip"``).
    positive: require values > 0 (clip norms).
  """

  def __init__(self, boundaries, values, *, name: str = "values", positive: bool = False):
    boundaries, values = list(boundaries), list(values)
    for i, b in enumerate(boundaries):
      _checks.check_integer(f"{name} boundaries[{i}]", b, minimum=1,
                            maximum=_checks.MAX_STEPS)
    if any(b1 >= b2 for b1, b2 in zip(boundaries, boundaries[1:])):
      raise ValueError(f"{name} boundaries must be strictly increasing, got {boundaries}.")
    if len(values) != len(boundaries) + 1:
      raise ValueError(f"{name} needs len(boundaries) + 1 = {len(boundaries) + 1} values (one "
                       f"before the first boundary and one after each), got {len(values)}.")
    check = _checks.check_finite_positive if positive else _checks.check_finite_nonnegative
    self.boundaries = tuple(int(b) for b in boundaries)
    self.values = tuple(check(f"{name} values[{i}]", v) for i, v in enumerate(values))
    self.name = name

  def __repr__(self):
    return f"PiecewiseConstant(boundaries={list(self.boundaries)}, values={list(self.values)})"

  def __eq__(self, other):
    return (isinstance(other, PiecewiseConstant) and other.boundaries == self.boundaries
            and other.values == self.values)

  def __hash__(self):
    return hash((self.boundaries, self.values))

  @property
  def num_pieces(self) -> int:
    """The number of runs of equal consecutive values (what a ledger needs rows for)."""
    return len(self.pieces(0, (self.boundaries[-1] if self.boundaries else 0) + 1))

  def value_at(self, step: int) -> float:
    """The value at the 0-based ``step`` (an integer >= 0)."""
    step = _checks.check_steps("step", step)
    return self.values[bisect.bisect_right(self.boundaries, step)]

  def pieces(self, start: int, stop: int) -> list:
    """``[(value, count), ...]`` over the steps ``start <= t < stop`` in order, equal
    consecutive values merged; empty when ``stop <= start``."""
    start, stop = _checks.check_steps("start", start), _checks.check_steps("stop", stop)
    out = []
    edges = [0, *self.boundaries, math.inf]
    for i, value in enumerate(self.values):
      count = min(stop, edges[i + 1]) - max(start, edges[i])
      if count <= 0:
        continue
      if out and out[-1][0] == value:
        out[-1] = (value, out[-1][1] + int(count))
      else:
        out.append((value, int(count)))
    return out

  def get_config(self) -> dict:
    return {"boundaries": list(self.boundaries), "values": list(self.values)}


def as_schedule(name: str, value, *, positive: bool):
  """``value`` as a :class:`PiecewiseConstant` if it is one (or its config dict
  ``{"boundaries": [...], "values": [...]}``), else None (a plain number, checked by the
  caller)."""
  if isinstance(value, PiecewiseConstant):
    return PiecewiseConstant(value.boundaries, value.values, name=name, positive=positive)
  if isinstance(value, dict):
    unknown = sorted(set(value) - {"boundaries", "values"})
    if unknown or "values" not in value:
      raise ValueError(f"{name} as a dict must be a piecewise-constant schedule "
                       f"{{'boundaries': [...], 'values': [...]}}, got keys {sorted(value)}.")
    return PiecewiseConstant(value.get("boundaries", ()), value["values"], name=name,
                             positive=positive)
  return None


def scheduled_dp_sgd_event(noise_multiplier, start: int, stop: int, **kwargs) -> events.DpEvent:
  """The event of DP-SGD steps ``start <= t < stop`` under a noise-multiplier schedule.

  ``noise_multiplier``: a number or a :class:`PiecewiseConstant`; ``kwargs`` go to
  ``analysis.dp_sgd.dp_sgd_event`` (sampling, sampling_probability, microbatch_size, ...).
  Returns ``ComposedEvent([dp_sgd_event(v_i, n_i, **kwargs) for each piece])`` (one event
  when the noise is constant over the range; a composition with no pieces when it is empty).
  """
  schedule = as_schedule("noise_multiplier", noise_multiplier, positive=False)
  if schedule is None:
    return dp_sgd.dp_sgd_event(noise_multiplier, _checks.check_steps("stop", stop)
                               - _checks.check_steps("start", start), **kwargs)
  parts = tuple(dp_sgd.dp_sgd_event(value, count, **kwargs)
                for value, count in schedule.pieces(start, stop))
  return parts[0] if len(parts) == 1 else events.ComposedEvent(parts)
