"""analysis._numerics against independent references (mpmath at 200 bits, closed forms)."""
import math

import mpmath
import numpy as np
import pytest

from analysis import _numerics

_ULP = 2.0**-52
# Tiny to huge arguments, a dense band around the switch-over point log 2, and the old
# switch-over points (1 and 30) of the copies this module replaced.
_XS = [float(x) for x in np.concatenate([
    np.logspace(-300, 300, 121), np.linspace(0.01, 3.0, 150),
    [math.log(2.0) * (1.0 + k * 1e-15) for k in range(-5, 6)],
    np.linspace(0.9, 1.1, 11), np.linspace(29.0, 31.0, 11)])]


def _exact_log_expm1(x):
  with mpmath.workprec(200):
    return mpmath.log(mpmath.expm1(mpmath.mpf(x)))


def _exact_log1mexp(x):
  with mpmath.workprec(200):
    return mpmath.log(-mpmath.expm1(-mpmath.mpf(x)))


def _ulps(value, exact, x):
  """Absolute error in units of the last place of max(1, |exact|, x) (the terms' size)."""
  return float(abs(mpmath.mpf(value) - exact)) / (max(1.0, abs(float(exact)), x) * _ULP)


@pytest.mark.parametrize("as_array", [False, True])
def test_log_expm1_within_two_ulps_of_mpmath(as_array):
  for x in _XS:
    value = (float(_numerics.log_expm1(np.array([x]))[0]) if as_array
             else _numerics.log_expm1(x))
    assert _ulps(value, _exact_log_expm1(x), x) <= 2.0, x


@pytest.mark.parametrize("as_array", [False, True])
def test_log1mexp_within_two_ulps_of_mpmath(as_array):
  for x in _XS:
    value = (float(_numerics.log1mexp(np.array([x]))[0]) if as_array
             else _numerics.log1mexp(x))
    assert _ulps(value, _exact_log1mexp(x), 1.0) <= 2.0, x


def test_log_expm1_edges():
  assert _numerics.log_expm1(0.0) == -math.inf
  assert _numerics.log_expm1(math.inf) == math.inf
  assert _numerics.log_expm1(1e308) == 1e308  # no overflow
  assert _numerics.log1mexp(0.0) == -math.inf
  assert math.isnan(_numerics.log1mexp(-1.0))
  assert _numerics.LOG_EXPM1_SWITCH == math.log(2.0)


def test_logsumexp_matches_mpmath_and_infinite_maxima():
  x = np.array([-1000.0, -1001.5, -999.25, -1200.0])
  with mpmath.workprec(200):
    exact = mpmath.log(sum(mpmath.exp(mpmath.mpf(float(v))) for v in x))
  assert abs(_numerics.logsumexp(x) - float(exact)) <= 4 * 1000 * _ULP
  assert _numerics.logsumexp(np.array([-math.inf, -math.inf])) == -math.inf
  assert _numerics.logsumexp(np.array([1.0, math.inf])) == math.inf


def test_finish_and_clamp_noise():
  assert _numerics.finish([2.5], True) == 2.5 and isinstance(_numerics.finish([2.5], True), float)
  out = _numerics.finish([1.0, 2.0], False)
  assert isinstance(out, np.ndarray) and out.dtype == np.float64 and out.tolist() == [1.0, 2.0]
  clamp = _numerics.clamp_noise
  assert clamp(1e-101, 1e-100, 1e100) == 0.0
  assert clamp(0.0, 1e-100, 1e100) == 0.0
  assert clamp(1e-100, 1e-100, 1e100) == 1e-100
  assert clamp(2e100, 1e-100, 1e100) == 1e100
  assert clamp(math.inf, 1e-100, 1e100) == math.inf
  assert clamp(0.5, 1e-3, 1e12) == 0.5


def test_noise_constants_have_one_name_per_meaning():
  from analysis import calibration, pld_accountant, rdp_accountant
  assert pld_accountant.MIN_NOISE_MULTIPLIER == _numerics.PLD_NOISE_FLOOR == 1e-3
  assert pld_accountant.MAX_NOISE_MULTIPLIER == _numerics.PLD_NOISE_CEILING == 1e12
  for module in (calibration, pld_accountant, rdp_accountant):
    assert not hasattr(module, "_MIN_NOISE"), module.__name__
    for name in ("_logsumexp", "_log_expm1", "_log_expm1_scalar", "_finish", "_accounted_noise"):
      assert not hasattr(module, name), (module.__name__, name)


def test_minimize_over_order_finds_the_closed_form_minimum():
  # (log(alpha - 1) - log 2)^2 is smallest at alpha = 3; non-finite values never win.
  alpha = _numerics.minimize_over_order(lambda a: (math.log(a - 1.0) - math.log(2.0)) ** 2,
                                        1.01, 1e4)
  assert alpha == pytest.approx(3.0, rel=1e-3)
  alpha = _numerics.minimize_over_order(lambda a: math.inf if a < 5.0 else a, 1.5, 50.0)
  assert 5.0 <= alpha <= 5.01
