"""Modules renamed so that their names say what they hold keep their old import paths for one
release, as thin re-exports: every name of the old path is the very object of the new one."""
import importlib

import pytest

RENAMED = [
    ("tf_dpkit.clipping.examples", "tf_dpkit.clipping.contract"),
]


@pytest.mark.parametrize("old_name, new_name", RENAMED)
def test_old_module_path_re_exports_the_same_objects(old_name, new_name):
  old, new = importlib.import_module(old_name), importlib.import_module(new_name)
  assert old is not new and "deprecated alias" in old.__doc__.lower()
  assert old.__all__ and set(old.__all__) == set(new.__all__)
  for name in new.__all__:
    assert getattr(old, name) is getattr(new, name), f"{old_name}.{name}"
