"""Piecewise-constant schedules (analysis.schedules): values against a brute-force step loop,
and a scheduled run's epsilon against dp_accounting composing the pieces."""
import math

import pytest

from analysis import accountants, dp_sgd, events
from analysis.schedules import PiecewiseConstant, as_schedule, scheduled_dp_sgd_event
from dp_references import dp_accounting, dp_rdp

ORDERS = [1 + x / 4 for x in range(1, 39)] + list(range(11, 65)) + [128, 256, 512, 1024]


def test_values_and_pieces_match_a_step_by_step_loop():
  schedule = PiecewiseConstant([3, 5, 9, 10], [2.0, 1.0, 1.0, 0.5, 3.0])
  wanted = [2.0] * 3 + [1.0] * 6 + [0.5] + [3.0] * 5
  assert [schedule.value_at(t) for t in range(15)] == wanted
  for start in range(15):
    for stop in range(start, 16):
      pieces = schedule.pieces(start, stop)
      expanded = [v for v, n in pieces for _ in range(n)]
      assert expanded == wanted[start:stop] + [3.0] * max(0, stop - 15)
      assert all(a[0] != b[0] for a, b in zip(pieces, pieces[1:]))  # merged
  assert schedule.num_pieces == 4  # 1.0 twice in a row is one run
  assert PiecewiseConstant([], [0.7]).pieces(4, 9) == [(0.7, 5)]
  assert PiecewiseConstant([], [0.7]).num_pieces == 1


def test_config_round_trip():
  schedule = PiecewiseConstant([100, 200], [1.0, 1.5, 2.0])
  assert as_schedule("noise_multiplier", schedule.get_config(), positive=False) == schedule
  assert as_schedule("noise_multiplier", 1.5, positive=False) is None


@pytest.mark.parametrize("boundaries, values, positive, match", [
    ([5, 5], [1.0, 2.0, 3.0], False, "strictly increasing"),
    ([7, 3], [1.0, 2.0, 3.0], False, "strictly increasing"),
    ([0], [1.0, 2.0], False, r"boundaries\[0\]"),
    ([2.5], [1.0, 2.0], False, r"boundaries\[0\]"),
    ([3], [1.0], False, "needs len"),
    ([3], [1.0, 2.0, 3.0], False, "needs len"),
    ([3], [1.0, -2.0], False, r"values\[1\]"),
    ([3], [1.0, math.inf], False, r"values\[1\]"),
    ([3], [0.0, 1.0], True, r"values\[0\]"),
])
def test_bad_schedules_are_refused(boundaries, values, positive, match):
  with pytest.raises(ValueError, match=match):
    PiecewiseConstant(boundaries, values, name="noise_multiplier", positive=positive)


def test_bad_schedule_dicts_are_refused():
  with pytest.raises(ValueError, match="piecewise-constant schedule"):
    as_schedule("l2_norm_clip", {"boundary": [3], "values": [1, 2]}, positive=True)
  with pytest.raises(ValueError, match="needs len"):
    as_schedule("l2_norm_clip", {"values": [1, 2]}, positive=True)


def test_scheduled_event_is_the_composition_of_the_pieces_and_matches_dp_accounting():
  dpa, rdp = dp_accounting(), dp_rdp()
  q, delta = 0.01, 1e-5
  schedule = PiecewiseConstant([300, 700], [0.8, 1.2, 2.0])
  event = scheduled_dp_sgd_event(schedule, 100, 1000, sampling_probability=q)
  assert event == events.ComposedEvent((
      dp_sgd.dp_sgd_event(0.8, 200, sampling_probability=q),
      dp_sgd.dp_sgd_event(1.2, 400, sampling_probability=q),
      dp_sgd.dp_sgd_event(2.0, 300, sampling_probability=q)))
  ours = accountants.make_accountant("rdp").compose(event).get_epsilon(delta)
  reference = rdp.RdpAccountant(ORDERS)
  reference.compose(dpa.ComposedDpEvent([
      dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(z)), n)
      for z, n in ((0.8, 200), (1.2, 400), (2.0, 300))]))
  # Our RDP accountant also searches between dp_accounting's orders: never above it, within
  # 1e-4 (here 8e-6 below).
  assert ours <= reference.get_epsilon(delta) * (1 + 1e-12)
  assert ours == pytest.approx(reference.get_epsilon(delta), rel=1e-4)
  # One piece: the plain event; a constant: dp_sgd_event itself.
  assert scheduled_dp_sgd_event(schedule, 0, 300, sampling_probability=q) == dp_sgd.dp_sgd_event(
      0.8, 300, sampling_probability=q)
  assert scheduled_dp_sgd_event(1.1, 5, 9, sampling_probability=q) == dp_sgd.dp_sgd_event(
      1.1, 4, sampling_probability=q)
