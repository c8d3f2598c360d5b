"""``mnist_dpsgd_tutorial.py --recipe=best``: the recipe's flag values resolve as its table says
(fast), and a shortened run reports the epsilon of its own q, sigma and steps
(analysis.rdp_accountant, independent of the budget code) (slow)."""
import math
import os
import re
import sys

import pytest

from tutorial_runs import ROOT, final_numbers, reference_rdp_epsilon, run_mnist_tutorial

sys.path.insert(0, os.path.join(ROOT, "tutorials"))
import recipes  # noqa: E402  pylint: disable=wrong-import-position


def _documented_table(recipe="best"):
  """``{flag: (value for target >= 2, value for target < 2)}`` read from the module docstring's
  table that follows the paragraph naming ``--recipe=RECIPE``."""
  doc = recipes.__doc__
  start = doc.index(f"``--recipe={recipe}``")
  table = {}
  for line in doc[start:].splitlines():
    cells = re.split(r"\s{2,}", line.strip())
    if len(cells) == 3 and cells[0].isidentifier() and cells[0] != "flag":
      table[cells[0]] = tuple(cells[1:])
    elif table and not line.strip():
      break  # the blank line after the table
  return table


def _as_text(value):
  return str(value) if not isinstance(value, float) or value != int(value) else f"{value:.1f}"


def _resolved_as_documented(recipe, flags):
  """The recipe's two rows resolved, after checking them against its documented table (which
  must list at least ``flags``)."""
  table = _documented_table(recipe)
  assert set(table) >= set(flags)
  default = recipes.resolve(recipe, {})
  small = recipes.resolve(recipe, {"target_epsilon": 1.0})
  for flag, (big_budget, small_budget) in table.items():
    assert _as_text(default[flag]) == big_budget, flag
    if small_budget != "(as given)":
      assert _as_text(small[flag]) == small_budget, flag
  return default, small


_FLAGS = ("activation", "l2_norm_clip", "momentum", "ema_momentum", "batch_size", "epochs",
          "learning_rate", "lr_schedule", "target_epsilon")


def test_best_recipe_resolves_as_its_table_says():
  default, small = _resolved_as_documented("best", _FLAGS)
  assert default["target_epsilon"] == 3.0 and small["target_epsilon"] == 1.0
  # The literal values, so that a docstring and code changed together are still noticed.
  assert (default["batch_size"], default["epochs"], default["learning_rate"], default["momentum"],
          default["l2_norm_clip"], default["activation"]) == (2048, 40, 8.0, 0.8, 0.1, "tanh")
  assert (small["batch_size"], small["epochs"], small["learning_rate"], small["momentum"],
          small["lr_schedule"]) == (1024, 15, 2.0, 0.9, "linear_decay_tail")


def test_scatternet_recipe_resolves_as_its_table_says():
  default, small = _resolved_as_documented("scatternet", _FLAGS + ("features",))
  assert (default["features"], default["batch_size"], default["epochs"], default["learning_rate"],
          default["momentum"]) == ("scattering", 2048, 40, 2.0, 0.9)
  assert (small["features"], small["batch_size"], small["epochs"]) == ("scattering", 2048, 20)
  assert (default["normalization_noise_multiplier"], default["normalization_mean_clip"],
          default["normalization_second_moment_clip"]) == (8.0, 0.2, 0.06)
  assert (small["normalization_noise_multiplier"], small["normalization_mean_clip"],
          small["normalization_second_moment_clip"]) == (20.0, 0.5, 0.5)
  assert recipes.resolve("scatternet", {"features": "pixels"})["features"] == "pixels"
  assert "features" not in recipes.resolve("best", {})


def test_explicit_flags_override_the_recipe():
  values = recipes.resolve("best", {"batch_size": 256, "epochs": 3, "activation": "relu"})
  assert (values["batch_size"], values["epochs"], values["activation"]) == (256, 3, "relu")
  assert values["target_epsilon"] == 3.0 and values["momentum"] == 0.8
  # A given noise multiplier without a target: no target is set, the default row is used.
  values = recipes.resolve("best", {"noise_multiplier": 1.3})
  assert values["target_epsilon"] is None and values["noise_multiplier"] == 1.3
  assert values["batch_size"] == 2048
  # Both given: the target is kept (the tutorial then calibrates the noise).
  assert recipes.resolve("best", {"noise_multiplier": 1.3, "target_epsilon": 0.5})[
      "batch_size"] == 1024
  assert recipes.resolve("none", {"epochs": 7}) == {"epochs": 7}
  with pytest.raises(ValueError, match="recipe must be one of"):
    recipes.resolve("fastest", {})


@pytest.mark.slow
def test_shortened_best_recipe_reports_the_epsilon_of_its_own_run():
  train, batch, epochs, delta = 2048, 64, 2, 1e-5
  result = run_mnist_tutorial("--recipe=best", "--target_epsilon=3", train=train, test=500,
                              batch=batch, epochs=epochs, delta=delta)
  final = final_numbers(result)
  recipe_line = next(l for l in result.stdout.splitlines() if l.startswith("Recipe best:"))
  for setting in ("activation=tanh", "momentum=0.8", "ema_momentum=0.99",
                  "lr_schedule=linear_decay_tail", "target_epsilon=3.0", f"batch_size={batch}",
                  f"epochs={epochs}"):
    assert setting in recipe_line.split(), (setting, recipe_line)
  sigma = float(re.search(r"Train to a budget: noise_multiplier=([\d.]+)", result.stdout)[1])
  steps = epochs * (train // batch)
  assert final["steps"] == steps
  assert final["test_accuracy"] > 0.2  # chance is 0.1
  expected = reference_rdp_epsilon(batch / train, sigma, steps, delta)
  # sigma is printed to 4 decimals: allow the epsilon change of a 5e-5 change in sigma.
  assert math.isclose(final["epsilon_rdp"], expected, rel_tol=1e-3)
  assert final["epsilon_rdp"] <= 3.0 + 1e-4
