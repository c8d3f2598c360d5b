"""The MNIST tutorial's --gradient_accumulation_steps: k micro-steps per logical step, and the
epsilon of the logical configuration (analysis.rdp_accountant / pld_accountant, closed form)."""
import math

import pytest

from tutorial_runs import final_numbers, reference_rdp_epsilon, run_mnist_tutorial
from analysis import pld_accountant
from dp_references import exact_gaussian_epsilon

TRAIN, TEST, BATCH, EPOCHS, DELTA, SIGMA = 1024, 500, 64, 4, 1e-5, 1.1


def _final(*flags):
  return final_numbers(run_mnist_tutorial(
      *flags, train=TRAIN, test=TEST, batch=BATCH, epochs=EPOCHS, sigma=SIGMA, delta=DELTA,
      learning_rate=0.5))


@pytest.mark.slow
def test_poisson_virtual_batches_report_the_logical_epsilon():
  final = _final("--gradient_accumulation_steps=4")
  steps = EPOCHS * (TRAIN // BATCH)  # logical steps; fit ran 4 times as many micro-steps
  assert final["steps"] == steps
  assert final["test_accuracy"] > 0.2  # chance is 0.1
  rdp_eps = reference_rdp_epsilon(BATCH / TRAIN, SIGMA, steps, DELTA)
  assert math.isclose(final["epsilon_rdp"], rdp_eps, rel_tol=1e-3)
  pld_eps = pld_accountant.compute_epsilon(BATCH / TRAIN, SIGMA, steps, DELTA)
  assert math.isclose(final["epsilon_pld"], pld_eps, rel_tol=1e-3)


@pytest.mark.slow
def test_shuffled_virtual_batches_report_one_gaussian_per_epoch():
  final = _final("--sampling=shuffle", "--gradient_accumulation_steps=2")
  assert final["steps"] == EPOCHS * (TRAIN // BATCH)
  exact = exact_gaussian_epsilon(SIGMA, EPOCHS, DELTA)
  assert math.isclose(final["epsilon_rdp"], exact, rel_tol=1e-3)
