"""Tests of analysis.compute_dp_sgd_privacy: the library function, its statement and the CLI.

The canonical MNIST setting (N=60000, batch 256, noise 1.1, 60 epochs, delta 1e-5) is checked
against dp_accounting's RdpAccountant on the same orders (a test-only dependency that also uses
the tight RDP -> DP conversion); the classic conversion eps = rdp - log(delta) / (alpha - 1),
computed here from dp_accounting's RDP, must be larger.
"""
from __future__ import annotations

import math
import os
import pathlib
import subprocess
import sys

import pytest

from analysis import compute_dp_sgd_privacy as cdp
from analysis import rdp_accountant
from dp_references import dp_accounting as _dp_accounting, dp_rdp as _dp_rdp

ROOT = pathlib.Path(__file__).resolve().parents[2]
INT_ORDERS = [float(a) for a in rdp_accountant.DEFAULT_ORDERS if float(a).is_integer()]


def _dp_accounting_rdp(q, sigma, steps, orders):
  dp_accounting, dp_rdp = _dp_accounting(), _dp_rdp()
  accountant = dp_rdp.RdpAccountant(orders=orders)
  if q == 1.0:
    accountant.compose(dp_accounting.GaussianDpEvent(sigma), steps)
  else:
    accountant.compose(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps)
  return accountant


def test_canonical_mnist_against_dp_accounting():
  result = cdp.compute_dp_sgd_privacy(60000, 256, 1.1, 60, 1e-5)
  assert result.steps == 14063 and result.sampling_probability == 256 / 60000
  # Same (integer) orders in both: dp_accounting's value is the independent reference.
  on_ints = cdp.compute_dp_sgd_privacy(60000, 256, 1.1, 60, 1e-5, orders=INT_ORDERS)
  accountant = _dp_accounting_rdp(256 / 60000, 1.1, 14063, INT_ORDERS)
  eps_ref, order_ref = accountant.get_epsilon_and_optimal_order(1e-5)
  assert on_ints.epsilon == pytest.approx(eps_ref, rel=1e-9)
  assert on_ints.optimal_order == order_ref
  # Fractional orders can only help.
  assert result.epsilon <= on_ints.epsilon
  # The classic conversion (Mironov 2017, Prop. 3) is looser.
  classic = min(r - math.log(1e-5) / (a - 1)
                for a, r in zip(INT_ORDERS, accountant._rdp))  # pylint: disable=protected-access
  assert result.epsilon < classic
  # The issue quotes "about 2.9" (classic) and "~2.6" (tight) for this setting.
  assert 2.85 < classic < 3.05 and 2.5 < result.epsilon < 2.7
  # No amplification: 60 compositions of the unsampled Gaussian.
  eps0 = _dp_accounting_rdp(1.0, 1.1, 60, INT_ORDERS).get_epsilon(1e-5)
  assert result.epsilon_no_amplification <= eps0 * (1 + 1e-9)
  assert result.epsilon_no_amplification > 10 * result.epsilon


def test_statement_mentions_the_facts():
  result = cdp.compute_dp_sgd_privacy(60000, 256, 1.1, 60, 1e-5)
  text = result.statement()
  assert str(result) == text
  for fragment in ["14063 steps", "q = 0.00426667", "noise multiplier 1.1",
                   f"({result.epsilon:.4g}, 1e-05)", f"order {result.optimal_order:g}",
                   "Poisson sampling", "shuffle-and-iterate",
                   f"{result.epsilon_no_amplification:.4g}"]:
    assert fragment in text, fragment
  assert "\n" not in text


def test_microbatches_halve_the_effective_noise():
  result = cdp.compute_dp_sgd_privacy(60000, 256, 1.1, 10, 1e-5, microbatch_size=4)
  assert result.effective_noise_multiplier == 0.55
  rdp = rdp_accountant.compute_rdp(256 / 60000, 0.55, result.steps,
                                   rdp_accountant.DEFAULT_ORDERS)
  eps, _, _ = rdp_accountant.get_privacy_spent(rdp_accountant.DEFAULT_ORDERS, rdp,
                                               target_delta=1e-5)
  assert result.epsilon == eps
  assert "microbatch of 4" in result.statement() and "0.55" in result.statement()
  plain = cdp.compute_dp_sgd_privacy(60000, 256, 1.1, 10, 1e-5)
  assert plain.effective_noise_multiplier == 1.1 and result.epsilon > plain.epsilon


def test_fractional_epochs_and_boundary_note():
  result = cdp.compute_dp_sgd_privacy(1000, 100, 1.0, 2.5, 1e-5)
  assert result.steps == 25
  # No amplification: an example is touched in ceil(2.5) = 3 epochs.
  eps0 = _dp_accounting_rdp(1.0, 1.0, 3, INT_ORDERS).get_epsilon(1e-5)
  assert result.epsilon_no_amplification <= eps0 * (1 + 1e-9)
  narrow = cdp.compute_dp_sgd_privacy(60000, 256, 1.1, 60, 1e-5, orders=[2, 3])
  assert narrow.order_at_boundary and "wider range" in narrow.statement()


def test_errors_name_the_argument():
  cases = [
      (dict(n=0), "n must be"), (dict(batch_size=70000), "batch_size"),
      (dict(noise_multiplier=-1.0), "noise_multiplier"), (dict(epochs=-1), "epochs"),
      (dict(delta=0.0), "delta"), (dict(microbatch_size=0), "microbatch_size"),
      (dict(microbatch_size=3), "microbatch_size must divide"),
      (dict(orders=[1.0]), "orders"), (dict(accountant="moments"), "accountant"),
  ]
  base = dict(n=60000, batch_size=256, noise_multiplier=1.1, epochs=1, delta=1e-5)
  for change, message in cases:
    args = {**base, **change}
    kwargs = {k: args.pop(k) for k in ("microbatch_size", "orders", "accountant") if k in args}
    with pytest.raises(ValueError, match=message):
      cdp.compute_dp_sgd_privacy(*args.values(), **kwargs)


def test_pld_accountant_branch():
  module = pytest.importorskip("analysis.pld_accountant")
  if not hasattr(module, "compute_epsilon"):
    pytest.skip("analysis.pld_accountant.compute_epsilon not written yet")
  result = cdp.compute_dp_sgd_privacy(60000, 256, 1.1, 3, 1e-5, accountant="pld")
  assert result.epsilon == module.compute_epsilon(256 / 60000, 1.1, result.steps, 1e-5)
  assert result.optimal_order is None and "privacy-loss-distribution" in result.statement()
  rdp = cdp.compute_dp_sgd_privacy(60000, 256, 1.1, 3, 1e-5)
  assert result.epsilon <= rdp.epsilon


def test_pld_accountant_is_pld_where_tighter_and_never_above_rdp():
  # Issue 11: at 1e6 epochs the PLD grid alone (coarsened to h = 0.065) gave 23,722 where RDP
  # gives 3,451; both are valid bounds, so the PLD accountant reports the smaller one.
  from analysis import pld_accountant  # pylint: disable=g-import-not-at-top
  q = 256 / 60000
  moderate = cdp.compute_dp_sgd_privacy(60000, 256, 1.1, 60, 1e-5, accountant="pld")
  moderate_rdp = cdp.compute_dp_sgd_privacy(60000, 256, 1.1, 60, 1e-5)
  ref_rdp = _dp_accounting_rdp(q, 1.1, 14063, list(rdp_accountant.DEFAULT_ORDERS))
  assert moderate.epsilon == pld_accountant.compute_epsilon(q, 1.1, 14063, 1e-5)  # 2.3818
  assert moderate.epsilon < 0.92 * min(moderate_rdp.epsilon, ref_rdp.get_epsilon(1e-5))  # 2.597
  assert moderate.optimal_order is None and moderate.order_no_amplification is None
  # No amplification: 60 Gaussian steps, exactly mu = sqrt(60) / 1.1, eps 54.045818 (mpmath).
  assert 54.045818 < moderate.epsilon_no_amplification < 54.0459

  huge = cdp.compute_dp_sgd_privacy(60000, 256, 1.1, 1e6, 1e-5, accountant="pld")
  huge_rdp = cdp.compute_dp_sgd_privacy(60000, 256, 1.1, 1e6, 1e-5)
  capped = pld_accountant.compute_epsilon_with_rdp_cap([q], [1.1], [huge.steps], 1e-5)
  ref_rdp = _dp_accounting_rdp(q, 1.1, huge.steps, list(rdp_accountant.DEFAULT_ORDERS))
  assert huge.steps == 234_375_000 and capped.pld_epsilon > 20000  # the grid alone: 23,722
  assert huge.epsilon == capped.epsilon == capped.rdp_epsilon
  assert huge.epsilon <= huge_rdp.epsilon <= ref_rdp.get_epsilon(1e-5)  # 3072.5, 3451, 3520
  assert 3000 < huge.epsilon < 3073 and 3451 < huge_rdp.epsilon < 3452
  assert huge.optimal_order == capped.rdp_order and 1.0 < huge.optimal_order < 1.25
  assert "Renyi-DP accounting" in huge.statement()
  assert "tighter here than privacy-loss-distribution (PLD) accounting" in huge.statement()
  # Without amplification (1e6 Gaussian steps) both accountants report the exact eps
  # 417,099.32 (mpmath, mu = 1000 / 1.1); RDP alone would give 516,600.
  assert huge.order_no_amplification is None and huge_rdp.order_no_amplification is None
  assert 417099.3 < huge.epsilon_no_amplification < 417099.3 * 1.0001
  assert huge_rdp.epsilon_no_amplification == huge.epsilon_no_amplification
  rdp_only = rdp_accountant.get_privacy_spent(
      rdp_accountant.DEFAULT_ORDERS, rdp_accountant.compute_rdp(
          1.0, 1.1, 10**6, rdp_accountant.DEFAULT_ORDERS), target_delta=1e-5)[0]
  assert huge.epsilon_no_amplification < 0.81 * rdp_only


def test_orders_with_pld_and_out_of_range_steps_are_errors():
  with pytest.raises(ValueError) as info:
    cdp.compute_dp_sgd_privacy(60000, 256, 1.1, 1, 1e-5, orders=[2, 3], accountant="pld")
  assert str(info.value) == ("orders must be None with accountant='pld' (the PLD accountant "
                             "has no Renyi orders), got [2, 3].")
  with pytest.raises(ValueError) as info:
    cdp.compute_dp_sgd_privacy(60000, 256, 1.1, 1, 1e-5, orders=[])
  assert str(info.value) == "orders must not be empty: give at least one Renyi order in (1, inf]."
  # 1e300 epochs: about 2e302 steps, which used to give a finite epsilon from rounded floats.
  with pytest.raises(ValueError, match=r"^epochs=1e\+300 with dataset_size=60000 and "
                                       r"batch_size=256 gives 2\.343e\+302"):
    cdp.compute_dp_sgd_privacy(60000, 256, 1.1, 1e300, 1e-5)
  with pytest.raises(ValueError) as info:
    cdp.compute_dp_sgd_privacy(60000, 256, 1.1, 1e8, 1e-5, accountant="pld")
  # 1e8 * 60000 / 256 = 23437500000 steps; at most 1e10 * 256 / 60000 = 4.26667e7 epochs.
  assert str(info.value) == (
      "epochs=100000000.0 gives 23437500000 steps, above the PLD accountant's supported "
      "maximum of 10000000000 steps; use fewer epochs (at most 4.26667e+07) or "
      "accountant='rdp'.")


# ------------------------------------------------------------------------------------------
# Command line, in a subprocess.


def _cli(*args):
  env = dict(os.environ, PYTHONPATH=str(ROOT))
  return subprocess.run([sys.executable, "-m", "analysis.compute_dp_sgd_privacy", *args],
                        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_cli_success():
  proc = _cli("--N=60000", "--batch_size=256", "--noise_multiplier=1.1", "--epochs=60",
              "--delta=1e-5")
  assert proc.returncode == 0, proc.stderr
  expected = cdp.compute_dp_sgd_privacy(60000, 256, 1.1, 60, 1e-5)
  assert f"epsilon = {expected.epsilon:.4g} at delta = 1e-05" in proc.stdout
  assert expected.statement() in proc.stdout
  proc = _cli("--N=60000", "--batch_size=256", "--noise_multiplier=1.1", "--epochs=60",
              "--orders=2,4,8,16,32", "--microbatch_size=2", "--delta=1e-6")
  assert proc.returncode == 0, proc.stderr
  expected = cdp.compute_dp_sgd_privacy(60000, 256, 1.1, 60, 1e-6, microbatch_size=2,
                                        orders=[2, 4, 8, 16, 32])
  assert f"epsilon = {expected.epsilon:.4g} at delta = 1e-06" in proc.stdout


def test_cli_pld_says_when_the_rdp_bound_is_smaller():
  base = ("--N=60000", "--batch_size=256", "--noise_multiplier=1.1", "--accountant=pld",
          "--delta=1e-5")
  proc = _cli(*base, "--epochs=1e6")
  assert proc.returncode == 0, proc.stderr
  expected = cdp.compute_dp_sgd_privacy(60000, 256, 1.1, 1e6, 1e-5, accountant="pld")
  assert proc.stdout.splitlines()[0] == (
      "epsilon = 3073 at delta = 1e-05 (Poisson sampling, pld accountant: the RDP bound, "
      "optimal order 1.065, is smaller here)")
  assert expected.statement() in proc.stdout
  proc = _cli(*base, "--epochs=60")
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.splitlines()[0] == (
      "epsilon = 2.382 at delta = 1e-05 (Poisson sampling, pld accountant)")


@pytest.mark.parametrize("args,fragment", [
    (["--N=60000", "--batch_size=70000", "--noise_multiplier=1.1", "--epochs=60"], "batch_size"),
    (["--N=60000", "--batch_size=256", "--noise_multiplier=-1", "--epochs=60"],
     "noise_multiplier"),
    (["--N=60000", "--noise_multiplier=1.1", "--epochs=60"], "batch_size"),
    (["--N=60000", "--batch_size=256", "--noise_multiplier=abc", "--epochs=60"],
     "noise_multiplier"),
    (["--N=60000", "--batch_size=256", "--noise_multiplier=1.1", "--epochs=60",
      "--orders=1.5,x"], "orders"),
    (["--N=60000", "--batch_size=256", "--noise_multiplier=1.1", "--epochs=60",
      "--accountant=moments"], "accountant"),
    (["--N=60000", "--batch_size=256", "--noise_multiplier=1.1", "--epochs=60", "--orders="],
     "orders must not be empty"),
    (["--N=60000", "--batch_size=256", "--noise_multiplier=1.1", "--epochs=1e300"],
     "epochs=1e+300 with dataset_size=60000"),
])
def test_cli_bad_flags_exit_nonzero_with_one_line(args, fragment):
  proc = _cli(*args)
  assert proc.returncode != 0
  assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and fragment in lines[0], proc.stderr


def test_cli_orders_with_pld_is_an_error():
  # --orders used to be silently ignored with --accountant=pld.
  for orders in ("--orders=2,4,8", "--orders=32"):
    proc = _cli("--N=60000", "--batch_size=256", "--noise_multiplier=1.1", "--epochs=3",
                "--accountant=pld", orders)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == (
        "compute_dp_sgd_privacy: error: --orders applies only to --accountant=rdp (the PLD "
        "accountant has no Renyi orders); drop --orders or use --accountant=rdp\n")
  # Without --orders the PLD run works, and --orders with rdp is honoured.
  proc = _cli("--N=60000", "--batch_size=256", "--noise_multiplier=1.1", "--epochs=3",
              "--accountant=pld", "--delta=1e-5")
  assert proc.returncode == 0, proc.stderr
  expected = cdp.compute_dp_sgd_privacy(60000, 256, 1.1, 3, 1e-5, accountant="pld")
  assert f"epsilon = {expected.epsilon:.4g} at delta = 1e-05" in proc.stdout


# ------------------------------------------------------------------------------------------
# TF Privacy's flags: --used_microbatching, --accountant_type, --max_examples_per_user; --help.
# References: dp_accounting on the same (integer) orders, the exact Gaussian in mpmath
# (dp_references.exact_gaussian_epsilon) and a brute-force group-privacy search.

_EPS_LINE = r"^epsilon = (\S+) at delta = 1e-05 \(Poisson sampling, "
_BASE = ("--N=60000", "--batch_size=256", "--noise_multiplier=1.1", "--delta=1e-5")
_INT_ORDERS_FLAG = "--orders=" + ",".join(f"{a:g}" for a in INT_ORDERS)


def _printed(pattern, stdout, group=1):
  import re  # pylint: disable=g-import-not-at-top
  match = re.search(pattern, stdout, re.MULTILINE)
  assert match, stdout
  return float(match.group(group))


def _exact(sigma, count, delta=1e-5):
  from dp_references import exact_gaussian_epsilon  # pylint: disable=g-import-not-at-top
  return exact_gaussian_epsilon(sigma, count, delta)


def test_used_microbatching_halves_the_effective_noise():
  q, steps = 256 / 60000, math.ceil(5 * 60000 / 256)
  reference = _dp_accounting_rdp(q, 0.55, steps, INT_ORDERS).get_epsilon(1e-5)
  for microbatch_size in (1, 4):
    result = cdp.compute_dp_sgd_privacy(60000, 256, 1.1, 5, 1e-5, orders=INT_ORDERS,
                                        used_microbatching=True,
                                        microbatch_size=microbatch_size)
    assert result.effective_noise_multiplier == 0.55 and result.used_microbatching
    assert result.epsilon == pytest.approx(reference, rel=1e-9)
    assert result.epsilon_no_amplification == pytest.approx(_exact(0.55, 5), rel=1e-9)
  text = cdp.compute_dp_sgd_privacy(60000, 256, 1.1, 5, 1e-5, used_microbatching=True).statement()
  assert "per microbatch of more than one example" in text and "0.55 (= 1.1 / 2)" in text
  with pytest.raises(ValueError) as info:
    cdp.compute_dp_sgd_privacy(60000, 256, 1.1, 5, 1e-5, used_microbatching="yes")
  assert str(info.value) == "used_microbatching must be True or False, got 'yes'."


def test_cli_used_microbatching():
  q, steps = 256 / 60000, math.ceil(5 * 60000 / 256)
  reference = _dp_accounting_rdp(q, 0.55, steps, INT_ORDERS).get_epsilon(1e-5)
  for extra in (("--used_microbatching",), ("--used_microbatching", "--microbatch_size=4"),
                ("--used_microbatching=true",)):
    proc = _cli(*_BASE, "--epochs=5", _INT_ORDERS_FLAG, *extra)
    assert proc.returncode == 0, proc.stderr
    assert _printed(_EPS_LINE, proc.stdout) == pytest.approx(reference, rel=5e-4)
    assert _printed(r"^epsilon without amplification by sampling = (\S+)$",
                    proc.stdout) == pytest.approx(_exact(0.55, 5), rel=5e-4)
    assert "effective noise multiplier = 0.55" in proc.stdout
  # --noused_microbatching is per-example clipping: the same run as without the flag.
  plain = _cli(*_BASE, "--epochs=5")
  proc = _cli(*_BASE, "--epochs=5", "--noused_microbatching")
  assert proc.returncode == 0 and proc.stdout == plain.stdout
  assert "effective noise multiplier = 1.1" in proc.stdout
  # ... and contradicts microbatches of 4.
  proc = _cli(*_BASE, "--epochs=5", "--noused_microbatching", "--microbatch_size=4")
  assert proc.returncode == 2 and proc.stdout == ""
  assert proc.stderr == ("compute_dp_sgd_privacy: error: --noused_microbatching contradicts "
                         "--microbatch_size=4; give one of them\n")


def test_cli_accountant_type():
  dp_accounting = _dp_accounting()
  pld_module = pytest.importorskip("dp_accounting.pld.pld_privacy_accountant")
  steps = math.ceil(2 * 60000 / 256)
  reference = pld_module.PLDAccountant(value_discretization_interval=1e-4)
  reference.compose(dp_accounting.PoissonSampledDpEvent(
      256 / 60000, dp_accounting.GaussianDpEvent(1.1)), steps)
  pld = _cli(*_BASE, "--epochs=2", "--accountant=pld")
  assert pld.returncode == 0, pld.stderr
  eps = _printed(_EPS_LINE, pld.stdout)
  assert eps <= reference.get_epsilon(1e-5) * (1 + 1e-3) + 5e-4 * eps
  assert eps >= reference.get_epsilon(1e-5) * (1 - 1e-3) - 5e-4 * eps
  for flags in (("--accountant_type=PLD",), ("--accountant_type=PLD", "--accountant=pld")):
    proc = _cli(*_BASE, "--epochs=2", *flags)
    assert proc.returncode == 0 and proc.stdout == pld.stdout, proc.stderr
  rdp = _cli(*_BASE, "--epochs=2")
  for flags in (("--accountant_type=RDP",), ("--accountant_type=RDP", "--accountant=rdp")):
    proc = _cli(*_BASE, "--epochs=2", *flags)
    assert proc.returncode == 0 and proc.stdout == rdp.stdout, proc.stderr
  assert "rdp accountant" in rdp.stdout and rdp.stdout != pld.stdout
  for given, typed in (("rdp", "PLD"), ("pld", "RDP")):
    proc = _cli(*_BASE, "--epochs=2", f"--accountant={given}", f"--accountant_type={typed}")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == (f"compute_dp_sgd_privacy: error: --accountant={given} and "
                           f"--accountant_type={typed} disagree; give one of them\n")
  proc = _cli(*_BASE, "--epochs=2", "--accountant_type=pld")
  assert proc.returncode == 2 and proc.stderr == (
      "compute_dp_sgd_privacy: error: flag --accountant_type=pld: value should be one of "
      "<RDP|PLD>\n")


def _brute_force_group_epsilon(get_epsilon, k, delta):
  """min over per-example d of k eps(d) s.t. k e^{(k-1) eps(d)} d <= delta, on a grid of
  log d over [log 1e-300, log(delta / k)] refined twice around its best feasible point."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  low, top = math.log(1e-300), math.log(delta / k)
  grid, best, where = np.linspace(low, top, 700), math.inf, None
  for _ in range(3):
    for log_d in grid:
      eps = get_epsilon(math.exp(log_d))
      if math.log(k) + (k - 1) * eps + log_d <= math.log(delta) and k * eps < best:
        best, where = k * eps, log_d
    if where is None:
      return math.inf
    step = grid[1] - grid[0]
    grid = np.linspace(max(where - step, low), min(where + step, top), 200)
  return best


def test_max_examples_per_user():
  q, steps = 256 / 60000, math.ceil(2.5 * 60000 / 256)
  result = cdp.compute_dp_sgd_privacy(60000, 256, 1.1, 2.5, 1e-5, orders=INT_ORDERS,
                                      max_examples_per_user=3)
  # Once per epoch: the user's examples are one Gaussian of sigma / 3 per epoch, 3 epochs.
  assert result.user_epsilon_no_amplification == pytest.approx(_exact(1.1 / 3, 3), rel=1e-9)
  # Poisson: group privacy on top of the per-example accountant; checked with dp_accounting.
  reference = _dp_accounting_rdp(q, 1.1, steps, INT_ORDERS)
  g = result.user_epsilon
  d = 1e-5 * math.exp(-2 * g / 3) / 3  # the largest per-example delta g allows
  assert reference.get_epsilon(d) <= g / 3 * (1 + 1e-9)
  brute = _brute_force_group_epsilon(reference.get_epsilon, 3, 1e-5)
  assert brute * (1 - 1e-3) <= g <= brute * (1 + 1e-3)
  assert g > 3 * result.epsilon
  text = result.statement()
  assert "each user contributing at most 3 examples" in text and f"{g:.4g}" in text
  # One example per user: the example-level numbers.
  one = cdp.compute_dp_sgd_privacy(60000, 256, 1.1, 2.5, 1e-5, max_examples_per_user=1)
  assert one.user_epsilon == one.epsilon
  assert one.user_epsilon_no_amplification == one.epsilon_no_amplification
  # With microbatches: sigma / (2 k) once per epoch.
  micro = cdp.compute_dp_sgd_privacy(60000, 256, 1.1, 2.5, 1e-5, max_examples_per_user=2,
                                     microbatch_size=2)
  assert micro.user_epsilon_no_amplification == pytest.approx(_exact(1.1 / 4, 3), rel=1e-9)
  plain = cdp.compute_dp_sgd_privacy(60000, 256, 1.1, 2.5, 1e-5)
  assert plain.user_epsilon is None and plain.user_epsilon_no_amplification is None
  assert "User-level" not in plain.statement()
  for k, message in [(0, "max_examples_per_user must be an integer in [1, 60000], got 0."),
                     (60001, "max_examples_per_user must be an integer in [1, 60000], got 60001."),
                     (2.0, "max_examples_per_user must be an integer in [1, 60000], got 2.0.")]:
    with pytest.raises(ValueError) as info:
      cdp.compute_dp_sgd_privacy(60000, 256, 1.1, 2.5, 1e-5, max_examples_per_user=k)
    assert str(info.value) == message


def test_cli_max_examples_per_user():
  q, steps = 256 / 60000, math.ceil(2.5 * 60000 / 256)
  proc = _cli(*_BASE, "--epochs=2.5", "--max_examples_per_user=3", _INT_ORDERS_FLAG)
  assert proc.returncode == 0, proc.stderr
  line = (r"^user-level epsilon \(at most 3 examples per user\) = (\S+) \(Poisson sampling, "
          r"group privacy\), (\S+) \(each example once per epoch\)$")
  reference = _dp_accounting_rdp(q, 1.1, steps, INT_ORDERS)
  brute = _brute_force_group_epsilon(reference.get_epsilon, 3, 1e-5)
  assert _printed(line, proc.stdout, 1) == pytest.approx(brute, rel=2e-3)
  assert _printed(line, proc.stdout, 2) == pytest.approx(_exact(1.1 / 3, 3), rel=5e-4)
  assert "User-level privacy" in proc.stdout
  proc = _cli(*_BASE, "--epochs=2.5")
  assert proc.returncode == 0 and "user-level" not in proc.stdout
  for k in (0, 60001):
    proc = _cli(*_BASE, "--epochs=2.5", f"--max_examples_per_user={k}")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == ("compute_dp_sgd_privacy: error: max_examples_per_user must be an "
                           f"integer in [1, 60000], got {k}.\n")


def test_installed_console_script_help_lists_every_flag():
  import re  # pylint: disable=g-import-not-at-top
  import shutil  # pylint: disable=g-import-not-at-top
  script = shutil.which("compute_dp_sgd_privacy")
  if script is None:
    candidate = pathlib.Path(sys.executable).parent / "compute_dp_sgd_privacy"
    script = str(candidate) if candidate.exists() else None
  if script is None:
    pytest.skip("the compute_dp_sgd_privacy console script is not installed")
  proc = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=120,
                        cwd=ROOT)
  assert proc.returncode == 0 and proc.stderr == "", proc.stderr
  flags = {"N", "batch_size", "noise_multiplier", "epochs", "delta", "microbatch_size",
           "orders", "accountant", "accountant_type", "used_microbatching",
           "max_examples_per_user", "tuning_runs_mean", "tuning_shape"}
  listed = set(re.findall(r"^\s+--(?:\[no\])?(\w+):", proc.stdout, re.MULTILINE))
  assert listed == flags, proc.stdout
  assert "--[no]used_microbatching:" in proc.stdout
  assert proc.stdout.startswith(cdp.__doc__.split("\n", 1)[0])


# ------------------------------------------------------------------------------------------
# Hyper-parameter tuning: --tuning_runs_mean / --tuning_shape.  Reference: dp_accounting's
# RdpAccountant on RepeatAndSelectDpEvent, on integer orders (tests/analysis/test_tuning.py
# explains why integer orders; its Poisson curve gets the monotone step dp_accounting omits).


def _dp_accounting_tuned_epsilon(steps, mean, shape, orders):
  import numpy as np  # pylint: disable=g-import-not-at-top
  dp_accounting, dp_rdp = _dp_accounting(), _dp_rdp()
  run = dp_accounting.SelfComposedDpEvent(
      dp_accounting.PoissonSampledDpEvent(256 / 60000, dp_accounting.GaussianDpEvent(1.1)),
      steps)
  accountant = dp_rdp.RdpAccountant(orders=orders)
  accountant.compose(dp_accounting.dp_event.RepeatAndSelectDpEvent(run, mean, shape))
  raw = np.asarray(accountant._rdp)  # pylint: disable=protected-access
  rdp = np.minimum.accumulate(raw[::-1])[::-1]
  return rdp_accountant.get_privacy_spent(orders, list(rdp), target_delta=1e-5)[0]


def _run_in_process(capsys, *args):
  """(exit code, stdout, stderr) of the command line run in this process."""
  code = 0
  try:
    cdp.run(["compute_dp_sgd_privacy", *args])
  except SystemExit as exit_:
    code = exit_.code
  out = capsys.readouterr()
  return code, out.out, out.err


def test_tuning_reports_the_tuned_epsilon(capsys):
  for shape, name, theorem in ((1.0, "geometric", "2"), (math.inf, "Poisson", "6")):
    reference = _dp_accounting_tuned_epsilon(14063, 10.0, shape, INT_ORDERS)
    result = cdp.compute_dp_sgd_privacy(60000, 256, 1.1, 60, 1e-5, orders=INT_ORDERS,
                                        tuning_runs_mean=10, tuning_shape=shape)
    assert result.tuned_epsilon == pytest.approx(reference, rel=1e-8)
    assert result.tuned_epsilon > 1.5 * result.epsilon
    assert (result.tuning_runs_mean, result.tuning_shape) == (10.0, shape)
    assert (f"K drawn independently of the data from the {name} distribution with mean 10, "
            f"and only the best run's output is released, the release is "
            f"({result.tuned_epsilon:.4g}, 1e-05)-differentially private") in result.statement()
    assert f"Theorem {theorem}," in result.statement()
    code, out, err = _run_in_process(capsys, *_BASE, "--epochs=60", _INT_ORDERS_FLAG,
                                     "--tuning_runs_mean=10", f"--tuning_shape={shape:g}")
    assert code == 0 and err == "", err
    printed = _printed(rf"^tuned epsilon = (\S+) at delta = 1e-05 \(best of K runs, K {name} "
                       r"with mean 10; Poisson sampling, rdp accountant\)$", out)
    assert printed == float(f"{reference:.4g}")
    assert result.statement() in out
  # Without the flags nothing is said about tuning; with --accountant=pld tuning is by RDP.
  plain = cdp.compute_dp_sgd_privacy(60000, 256, 1.1, 60, 1e-5)
  assert plain.tuned_epsilon is None and "tuning" not in plain.statement()
  rdp = cdp.compute_dp_sgd_privacy(60000, 256, 1.1, 60, 1e-5, tuning_runs_mean=10,
                                   tuning_shape=0)
  pld = cdp.compute_dp_sgd_privacy(60000, 256, 1.1, 60, 1e-5, tuning_runs_mean=10,
                                   tuning_shape=0, accountant="pld")
  assert pld.tuned_epsilon == rdp.tuned_epsilon and pld.epsilon < rdp.epsilon


@pytest.mark.parametrize("args,message", [
    (["--tuning_runs_mean=10"],
     "tuning_runs_mean and tuning_shape go together (the shape is the distribution K must be "
     "drawn from: inf Poisson, 1 geometric, 0 logarithmic, or any > -1), got "
     "tuning_runs_mean=10.0, tuning_shape=None."),
    (["--tuning_shape=1"],
     "tuning_runs_mean and tuning_shape go together (the shape is the distribution K must be "
     "drawn from: inf Poisson, 1 geometric, 0 logarithmic, or any > -1), got "
     "tuning_runs_mean=None, tuning_shape=1.0."),
    (["--tuning_runs_mean=0.5", "--tuning_shape=1"],
     "tuning_runs_mean must be a finite number >= 1 (the expected number of runs), got 0.5."),
    (["--tuning_runs_mean=10", "--tuning_shape=-1"],
     "tuning_shape must be in (-1, inf] (inf: Poisson, 1: geometric, 0: logarithmic, else "
     "truncated negative binomial), got -1.0."),
    (["--tuning_runs_mean=10", "--tuning_shape=nan"],
     "tuning_shape must be in (-1, inf] (inf: Poisson, 1: geometric, 0: logarithmic, else "
     "truncated negative binomial), got nan."),
])
def test_tuning_flag_errors_are_one_line(capsys, args, message):
  code, out, err = _run_in_process(capsys, *_BASE, "--epochs=1", *args)
  assert code == 2 and out == ""
  assert err == f"compute_dp_sgd_privacy: error: {message}\n"


def test_cli_default_delta_is_tf_privacys_and_a_delta_not_below_one_over_n_is_warned():
  # TF Privacy's compute_dp_sgd_privacy defines --delta with default 1e-6 (its flags).
  proc = _cli("--N=60000", "--batch_size=256", "--noise_multiplier=1.1", "--epochs=60")
  assert proc.returncode == 0, proc.stderr
  expected = cdp.compute_dp_sgd_privacy(60000, 256, 1.1, 60, 1e-6)
  assert f"epsilon = {expected.epsilon:.4g} at delta = 1e-06" in proc.stdout
  assert "warning" not in proc.stderr
  proc = _cli("--N=1000", "--batch_size=100", "--noise_multiplier=1.1", "--epochs=2",
              "--delta=1e-3")
  assert proc.returncode == 0, proc.stderr
  assert ("compute_dp_sgd_privacy: warning: delta=0.001 is not below 1/N = 0.001" in
          proc.stderr)
