"""A foreign module named ``analysis`` early on sys.path makes importing tf_dpkit fail with a
message naming the shadowing file and the fix (tf_dpkit/_analysis_guard.py), in subprocesses.

The subprocesses find tf_dpkit and its ``analysis`` through PYTHONPATH=<repo root> (as a regular
install would, on sys.path) and run in an empty directory, so only the PYTHONPATH entries
placed before the repo root can shadow ``analysis``.
"""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
GUARD = ROOT / "tf_dpkit" / "_analysis_guard.py"


def _run(code: str, tmp_path: pathlib.Path, *first_on_path: pathlib.Path):
  cwd = tmp_path / "cwd"
  cwd.mkdir(exist_ok=True)
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([*map(str, first_on_path), str(ROOT)]))
  return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True,
                        text=True, timeout=300)


def _expected_message(shadow: str) -> str:
  return (
      "ImportError: tf_dpkit needs its own privacy-accounting package 'analysis', installed "
      f"beside it, but 'import analysis' gave a different module: {shadow} (a folder or module "
      "of yours named 'analysis' comes earlier on sys.path; tf_dpkit's own is at "
      f"{ROOT / 'analysis' / '__init__.py'}). Rename your local 'analysis' folder or module "
      "(e.g. to 'my_analysis'), or put the directory that contains it later on sys.path than "
      "tf_dpkit's installation (Python puts the running script's directory, or the current "
      "directory, first).")


@pytest.mark.parametrize("layout", ["package", "module"])
def test_a_foreign_analysis_first_on_the_path_fails_with_a_clear_message(tmp_path, layout):
  user = tmp_path / "user_repo"
  if layout == "package":
    shadow = user / "analysis" / "__init__.py"
  else:
    shadow = user / "analysis.py"
  shadow.parent.mkdir(parents=True)
  shadow.write_text("RESULTS = {}\n")
  proc = _run("from tf_dpkit.budget import PrivacyBudget", tmp_path, user)
  assert proc.returncode == 1
  assert proc.stderr.strip().splitlines()[-1] == _expected_message(str(shadow))
  # Raised by the guard, before the confusing error it replaces and before TensorFlow loads.
  assert "cannot import name" not in proc.stderr and "tensorflow" not in proc.stderr


def test_the_guard_names_an_already_imported_foreign_analysis(tmp_path):
  # The same check, on the guard alone (no TensorFlow): the user imported their own package
  # first, so sys.modules["analysis"] is theirs whatever the path order.
  user = tmp_path / "user_repo"
  (user / "analysis").mkdir(parents=True)
  shadow = user / "analysis" / "__init__.py"
  shadow.write_text("")
  code = ("import importlib.util, sys\n"
          f"sys.path.insert(0, {str(user)!r})\n"
          "import analysis\n"
          "sys.path.pop(0)\n"
          f"spec = importlib.util.spec_from_file_location('guard', {str(GUARD)!r})\n"
          "spec.loader.exec_module(importlib.util.module_from_spec(spec))\n")
  proc = _run(code, tmp_path)
  assert proc.returncode == 1
  assert proc.stderr.strip().splitlines()[-1] == _expected_message(str(shadow))


def test_a_namespace_folder_named_analysis_does_not_shadow_the_package(tmp_path):
  # A folder without __init__.py never wins over a regular package on sys.path (guard alone).
  user = tmp_path / "user_repo"
  (user / "analysis").mkdir(parents=True)
  (user / "analysis" / "notes.py").write_text("")
  code = ("import importlib.util\n"
          f"spec = importlib.util.spec_from_file_location('guard', {str(GUARD)!r})\n"
          "guard = importlib.util.module_from_spec(spec)\n"
          "spec.loader.exec_module(guard)\n"
          "print(guard.check_analysis_package().__file__)\n")
  proc = _run(code, tmp_path, user)
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.strip() == str(ROOT / "analysis" / "__init__.py")


def test_positive_control_a_normal_import_works(tmp_path):
  proc = _run("from tf_dpkit.budget import PrivacyBudget\n"
              "import analysis, tf_dpkit\n"
              "print(analysis.__tf_dpkit_analysis__, analysis.__file__)\n", tmp_path)
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.strip().splitlines()[-1] == f"True {ROOT / 'analysis' / '__init__.py'}"
