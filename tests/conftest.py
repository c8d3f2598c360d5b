"""Shared test settings: quiet TensorFlow logs; shared test helpers (tests/dp_references.py)
importable from every test file."""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _heavy_ids():
  path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "heavy.txt")
  with open(path) as listing:
    return {line.strip() for line in listing if line.strip() and not line.startswith("#")}


def pytest_collection_modifyitems(config, items):  # pylint: disable=unused-argument
  """Marks the tests listed in tests/heavy.txt ``heavy``: node ids, node ids without their
  parameters (every parametrisation), or whole files."""
  import pytest  # pylint: disable=g-import-not-at-top
  heavy = _heavy_ids()
  for item in items:
    if (item.nodeid in heavy or item.nodeid.split("[")[0] in heavy or
        item.nodeid.split("::")[0] in heavy):
      item.add_marker(pytest.mark.heavy)
