"""``python -m tf_dpkit.native build [--force]``: builds, verifies, loads and self-checks every
compiled kernel family ahead of time (run once after installing tf_dpkit or TensorFlow), so no
build happens inside a training step; ``python -m tf_dpkit.native status`` only reports.

Prints one line per family (``tf_dpkit.native.status``); exits with 1 if any family is
unavailable (training then uses the TensorFlow ops for it), 0 otherwise.
"""
from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(
      prog="python -m tf_dpkit.native",
      description="Build and check tf_dpkit's compiled CPU kernels ahead of time.")
  parser.add_argument("command", choices=("build", "status"),
                      help="build: compile (if not cached), verify, load and self-check every "
                           "family; status: say what is cached and usable without building")
  parser.add_argument("--force", action="store_true",
                      help="build: compile again even where a verified library is cached "
                           "(replaces a library refused for its digest, a link or its mode)")
  args = parser.parse_args(argv)
  from tf_dpkit import native  # pylint: disable=g-import-not-at-top  (after --help)
  if not native.enabled():
    print(native.status())
    return 1
  print(f"cache folder: {native.cache_dir()}")
  if args.command == "build":
    results = native.build_all(force=args.force)
  else:
    results = native.cached_status()
  for family, reason in results.items():
    print(f"{family}: {reason}")
  usable = all(reason.startswith(("loaded from", "cached at")) for reason in results.values())
  return 0 if usable else 1


if __name__ == "__main__":
  sys.exit(main())
