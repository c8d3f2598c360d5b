"""analysis.accountants: accountants registered by name in one place.  A toy accountant,
registered once, is usable by name in calibration and listed by the command line."""
from __future__ import annotations

import math

import pytest

from analysis import accountant_base, accountants, calibration, compute_dp_sgd_privacy, events
from analysis import gaussian


class _ToyGaussianAccountant(accountant_base.Accountant):
  """Pure Gaussian releases only, with the exact epsilon (analysis.gaussian)."""

  method = "a toy Gaussian accountant"

  def _check_atoms(self, atoms):
    for atom in atoms:
      if getattr(atom, "sampling", None) is not None:
        raise events.UnsupportedEventError("the toy accountant takes unsampled Gaussians only")

  def _epsilon(self, delta):
    sigmas = [atom.noise_multiplier for atom in self.atoms]
    counts = [atom.count for atom in self.atoms]
    return gaussian.composed_epsilon(sigmas, counts, delta)

  def _delta(self, epsilon):
    raise NotImplementedError


@pytest.fixture
def toy():
  accountants.register_accountant("toy", _ToyGaussianAccountant)
  try:
    yield "toy"
  finally:
    accountants.unregister_accountant("toy")
  assert "toy" not in accountants.ACCOUNTANTS


def test_builtin_names_come_from_the_registry():
  assert accountants.ACCOUNTANTS == accountants.accountant_names() == ("rdp", "pld")
  assert accountants.takes_orders("rdp") and not accountants.takes_orders("pld")
  assert accountants.max_steps("rdp") == 2**53 and accountants.max_steps("pld") == 10**10


def test_a_registered_accountant_is_usable_by_name_in_calibrate(toy):
  assert toy in accountants.ACCOUNTANTS and toy in calibration.ACCOUNTANTS
  assert isinstance(accountants.make_accountant(toy), _ToyGaussianAccountant)
  count, delta, target = 10, 1e-5, 2.0
  event_of = lambda s: events.SelfComposedEvent(events.GaussianEvent(s), count)  # noqa: E731
  tolerance = 1e-6
  sigma = calibration.calibrate(event_of, target, delta, accountant=toy, tolerance=tolerance)
  # The exact Gaussian inverse (an independent closed form) is the smallest sigma.
  exact = gaussian.noise_multiplier_for_epsilon(target, delta, count)
  assert exact <= sigma <= exact * (1 + 2 * tolerance)
  with pytest.raises(ValueError, match=r"orders must be None with accountant='toy'"):
    calibration.calibrate(event_of, target, delta, accountant=toy, orders=[2.0, 3.0])


def test_a_registered_accountant_is_a_command_line_choice(toy, capsys):
  help_text = compute_dp_sgd_privacy._define_flags().get_help()  # pylint: disable=protected-access
  assert "<rdp|pld|toy>" in help_text
  assert "<RDP|PLD|TOY>" in help_text


def test_registry_errors_name_the_argument(toy):
  with pytest.raises(ValueError, match="already registered"):
    accountants.register_accountant(toy, _ToyGaussianAccountant)
  with pytest.raises(ValueError, match="name must be a non-empty string"):
    accountants.register_accountant("", _ToyGaussianAccountant)
  with pytest.raises(ValueError, match=r"accountant must be one of \['pld', 'rdp', 'toy'\]"):
    accountants.make_accountant("moments")
  with pytest.raises(ValueError, match="accountant must be one of"):
    accountants.unregister_accountant("moments")
  accountants.register_accountant("broken", lambda: int)
  try:
    with pytest.raises(TypeError, match="not an analysis.accountant_base.Accountant subclass"):
      accountants.make_accountant("broken")
  finally:
    accountants.unregister_accountant("broken")
  assert math.isfinite(accountants.make_accountant(toy).compose(
      events.GaussianEvent(1.0)).get_epsilon(1e-5))
