"""PATE's privacy-utility curve: student accuracy against epsilon, from tutorial runs.

    python tutorials/pate_curve.py --runs=tutorials/results/pate_curve/confident_gnmax,... \
        --output_dir=tutorials/results/pate_curve

Reads the ``results.json`` that ``mnist_pate_tutorial.py`` wrote into each folder of ``--runs``
and lists every student it trained (the final one, and with ``--curve_points`` one per prefix of
the queries) with the epsilons of the queries that student's labels came from:

* ``epsilon_data_independent``: publishable, holds for every data set;
* ``epsilon_data_dependent``: PATE 2018's bound at the actual votes (computed from the private
  votes, so not itself publishable; it is the number papers compare).

Writes ``curve.md`` (one row per student: aggregator, seed, queries, labels, test accuracy,
validation accuracy when the run held a split out, both epsilons) and, when matplotlib is
installed, ``student_accuracy_vs_epsilon.png`` (accuracy against each epsilon, one line per
run).  Reads no data and trains nothing: the numbers are the runs' own.
"""
from __future__ import annotations

import json
import os

from absl import app, flags

flags.DEFINE_list("runs", None, "Output folders of mnist_pate_tutorial.py runs.")
flags.DEFINE_string("output_dir", None, "Where curve.md and the plot go.")
flags.mark_flags_as_required(["runs", "output_dir"])
FLAGS = flags.FLAGS


def points(results):
  """One dict per student of a run's ``results.json``, fewest queries first."""
  rows = []
  for p in results["accuracy_points"]:
    rows.append({
        "aggregator": results["aggregator"], "seed": results["seed"], "queries": p["queries"],
        "labels": p["labels"], "student_accuracy": p["student_accuracy"],
        "validation_accuracy": p.get("validation_accuracy"),
        "epsilon_data_independent": p["epsilon_data_independent"],
        "epsilon_data_dependent": p["epsilon_data_dependent"]})
  if not rows:  # a run whose only student is the final one (Interactive GNMax)
    rows.append({
        "aggregator": results["aggregator"], "seed": results["seed"],
        "queries": results["queries"],
        "labels": results["answered"] + results.get("student_labeled", 0),
        "student_accuracy": results["student_accuracy"],
        "validation_accuracy": results.get("validation_accuracy"),
        "epsilon_data_independent": results["epsilon_data_independent"],
        "epsilon_data_dependent": results["epsilon_data_dependent"]})
  return sorted(rows, key=lambda r: r["queries"])


def table(rows) -> str:
  pct = lambda v: "-" if v is None else f"{100 * v:.1f}%"  # noqa: E731
  lines = ["| aggregator | seed | queries | labels | student (test) | student (validation) | "
           "eps data-indep. | eps data-dep. |", "|" + "---|" * 8]
  for r in rows:
    lines.append(f"| {r['aggregator']} | {r['seed']} | {r['queries']} | {r['labels']} | "
                 f"{pct(r['student_accuracy'])} | {pct(r['validation_accuracy'])} | "
                 f"{r['epsilon_data_independent']:.2f} | {r['epsilon_data_dependent']:.2f} |")
  return "\n".join(lines) + "\n"


def _plot(runs, path) -> bool:
  try:
    import matplotlib  # pylint: disable=g-import-not-at-top
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  except ImportError:
    print("matplotlib is not installed: no plot (pip install matplotlib)")
    return False
  fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
  for rows in runs:
    label = f"{rows[0]['aggregator']} (seed {rows[0]['seed']})"
    acc = [100 * r["student_accuracy"] for r in rows]
    for ax, key in zip(axes, ("epsilon_data_independent", "epsilon_data_dependent")):
      ax.plot([r[key] for r in rows], acc, "o-", label=label)
  axes[0].set_xlabel("data-independent epsilon (publishable), delta 1e-5")
  axes[1].set_xlabel("data-dependent epsilon (PATE 2018's), delta 1e-5")
  axes[0].set_ylabel("student test accuracy (%)")
  axes[1].legend(fontsize=8)
  for ax in axes:
    ax.grid(alpha=0.3)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return True


def main(argv):
  del argv
  runs = []
  for folder in FLAGS.runs:
    with open(os.path.join(folder, "results.json")) as f:
      runs.append(points(json.load(f)))
  os.makedirs(FLAGS.output_dir, exist_ok=True)
  text = table([r for rows in runs for r in rows])
  with open(os.path.join(FLAGS.output_dir, "curve.md"), "w") as f:
    f.write(text)
  print(text)
  _plot(runs, os.path.join(FLAGS.output_dir, "student_accuracy_vs_epsilon.png"))


if __name__ == "__main__":
  app.run(main)
