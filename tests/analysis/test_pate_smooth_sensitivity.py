"""Smooth sensitivity of the GNMax data-dependent RDP: brute force and the PATE 2018 reference.

The brute-force tests enumerate every vote histogram with a fixed number of votes over a few
classes, compute the data-dependent RDP of each exactly (``rdp_gnmax``), and compare the
largest change between neighbours (one vote moved) with the bounds U^(d) at distances 0 and 1,
and the exact range of q within distance d with a search over all histograms.
"""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from analysis import pate
from analysis.pate import _smooth

# (sigma, order, classes, votes): C5 and C6 hold (unimodal branch) or C6 fails (cell branch).
UNIMODAL = [(1.0, 2.0, 3, 10), (1.5, 2.0, 4, 8), (3.0, 3.0, 2, 14), (0.5, 1.5, 3, 9)]
CELLS = [(1.0, 5.0, 3, 10), (0.5, 2.0, 3, 10), (2.0, 5.0, 4, 8), (1.0, 3.0, 2, 14)]


def _histograms(total: int, classes: int) -> list[tuple]:
  """Every histogram of ``total`` votes over ``classes`` classes."""
  out = []
  for cuts in itertools.combinations(range(total + classes - 1), classes - 1):
    bounds = (-1,) + cuts + (total + classes - 1,)
    out.append(tuple(bounds[i + 1] - bounds[i] - 1 for i in range(classes)))
  return out


def _neighbours(votes: tuple) -> list[tuple]:
  """Histograms with one vote moved from one class to another."""
  out = []
  for i, j in itertools.permutations(range(len(votes)), 2):
    if votes[i] > 0:
      moved = list(votes)
      moved[i] -= 1
      moved[j] += 1
      out.append(tuple(moved))
  return out


def _distance(a: tuple, b: tuple) -> int:
  return int(sum(max(0, x - y) for x, y in zip(a, b)))


def _brute_force(sigma: float, order: float, classes: int, total: int):
  """f at every histogram and the local sensitivity max_{D'} |f(D) - f(D')| of each."""
  hists = _histograms(total, classes)
  f = {h: pate.rdp_gnmax(h, sigma, order) for h in hists}
  ls = {h: max(abs(f[h] - f[n]) for n in _neighbours(h)) for h in hists}
  return hists, f, ls


@pytest.mark.parametrize("case, unimodal", [(c, True) for c in UNIMODAL] +
                         [(c, False) for c in CELLS])
def test_the_branch_follows_the_conditions(case, unimodal):
  sigma, order, classes, _ = case
  table = pate._gnmax_table(sigma, order, classes)  # pylint: disable=protected-access
  assert table is not None and table[2]  # C5 holds in every case here
  shape = _smooth._gnmax_unimodal(sigma, order, classes)  # pylint: disable=protected-access
  assert (shape is not None) == unimodal


@pytest.mark.parametrize("sigma, order, classes, total", UNIMODAL + CELLS)
def test_local_sensitivity_bounds_the_brute_force_at_distances_0_and_1(sigma, order, classes,
                                                                       total):
  hists, f, ls = _brute_force(sigma, order, classes, total)
  assert max(ls.values()) > 1e-3 * order / sigma**2  # f is not flat: the test can fail
  tight = 0
  for h in hists:
    bounds = pate.local_sensitivity_gnmax(h, total, sigma, order)
    assert bounds[0] >= ls[h] - 1e-12, (h, bounds[0], ls[h])
    ball = max(ls[n] for n in [h] + _neighbours(h))
    assert bounds[1] >= ball - 1e-12, (h, bounds[1], ball)
    tight += bool(bounds[1] <= 1.5 * ball + 1e-9)
  assert tight >= len(hists) // 2  # and not trivially loose


@pytest.mark.parametrize("sigma, order, classes, total", UNIMODAL[:2] + CELLS[:2])
def test_local_sensitivity_bounds_are_nested_between_neighbours(sigma, order, classes, total):
  hists = _histograms(total, classes)
  table = {h: pate.local_sensitivity_gnmax(h, total, sigma, order) for h in hists}
  for h in hists:
    assert np.all(np.diff(table[h]) >= 0.0)
    for n in _neighbours(h):
      assert np.all(table[h][:-1] <= table[n][1:] + 1e-12), (h, n)
  # The last entry bounds the local sensitivity of every histogram.
  _, _, ls = _brute_force(sigma, order, classes, total)
  assert min(t[-1] for t in table.values()) >= max(ls.values()) - 1e-12


@pytest.mark.parametrize("sigma, classes, total", [(1.0, 3, 10), (2.0, 4, 8), (1.0, 2, 9)])
def test_range_of_q_within_distance_d_is_exact(sigma, classes, total):
  hists = _histograms(total, classes)
  logq = {h: pate.log_q_gnmax(h, sigma) for h in hists}
  cap = math.log1p(-1.0 / classes)
  for h in hists:
    lo, hi, exact = _smooth._reach_gnmax(np.array(h, float), total, sigma)  # pylint: disable=protected-access
    for d in range(total + 1):
      reach = [logq[g] for g in hists if _distance(h, g) <= d]
      assert lo[d] == pytest.approx(min(reach), abs=1e-9), (h, d)
      if exact[d]:
        assert hi[d] == pytest.approx(max(reach), abs=1e-9), (h, d)
      else:
        assert hi[d] == cap and max(reach) <= cap + 1e-12
    assert exact[0]


# The reference: tensorflow/privacy research/pate_2018/smooth_sensitivity.py at commit
# 03035d5d4a271ac795dab80f5bc1cef82fc3d462 (PATE 2018's code), run once without TensorFlow:
#   ls = compute_local_sensitivity_bounds_gnmax(np.array(votes), 250, 40.0, order)
#   (ls[0], ls[25], ls[100], compute_discounted_max(0.4 / order, ls))
# Its check_conditions(40.0, 10, order) returned (True, True) for both orders.
REFERENCE = {
    (10.0, (230, 8, 4, 2, 2, 1, 1, 1, 1, 0)):
        (1.6875637229796467e-05, 0.00010595972912058995, 0.0005262442643467254,
         6.988616618422528e-05),
    (10.0, (150, 60, 20, 10, 5, 2, 1, 1, 1, 0)):
        (0.0, 0.0005262442643467254, 0.0005262442643467254, 0.00022718518681267584),
    (10.0, (100, 90, 30, 10, 10, 5, 3, 1, 1, 0)):
        (0.0, 0.0, 0.0005262442643467254, 3.330693007962247e-05),
    (10.0, (60, 50, 40, 30, 20, 20, 10, 10, 5, 5)): (0.0, 0.0, 0.0, 7.2846215262997125e-06),
    (10.0, (200, 40, 5, 2, 1, 1, 1, 0, 0, 0)):
        (0.0001572299324347087, 0.0005262442643467254, 0.0005262442643467254,
         0.00023824334337561542),
    (20.5, (230, 8, 4, 2, 2, 1, 1, 1, 1, 0)):
        (3.289207845481781e-05, 0.00017129560684584822, 0.0008268187886778054,
         0.0002688630484534127),
    (20.5, (150, 60, 20, 10, 5, 2, 1, 1, 1, 0)):
        (0.0, 0.0008268187886778054, 0.0008268187886778054, 0.0006415755933495),
    (20.5, (100, 90, 30, 10, 10, 5, 3, 1, 1, 0)):
        (0.0, 0.0, 0.0008268187886778054, 0.0002564295184054695),
    (20.5, (60, 50, 40, 30, 20, 20, 10, 10, 5, 5)):
        (0.0, 0.0, 0.0008268187886778054, 0.00012216717946399074),
    (20.5, (200, 40, 5, 2, 1, 1, 1, 0, 0, 0)):
        (0.0002415377420500655, 0.0007867651434913542, 0.0008268187886778054,
         0.000488760953569982),
}


@pytest.mark.parametrize("order, votes", sorted(REFERENCE))
def test_agrees_with_the_pate_2018_reference_where_its_conditions_hold(order, votes):
  sigma, teachers = 40.0, 250
  assert _smooth._gnmax_unimodal(sigma, order, len(votes)) is not None  # pylint: disable=protected-access
  ls = pate.local_sensitivity_gnmax(votes, teachers, sigma, order)
  ours = (ls[0], ls[25], ls[100],
          pate.smooth_sensitivity_gnmax(0.4 / order, votes, teachers, sigma, order))
  slack = 2e-9 * order / sigma**2  # the grid-check slack added to every value read off G
  for mine, theirs in zip(ours, REFERENCE[(order, votes)]):
    assert theirs * (1 - 1e-6) <= mine <= theirs * (1 + 1e-6) + slack


def test_accountant_smooth_sensitivity_sums_the_tighter_bounds():
  votes = (230, 8, 4, 2, 2, 1, 1, 1, 1, 0)
  acc = pate.PateAccountant(num_teachers=250)
  for _ in range(3):
    acc.compose_gnmax(votes, 40.0)
  beta = 0.4 / 20.5
  single = pate.smooth_sensitivity_gnmax(beta, votes, 250, 40.0, 20.5)
  assert acc.smooth_sensitivity(beta, 20.5) == pytest.approx(3 * single, rel=1e-12)
  assert 3 * single <= 3 * 0.0002688630484534127 * (1 + 1e-6) + 1e-11
