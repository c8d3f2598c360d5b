"""Tests of analysis.events: validation, immutability, flatten, relations and export.

The expected atoms, epochs and relations are worked out by hand from the module's rules; the
export is compared with dp_accounting events built by hand.
"""
from __future__ import annotations

import dataclasses
import fractions
import math
import re

import numpy as np
import pytest

from analysis import events
from analysis.events import (ADD_OR_REMOVE_ONE, REPLACE_ONE, ZERO_OUT, Atom, ComposedEvent,
                             GaussianEvent, IncompatibleEventsError, PoissonSampledEvent,
                             SampledWithoutReplacementEvent, SelfComposedEvent, ShuffledEvent,
                             UnsupportedEventError)
from dp_references import dp_accounting as _dp_accounting

G = GaussianEvent
P = PoissonSampledEvent
W = SampledWithoutReplacementEvent
S = ShuffledEvent
SC = SelfComposedEvent
C = ComposedEvent
TWO_53 = "2**53 = 9007199254740992"
NOT_EVENT = "must be an analysis.events event (e.g. GaussianEvent), got"


# ------------------------------------------------------------------------------------------
# Validation: every field, every way out of its range; the message names field and range.

_INVALID = [
    # GaussianEvent.noise_multiplier in [0, inf]
    (lambda: G(-1.0), "noise_multiplier must be >= 0, got -1.0."),
    (lambda: G(-math.inf), "noise_multiplier must be >= 0, got -inf."),
    (lambda: G("1"), "noise_multiplier must be a real number, got '1'."),
    (lambda: G(True), "noise_multiplier must be a real number, got True."),
    (lambda: G(None), "noise_multiplier must be a real number, got None."),
    # PoissonSampledEvent.sampling_probability in [0, 1], event an event
    (lambda: P(1.5, G(1.0)), "sampling_probability must be in [0, 1], got 1.5."),
    (lambda: P(-0.1, G(1.0)), "sampling_probability must be in [0, 1], got -0.1."),
    (lambda: P(math.nan, G(1.0)), "sampling_probability must be in [0, 1], got nan."),
    (lambda: P("0.5", G(1.0)), "sampling_probability must be a real number, got '0.5'."),
    (lambda: P(0.5, 1.0), f"event {NOT_EVENT} float 1.0."),
    (lambda: P(0.5, None), f"event {NOT_EVENT} NoneType None."),
    # SampledWithoutReplacementEvent: source_size >= 1, sample_size in [0, source_size]
    (lambda: W(0, 0, G(1.0)), "source_size must be an integer in [1, inf], got 0."),
    (lambda: W(10.0, 1, G(1.0)), "source_size must be an integer in [1, inf], got 10.0."),
    (lambda: W(True, 1, G(1.0)), "source_size must be an integer in [1, inf], got True."),
    (lambda: W(10, 11, G(1.0)), "sample_size must be an integer in [0, 10], got 11."),
    (lambda: W(10, -1, G(1.0)), "sample_size must be an integer in [0, 10], got -1."),
    (lambda: W(10, 1.0, G(1.0)), "sample_size must be an integer in [0, 10], got 1.0."),
    (lambda: W(10, 1, "g"), f"event {NOT_EVENT} str 'g'."),
    # ShuffledEvent: event, steps in [0, 2**53], steps_per_epoch >= 1
    (lambda: S(1, 1, 1), f"event {NOT_EVENT} int 1."),
    (lambda: S(G(1.0), -1, 1), "steps must be an integer >= 0, got -1."),
    (lambda: S(G(1.0), 1.5, 1), "steps must be an integer >= 0, got 1.5."),
    (lambda: S(G(1.0), 2**53 + 1, 1),
     f"steps must be an integer in [0, {TWO_53}], got 9007199254740993."),
    (lambda: S(G(1.0), 1, 0), "steps_per_epoch must be an integer in [1, inf], got 0."),
    (lambda: S(G(1.0), 1, 2.0), "steps_per_epoch must be an integer in [1, inf], got 2.0."),
    # SelfComposedEvent: event, count in [0, 2**53]
    (lambda: SC("x", 1), f"event {NOT_EVENT} str 'x'."),
    (lambda: SC(G(1.0), -1), "count must be an integer >= 0, got -1."),
    (lambda: SC(G(1.0), 1.5), "count must be an integer >= 0, got 1.5."),
    (lambda: SC(G(1.0), True), "count must be an integer >= 0, got True."),
    (lambda: SC(G(1.0), 2**53 + 1),
     f"count must be an integer in [0, {TWO_53}], got 9007199254740993."),
    # ComposedEvent: a sequence of events
    (lambda: C(G(1.0)), "events must be a sequence of events, got "
                        "GaussianEvent(noise_multiplier=1.0)."),
    (lambda: C("ab"), "events must be a sequence of events, got 'ab'."),
    (lambda: C(5), "events must be a sequence of events, got 5."),
    (lambda: C([G(1.0), 3]), f"events[1] {NOT_EVENT} int 3."),
]


@pytest.mark.parametrize("make,message", _INVALID)
def test_invalid_fields_name_the_field_and_its_range(make, message):
  with pytest.raises(ValueError) as info:
    make()
  assert str(info.value) == message


def test_nan_noise_multiplier_names_the_range():
  with pytest.raises(ValueError, match=r"^noise_multiplier must be (>= 0|in \[0, inf\])"):
    G(math.nan)


def test_boundary_values_are_accepted_and_normalised():
  assert G(0).noise_multiplier == 0.0 and G(math.inf).noise_multiplier == math.inf
  assert type(G(2).noise_multiplier) is float and type(G(np.float32(2)).noise_multiplier) is float
  assert P(0, G(1.0)).sampling_probability == 0.0 and P(1, G(1.0)).sampling_probability == 1.0
  w = W(np.int64(10), np.int32(10), G(1.0))
  assert (w.source_size, w.sample_size) == (10, 10)
  assert type(w.source_size) is int and type(w.sample_size) is int
  assert W(1, 0, G(1.0)).sample_size == 0
  assert S(G(1.0), 0, 1).steps == 0 and S(G(1.0), 2**53, 1).steps == 2**53
  assert SC(G(1.0), 0).count == 0 and SC(G(1.0), 2**53).count == 2**53
  assert C([]).events == () and C(iter([G(1.0)])).events == (G(1.0),)


# ------------------------------------------------------------------------------------------
# Frozen, hashable, comparable.

_SAMPLES = [
    G(1.0), P(0.01, G(1.1)), W(100, 10, G(0.5)), S(G(2.0), 10, 3), SC(G(1.0), 4),
    C([G(1.0), SC(P(0.1, G(2.0)), 3), S(G(1.0), 5, 2)]),
]


@pytest.mark.parametrize("event", _SAMPLES, ids=lambda e: type(e).__name__)
def test_events_are_frozen(event):
  field = dataclasses.fields(event)[0].name
  with pytest.raises(dataclasses.FrozenInstanceError):
    setattr(event, field, getattr(event, field))
  assert isinstance(event, events.DpEvent)


def test_events_are_hashable_and_compare_by_value():
  twins = [
      G(1), P(0.01, G(1.1)), W(100, 10, G(0.5)), S(G(2), 10, 3), SC(G(1), 4),
      C((G(1), SC(P(0.1, G(2)), 3), S(G(1), 5, 2))),
  ]
  for a, b in zip(_SAMPLES, twins):
    assert a == b and hash(a) == hash(b) and a is not b
  assert len(set(_SAMPLES + twins)) == len(_SAMPLES)
  assert {e: i for i, e in enumerate(_SAMPLES)}[twins[-1]] == len(_SAMPLES) - 1
  assert G(1.0) != G(1.1) and P(0.1, G(1)) != P(0.2, G(1)) and S(G(1), 10, 3) != S(G(1), 10, 4)
  assert C([G(1), G(2)]) != C([G(2), G(1)]) and SC(G(1), 2) != C([G(1), G(1)])
  # A list given to ComposedEvent is frozen into a tuple: later changes to it do not leak.
  parts = [G(1.0)]
  composed = C(parts)
  parts.append(G(2.0))
  assert composed.events == (G(1.0),)


# ------------------------------------------------------------------------------------------
# flatten.


def _atom(sigma, sampling=None, count=1, relation=ADD_OR_REMOVE_ONE):
  return Atom(sigma, sampling, count, relation)


def test_flatten_single_events():
  assert events.flatten(G(1.5)) == [_atom(1.5)]
  assert events.flatten(P(0.01, G(1.1))) == [_atom(1.1, 0.01)]
  assert events.flatten(W(100, 10, G(0.5))) == [_atom(0.5, (100, 10), 1, REPLACE_ONE)]
  assert events.flatten(S(G(2.0), 10, 3)) == [_atom(2.0, None, 4, ZERO_OUT)]
  assert events.flatten(SC(G(1.0), 7)) == [_atom(1.0, None, 7)]
  assert events.flatten(G(1.0), 5) == [_atom(1.0, None, 5)]
  assert events.flatten(C([])) == [] and events.flatten(G(1.0), 0) == []


def test_flatten_merges_equal_neighbours_only():
  flat = events.flatten(C([G(1.0), G(1.0), P(0.1, G(2.0)), SC(P(0.1, G(2.0)), 3), G(1.0)]))
  assert flat == [_atom(1.0, None, 2), _atom(2.0, 0.1, 4), _atom(1.0, None, 1)]
  # Same sigma, different sampling or relation: not merged.
  flat = events.flatten(C([G(1.0), P(0.1, G(1.0)), S(G(1.0), 1, 1), G(1.0)]))
  assert flat == [_atom(1.0), _atom(1.0, 0.1), _atom(1.0, None, 1, ZERO_OUT), _atom(1.0)]
  # Poisson with q = 1 is the plain Gaussian and merges with it.
  assert events.flatten(C([G(3.0), P(1.0, G(3.0)), SC(P(1, G(3.0)), 2)])) == [_atom(3.0, None, 4)]


def test_flatten_multiplies_counts_through_nesting():
  inner = C([SC(P(0.01, G(1.0)), 3), C([G(2.0), SC(G(2.0), 2)])])
  assert events.flatten(SC(inner, 7)) == [_atom(1.0, 0.01, 21), _atom(2.0, None, 21)]
  assert events.flatten(SC(SC(SC(W(10, 2, G(1.0)), 2), 3), 5), 11) == [
      _atom(1.0, (10, 2), 330, REPLACE_ONE)]
  # A composition repeated: its parts' counts times the repetitions, merged where equal.
  assert events.flatten(SC(C([G(1.0), G(1.0)]), 5)) == [_atom(1.0, None, 10)]
  assert events.flatten(C([G(1.0), P(0.5, G(1.0))]), 3) == [_atom(1.0, None, 3),
                                                            _atom(1.0, 0.5, 3)]
  # Shuffled: count x epochs.
  assert events.flatten(SC(S(SC(G(2.0), 3), 25, 10), 2)) == [_atom(2.0, None, 18, ZERO_OUT)]
  # Shuffled Poisson events keep their rate and hold under zero-out.
  assert events.flatten(S(P(0.1, G(1.0)), 5, 2)) == [_atom(1.0, 0.1, 3, ZERO_OUT)]


def test_flatten_counts_above_2_to_53_through_nesting_are_errors():
  with pytest.raises(ValueError) as info:
    events.flatten(SC(SC(G(1.0), 2**27), 2**27))
  assert str(info.value) == f"count must be an integer in [0, {TWO_53}], got 18014398509481984."
  with pytest.raises(ValueError, match=re.escape(f"count must be an integer in [0, {TWO_53}]")):
    events.flatten(S(G(1.0), 2**53, 1), 2)
  with pytest.raises(ValueError, match=re.escape(f"count must be an integer in [0, {TWO_53}]")):
    events.flatten(C([G(1.0)]), 2**53 + 1)
  with pytest.raises(ValueError) as info:
    events.flatten(G(1.0), -1)
  assert str(info.value) == "count must be an integer >= 0, got -1."
  assert events.flatten(SC(SC(G(1.0), 2**26), 2**27)) == [_atom(1.0, None, 2**53)]


def test_flatten_drops_atoms_that_release_nothing():
  nothing = [SC(G(1.0), 0), G(math.inf), P(0.0, G(1.0)), P(0.5, G(math.inf)),
             W(10, 0, G(1.0)), W(10, 5, G(math.inf)), S(G(1.0), 0, 3), C([]),
             SC(P(0.5, G(1.0)), 0), SC(C([G(1.0)]), 0)]
  for event in nothing:
    assert events.flatten(event) == [], event
  # Dropped atoms do not separate equal neighbours.
  mixed = C([G(1.0), G(math.inf), P(0.0, G(1.0)), SC(G(2.0), 0), G(1.0), S(G(5.0), 0, 1),
             G(1.0)])
  assert events.flatten(mixed) == [_atom(1.0, None, 3)]
  # Noise 0 releases everything: kept.
  assert events.flatten(G(0.0)) == [_atom(0.0)]
  assert events.flatten(P(0.5, G(0.0))) == [_atom(0.0, 0.5)]


@pytest.mark.parametrize("steps,steps_per_epoch", [
    (0, 5), (1, 5), (4, 5), (5, 5), (6, 5), (9, 3), (10, 3), (11, 3), (14063, 234),
    (2**53, 1), (2**53, 3), (2**53 - 1, 2**52), (7, 2**60),
])
def test_shuffled_epochs_are_epochs_started(steps, steps_per_epoch):
  expected = math.ceil(fractions.Fraction(steps, steps_per_epoch))
  event = S(G(1.0), steps, steps_per_epoch)
  assert event.epochs == expected and type(event.epochs) is int
  assert events.flatten(event) == ([_atom(1.0, None, expected, ZERO_OUT)] if expected else [])


_UNSUPPORTED = [
    (P(0.5, C([G(1.0)])), "PoissonSampledEvent must wrap a GaussianEvent", "ComposedEvent"),
    (P(0.5, SC(G(1.0), 2)), "PoissonSampledEvent must wrap a GaussianEvent", "SelfComposedEvent"),
    (P(0.5, P(0.5, G(1.0))), "PoissonSampledEvent must wrap a GaussianEvent",
     "PoissonSampledEvent"),
    (P(0.5, S(G(1.0), 2, 1)), "PoissonSampledEvent must wrap a GaussianEvent", "ShuffledEvent"),
    (P(1.0, C([G(1.0)])), "PoissonSampledEvent must wrap a GaussianEvent", "ComposedEvent"),
    (W(10, 2, C([G(1.0)])), "SampledWithoutReplacementEvent must wrap a GaussianEvent",
     "ComposedEvent"),
    (W(10, 2, P(0.5, G(1.0))), "SampledWithoutReplacementEvent must wrap a GaussianEvent",
     "PoissonSampledEvent"),
    (SC(C([G(1.0), P(0.1, C([G(1.0)]))]), 3), "PoissonSampledEvent must wrap a GaussianEvent",
     "ComposedEvent"),
]


@pytest.mark.parametrize("event,prefix,got", _UNSUPPORTED)
def test_unsupported_nestings_raise(event, prefix, got):
  with pytest.raises(UnsupportedEventError) as info:
    events.flatten(event)
  message = str(info.value)
  assert message.startswith(prefix) and f"got {got};" in message
  assert "compose sampled Gaussian events instead" in message
  assert isinstance(info.value, ValueError)


def test_shuffled_without_replacement_is_unsupported():
  with pytest.raises(UnsupportedEventError) as info:
    events.flatten(S(W(10, 2, G(1.0)), 3, 1))
  assert str(info.value) == (
      "ShuffledEvent of a sampled-without-replacement event is not supported: shuffled "
      "batches are accounted under zero-out adjacency, sampling without replacement under "
      "replace-one.")


def test_unknown_event_classes_and_non_events():

  class Laplace(events.DpEvent):
    pass

  with pytest.raises(UnsupportedEventError, match=r"^Unsupported event "):
    events.flatten(Laplace())
  with pytest.raises(UnsupportedEventError, match=r"^Unsupported event "):
    events.flatten(C([G(1.0), Laplace()]))
  with pytest.raises(ValueError) as info:
    events.flatten("gaussian")
  assert str(info.value) == f"event {NOT_EVENT} str 'gaussian'."


# ------------------------------------------------------------------------------------------
# Neighbouring relations.


@pytest.mark.parametrize("event,relation", [
    (C([]), ADD_OR_REMOVE_ONE),
    (G(1.0), ADD_OR_REMOVE_ONE),
    (P(0.1, G(1.0)), ADD_OR_REMOVE_ONE),
    (C([G(1.0), SC(P(0.1, G(1.0)), 5)]), ADD_OR_REMOVE_ONE),
    (S(G(1.0), 10, 3), ZERO_OUT),
    (C([S(G(1.0), 10, 3), SC(P(0.1, G(1.0)), 5), G(2.0)]), ZERO_OUT),
    (W(100, 10, G(1.0)), REPLACE_ONE),
    (C([SC(W(100, 10, G(1.0)), 5), W(200, 20, G(2.0))]), REPLACE_ONE),
    # Parts that release nothing do not constrain the relation.
    (C([W(100, 0, G(1.0)), P(0.1, G(1.0))]), ADD_OR_REMOVE_ONE),
    (C([W(100, 10, G(1.0)), G(math.inf), S(G(1.0), 0, 1)]), REPLACE_ONE),
])
def test_neighboring_relation(event, relation):
  assert events.neighboring_relation(event) == relation


@pytest.mark.parametrize("other", [P(0.1, G(1.0)), G(1.0), S(G(1.0), 3, 1),
                                   SC(P(1.0, G(2.0)), 2)], ids=lambda e: type(e).__name__)
def test_replace_one_does_not_mix_with_the_others(other):
  for parts in ([W(100, 10, G(1.0)), other], [other, SC(W(100, 10, G(1.0)), 3)]):
    with pytest.raises(IncompatibleEventsError) as info:
      events.neighboring_relation(C(parts))
    assert str(info.value).startswith(
        "Cannot compose sampling without replacement (replace-one adjacency) with Poisson or "
        "shuffled batches (add-or-remove / zero-out adjacency)")
    assert isinstance(info.value, ValueError)


# ------------------------------------------------------------------------------------------
# Export to dp_accounting.


def test_to_dp_accounting_builds_the_namesakes():
  dpa = _dp_accounting()
  g = dpa.GaussianDpEvent
  cases = [
      (G(1.5), g(1.5)),
      (P(0.01, G(1.1)), dpa.PoissonSampledDpEvent(0.01, g(1.1))),
      (W(100, 10, G(0.5)), dpa.SampledWithoutReplacementDpEvent(100, 10, g(0.5))),
      (S(G(2.0), 25, 10), dpa.SelfComposedDpEvent(g(2.0), 3)),
      (S(G(2.0), 30, 10), dpa.SelfComposedDpEvent(g(2.0), 3)),
      (SC(G(1.0), 7), dpa.SelfComposedDpEvent(g(1.0), 7)),
      (C([]), dpa.ComposedDpEvent([])),
      (SC(C([SC(P(0.01, G(1.0)), 100), S(G(3.0), 7, 2), G(4.0)]), 5),
       dpa.SelfComposedDpEvent(dpa.ComposedDpEvent([
           dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(0.01, g(1.0)), 100),
           dpa.SelfComposedDpEvent(g(3.0), 4), g(4.0)]), 5)),
  ]
  for ours, theirs in cases:
    assert events.to_dp_accounting(ours) == theirs, ours


def test_to_dp_accounting_refuses_non_events():
  _dp_accounting()
  with pytest.raises(ValueError) as info:
    events.to_dp_accounting(1.0)
  assert str(info.value) == f"event {NOT_EVENT} float 1.0."
