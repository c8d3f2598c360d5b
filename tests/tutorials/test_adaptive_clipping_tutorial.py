"""The MNIST tutorial's --adaptive_clipping: the clip norm moves (logged every epoch) and the
epsilon is that of fixed clipping with the same noise multiplier (analysis.rdp_accountant).

The clip follows the median norm (about 5 at initialisation, 10 soon after for this CNN), so the
learning rate is 0.1 instead of the fixed-clip tests' 0.5: the clip norm scales the update."""
import math
import os
import re
import subprocess
import sys

import pytest

from analysis import rdp_accountant

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN, TEST, BATCH, EPOCHS, DELTA, SIGMA = 1024, 500, 64, 4, 1e-5, 1.1


def _run(*flags):
  env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
  cmd = [sys.executable, os.path.join(ROOT, "tutorials", "mnist_dpsgd_tutorial.py"),
         f"--train_size={TRAIN}", f"--test_size={TEST}", f"--batch_size={BATCH}",
         f"--epochs={EPOCHS}", f"--noise_multiplier={SIGMA}", "--l2_norm_clip=1.0",
         f"--delta={DELTA}", "--learning_rate=0.1", *flags]
  return subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)


@pytest.mark.slow
def test_adaptive_clipping_flag_moves_the_clip_and_keeps_the_epsilon():
  result = _run("--adaptive_clipping", "--target_quantile=0.5")
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  epochs = [dict(re.findall(r"(\w+)=([-\d.e+]+)", line)) for line in result.stdout.splitlines()
            if line.startswith("epoch ")]
  clips = [float(e["l2_norm_clip"]) for e in epochs]
  assert len(clips) == EPOCHS and len(set(clips)) == EPOCHS  # it moved every epoch
  line = next(l for l in result.stdout.splitlines() if l.startswith("final:"))
  final = {k: float(v) for k, v in re.findall(r"(\w+)=([-\d.e+]+)", line)}
  assert 0.0 <= final["test_accuracy"] <= 1.0  # 64 noisy steps: accuracy not asserted
  steps = EPOCHS * math.ceil(TRAIN / BATCH)
  orders = rdp_accountant.DEFAULT_ORDERS
  fixed_clip_eps = rdp_accountant.get_privacy_spent(
      orders, rdp_accountant.compute_rdp(BATCH / TRAIN, SIGMA, steps, orders),
      target_delta=DELTA)[0]
  assert math.isclose(final["epsilon_rdp"], fixed_clip_eps, rel_tol=1e-3)


@pytest.mark.slow
def test_too_little_count_noise_is_refused_before_training():
  result = _run("--adaptive_clipping", "--count_noise_stddev=0.5")
  assert result.returncode != 0
  assert "count_noise_stddev > noise_multiplier / 2" in result.stdout + result.stderr
  assert "epoch 1" not in result.stdout
