"""The MNIST tutorial's --adaptive_clipping: the clip norm moves (logged every epoch) and the
epsilon is that of fixed clipping with the same noise multiplier (analysis.rdp_accountant).

The clip follows the median norm (about 5 at initialisation, 10 soon after for this CNN), so the
learning rate is 0.1 instead of the fixed-clip tests' 0.5: the clip norm scales the update."""
import math
import re

import pytest

from tutorial_runs import final_numbers, reference_rdp_epsilon, run_mnist_tutorial

TRAIN, TEST, BATCH, EPOCHS, DELTA, SIGMA = 1024, 500, 64, 4, 1e-5, 1.1


def _run(*flags):
  return run_mnist_tutorial(*flags, train=TRAIN, test=TEST, batch=BATCH, epochs=EPOCHS,
                            sigma=SIGMA, delta=DELTA, learning_rate=0.1)


@pytest.mark.slow
def test_adaptive_clipping_flag_moves_the_clip_and_keeps_the_epsilon():
  result = _run("--adaptive_clipping", "--target_quantile=0.5")
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  epochs = [dict(re.findall(r"(\w+)=([-\d.e+]+)", line)) for line in result.stdout.splitlines()
            if line.startswith("epoch ")]
  clips = [float(e["l2_norm_clip"]) for e in epochs]
  assert len(clips) == EPOCHS and len(set(clips)) == EPOCHS  # it moved every epoch
  final = final_numbers(result)
  assert 0.0 <= final["test_accuracy"] <= 1.0  # 64 noisy steps: accuracy not asserted
  steps = EPOCHS * math.ceil(TRAIN / BATCH)
  fixed_clip_eps = reference_rdp_epsilon(BATCH / TRAIN, SIGMA, steps, DELTA)
  assert math.isclose(final["epsilon_rdp"], fixed_clip_eps, rel_tol=1e-3)


@pytest.mark.slow
def test_too_little_count_noise_is_refused_before_training():
  result = _run("--adaptive_clipping", "--count_noise_stddev=0.5")
  assert result.returncode != 0
  assert "count_noise_stddev > noise_multiplier / 2" in result.stdout + result.stderr
  assert "epoch 1" not in result.stdout
