"""The front page and the documentation: every relative link resolves, the README stays short,
and every README code block runs as written on small data (or is marked, with a reason).

A block preceded by ``<!-- not run: REASON -->`` is skipped (e.g. install commands, which CI
runs itself, and printed output).  The Python blocks run in order in one namespace, as a reader
would paste them, after a prelude that defines the data names they use (``x_train``,
``y_train``, ``batches``) with small random arrays of MNIST's shapes.
"""
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BLOCK = re.compile(r"(?:<!-- not run: (?P<reason>[^>]*?) -->\s*\n)?```(?P<lang>\w*)\n(?P<code>.*?)```",
                   re.S)
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _blocks(path):
  return [(m.group("lang"), m.group("code"), m.group("reason"))
          for m in BLOCK.finditer(path.read_text())]


def _markdown_files():
  files = [README, ROOT / "CHANGELOG.md", ROOT / "tutorials" / "README.md"]
  files += sorted((ROOT / "docs").rglob("*.md"))
  return [f for f in files if f.exists()]


def test_readme_is_a_short_front_page():
  assert len(README.read_text().splitlines()) <= 200


@pytest.mark.parametrize("path", _markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path):
  missing = []
  for target in LINK.findall(path.read_text()):
    if re.match(r"[a-z]+:", target):  # http:, https:, mailto: -- not checked offline
      continue
    if not (path.parent / target).exists():
      missing.append(target)
  assert not missing, f"{path.relative_to(ROOT)} links to missing files: {missing}"


def test_every_readme_block_is_run_or_marked_with_a_reason():
  for lang, code, reason in _blocks(README):
    if lang != "python":
      assert reason, f"a ```{lang} block is not run by this test and has no reason:\n{code}"


PRELUDE = """
import numpy as np, tensorflow as tf
rng = np.random.default_rng(0)
x_train = rng.uniform(size=(512, 28, 28, 1)).astype(np.float32)
y_train = rng.integers(0, 10, 512)
batches = tf.data.Dataset.from_tensor_slices((x_train, y_train)).batch(64).take(2)
"""


def test_readme_python_blocks_run_in_order_on_small_data(tmp_path):
  code = "\n".join(block for lang, block, reason in _blocks(README)
                   if lang == "python" and not reason)
  assert code, "the README has no Python block"
  script = tmp_path / "readme_blocks.py"
  script.write_text(textwrap.dedent(PRELUDE) + code + textwrap.dedent("""
      print("EPSILON", private.epsilon, model.optimizer is not None)
      print("OK")
      """))
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
  result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=600)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  assert "OK" in result.stdout
