"""tutorials/mnist_pategan_tutorial.py on a small MNIST slice: outputs and their contents,
private (epsilon 10, MLP networks) and non-private (inf, conv generator and projection
student).  Two subprocess runs of about 20 s each on 2 cores,
so in the slow suite; the default suite trains PATEGAN end to end in
tests/tf_dpkit/test_pategan.py."""
import json
import math
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(out, epsilon, *extra):
  env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
  cmd = [sys.executable, os.path.join(ROOT, "tutorials", "mnist_pategan_tutorial.py"),
         f"--output_dir={out}", f"--target_epsilon={epsilon}", "--train_size=1000",
         "--test_size=300", "--num_teachers=20", "--iterations=6", "--student_batch_size=8",
         "--tstr_samples=200", "--tstr_epochs=1", "--fd_samples=100", "--feature_epochs=1",
         "--log_every=3", *extra]
  result = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  with open(os.path.join(out, "results.json"), encoding="utf-8") as handle:
    return json.load(handle), result.stdout


@pytest.mark.slow
def test_pategan_tutorial_private_and_nonprivate(tmp_path):
  import keras  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from tf_dpkit import generative  # pylint: disable=g-import-not-at-top
  from tf_dpkit.generative import pategan  # pylint: disable=g-import-not-at-top
  results, stdout = _run(tmp_path / "dp", 10, "--vote=rank", "--smooth_sensitivity")
  for name in ("generator.keras", "results.json", "samples.png"):
    assert (tmp_path / "dp" / name).is_file()
  # 6 iterations x 8 answers, sigma calibrated to epsilon 10 (to 0.1% in sigma).
  assert results["pate_answers"] == 48 and results["iterations_done"] == 6
  assert results["epsilon"] == pytest.approx(
      pategan.data_independent_epsilon(48, results["gnmax_sigma"], 1e-5), rel=1e-9)
  assert 9.9 < results["epsilon"] <= 10.0 and results["delta"] == 1e-5
  assert results["smooth_sensitivity_release"]["epsilon"] <= results["epsilon"] + 1e-9
  assert results["latent_dim"] == 64
  assert 0.0 <= results["tstr_accuracy"] <= 1.0 and results["frechet_distance"] >= 0.0
  assert "final: epsilon=" in stdout
  generator = keras.models.load_model(tmp_path / "dp" / "generator.keras", compile=False)
  assert [tuple(i.shape) for i in generator.inputs] == [(None, 64), (None, 10)]
  images, _ = generative.sample(generator, 10, seed=0)
  assert images.shape == (10, 28, 28, 1) and 0.0 <= images.min() <= images.max() <= 1.0
  assert np.isfinite(images).all()
  assert results["flags"]["generator"] == "mlp"
  assert results["flags"]["student_conditioning"] == "concat"
  results, _ = _run(tmp_path / "inf", "inf", "--generator=conv", "--generator_filters=4",
                    "--student_conditioning=projection")
  assert results["flags"]["generator"] == "conv"
  assert results["flags"]["student_conditioning"] == "projection"
  generator = keras.models.load_model(tmp_path / "inf" / "generator.keras", compile=False)
  assert any(isinstance(layer, keras.layers.Conv2DTranspose) for layer in generator.layers)
  assert results["epsilon"] == math.inf and results["gnmax_sigma"] is None
  assert results["pate_answers"] == 0
