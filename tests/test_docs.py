"""The front page and the documentation: every relative link resolves, the README stays short,
every code block of the README, the guides and the other docs pages runs as written on small
data (or is marked, with a reason), module docstrings stay short and every design page is in
the site's navigation.

A block preceded by ``<!-- not run: REASON -->`` is skipped (e.g. install commands, which CI
runs itself, and printed output).  The Python blocks of one page run in order in one namespace,
as a reader would paste them, after a prelude that defines the data names they use (``x_train``,
``y_train``, ``batches``) with small random arrays of MNIST's shapes.  A guide's blocks may
leave to the reader what the reader has (a model, a dataset, ``[...layers...]``) and show
full-size settings (60 epochs of MNIST): ``PAGE_SETUP`` supplies the former and ``PAGE_SMALL``
shrinks the latter for the test; every such replacement must still occur in its page, so a
stale one fails instead of silently testing nothing.  The prelude imports nothing into the
blocks' namespace, so a block that forgets an import fails.
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


def _checkout_env():
  """The environment of a block's process: this checkout's packages first (the blocks run in a
  temporary folder, where an installed copy or none at all would otherwise be imported)."""
  path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
  return dict(os.environ, PYTHONPATH=path, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")


def test_readme_python_blocks_run_in_order_on_small_data(tmp_path):
  code = "\n".join(block for lang, block, reason in _blocks(README)
                   if lang == "python" and not reason)
  assert code, "the README has no Python block"
  script = tmp_path / "readme_blocks.py"
  script.write_text(textwrap.dedent(PRELUDE) + code + textwrap.dedent("""
      print("EPSILON", private.epsilon, model.optimizer is not None)
      print("OK")
      """))
  result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          cwd=tmp_path, env=_checkout_env(), timeout=600)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  assert "OK" in result.stdout


DOC_PAGES = sorted((ROOT / "docs" / "guides").glob("*.md")) + sorted((ROOT / "docs").glob("*.md"))

# The small data every page's blocks may use, defined without leaking an import into the blocks'
# namespace: ``x_train``/``y_train`` (and ``x``/``y``) of MNIST's shapes, ``batches`` (a batched
# dataset), and ``small_layers()``, a fresh small layer list for ``[...layers...]``.
DOC_PRELUDE = """
def _small_data():
  import keras, numpy as np, tensorflow as tf
  rng = np.random.default_rng(0)
  x_train = rng.uniform(size=(512, 28, 28, 1)).astype(np.float32)
  y_train = rng.integers(0, 10, 512)
  def small_layers():
    return [keras.Input((28, 28, 1)), keras.layers.Flatten(), keras.layers.Dense(10)]
  return dict(x_train=x_train, y_train=y_train, x=x_train, y=y_train, small_layers=small_layers,
              batches=tf.data.Dataset.from_tensor_slices((x_train, y_train)).batch(64).take(2))
globals().update(_small_data())
del _small_data
"""

# Pages whose blocks need no TensorFlow: run without the prelude, and TensorFlow must stay
# unimported (the accounting runs on machines without it).
NO_TENSORFLOW_PAGES = {"guides/accounting.md", "hyperparameter_tuning.md"}

# What the reader has and a page's fragments leave to the reader (run after the prelude).
_SMALL_MODEL = """
import keras, tf_dpkit
model = tf_dpkit.DPSequential(small_layers())
"""
PAGE_SETUP = {
    "guides/auditing.md": """
        import keras, tf_dpkit
        base_model = keras.Sequential(small_layers())
        dp_optimizer = tf_dpkit.DPGradientDescentGaussianOptimizer(
            l2_norm_clip=1.0, noise_multiplier=1.1, learning_rate=0.1, expected_batch_size=64)
        steps = 3
        """,
    "guides/budget.md": _SMALL_MODEL,
    "guides/distributed.md": """
        import tensorflow as tf
        train_dataset = tf.data.Dataset.from_tensor_slices((x_train, y_train)).batch(64).take(2)
        """,
    "guides/pate.md": """
        import numpy as np   # the block uses np without importing it (page of pate-37: to add)
        x_private, y_private = x_train[:400], y_train[:400]
        x_queries, x_public = x_train[400:], x_train[400:]
        """,
    "guides/published_accuracy.md": _SMALL_MODEL + "test = (x_train[:64], y_train[:64])\n",
    "migration_from_tf_privacy.md": """
        import keras
        train_data, train_labels = x_train[:500], keras.utils.to_categorical(y_train[:500], 10)
        test_data, test_labels = x_train[:100], keras.utils.to_categorical(y_train[:100], 10)
        layers = small_layers()
        """,
}

# (text in the page's blocks, what the test runs instead): placeholders and full-size settings.
COMMON_SMALL = [("[...layers...]", "small_layers()"), ("[...]", "small_layers()")]
PAGE_SMALL = {
    "guides/auditing.md": [("make_canaries(10000,", "make_canaries(20,"),
                           ("model.fit(batches,",  # the reader's pipeline of the canary data
                            "model.fit(tf_dpkit.data.poisson_batches(((x_all, index), y_all), "
                            "expected_batch_size=64, steps=steps),"),
                           ("num_guesses=400", "num_guesses=10")],
    "guides/budget.md": [("steps=60 * steps_per_epoch", "steps=2 * steps_per_epoch"),
                         ("epochs=60, steps_per_epoch", "epochs=2, steps_per_epoch")],
    "guides/distributed.md": [("epochs=60)", "epochs=1)"),
                              ("tf.distribute.MultiWorkerMirroredStrategy()",
                               "tf.distribute.MirroredStrategy()"),  # no second process here
                              ("q = 256 / len(x_train)", "q = 16 / len(x_train)"),  # 256 of 512
                              # would spend a budget of 3 in one step
                              ("steps=60 * steps_per_epoch", "steps=2 * steps_per_epoch"),
                              ("epochs=60, steps_per_epoch", "epochs=2, steps_per_epoch")],
    "guides/generative.md": [("answers = 3000 * 8", "answers = 2 * 8"),
                             ("num_teachers=250", "num_teachers=5"),
                             ("iterations=3000", "iterations=2")],
    "guides/make_private.md": [("epochs=60", "epochs=2")],
    "guides/pate.md": [("len(x_private), 250", "len(x_private), 10"),
                       ("TeacherEnsemble(250", "TeacherEnsemble(10"),
                       ("epochs=15", "epochs=1"),
                       ("threshold=200, sigma1=150", "threshold=0, sigma1=1.5"),  # untrained teachers
                       # agree too little for a real threshold: answer every query
                       ("sigma2=40", "sigma2=0.4"),
                       ('method="fixmatch"', 'method="fixmatch", steps=2')],
    "guides/published_accuracy.md": [("batch_size=2048, epochs=40", "batch_size=256, epochs=2")],
    "guides/virtual_batches.md": [("k, steps = 4, 200", "k, steps = 4, 3")],
    "guides/ways_to_train.md": [("steps=60 * 235", "steps=2 * 2"),
                                ("epochs=60, steps_per_epoch=235", "epochs=2, steps_per_epoch=2")],
    "index.md": [("epochs=60", "epochs=2")],
    "migration_from_tf_privacy.md": [("epochs=15", "epochs=1"), ("epochs=60", "epochs=1")],
}

# Run after a page's blocks: what its comments promise.  The accounting numbers a page prints
# are checked against the page's text (references for them are in tests/analysis); the others
# against closed forms.
PAGE_CHECKS = {
    "guides/accounting.md": """
        assert abs(accountants.make_accountant("rdp").compose(run).get_epsilon(1e-5) - 2.597) < 5e-4
        assert abs(accountants.make_accountant("pld").compose(run).get_epsilon(1e-5) - 2.382) < 5e-4
        assert abs(eps - 2.5966) < 5e-5 and abs(order - 8.12) < 5e-3   # the optimal real order
        """,
    "hyperparameter_tuning.md": """
        assert abs(tuning.tuned_epsilon(run, 10, 1.0, 1e-5) - 5.05) < 5e-3
        """,
    "guides/per_layer_clipping.md": """
        assert abs(optimizer.l2_norm_clip - (0.8 ** 2 + 0.6 ** 2) ** 0.5) < 1e-6
        """,
    "guides/virtual_batches.md": """
        assert model.optimizer.iterations.numpy() == budget.accountant.steps == steps  # not k * steps
        """,
}


def _page_id(path):
  return str(path.relative_to(ROOT / "docs"))


def _page_script(path):
  page = _page_id(path)
  code = "\n".join(block for lang, block, reason in _blocks(path)
                   if lang == "python" and not reason)
  for old, new in PAGE_SMALL.get(page, []):
    assert old in code, f"PAGE_SMALL[{page!r}]: {old!r} no longer occurs in the page's blocks"
    code = code.replace(old, new)
  for old, new in COMMON_SMALL:
    code = code.replace(old, new)
  code += "\n" + textwrap.dedent(PAGE_CHECKS.get(page, ""))
  if page in NO_TENSORFLOW_PAGES:
    return code + "\nimport sys\nassert 'tensorflow' not in sys.modules, 'TensorFlow was imported'\n"
  return textwrap.dedent(DOC_PRELUDE) + textwrap.dedent(PAGE_SETUP.get(page, "")) + code


def test_every_docs_block_is_run_or_marked_with_a_reason():
  unmarked = [f"{_page_id(path)}: ```{lang}" for path in DOC_PAGES
              for lang, _, reason in _blocks(path) if lang not in ("python", "bash") and not reason]
  assert not unmarked, f"blocks neither run by a test nor marked with a reason: {unmarked}"


def test_the_page_settings_name_existing_pages():
  pages = {_page_id(path) for path in DOC_PAGES}
  assert set(PAGE_SETUP) | set(PAGE_SMALL) | set(PAGE_CHECKS) | NO_TENSORFLOW_PAGES <= pages


def _runs_something(path):
  return any(lang in ("python", "bash") and not reason for lang, _, reason in _blocks(path))


# The pages whose blocks need TensorFlow run in tests/test_docs_pages.py (listed in
# tests/heavy.txt: together they take minutes); the accounting pages run here.
TENSORFLOW_PAGES = [path for path in DOC_PAGES
                    if _runs_something(path) and _page_id(path) not in NO_TENSORFLOW_PAGES]


@pytest.mark.parametrize("path", [path for path in DOC_PAGES if _page_id(path) in NO_TENSORFLOW_PAGES],
                         ids=_page_id)
def test_accounting_pages_blocks_run_without_tensorflow(path, tmp_path):
  run_page_blocks(path, tmp_path)


def run_page_blocks(path, tmp_path):
  """Runs the page's bash blocks, then its Python blocks in order in one fresh process."""
  blocks = _blocks(path)
  script = _page_script(path)
  shell = [block for lang, block, reason in blocks if lang == "bash" and not reason]
  env = _checkout_env()
  for block in shell:
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", block], capture_output=True,
                            text=True, cwd=tmp_path, env=env, timeout=300)
    assert result.returncode == 0, block + result.stdout[-3000:] + result.stderr[-3000:]
  (tmp_path / "page_blocks.py").write_text(script + "\nprint('PAGE OK')\n")
  result = subprocess.run([sys.executable, "page_blocks.py"], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=600)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  assert "PAGE OK" in result.stdout


MAX_MODULE_DOCSTRING_LINES = 35

def test_module_docstrings_are_short_and_the_design_is_in_docs_design():
  import ast  # pylint: disable=g-import-not-at-top
  long = {}
  for package in ("analysis", "tf_dpkit"):
    for path in sorted((ROOT / package).rglob("*.py")):
      docstring = ast.get_docstring(ast.parse(path.read_text()), clean=False)
      if docstring and len(docstring.splitlines()) > MAX_MODULE_DOCSTRING_LINES:
        long[str(path.relative_to(ROOT))] = len(docstring.splitlines())
  assert not long, (
      "module docstrings over %d lines (move the design to docs/design/<topic>.md and keep the "
      "contract in a few lines): %s" % (MAX_MODULE_DOCSTRING_LINES, long))


def test_every_design_page_is_in_the_site_navigation():
  nav = (ROOT / "mkdocs.yml").read_text()
  missing = [page.name for page in sorted((ROOT / "docs" / "design").glob("*.md"))
             if not re.search(r":\s*design/%s\s*$" % re.escape(page.name), nav, re.M)]
  assert not missing, f"docs/design pages missing from mkdocs.yml's nav: {missing}"
