"""Fails early, and clearly, when ``import analysis`` does not give tf_dpkit's own package.

tf_dpkit's privacy accounting lives in the top-level package ``analysis``, installed beside
``tf_dpkit``.  A user's own module or folder of that name found earlier on ``sys.path`` (the
directory of the script being run and the current directory come first, and research repos often
have an ``analysis/``) is imported instead, and every ``from analysis import ...`` in tf_dpkit
would then fail with an unhelpful "cannot import name".  ``tf_dpkit/__init__.py`` imports this
module before anything else, so every tf_dpkit import of ``analysis`` goes through this check:
the module bound to the name ``analysis`` must carry the marker ``__tf_dpkit_analysis__ = True``
set in ``analysis/__init__.py``.  A folder ``analysis`` without ``__init__.py`` (a namespace
package) never takes precedence over tf_dpkit's regular package on sys.path, but it does shadow
an editable install (``pip install -e``), whose import hook runs after the path search; both
cases are caught.
"""
from __future__ import annotations

import importlib
import pathlib

_MARKER = "__tf_dpkit_analysis__"


def _describe(module) -> str:
  """Where a module was loaded from: its file, or its folders for a namespace package."""
  where = getattr(module, "__file__", None)
  if where:
    return str(where)
  path = list(getattr(module, "__path__", None) or [])
  return f"namespace package {path}" if path else repr(module)


def _own_location() -> str:
  """Where tf_dpkit's ``analysis`` should be: the folder beside the tf_dpkit package."""
  beside = pathlib.Path(__file__).resolve().parent.parent / "analysis" / "__init__.py"
  if beside.is_file():
    return f"tf_dpkit's own is at {beside}"
  return (f"it is not installed beside tf_dpkit ({beside.parent.parent}); reinstall tf_dpkit "
          "(pip install tf_dpkit) to get it")


def check_analysis_package():
  """Returns tf_dpkit's ``analysis`` package; raises ImportError naming the cause if the name
  ``analysis`` resolves to something else (or to nothing)."""
  try:
    module = importlib.import_module("analysis")
  except ImportError as error:
    raise ImportError(
        f"tf_dpkit could not import its privacy-accounting package 'analysis' ({error}); "
        f"tf_dpkit needs its own 'analysis' package, installed beside it: {_own_location()}."
    ) from error
  if getattr(module, _MARKER, False) is not True:
    raise ImportError(
        f"tf_dpkit needs its own privacy-accounting package 'analysis', installed beside it, "
        f"but 'import analysis' gave a different module: {_describe(module)} (a folder or "
        f"module of yours named 'analysis' comes earlier on sys.path; {_own_location()}). "
        "Rename your local 'analysis' folder or module (e.g. to 'my_analysis'), or put the "
        "directory that contains it later on sys.path than tf_dpkit's installation (Python "
        "puts the running script's directory, or the current directory, first).")
  return module


check_analysis_package()
