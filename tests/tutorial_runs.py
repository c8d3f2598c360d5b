"""Runs ``tutorials/mnist_dpsgd_tutorial.py`` on a small MNIST slice in a subprocess (one place for
the command the tutorial-flag tests share) and parses its ``final:`` line."""
from __future__ import annotations

import os
import re
import subprocess
import sys

from analysis import rdp_accountant

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tutorials", "mnist_dpsgd_tutorial.py")


def run_tutorial(name, *flags, timeout=300):
  """Runs ``tutorials/<name>`` with ``flags`` in a subprocess from the repository root (CPU
  only, TensorFlow's info logs off); returns the ``subprocess.CompletedProcess``."""
  env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
  cmd = [sys.executable, os.path.join(ROOT, "tutorials", name), *flags]
  return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                        env=env)


def run_mnist_tutorial(*flags, train=1024, test=500, batch=64, epochs=4, sigma=1.1,
                       clip=1.0, delta=1e-5, learning_rate=0.5, timeout=600):
  """``subprocess.CompletedProcess`` of the tutorial with these settings and extra ``flags``."""
  env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
  cmd = [sys.executable, SCRIPT, f"--train_size={train}", f"--test_size={test}",
         f"--batch_size={batch}", f"--epochs={epochs}", f"--noise_multiplier={sigma}",
         f"--l2_norm_clip={clip}", f"--delta={delta}", f"--learning_rate={learning_rate}",
         *flags]
  return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)


def final_numbers(result) -> dict:
  """The ``key=value`` numbers of the tutorial's ``final:`` line (fails with its output)."""
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  line = next(l for l in result.stdout.splitlines() if l.startswith("final:"))
  return {k: float(v) for k, v in re.findall(r"(\w+)=([-\d.e+]+)", line)}


def reference_rdp_epsilon(q, sigma, steps, delta):
  """The epsilon an independent RDP computation gives for ``steps`` Poisson-sampled Gaussian
  steps (rate ``q``, noise multiplier ``sigma``) at ``delta``, over the default orders: what a
  tutorial's reported ``epsilon_rdp`` must equal."""
  orders = rdp_accountant.DEFAULT_ORDERS
  return rdp_accountant.get_privacy_spent(
      orders, rdp_accountant.compute_rdp(q, sigma, steps, orders), target_delta=delta)[0]
