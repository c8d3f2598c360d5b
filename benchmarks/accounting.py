"""Median wall time of the accounting functions, as a markdown table.

    python benchmarks/accounting.py            # prints the table, writes results/accounting.md

Setting: MNIST DP-SGD, q = 256/60000, noise multiplier 1.1, delta 1e-5; 14063 steps (60 epochs)
for the RDP rows, 100,000 steps for the PLD row.  Each row is timed ``--reps`` times (default
20) after one warm-up call and the median is reported.  Targets: < 50 ms for the RDP rows,
< 2 s for PLD.  No TensorFlow import.
"""
from __future__ import annotations

import os
import pathlib
import platform
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from analysis import calibration, rdp_accountant  # noqa: E402

Q, SIGMA, DELTA, STEPS = 256 / 60000, 1.1, 1e-5, 14063
PLD_STEPS = 100_000
COMMAND = "python benchmarks/accounting.py"


def _median_seconds(fn, reps):
  fn()  # warm-up (imports, caches of the first call)
  times = []
  for _ in range(reps):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def _rdp_grid():
  rdp = rdp_accountant.compute_rdp(Q, SIGMA, STEPS, rdp_accountant.DEFAULT_ORDERS)
  return rdp_accountant.get_privacy_spent(rdp_accountant.DEFAULT_ORDERS, rdp,
                                          target_delta=DELTA)[0]


def _rows(reps):
  rows = []
  # compute_rdp caches integer-order values per (q, sigma, alpha); clear it so each rep pays
  # the full cost, as a fresh query would.
  clear = rdp_accountant._log_a_int.cache_clear  # pylint: disable=protected-access

  def timed(label, fn, target):
    def run():
      clear()
      return fn()
    value = run()
    rows.append((label, _median_seconds(run, reps), target, value))

  timed(f"compute_rdp + get_privacy_spent, DEFAULT_ORDERS ({len(rdp_accountant.DEFAULT_ORDERS)}"
        f" orders), {STEPS} steps", _rdp_grid, 0.05)
  timed("get_privacy_spent_optimal_order (grid + continuous search)",
        lambda: rdp_accountant.get_privacy_spent_optimal_order(
            Q, SIGMA, STEPS, target_delta=DELTA)[0], 0.05)
  timed("compute_noise_multiplier (rdp) for eps = 2.6",
        lambda: calibration.compute_noise_multiplier(2.6, DELTA, Q, STEPS), 0.05)
  try:
    from analysis import pld_accountant  # pylint: disable=g-import-not-at-top
    compute_epsilon = getattr(pld_accountant, "compute_epsilon", None)
  except ImportError:
    compute_epsilon = None
  if compute_epsilon is not None:
    pld_reps = max(3, reps // 4)
    value = compute_epsilon(Q, SIGMA, PLD_STEPS, DELTA)
    rows.append((f"pld_accountant.compute_epsilon, {PLD_STEPS} steps",
                 _median_seconds(lambda: compute_epsilon(Q, SIGMA, PLD_STEPS, DELTA), pld_reps),
                 2.0, value))
    value = calibration.compute_noise_multiplier(2.6, DELTA, Q, STEPS, accountant="pld")
    rows.append(("compute_noise_multiplier (pld) for eps = 2.6",
                 _median_seconds(lambda: calibration.compute_noise_multiplier(
                     2.6, DELTA, Q, STEPS, accountant="pld"), 3), None, value))
  return rows


def main(argv):
  reps = 20
  for arg in argv[1:]:
    if arg.startswith("--reps="):
      reps = int(arg.split("=", 1)[1])
  rows = _rows(reps)
  lines = [
      f"Command: `{COMMAND}`",
      "",
      f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
      f"Python {platform.python_version()}; median of {reps} runs (PLD rows: fewer, see "
      "benchmarks/accounting.py).",
      f"Setting: q = 256/60000, noise multiplier {SIGMA}, delta {DELTA:g}.",
      "",
      "| what | median time | target | result |",
      "|---|---:|---:|---:|",
  ]
  for label, seconds, target, value in rows:
    target_text = "-" if target is None else (f"< {target * 1e3:.0f} ms" if target < 1
                                              else f"< {target:g} s")
    lines.append(f"| {label} | {seconds * 1e3:.1f} ms | {target_text} | {value:.4f} |")
  table = "\n".join(lines) + "\n"
  print(table)
  out = ROOT / "benchmarks" / "results" / "accounting.md"
  out.parent.mkdir(parents=True, exist_ok=True)
  out.write_text("# Accounting benchmark\n\n" + table)


if __name__ == "__main__":
  main(sys.argv)
