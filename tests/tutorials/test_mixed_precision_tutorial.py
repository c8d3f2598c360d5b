"""The MNIST tutorial's --dtype_policy: mixed_float16 trains (finite loss every epoch, every step
taken) and its epsilon is float32's (analysis.rdp_accountant): the loss scale is static, so the
dtype never changes what is released or accounted."""
import math
import re

import pytest

from tutorial_runs import final_numbers, reference_rdp_epsilon, run_mnist_tutorial

TRAIN, TEST, BATCH, EPOCHS, DELTA, SIGMA = 1024, 500, 64, 2, 1e-5, 1.1


def _run(*flags):
  return run_mnist_tutorial(*flags, train=TRAIN, test=TEST, batch=BATCH, epochs=EPOCHS,
                            sigma=SIGMA, delta=DELTA, learning_rate=0.5)


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_dtype_policy_flag_trains_with_the_float32_epsilon(policy):
  result = _run(f"--dtype_policy={policy}")
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  epochs = [dict(re.findall(r"(\w+)=([-\d.e+]+)", line)) for line in result.stdout.splitlines()
            if line.startswith("epoch ")]
  assert len(epochs) == EPOCHS
  assert all(math.isfinite(float(e["loss"])) for e in epochs)
  final = final_numbers(result)
  steps = EPOCHS * math.ceil(TRAIN / BATCH)
  assert final["steps"] == steps  # no step skipped
  assert 0.0 <= final["test_accuracy"] <= 1.0  # 32 noisy steps: accuracy not asserted
  eps = reference_rdp_epsilon(BATCH / TRAIN, SIGMA, steps, DELTA)
  assert math.isclose(final["epsilon_rdp"], eps, rel_tol=1e-3)


@pytest.mark.slow
def test_an_unknown_dtype_policy_is_refused_before_training():
  result = _run("--dtype_policy=float16")
  assert result.returncode != 0
  assert "dtype_policy" in result.stdout + result.stderr
  assert "epoch 1" not in result.stdout
