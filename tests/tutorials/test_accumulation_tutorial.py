"""The MNIST tutorial's --gradient_accumulation_steps: k micro-steps per logical step, and the
epsilon of the logical configuration (analysis.rdp_accountant / pld_accountant, closed form)."""
import math
import os
import re
import subprocess
import sys

import pytest

from analysis import pld_accountant, rdp_accountant
from dp_references import exact_gaussian_epsilon

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN, TEST, BATCH, EPOCHS, DELTA, SIGMA = 1024, 500, 64, 4, 1e-5, 1.1


def _final(*flags):
  env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
  cmd = [sys.executable, os.path.join(ROOT, "tutorials", "mnist_dpsgd_tutorial.py"),
         f"--train_size={TRAIN}", f"--test_size={TEST}", f"--batch_size={BATCH}",
         f"--epochs={EPOCHS}", f"--noise_multiplier={SIGMA}", "--l2_norm_clip=1.0",
         f"--delta={DELTA}", "--learning_rate=0.5", *flags]
  result = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  line = next(l for l in result.stdout.splitlines() if l.startswith("final:"))
  return {k: float(v) for k, v in re.findall(r"(\w+)=([-\d.e+]+)", line)}


@pytest.mark.slow
def test_poisson_virtual_batches_report_the_logical_epsilon():
  final = _final("--gradient_accumulation_steps=4")
  steps = EPOCHS * (TRAIN // BATCH)  # logical steps; fit ran 4 times as many micro-steps
  assert final["steps"] == steps
  assert final["test_accuracy"] > 0.2  # chance is 0.1
  orders = rdp_accountant.DEFAULT_ORDERS
  rdp_eps = rdp_accountant.get_privacy_spent(
      orders, rdp_accountant.compute_rdp(BATCH / TRAIN, SIGMA, steps, orders),
      target_delta=DELTA)[0]
  assert math.isclose(final["epsilon_rdp"], rdp_eps, rel_tol=1e-3)
  pld_eps = pld_accountant.compute_epsilon(BATCH / TRAIN, SIGMA, steps, DELTA)
  assert math.isclose(final["epsilon_pld"], pld_eps, rel_tol=1e-3)


@pytest.mark.slow
def test_shuffled_virtual_batches_report_one_gaussian_per_epoch():
  final = _final("--sampling=shuffle", "--gradient_accumulation_steps=2")
  assert final["steps"] == EPOCHS * (TRAIN // BATCH)
  exact = exact_gaussian_epsilon(SIGMA, EPOCHS, DELTA)
  assert math.isclose(final["epsilon_rdp"], exact, rel_tol=1e-3)
