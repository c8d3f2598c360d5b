"""``mnist_dpsgd_tutorial.py --features=scattering``: a shortened private run reports the epsilon
of the private statistics composed with its own DP-SGD steps, recomputed here with
``analysis.rdp_accountant`` alone (independent of the ledger and calibration code); the
non-private run uses exact statistics; bad flags are refused before any work."""
import math
import re

from analysis import rdp_accountant
from tutorial_runs import final_numbers, run_mnist_tutorial


def test_private_run_reports_the_statistics_composed_with_training():
  train, batch, epochs, delta, nsig = 4096, 128, 3, 1e-5, 5.0
  result = run_mnist_tutorial("--features=scattering", "--activation=tanh", "--target_epsilon=8",
                              f"--normalization_noise_multiplier={nsig}", "--momentum=0.9",
                              train=train, test=500, batch=batch, epochs=epochs, delta=delta,
                              learning_rate=2.0)
  final = final_numbers(result)
  assert "Scattering transform (J=2, L=8): 81 x 7 x 7 features per image" in result.stdout
  assert "Private per-channel statistics: noise multiplier 5.0" in result.stdout
  assert "composed with the feature statistics" in result.stdout
  sigma = float(re.search(r"Train to a budget: noise_multiplier=([\d.]+)", result.stdout)[1])
  steps = epochs * (train // batch)
  assert final["steps"] == steps
  orders = rdp_accountant.DEFAULT_ORDERS
  rdp = (rdp_accountant.compute_rdp(1.0, nsig, 2, orders)  # two Gaussian sums of the statistics
         + rdp_accountant.compute_rdp(batch / train, sigma, steps, orders))
  expected = rdp_accountant.get_privacy_spent(orders, rdp, target_delta=delta)[0]
  # The ledger reports min(RDP bound, ...) through the same orders; sigma is printed to 4
  # decimals, so allow the epsilon change of a 5e-5 change in sigma.
  assert math.isclose(final["epsilon_rdp"], expected, rel_tol=1e-3), (final, expected)
  assert final["epsilon_rdp"] <= 8.0 + 1e-4
  without = rdp_accountant.get_privacy_spent(
      orders, rdp_accountant.compute_rdp(batch / train, sigma, steps, orders),
      target_delta=delta)[0]
  assert final["epsilon_rdp"] > without + 0.01  # the statistics are in it
  assert final["test_accuracy"] > 0.3  # chance is 0.1


def test_non_private_run_and_refusals():
  result = run_mnist_tutorial("--features=scattering", "--nodpsgd", train=512, test=200,
                              batch=64, epochs=1)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "non-private" in result.stdout
  assert "Private per-channel statistics" not in result.stdout
  for flag, message in [("--normalization_noise_multiplier=0", "must be finite and > 0"),
                        ("--normalization_mean_clip=-1", "must be finite and > 0"),
                        ("--normalization_second_moment_clip=nan", "must be finite and > 0")]:
    bad = run_mnist_tutorial("--features=scattering", flag, train=256, test=100, epochs=1)
    assert bad.returncode != 0
    assert message in bad.stdout + bad.stderr and flag.split("=")[0] in bad.stdout + bad.stderr
    assert "Scattering transform" not in bad.stdout
  bad = run_mnist_tutorial("--features=scattering", "--dtype_policy=mixed_float16", train=256,
                           test=100, epochs=1)
  assert bad.returncode != 0 and "trains in float32 only" in bad.stdout + bad.stderr


def test_validation_split_is_reported_as_such():
  """--validation scores the last 10,000 training images: the lines name validation_accuracy,
  never test_accuracy."""
  result = run_mnist_tutorial("--validation", "--nodpsgd", train=512, test=300, batch=64,
                              epochs=1)
  assert result.returncode == 0, result.stderr[-3000:]
  final = next(l for l in result.stdout.splitlines() if l.startswith("final:"))
  assert "validation_accuracy=" in final and "test_accuracy" not in result.stdout
