"""What a dataset made by ``tf_dpkit.data`` is (:class:`Pipeline`) and whether a dataset
derived from one still is (:func:`pipeline_of`), for the privacy checks of
``tf_dpkit.budget`` and the DP models' ``fit`` (``docs/design/data_pipelines.md``).
"""
from __future__ import annotations

import dataclasses

import tensorflow as tf


@dataclasses.dataclass(frozen=True)
class Pipeline:
  """What a dataset made here is, for the privacy checks of ``tf_dpkit.budget``.

  ``sampling`` is ``"poisson"`` or ``"shuffle"``; ``num_examples`` N; ``batch_size`` the
  expected (Poisson: qN) or fixed batch size; ``steps_per_epoch``; ``sampling_probability`` q
  for Poisson (None for shuffle); ``replicas``: the number of replicas a
  :func:`distributed_poisson_batches` dataset feeds (1 for the others, which feed one replica
  or are split by ``tf.distribute``); ``accumulation_steps``: k, the chunks each logical batch
  is emitted as (``gradient_accumulation_steps``; ``batch_size`` and ``steps_per_epoch`` are
  those of the logical batches).  Read it with :func:`pipeline_of`.
  """
  sampling: str
  num_examples: int
  batch_size: float
  steps_per_epoch: int
  sampling_probability: float | None = None
  replicas: int = 1
  accumulation_steps: int = 1


def tagged(dataset: tf.data.Dataset, pipeline: Pipeline) -> tf.data.Dataset:
  dataset._tf_dpkit_pipeline = pipeline  # pylint: disable=protected-access
  return dataset


#: Transformations of a pipeline's dataset that keep what it is: each element is still one
#: fresh batch of the pipeline (or the element mapped on its own), in some order, possibly fewer
#: of them.  ``repeat`` qualifies because every pass draws fresh batches
#: (:class:`tf_dpkit.data._batching.Passes`).
_KEEPING = frozenset(["PrefetchDataset", "TakeDataset", "SkipDataset", "RepeatDataset",
                      "ShuffleDataset", "MapDataset", "ParallelMapDataset", "OptionsDataset",
                      "AssertCardinalityDataset", "ModelDataset", "MaxIntraOpParallelismDataset",
                      "PrivateThreadPoolDataset"])


def _inputs(dataset) -> list:
  inputs = getattr(dataset, "_inputs", None)
  try:
    return list(inputs()) if callable(inputs) else []
  except (NotImplementedError, TypeError, AttributeError):
    return []


def _tagged_ancestor(dataset, seen: set):
  """``(pipeline, path)`` of the nearest tagged dataset ``dataset`` is derived from, where
  ``path`` lists the transformations in between (outermost first); ``(None, [])`` if none."""
  if id(dataset) in seen:
    return None, []
  seen.add(id(dataset))
  tag = getattr(dataset, "_tf_dpkit_pipeline", None)
  if tag is not None:
    return tag, []
  for parent in _inputs(dataset):
    tag, path = _tagged_ancestor(parent, seen)
    if tag is not None:
      return tag, [type(dataset).__name__.lstrip("_")] + path
  return None, []


def pipeline_of(dataset) -> Pipeline | None:
  """The :class:`Pipeline` a dataset is, or None when it comes from no tf_dpkit pipeline.

  A dataset returned by :func:`poisson_batches` / :func:`shuffled_batches` /
  :func:`distributed_poisson_batches` carries its :class:`Pipeline`.  A dataset derived from one
  keeps it through transformations that emit each element as one fresh batch of the pipeline
  (``prefetch``, ``take``, ``skip``, ``repeat``, ``shuffle``, an element-wise ``map``,
  ``with_options``); any other transformation between them is refused, since it can replay
  batches (``cache``, ``snapshot``: each replayed batch would be released again while the ledger
  counts a fresh sample), select steps by their content (``filter``, ``ignore_errors``) or
  re-cut the batches (``batch``, ``unbatch``, ``rebatch``, ``concatenate``, ``zip``), all of
  which change the mechanism the ledger accounts.

  Raises:
    ValueError: ``dataset`` derives from a tf_dpkit pipeline through such a transformation.
  """
  tag, path = _tagged_ancestor(dataset, set())
  bad = [name for name in path if name not in _KEEPING]
  if bad:
    raise ValueError(
        f"x: this dataset is a tf_dpkit {tag.sampling} pipeline transformed by {bad[0]} "
        f"(transformations from the pipeline outwards: {list(reversed(path))}). {bad[0]} can "
        "replay batches (cache, snapshot), choose steps by their content (filter, "
        "ignore_errors) or re-cut them (batch, unbatch, concatenate, zip), so the accounted "
        "mechanism would not be the one that ran. Only prefetch, take, skip, repeat, shuffle, "
        "element-wise map and with_options are allowed; every pass over the pipeline draws "
        "fresh batches, so no cache is needed.")
  return tag


__all__ = ["Pipeline", "pipeline_of"]
