"""Median wall time of the accounting functions, as a markdown table.

    python benchmarks/accounting.py            # prints the table, writes results/accounting.md

Setting: MNIST DP-SGD, q = 256/60000, noise multiplier 1.1, delta 1e-5; 14063 steps (60 epochs)
for the RDP rows, 100,000 steps for the PLD row.  Each row is timed ``--reps`` times (default
20) after one warm-up call and the median is reported.  Every timed call, the warm-up included,
starts with all memoisation caches of the accounting modules cleared (every functools cache
found on them, e.g. rdp_accountant._log_a_int), so each rep pays the full cost of a fresh
query, as a first call in a new process would (module imports aside).  Targets: < 50 ms for
the RDP rows, < 2 s for PLD.  No TensorFlow import.
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

from analysis import calibration, pld_accountant, rdp_accountant  # noqa: E402

Q, SIGMA, DELTA, STEPS = 256 / 60000, 1.1, 1e-5, 14063
PLD_STEPS = 100_000
COMMAND = "python benchmarks/accounting.py"


_MODULES = (calibration, pld_accountant, rdp_accountant)


def _caches():
  """Every functools.lru_cache / functools.cache wrapper defined on the accounting modules."""
  found = []
  for module in _MODULES:
    for name in dir(module):
      obj = getattr(module, name)
      if callable(getattr(obj, "cache_clear", None)) and callable(getattr(obj, "cache_info",
                                                                           None)):
        found.append(obj)
  return found


CACHES = _caches()


def _clear_caches():
  for cache in CACHES:
    cache.cache_clear()


def _median_seconds(fn, reps):
  """Median wall time of fn over reps calls, each after clearing every cache."""
  _clear_caches()
  fn()  # warm-up (lazy imports, code paths); caches are cleared again below
  times = []
  for _ in range(reps):
    _clear_caches()
    assert all(cache.cache_info().currsize == 0 for cache in CACHES)
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
  assert CACHES, "expected rdp_accountant._log_a_int's cache; did the module change?"

  def timed(label, fn, target, count=reps):
    _clear_caches()
    value = fn()
    rows.append((label, _median_seconds(fn, count), target, value))

  timed(f"compute_rdp + get_privacy_spent, DEFAULT_ORDERS ({len(rdp_accountant.DEFAULT_ORDERS)}"
        f" orders), {STEPS} steps", _rdp_grid, 0.05)
  timed("get_privacy_spent_optimal_order (grid + continuous search)",
        lambda: rdp_accountant.get_privacy_spent_optimal_order(
            Q, SIGMA, STEPS, target_delta=DELTA)[0], 0.05)
  timed("compute_noise_multiplier (rdp) for eps = 2.6",
        lambda: calibration.compute_noise_multiplier(2.6, DELTA, Q, STEPS), 0.05)
  timed(f"pld_accountant.compute_epsilon, {PLD_STEPS} steps",
        lambda: pld_accountant.compute_epsilon(Q, SIGMA, PLD_STEPS, DELTA), 2.0,
        count=max(3, reps // 4))
  timed("compute_noise_multiplier (pld) for eps = 2.6",
        lambda: calibration.compute_noise_multiplier(2.6, DELTA, Q, STEPS, accountant="pld"),
        None, count=3)
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
      "benchmarks/accounting.py), each with every memoisation cache of the accounting "
      "modules cleared first (cold: a fresh query's full cost).",
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
