"""tutorials/mnist_dpgan_tutorial.py on a small MNIST slice: its outputs and their contents,
private (epsilon 10, the default networks: conv generator, projection MLP discriminator) and
non-private (inf, MLP generator and conv discriminator, two discriminator steps per generator
step, CNN TSTR only).  About 30 s on 2 cores, so in the slow suite; the
default suite trains the library end to end in tests/tf_dpkit/test_generative.py."""
import json
import math

import pytest

from tests import tutorial_runs


def _run(tmp_path, epsilon, *extra):
  result = tutorial_runs.run_tutorial(
      "mnist_dpgan_tutorial.py", f"--output_dir={tmp_path}", f"--target_epsilon={epsilon}",
      "--train_size=1000", "--test_size=500", "--generator_steps=8", "--batch_size=50",
      "--tstr_samples=200", "--tstr_epochs=1", "--fd_samples=100", "--feature_epochs=1",
      "--log_every=4", *extra, timeout=600)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  with open(tmp_path / "results.json", encoding="utf-8") as handle:
    return json.load(handle), result.stdout


@pytest.mark.slow
def test_dpgan_tutorial_private_and_nonprivate(tmp_path):
  results, stdout = _run(tmp_path / "dp", 10)
  for name in ("generator.keras", "results.json", "samples.png"):
    assert (tmp_path / "dp" / name).is_file()
  assert 9.0 < results["epsilon"] <= 10.0 and results["delta"] == 1e-5
  assert results["latent_dim"] == 64 and results["discriminator_steps_done"] == 8
  assert 0.0 <= results["tstr_accuracy"] <= 1.0 and results["frechet_distance"] >= 0.0
  assert 0.0 <= results["tstr_accuracy_cnn"] <= 1.0
  assert results["flags"]["generator"] == "conv" and results["flags"]["discriminator"] == "mlp"
  assert results["flags"]["discriminator_conditioning"] == "projection"
  assert "final: epsilon=" in stdout and "tstr_accuracy_cnn=" in stdout
  results, _ = _run(tmp_path / "inf", "inf", "--discriminator=conv", "--generator=mlp",
                    "--discriminator_filters=4,8",
                    "--discriminator_steps=2", "--tstr_classifiers=cnn")
  assert results["epsilon"] == math.inf and results["noise_multiplier"] == 0.0
  assert results["tstr_accuracy"] is None and 0.0 <= results["tstr_accuracy_cnn"] <= 1.0
  assert results["discriminator_steps_done"] == 16 and results["generator_steps_done"] == 8
  assert results["config"]["discriminator_steps"] == 2


@pytest.mark.slow
def test_dpgan_tutorial_private_checkpoint_choice_and_average(tmp_path):
  """--generator_ema with --validation_size / --checkpoint_every: the choice is among the kept
  steps, its noisy scores are released, and the reported epsilon (training composed with the
  choice) meets the target, computed here from the composed events; the mode-seeking
  generator term (post-processing) leaves it unchanged."""
  from analysis import dp_sgd, events, rdp_accountant  # pylint: disable=g-import-not-at-top
  results, stdout = _run(tmp_path, 5, "--generator_ema=0.9", "--validation_size=200",
                         "--checkpoint_every=4", "--selection_samples=100",
                         "--selection_epochs=1", "--selection_noise_multiplier=3",
                         "--tstr_classifiers=cnn", "--mode_seeking=1")
  assert results["candidate_generator_steps"] == [4, 8]
  assert results["config"]["mode_seeking"] == 1.0 == results["flags"]["mode_seeking"]
  assert results["chosen_generator_step"] in (4, 8)
  assert len(results["noisy_validation_accuracies"]) == 2
  assert results["selection_noise_stddev"] == pytest.approx(3 * math.sqrt(2) / 200)
  assert results["train_size"] == 800 and results["config"]["generator_ema"] == 0.9
  composed = events.ComposedEvent([
      dp_sgd.dp_sgd_event(results["noise_multiplier"], 8, sampling_probability=50 / 800),
      events.GaussianEvent(3.0)])
  want = rdp_accountant.RdpAccountant().compose(composed).get_epsilon(1e-5)
  assert results["epsilon"] == pytest.approx(want, rel=1e-6)
  assert 4.5 < results["epsilon"] <= 5.0
  assert "private checkpoint choice: generator step" in stdout


@pytest.mark.parametrize("flags, match", [
    (["--validation_size=100"], "--validation_size and --checkpoint_every go together"),
    (["--checkpoint_every=3"], "--checkpoint_every must be 0 or a positive multiple"),
    (["--validation_size=-1"], "--validation_size must be >= 0"),
    (["--mode_seeking=-1"], "--mode_seeking must be a finite number >= 0"),
    (["--mode_seeking=nan"], "--mode_seeking must be a finite number >= 0"),
    (["--validation_size=100", "--checkpoint_every=8", "--generator_steps=4"],
     "--checkpoint_every must be <= --generator_steps=4"),
    (["--validation_size=100", "--checkpoint_every=4", "--selection_noise_multiplier=0"],
     "--selection_noise_multiplier must be finite and > 0"),
    (["--validation_size=100", "--checkpoint_every=4", "--selection_epochs=0"],
     "--selection_epochs must be >= 1"),
])
def test_dpgan_tutorial_refuses_bad_selection_flags_before_training(tmp_path, flags, match):
  result = tutorial_runs.run_tutorial("mnist_dpgan_tutorial.py", f"--output_dir={tmp_path}",
                                      "--log_every=4", *flags)
  assert result.returncode != 0 and match in result.stderr + result.stdout
  assert not (tmp_path / "results.json").exists()
