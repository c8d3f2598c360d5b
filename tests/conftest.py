"""Shared test settings: quiet TensorFlow logs; shared test helpers (tests/dp_references.py)
importable from every test file."""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
