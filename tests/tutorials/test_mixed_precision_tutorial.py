"""The MNIST tutorial's --dtype_policy: mixed_float16 trains (finite loss every epoch, every step
taken) and its epsilon is float32's (analysis.rdp_accountant): the loss scale is static, so the
dtype never changes what is released or accounted."""
import math
import os
import re
import subprocess
import sys

import pytest

from analysis import rdp_accountant

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN, TEST, BATCH, EPOCHS, DELTA, SIGMA = 1024, 500, 64, 2, 1e-5, 1.1


def _run(*flags):
  env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
  cmd = [sys.executable, os.path.join(ROOT, "tutorials", "mnist_dpsgd_tutorial.py"),
         f"--train_size={TRAIN}", f"--test_size={TEST}", f"--batch_size={BATCH}",
         f"--epochs={EPOCHS}", f"--noise_multiplier={SIGMA}", "--l2_norm_clip=1.0",
         f"--delta={DELTA}", "--learning_rate=0.5", *flags]
  return subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_dtype_policy_flag_trains_with_the_float32_epsilon(policy):
  result = _run(f"--dtype_policy={policy}")
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  epochs = [dict(re.findall(r"(\w+)=([-\d.e+]+)", line)) for line in result.stdout.splitlines()
            if line.startswith("epoch ")]
  assert len(epochs) == EPOCHS
  assert all(math.isfinite(float(e["loss"])) for e in epochs)
  line = next(l for l in result.stdout.splitlines() if l.startswith("final:"))
  final = {k: float(v) for k, v in re.findall(r"(\w+)=([-\d.e+]+)", line)}
  steps = EPOCHS * math.ceil(TRAIN / BATCH)
  assert final["steps"] == steps  # no step skipped
  assert 0.0 <= final["test_accuracy"] <= 1.0  # 32 noisy steps: accuracy not asserted
  orders = rdp_accountant.DEFAULT_ORDERS
  eps = rdp_accountant.get_privacy_spent(
      orders, rdp_accountant.compute_rdp(BATCH / TRAIN, SIGMA, steps, orders),
      target_delta=DELTA)[0]
  assert math.isclose(final["epsilon_rdp"], eps, rel_tol=1e-3)


@pytest.mark.slow
def test_an_unknown_dtype_policy_is_refused_before_training():
  result = _run("--dtype_policy=float16")
  assert result.returncode != 0
  assert "dtype_policy" in result.stdout + result.stderr
  assert "epoch 1" not in result.stdout
