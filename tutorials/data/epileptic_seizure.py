"""UCI Epileptic Seizure Recognition (tutorials/data/README.md): loading, split, public scaling.

* :func:`load` reads the shipped copy after checking its SHA-256 and returns the 178 features
  (12-bit A/D converter counts) and the binary label ``y == 1`` (seizure).
* :func:`split` is the stratified split of the PATE-GAN protocol (a fixed public seed).
* :func:`to_unit` / :func:`from_unit` map counts to ``[0, 1]`` and back with a FIXED,
  data-independent function: clip to the converter's documented range ``[-2048, 2047]``, then
  compand with ``asinh(x / SCALE)`` (``SCALE`` = 100 counts, chosen a priori from the range of
  EEG amplitudes; it only spreads the small amplitudes of non-seizure EEG over more of
  ``[0, 1]``).  No statistic of the (private) data enters, so the scaling costs no privacy
  (unlike min-max scaling with the data's own extremes).
"""
from __future__ import annotations

import hashlib
import os

import numpy as np

PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "epileptic_seizure.csv.gz")
SHA256 = "1dab5441be457189bb6aadc3af4f288ad090e4f7877a7a1e329c85054792cb19"
NUM_FEATURES = 178
COLUMNS = tuple(f"X{i}" for i in range(1, NUM_FEATURES + 1))
#: The recording's 12-bit A/D converter range (counts): a public bound, not read from the data.
LOW, HIGH = -2048.0, 2047.0
#: Companding scale (counts), fixed in advance (module docstring).
SCALE = 100.0
#: Seed of the public train/test split.
SPLIT_SEED = 0


def sha256(path):
  digest = hashlib.sha256()
  with open(path, "rb") as handle:
    for block in iter(lambda: handle.read(1 << 20), b""):
      digest.update(block)
  return digest.hexdigest()


def load(path=PATH):
  """``(x, y)``: float32 ``[11500, 178]`` counts and int64 ``[11500]`` labels ``1[y == 1]``.

  Raises ``ValueError`` if the file's SHA-256 is not :data:`SHA256` or its header is not
  ``X1..X178, y``.
  """
  found = sha256(path)
  if found != SHA256:
    raise ValueError(f"{path} has SHA-256 {found}, expected {SHA256} (the UCI Epileptic "
                     "Seizure Recognition copy described in tutorials/data/README.md).")
  table = np.loadtxt(path, delimiter=",", dtype=str, max_rows=1)
  if tuple(table[:-1]) != COLUMNS or table[-1] != "y":
    raise ValueError(f"{path}: header must be X1..X178,y, got {list(table[:3])}...")
  data = np.loadtxt(path, delimiter=",", skiprows=1, dtype=np.float64)
  x = data[:, :NUM_FEATURES].astype(np.float32)
  y = (data[:, NUM_FEATURES] == 1).astype(np.int64)
  return x, y


def split(x, y, test_fraction=0.2, seed=SPLIT_SEED):
  """Stratified split: in each class, ``round(test_fraction * n_class)`` rows (a uniformly
  random subset drawn with ``seed``) go to the test part.  Returns ``(x_a, y_a), (x_b, y_b)``,
  rows in their original order within each part."""
  if not 0.0 < test_fraction < 1.0:
    raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}.")
  y = np.asarray(y)
  rng = np.random.default_rng(seed)
  test = np.zeros(len(y), bool)
  for label in np.unique(y):
    rows = np.flatnonzero(y == label)
    test[rng.choice(rows, int(round(test_fraction * len(rows))), replace=False)] = True
  return (x[~test], y[~test]), (x[test], y[test])


def _bounds():
  return np.arcsinh(LOW / SCALE), np.arcsinh(HIGH / SCALE)


def to_unit(x):
  """Counts -> ``[0, 1]``: clip to ``[LOW, HIGH]``, then ``(asinh(x / SCALE) - a) / (b - a)``
  with ``a, b`` the images of ``LOW, HIGH``.  Element-wise and data-independent."""
  a, b = _bounds()
  u = np.arcsinh(np.clip(np.asarray(x, np.float64), LOW, HIGH) / SCALE)
  return ((u - a) / (b - a)).astype(np.float32)


def from_unit(u):
  """``[0, 1]`` -> counts: the inverse of :func:`to_unit` (inputs clipped to ``[0, 1]``),
  rounded to integers as in the input file."""
  a, b = _bounds()
  v = a + np.clip(np.asarray(u, np.float64), 0.0, 1.0) * (b - a)
  return np.round(SCALE * np.sinh(v)).astype(np.float32)
