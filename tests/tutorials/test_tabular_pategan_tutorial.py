"""tutorials/tabular_pategan_tutorial.py end to end on the shipped UCI Epileptic Seizure copy, with
a few training steps: the released table's format, the publishable epsilon, the TSTR figures.
Two subprocess runs (PATE-GAN at epsilon 1 with MLPs, DP-GAN at epsilon 10 with the 1-D
convolutional networks), about a minute each on 2
cores (TSTR fits four classifiers on 9,200 rows), so in the slow suite."""
import csv
import gzip
import json
import math
import os

import pytest

from tests import tutorial_runs


def _run(out, *flags):
  result = tutorial_runs.run_tutorial("tabular_pategan_tutorial.py", f"--output_dir={out}",
                                      *flags, timeout=900)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  with open(os.path.join(out, "results.json"), encoding="utf-8") as handle:
    return json.load(handle)


def _table(path):
  with gzip.open(path, "rt", encoding="ascii") as handle:
    rows = list(csv.reader(handle))
  return rows[0], rows[1:]


@pytest.mark.slow
def test_tabular_tutorial_pategan_and_dpgan(tmp_path):
  from tf_dpkit.generative import pategan  # pylint: disable=g-import-not-at-top
  results = _run(tmp_path / "pg", "--target_epsilon=1", "--iterations=3", "--num_teachers=20",
                 "--student_batch_size=8", "--log_every=1")
  header, rows = _table(tmp_path / "pg" / "synthetic.csv.gz")
  assert header == [f"X{i}" for i in range(1, 179)] + ["y"]
  assert len(rows) == 9200 == results["train_rows"] and results["evaluation_rows"] == 2300
  values = [[int(v) for v in row] for row in rows[:500]]
  assert all(-2048 <= v <= 2047 for row in values for v in row[:-1])
  assert sum(int(row[-1]) for row in rows) == 4600  # the public 50% fraction, not the data's
  # The publishable data-independent epsilon of 3 x 8 GNMax answers at the logged sigma.
  assert results["pate_answers"] == 24
  assert results["epsilon"] == pytest.approx(
      pategan.data_independent_epsilon(24, results["gnmax_sigma"], 1e-5), rel=1e-9)
  assert 0.99 < results["epsilon"] <= 1.0 and results["delta"] == 1e-5
  assert "data-independent" in results["epsilon_kind"]
  assert set(results["tstr_auroc"]) == {"logistic_regression", "random_forest",
                                        "gradient_boosting", "mlp"}
  assert 0.0 <= results["tstr_auroc_mean"] <= 1.0 and 0.0 <= results["tstr_auprc_mean"] <= 1.0
  assert (tmp_path / "pg" / "generator.keras").is_file()
  # The 1-D convolutional networks: the release reloads the saved sequence generator.
  results = _run(tmp_path / "dg", "--method=dpgan", "--target_epsilon=10", "--dpgan_steps=3",
                 "--validation", "--log_every=1", "--network=sequence")
  assert results["flags"]["network"] == "sequence"
  assert results["flags"]["release_shift"] is False
  assert results["evaluated_on"].startswith("validation")
  assert results["train_rows"] == 7360 and results["evaluation_rows"] == 1840
  assert 9.9 < results["epsilon"] <= 10.0 and results["discriminator_steps_done"] == 3


@pytest.mark.slow
def test_tabular_tutorial_statistics_recipe_and_public_release_randomisation(tmp_path):
  """The recipe of the results table (statistics teachers and student, threshold votes, query
  rescaling, shifted and rescaled release) runs, and its release is the saved generator's rows
  put through randomize_rows with the public seed (rebuilt here from generator.keras): a test
  of the wiring (which generator, which seed, which options); randomize_rows' maths is tested
  by hand in tests/tf_dpkit/test_generative.py."""
  import keras  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from tf_dpkit import generative  # pylint: disable=g-import-not-at-top
  from tutorials.data import epileptic_seizure  # pylint: disable=g-import-not-at-top
  out = tmp_path / "pg"
  results = _run(out, "--target_epsilon=10", "--iterations=3", "--num_teachers=20",
                 "--student_batch_size=8", "--log_every=1", "--network=sequence",
                 "--student=statistics", "--teacher_input=row_statistics", "--vote=threshold",
                 "--query_scale_noise=1.5", "--release_shift", "--release_scale_noise=0.3",
                 "--seed=4", "--validation")
  flags = results["flags"]
  assert (flags["student"], flags["teacher_input"], flags["query_scale_noise"]) == (
      "statistics", "row_statistics", 1.5)
  assert flags["release_shift"] is True and flags["release_scale_noise"] == 0.3
  assert 9.9 < results["epsilon"] <= 10.0
  _, rows = _table(out / "synthetic.csv.gz")
  released = np.array([[int(v) for v in row] for row in rows])
  generator = keras.models.load_model(out / "generator.keras", compile=False)
  y = released[:, -1]
  u, _ = generative.sample(generator, len(y), labels=y, seed=4)
  expected = epileptic_seizure.from_unit(generative.randomize_rows(
      u, shift=True, log_scale_std=0.3, seed=5))
  # Integer counts after float32 round trips: equal up to one count of rounding.
  assert np.abs(released[:, :-1] - expected).max() <= 1
  # A bad release flag is refused before any training (the run ends within the start-up).
  bad = tutorial_runs.run_tutorial("tabular_pategan_tutorial.py",
                                   f"--output_dir={tmp_path / 'bad'}", "--release_scale_noise=-0.1")
  assert bad.returncode != 0
  assert "--release_scale_noise must be finite and >= 0, got -0.1" in bad.stderr
  assert "PATE-GAN: N=" not in bad.stdout  # no training started
  # The DP-GAN comparison row's discriminator option.
  results = _run(tmp_path / "dg", "--method=dpgan", "--target_epsilon=10", "--dpgan_steps=3",
                 "--validation", "--log_every=1", "--network=sequence",
                 "--dpgan_discriminator=statistics", "--release_shift")
  assert results["flags"]["dpgan_discriminator"] == "statistics"
  assert 9.9 < results["epsilon"] <= 10.0 and results["discriminator_steps_done"] == 3


@pytest.mark.slow
def test_tabular_tutorial_private_choice_of_the_generator(tmp_path):
  """--checkpoint_every: the kept iterations (and the last) are the candidates, the choice's
  noisy mean scores are released with the noise std sigma sqrt(K) / n, and the reported epsilon
  is that of the GNMax answers composed with the choice: one Gaussian mechanism of
  mu^2 = 2 n / s^2 + 1 / sigma^2, whose exact epsilon (Balle & Wang 2018) is solved here."""
  from scipy import optimize, stats  # pylint: disable=g-import-not-at-top
  results = _run(tmp_path / "pg", "--target_epsilon=2", "--iterations=5", "--num_teachers=20",
                 "--student_batch_size=8", "--log_every=2", "--checkpoint_every=2",
                 "--selection_noise_multiplier=4", "--selection_class_weights=0.25,1",
                 "--validation", "--evaluate_candidates")
  assert results["candidate_iterations"] == [2, 4, 5]
  noisy = results["noisy_mean_record_scores"]
  assert len(noisy) == 3 and len(results["candidate_tstr_auroc_mean"]) == 3
  chosen = results["candidate_iterations"].index(results["chosen_iteration"])
  assert chosen == max(range(3), key=lambda k: noisy[k])  # the arg-max of the released sums
  # The released table is the chosen generator's: its TSTR (same public release and classifier
  # seeds) is the one --evaluate_candidates measured for that candidate (rounded to 1e-4).
  assert results["tstr_auroc_mean"] == pytest.approx(
      results["candidate_tstr_auroc_mean"][chosen], abs=6e-5)
  assert results["selection_noise_stddev"] == pytest.approx(4 * math.sqrt(3) / 7360)
  assert results["pate_answers"] == 40
  mu = math.sqrt(2 * 40 / results["gnmax_sigma"] ** 2 + 1 / 16)
  gap = lambda e: (stats.norm.cdf(mu / 2 - e / mu)
                   - math.exp(e) * stats.norm.cdf(-mu / 2 - e / mu) - 1e-5)
  assert results["epsilon"] == pytest.approx(optimize.brentq(gap, 0.0, 50.0, xtol=1e-12),
                                             rel=1e-6)
  assert 1.98 < results["epsilon"] <= 2.0
  assert "composed with the private choice" in results["epsilon_kind"]


@pytest.mark.parametrize("flags, match", [
    (["--checkpoint_every=3"], "--checkpoint_every must be 0 or a positive multiple"),
    (["--checkpoint_every=4", "--iterations=2"], "--checkpoint_every must be <= --iterations=2"),
    (["--checkpoint_every=2", "--method=dpgan"], "offered for --method=pategan only"),
    (["--checkpoint_every=2", "--selection_noise_multiplier=0"],
     "--selection_noise_multiplier must be finite and > 0"),
    (["--checkpoint_every=2", "--selection_class_weights=1.5,1"],
     "--selection_class_weights must be two numbers in [0, 1]"),
    (["--checkpoint_every=2", "--selection_class_weights=1"],
     "--selection_class_weights must be two numbers in [0, 1]"),
    (["--checkpoint_every=2", "--selection_class_weights=a,1"],
     "--selection_class_weights must be two numbers in [0, 1]"),
    (["--checkpoint_every=-2"], "--checkpoint_every must be 0 or a positive multiple"),
    (["--checkpoint_every=2", "--selection_noise_multiplier=nan"],
     "--selection_noise_multiplier must be finite and > 0"),
    (["--checkpoint_every=2", "--selection_noise_multiplier=0.5", "--target_epsilon=1"],
     "--selection_noise_multiplier=0.5 alone spends --target_epsilon=1.0"),
])
def test_tabular_tutorial_refuses_bad_choice_flags_before_training(tmp_path, flags, match):
  result = tutorial_runs.run_tutorial("tabular_pategan_tutorial.py",
                                      f"--output_dir={tmp_path}", "--log_every=2", *flags)
  assert result.returncode != 0 and match in result.stderr + result.stdout
  assert "PATE-GAN: N=" not in result.stdout and not (tmp_path / "results.json").exists()
