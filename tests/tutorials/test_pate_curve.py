"""tutorials/pate_curve.py lists every student of the given PATE runs with the epsilons of its
labels' queries, read from the runs' results.json (fabricated here, so every number is known)."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "tutorials", "pate_curve.py")


def _write(folder, results):
  os.makedirs(folder)
  with open(os.path.join(folder, "results.json"), "w") as f:
    json.dump(results, f)


def test_table_has_one_row_per_student_with_its_own_epsilons(tmp_path):
  _write(tmp_path / "cg", {
      "aggregator": "confident_gnmax", "seed": 0, "accuracy_points": [
          {"queries": 1000, "labels": 585, "student_accuracy": 0.965,
           "validation_accuracy": 0.983, "epsilon_data_independent": 3.9,
           "epsilon_data_dependent": 1.40},
          {"queries": 640, "labels": 381, "student_accuracy": 0.9651,
           "validation_accuracy": None, "epsilon_data_independent": 2.95,
           "epsilon_data_dependent": 1.02}]})
  _write(tmp_path / "igm", {  # Interactive GNMax: only the final student, no accuracy points
      "aggregator": "interactive_gnmax", "seed": 2, "accuracy_points": [], "queries": 1280,
      "answered": 400, "student_labeled": 500, "student_accuracy": 0.974,
      "validation_accuracy": 0.99, "epsilon_data_independent": 4.25,
      "epsilon_data_dependent": 1.234})
  out = tmp_path / "curve"
  result = subprocess.run([sys.executable, SCRIPT, f"--runs={tmp_path / 'cg'},{tmp_path / 'igm'}",
                           f"--output_dir={out}"], capture_output=True, text=True, timeout=120,
                          cwd=ROOT)
  assert result.returncode == 0, result.stderr[-2000:]
  rows = [line for line in (out / "curve.md").read_text().splitlines()
          if line.startswith("| ") and "aggregator" not in line]
  assert rows == [
      "| confident_gnmax | 0 | 640 | 381 | 96.5% | - | 2.95 | 1.02 |",
      "| confident_gnmax | 0 | 1000 | 585 | 96.5% | 98.3% | 3.90 | 1.40 |",
      "| interactive_gnmax | 2 | 1280 | 900 | 97.4% | 99.0% | 4.25 | 1.23 |"]
  try:
    import matplotlib  # noqa: F401  pylint: disable=unused-import,g-import-not-at-top
  except ImportError:
    assert "no plot" in result.stdout
  else:
    assert (out / "student_accuracy_vs_epsilon.png").stat().st_size > 1000


def test_runs_and_output_dir_are_required():
  result = subprocess.run([sys.executable, SCRIPT], capture_output=True, text=True, timeout=120,
                          cwd=ROOT)
  assert result.returncode != 0
  assert "--runs" in result.stderr and "--output_dir" in result.stderr
