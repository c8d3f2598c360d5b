"""BUILD must list every source and test file, and nothing that does not exist.

Bazel cannot run offline on these machines, so this test parses BUILD with Python's ast (its
syntax is a Python subset) and checks it against the tree.
"""
import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _targets():
  tree = ast.parse((ROOT / "BUILD").read_text())
  targets = []
  for node in ast.walk(tree):
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and
        node.func.id.startswith("py_")):
      kwargs = {k.arg: k.value for k in node.keywords}
      srcs = []
      if "srcs" in kwargs:
        srcs = [ast.literal_eval(e) for e in kwargs["srcs"].elts]
      targets.append((node.func.id, ast.literal_eval(kwargs["name"]), srcs))
  return targets


def _files(pattern_root):
  return {str(p.relative_to(ROOT)) for p in (ROOT / pattern_root).rglob("*.py")
          if "__pycache__" not in p.parts}


def test_every_listed_file_exists():
  for kind, name, srcs in _targets():
    for src in srcs:
      assert (ROOT / src).is_file(), f"{kind} {name} lists missing file {src}"


def test_every_package_source_is_in_a_py_library():
  listed = {s for kind, _, srcs in _targets() if kind == "py_library" for s in srcs}
  missing = (_files("tf_dpkit") | _files("analysis")) - listed
  assert not missing, f"add to a py_library in BUILD: {sorted(missing)}"


def test_every_script_and_test_helper_is_in_some_target():
  listed = {s for _, _, srcs in _targets() for s in srcs}
  wanted = _files("tutorials") | _files("benchmarks") | _files("tests")
  missing = wanted - listed
  assert not missing, f"add to a target in BUILD: {sorted(missing)}"


def test_every_test_file_has_its_own_py_test():
  tests = [srcs[0] for kind, _, srcs in _targets() if kind == "py_test"]
  assert len(tests) == len(set(tests)), "a test file has two py_test targets"
  tests = set(tests)
  wanted = {f for f in _files("tests") if pathlib.Path(f).name.startswith("test_")}
  assert wanted == tests, f"py_test targets differ from test files: {sorted(wanted ^ tests)}"


def test_command_line_tools_are_py_binaries():
  binaries = {name for kind, name, _ in _targets() if kind == "py_binary"}
  assert "compute_dp_sgd_privacy" in binaries
