"""Modules renamed so that their names say what they hold keep their old import paths for one
release, as thin re-exports: every name of the old path is the very object of the new one."""
import importlib
import sys

import pytest

RENAMED = [
    ("tf_dpkit.clipping.examples", "tf_dpkit.clipping.contract"),
    ("tf_dpkit.models", "tf_dpkit.dp_models"),
    ("tf_dpkit.model_gradients", "tf_dpkit.dp_gradients"),
    ("tf_dpkit.generative.models", "tf_dpkit.generative.networks"),
]


@pytest.mark.parametrize("old_name, new_name", RENAMED)
def test_old_module_path_re_exports_the_same_objects(old_name, new_name):
  old, new = importlib.import_module(old_name), importlib.import_module(new_name)
  assert old is not new and "deprecated alias" in old.__doc__.lower()
  assert old.__all__ and set(old.__all__) == set(new.__all__)
  for name in new.__all__:
    assert getattr(old, name) is getattr(new, name), f"{old_name}.{name}"


@pytest.mark.parametrize("old_name, new_name", RENAMED)
def test_old_module_is_an_attribute_of_its_package_without_importing_it(old_name, new_name,
                                                                          monkeypatch):
  # Before the renames, `import tf_dpkit` made e.g. `tf_dpkit.models` an attribute; it still is.
  importlib.import_module(new_name)
  parent_name, child = old_name.rsplit(".", 1)
  parent = importlib.import_module(parent_name)
  monkeypatch.delitem(sys.modules, old_name, raising=False)
  monkeypatch.delattr(parent, child, raising=False)
  old = getattr(parent, child)
  assert old is sys.modules[old_name] and old.__name__ == old_name
  with pytest.raises(AttributeError, match="has no attribute 'no_such_module'"):
    getattr(parent, "no_such_module")


def test_top_level_names_are_unchanged():
  import tf_dpkit  # pylint: disable=g-import-not-at-top
  from tf_dpkit import dp_gradients, dp_models  # pylint: disable=g-import-not-at-top
  assert tf_dpkit.DPModel is dp_models.DPModel and tf_dpkit.DPSequential is dp_models.DPSequential
  assert tf_dpkit.make_dp_model_class is dp_models.make_dp_model_class
  assert tf_dpkit.private_gradients is dp_gradients.private_gradients  # the function, not a module
