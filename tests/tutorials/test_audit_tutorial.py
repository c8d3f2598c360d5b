"""tutorials/audit_tutorial.py on a small MNIST slice: its table, and the audit catching the
broken pipelines (claimed epsilon 1, 200 canaries, 40 guesses: the most 40 guesses can show is
about 2.55, so a correct row below 1 and the broken rows above it are both possible)."""
import json
import os
import subprocess
import sys

import pytest

from analysis import auditing, rdp_accountant

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow  # 11 s end to end; the audits themselves are unit-tested (default suite)
def test_audit_tutorial_table(tmp_path):
  env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
  cmd = [sys.executable, os.path.join(ROOT, "tutorials", "audit_tutorial.py"),
         f"--output_dir={tmp_path}", "--train_size=2000", "--canaries=200", "--guesses=40",
         "--epochs=2", "--target_epsilons=1", "--audits=mnist"]
  result = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  with open(tmp_path / "results.json", encoding="utf-8") as handle:
    rows = {r["pipeline"]: r for r in json.load(handle)}
  assert set(rows) == {"dp", "nonprivate", "noise_off", "same_noise_every_step",
                       "averaged_clipping"}
  assert (tmp_path / "results.md").read_text().count("| dp |") == 1
  dp = rows["dp"]
  # The claim is the accountant's epsilon of the run as it ran (q = 256 / N for the steps
  # taken), and the noise was calibrated so that it is at most the target 1.
  orders = rdp_accountant.DEFAULT_ORDERS
  rdp = rdp_accountant.compute_rdp(256 / dp["num_examples"], dp["noise_multiplier"],
                                   dp["steps"], orders)
  assert dp["claimed_epsilon"] == pytest.approx(
      rdp_accountant.get_privacy_spent(orders, rdp, target_delta=1e-5)[0], rel=1e-12)
  assert 0.99 < dp["claimed_epsilon"] <= 1.0 + 1e-9
  best = auditing.max_one_run_epsilon_lower_bound(200, 40, delta=1e-5)
  for row in rows.values():
    assert row["canaries"] == 200 and row["guesses"] == 40
    assert row["max_epsilon_lower_bound"] == pytest.approx(best, rel=1e-12)
    assert row["epsilon_lower_bound"] == pytest.approx(auditing.one_run_epsilon_lower_bound(
        200, 40, row["correct"], delta=1e-5), rel=1e-12)
    assert row["fdp_epsilon_lower_bound"] == pytest.approx(
        auditing.one_run_fdp_epsilon_lower_bound(200, 40, row["correct"], 1e-5), rel=1e-9)
  assert dp["epsilon_lower_bound"] < dp["claimed_epsilon"]
  for kind in ("noise_off", "same_noise_every_step", "averaged_clipping"):
    assert rows[kind]["epsilon_lower_bound"] > rows[kind]["claimed_epsilon"], kind


@pytest.mark.slow
def test_audit_tutorial_white_box_audits(tmp_path):
  # The Dirac one-run audit and the many-run audit, small: claims exact (analysis.gaussian),
  # correct rows below them, broken rows above, the many-run counts adding up.
  env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
  cmd = [sys.executable, os.path.join(ROOT, "tutorials", "audit_tutorial.py"),
         f"--output_dir={tmp_path}", "--audits=dirac,many_run", "--dirac_canaries=1000",
         "--dirac_guesses=100", "--dirac_steps=2", "--dirac_train_size=200",
         "--many_run_epsilons=4", "--many_runs=400"]
  result = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  with open(tmp_path / "results.json", encoding="utf-8") as handle:
    rows = json.load(handle)
  dirac = {r["pipeline"]: r for r in rows if r["audit"] == "dirac"}
  assert set(dirac) == {"dp", "noise_off", "averaged_clipping"}
  assert dirac["dp"]["claimed_epsilon"] == pytest.approx(4.0, rel=1e-6)
  assert dirac["dp"]["epsilon_lower_bound"] < dirac["dp"]["fdp_epsilon_lower_bound"] < 4.0
  for kind in ("noise_off", "averaged_clipping"):
    assert dirac[kind]["epsilon_lower_bound"] > dirac[kind]["claimed_epsilon"], kind
  (many,) = [r for r in rows if r["audit"] == "many_run"]
  assert many["positives"] + many["negatives"] == 400
  assert many["gdp_mu_lower_bound"] == pytest.approx(auditing.gdp_lower_bound(
      many["true_positives"], many["positives"], many["false_positives"], many["negatives"]))
  assert 0.0 < many["gdp_epsilon_lower_bound"] < many["claimed_epsilon"]
