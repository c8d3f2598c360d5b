"""Private ``model.fit``: Keras models whose ``train_step`` runs DP-SGD.

``make_dp_model_class(Base)`` (``DPSequential``, ``DPModel``) evaluates the compiled loss per
example (any reduction), clips and noises with the compiled DP optimizer's settings (the single
source of truth), adds weight regularisers after clipping and updates metrics without a
second forward pass.  Refused: a non-DP optimizer, ``activity_regularizer`` / ``add_loss``,
dynamic loss scaling.  Steps, augmentation, masks and mixed precision:
docs/design/dp_models.md.
"""
from __future__ import annotations

import functools
import math

import keras
import tensorflow as tf

from tf_dpkit import _autograph
from tf_dpkit import augmentation as augmentation_lib
from tf_dpkit.data.poisson import check_class_labels, pipeline_of
from tf_dpkit.clipping import _keras_internals
from tf_dpkit.clipping import swap
from tf_dpkit.clipping.contract import (check_loss_is_per_example, mark_per_example,
                                        per_example_loss_function)
from tf_dpkit.optimizers import accumulation, is_dp_optimizer
from tf_dpkit.dp_gradients import clipped_sum_for_model

__all__ = ["DPModel", "DPSequential", "make_dp_model_class"]


def _privacy_callbacks_first(callbacks):
  if callbacks is None or isinstance(callbacks, keras.callbacks.CallbackList):
    return callbacks
  callbacks = list(callbacks)
  first = [c for c in callbacks if getattr(c, "_dp_runs_first", False)]
  return first + [c for c in callbacks if not getattr(c, "_dp_runs_first", False)]


# Log keys released by an accounted mechanism, or independent of the data: callbacks may
# decide from them.  Everything else fit logs on the training batches is an exact statistic of
# the private data (see _DPTrainStep.fit).
_ACCOUNTED_LOGS = ("epsilon", "l2_norm_clip", "learning_rate", "lr")


def _callback_list(callbacks):
  if callbacks is None:
    return []
  if isinstance(callbacks, keras.callbacks.CallbackList):
    return list(callbacks.callbacks)
  return list(callbacks)


def _with_carried_callbacks(x, callbacks):
  """``callbacks`` with those carried by ``x`` (``DPTraining.fit_arguments``) first, each once."""
  carried = getattr(x, "_tf_dpkit_fit_callbacks", None)
  if not carried:
    return callbacks
  given = _callback_list(callbacks)
  return list(carried) + [c for c in given if not any(c is d for d in carried)]


def _check_no_decisions_on_training_logs(callbacks):
  """Refuses callbacks that decide from a statistic of the private training batches."""
  for callback in _callback_list(callbacks):
    name = type(callback).__name__
    if isinstance(callback, keras.callbacks.TerminateOnNaN):
      monitor = "loss"
    else:
      monitor = getattr(callback, "monitor", None)
      if not isinstance(monitor, str):
        continue
      if (isinstance(callback, keras.callbacks.ModelCheckpoint)
          and not getattr(callback, "save_best_only", False)):
        continue  # saves every time: the monitor decides nothing
      if monitor.startswith("val_") or monitor in _ACCOUNTED_LOGS:
        continue
    raise ValueError(
        f"callbacks: {name} decides from {monitor!r} (monitor={monitor!r}), a statistic fit "
        "computes on the private training batches and logs exactly (neither clipped nor "
        "noised): the privacy accounting (epsilon) does not cover it, and one example could "
        "change what the callback does (when training stops, the learning rate, which weights "
        f"are kept). Monitor a validation metric instead (monitor='val_{monitor}', with "
        "validation_data outside the private training set; the epsilon does not cover it "
        "either), or pass fit(..., allow_unaccounted_training_metrics=True) to accept a "
        "release the epsilon does not account for.")


def _array_fit_sizes(x, args, kwargs):
  """``(N, batch_size, steps_per_epoch)`` of ``fit`` on in-memory arrays ``x`` as Keras batches
  them (N after ``validation_split``; ``steps_per_epoch`` None when not given), or None when
  ``x`` has no leading dimension."""
  first = tf.nest.flatten(x)[0] if tf.nest.flatten(x) else None
  if getattr(first, "shape", None) is None or len(first.shape) == 0 or first.shape[0] is None:
    return None
  n = int(first.shape[0])
  batch_size = args[0] if args else kwargs.get("batch_size")
  batch_size = 32 if batch_size is None else int(batch_size)  # Keras's default
  split = args[4] if len(args) > 4 else kwargs.get("validation_split", 0.0)
  if split:
    n = int(math.floor(n * (1.0 - split)))  # as Keras splits the arrays
  steps = args[10] if len(args) > 10 else kwargs.get("steps_per_epoch")
  return n, batch_size, steps


def _check_array_batches_split_into_microbatches(model, x, args, kwargs):
  """With in-memory arrays, refuses before training a batch that ``num_microbatches`` does not
  divide (Keras's last batch of an epoch holds the remainder ``N mod batch_size``)."""
  m = getattr(model.optimizer, "num_microbatches", None)
  sizes = _array_fit_sizes(x, args, kwargs)
  if m is None or sizes is None:
    return
  n, batch_size, steps = sizes
  if batch_size % m:
    raise ValueError(
        f"batch_size={batch_size} is not a multiple of the DP optimizer's num_microbatches={m}: "
        "every batch is cut into that many equal microbatches. Pick a batch size that is a "
        "multiple of num_microbatches.")
  remainder = n % batch_size if n > batch_size else n
  if steps is None and remainder % m:
    raise ValueError(
        f"x has N={n} training examples, so with batch_size={batch_size} the last batch of "
        f"every epoch holds {remainder} examples, which num_microbatches={m} does not divide "
        "(every batch is cut into that many equal microbatches). Trim N to a multiple of the "
        f"batch size (e.g. the first {n - remainder} examples) or pick a batch size that "
        "divides N (and is a multiple of num_microbatches).")


def _check_inputs_match_model(model, x, augmented):
  """Refuses, while the train step is traced (before any step runs), examples whose shape is
  not the one the model's inputs take (a wrong feature size, or an augmentation that crops to
  another size), which would otherwise end in an error deep inside a layer."""
  try:
    expected = list(model.inputs or [])
  except (AttributeError, ValueError):
    return
  flat = tf.nest.flatten(x)
  if not expected or isinstance(x, dict) or len(flat) != len(expected):
    return
  for i, (got, want) in enumerate(zip(flat, expected)):
    got = tf.TensorShape(getattr(got, "shape", None))
    if got.rank is None:
      continue
    want = tf.TensorShape(tuple(want.shape))
    if got.rank != want.rank or got[1:].is_compatible_with(want[1:]):
      continue  # (Keras adjusts inputs off by one rank itself)
    source = ("augment_fn (compile(augmentation=...)) returns examples"
              if augmented else "the training batches hold examples")
    fix = (f"build the model with keras.Input(shape={tuple(got[1:].as_list())}), the shape "
           "augment_fn returns" if augmented else
           "give the model inputs of the data's shape or fix the data")
    raise ValueError(
        f"x: the model's input {i} takes examples of shape {tuple(want[1:].as_list())}, but "
        f"{source} of shape {tuple(got[1:].as_list())}; {fix}.")


def _sparse_class_count(model, loss):
  """K, the class count the compiled sparse categorical cross-entropy indexes (the single
  output's last dimension), or None for any other loss or output."""
  sparse = (loss in ("sparse_categorical_crossentropy", keras.losses.sparse_categorical_crossentropy)
            or isinstance(loss, keras.losses.SparseCategoricalCrossentropy))
  outputs = getattr(model, "outputs", None) if model.built else None
  if not sparse or not outputs or len(outputs) != 1:
    return None
  k = outputs[0].shape[-1]
  return int(k) if k is not None and k > 1 else None


def _single_loss(loss):
  """``keras.losses.get(loss)`` as an unreduced ``f(y_true, y_pred)``."""
  loss_obj = keras.losses.get(loss)
  if isinstance(loss_obj, keras.losses.Loss):
    check_loss_is_per_example(loss_obj)
    return loss_obj.call
  if callable(loss_obj):
    return loss_obj
  raise ValueError(f"Unsupported loss {loss!r}.")


def _by_output(spec, names, what):
  """A list/tuple/dict ``spec`` as a list aligned with the output ``names``."""
  if isinstance(spec, dict):
    unknown = sorted(set(spec) - set(names))
    if unknown:
      raise ValueError(f"{what} names unknown outputs {unknown}; the model's outputs are {names}.")
    return [spec.get(name) for name in names]
  if len(spec) != len(names):
    raise ValueError(f"{what} has {len(spec)} entries for the model's {len(names)} outputs "
                     f"{names}.")
  return list(spec)


def _output_names(model):
  names = getattr(model, "output_names", None)
  if names:
    return list(names)
  if isinstance(model, keras.Sequential) and model.layers:
    return [model.layers[-1].name]
  raise ValueError("A list or dict of losses needs a model whose outputs are known (build it "
                   "with keras.Input first).")


def _per_example_loss_fn(model, loss, loss_weights=None):
  """Returns ``f(y_true, y_pred) -> [batch]``, the compiled loss per example.

  One output: the loss's per-example values (mean over trailing, unmasked axes).  Several
  outputs (``loss`` a list or a dict keyed by output name, optional ``loss_weights`` likewise):
  ``sum_k w_k L_k(y_true_k, y_pred_k)`` per example, outputs without a loss skipped, as Keras
  sums them.
  """
  if loss is None:
    raise ValueError("DP models need `loss=` in compile() (a Keras loss, its name, or a "
                     "function returning one loss per example).")
  if not isinstance(loss, (list, tuple, dict)):
    if loss_weights is not None and not isinstance(loss_weights, (int, float)):
      raise ValueError(f"loss_weights for one loss must be a number, got {loss_weights!r}.")
    fn = per_example_loss_function(_single_loss(loss))
    if loss_weights is None:
      return fn
    return mark_per_example(lambda y_true, y_pred: loss_weights * fn(y_true, y_pred),
                            isolated=fn._tf_dpkit_isolated)  # pylint: disable=protected-access
  names = _output_names(model)
  losses = _by_output(loss, names, "loss")
  weights = [1.0] * len(names) if loss_weights is None else _by_output(loss_weights, names,
                                                                       "loss_weights")
  terms = [(k, per_example_loss_function(_single_loss(l)), 1.0 if w is None else float(w))
           for k, (l, w) in enumerate(zip(losses, weights)) if l is not None]
  if not terms:
    raise ValueError("compile() got no loss for any output.")

  def total(y_true, y_pred):
    preds = y_pred if isinstance(y_pred, (list, tuple)) else [y_pred[n] for n in names]
    trues = ([y_true[n] for n in names] if isinstance(y_true, dict) else
             list(y_true) if isinstance(y_true, (list, tuple)) else [y_true])
    if len(trues) != len(names):
      raise ValueError(f"y has {len(trues)} targets for the model's {len(names)} outputs.")
    return tf.add_n([w * fn(trues[k], preds[k]) for k, fn, w in terms])
  return mark_per_example(total, isolated=all(fn._tf_dpkit_isolated for _, fn, _ in terms))  # pylint: disable=protected-access


def _weight_regularization(variables):
  terms = [v.regularizer(v) for v in variables if getattr(v, "regularizer", None) is not None]
  return tf.add_n([tf.cast(t, tf.float32) for t in terms]) if terms else None


@_autograph.graph_code  # a DP model called in the user's tf.function runs as written
class _DPTrainStep:
  """Mixin holding the private ``compile`` and ``train_step``."""

  def compile(self, optimizer="rmsprop", loss=None, loss_weights=None, *, augmentation=None,  # pylint: disable=missing-function-docstring
              **kwargs):
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
      raise TypeError(
          f"{type(self).__name__}.compile got a LossScaleOptimizer: its dynamic loss scaling "
          "skips steps and changes its scale depending on the private batch (not covered by "
          "the privacy accounting). Pass the tf_dpkit DP optimizer itself; under "
          "mixed_float16 it uses a static loss scale (its loss_scale_factor, default 2**10).")
    if not is_dp_optimizer(optimizer):
      raise TypeError(
          f"{type(self).__name__} trains with DP-SGD and needs a tf_dpkit DP optimizer (e.g. "
          "tf_dpkit.DPGradientDescentGaussianOptimizer(l2_norm_clip=..., noise_multiplier=..., "
          f"learning_rate=...)), got {optimizer!r}.")
    if kwargs.pop("auto_scale_loss", None) and self.dtype_policy.name == "mixed_float16":
      raise ValueError(
          "auto_scale_loss=True wraps the optimizer in Keras's dynamic LossScaleOptimizer, whose "
          "skipped steps and scale changes depend on the private batch (not covered by the "
          "privacy accounting). DP models use a static loss scale under mixed_float16: leave "
          "auto_scale_loss unset (or False) and, to choose the scale, pass "
          "loss_scale_factor=... (a finite number > 0; default 2**10) to the DP optimizer.")
    self._dp_per_example_loss = _per_example_loss_fn(self, loss, loss_weights)
    self._dp_class_count = _sparse_class_count(self, loss)
    # Augmentation multiplicity (tf_dpkit.augmentation): not part of the compile config.
    self._dp_augmentation = augmentation_lib.check_augmentation(
        augmentation, optimizer.num_microbatches)
    # Re-compiling (e.g. to change the noise) keeps the privacy ledger: the earlier steps still
    # count, whatever optimizer takes the next ones (tf_dpkit.budget).
    previous = getattr(self, "optimizer", None)
    ledger = getattr(previous, "privacy_ledger", None)
    ledger = ledger.numpy() if ledger is not None and previous is not optimizer else None
    # No dynamic loss scaling (see the module docstring): the static scale is used instead.
    super().compile(optimizer=optimizer, loss=loss, loss_weights=loss_weights,
                    auto_scale_loss=False, **kwargs)
    target = getattr(self.optimizer, "privacy_ledger", None)
    if ledger is not None and ledger.any() and target is not None:
      if target.numpy().any():
        raise ValueError("The new optimizer already holds a privacy ledger, and so did the "
                         "previous one; compile with a fresh DP optimizer to continue the run.")
      target.assign(ledger)
    if not is_dp_optimizer(self.optimizer):  # a Keras upgrade that wraps it anyway
      raise ValueError(
          f"Keras wrapped the DP optimizer in {type(self.optimizer).__name__}; DP models "
          "need the DP optimizer itself (dynamic loss scaling is not private: under "
          "mixed_float16 they use the optimizer's static loss_scale_factor).")

  def compile_from_config(self, config):
    """Re-compiles a loaded ``.keras`` model with its saved DP optimizer and loss."""
    config = keras.saving.deserialize_keras_object(config)
    self.compile(**config)
    if self.built:
      self.optimizer.build(self.trainable_variables)

  def _check_no_added_losses(self):
    added = [layer.name for layer in _keras_internals.sublayers(self, include_self=True)
             if _keras_internals.added_losses(layer)]
    if added:
      raise ValueError(
          f"Layers {added} call add_loss(): such a loss is computed from the whole batch and "
          "is not clipped per example, so DP models refuse it. Make it part of the per-example "
          "loss passed to compile(), or a weight regularizer (added after clipping).")

  def _check_no_activity_regularizers(self):
    for layer in _keras_internals.sublayers(self, include_self=True):
      if getattr(layer, "activity_regularizer", None) is not None:
        raise ValueError(
            f"Layer {layer.name!r} has an activity_regularizer: that loss depends on the data "
            "and is not clipped per example, so DP models refuse it.")

  def fit(self, x=None, y=None, *args, allow_unaccounted_training_metrics=False, **kwargs):
    """Keras's ``fit`` with DP-SGD steps (module docstring), checked before the first step.

    What the privacy accounting (the ``epsilon`` a ``tf_dpkit.budget.PrivacyBudget`` logs)
    covers: the released model weights (and the noised clip norm of adaptive clipping).  It
    does NOT cover the training ``loss`` and metrics that ``fit`` computes on the private
    batches, logs and returns in ``History`` (exact, neither clipped nor noised: one example
    can move them arbitrarily), nor anything computed on ``validation_data``.  So callbacks
    that decide from a training statistic are refused: any callback with a ``monitor`` that
    is not a ``val_`` metric (or the accounted ``epsilon`` / ``l2_norm_clip`` /
    ``learning_rate``), e.g. ``EarlyStopping(monitor="loss")``, ``ReduceLROnPlateau`` or
    ``ModelCheckpoint(save_best_only=True)`` on ``loss``, and ``TerminateOnNaN`` (it reads
    the training loss).  Monitoring ``val_`` metrics is allowed; their data is outside the
    accounted training set, so whether they leak is the caller's business (not covered by
    the epsilon either).  ``allow_unaccounted_training_metrics=True`` accepts such callbacks
    (the run then releases more than the epsilon states).

    With in-memory arrays and an optimizer with ``num_microbatches=M``, every batch (the last,
    shorter one included) must hold a multiple of ``M`` examples; this is checked here.
    Callbacks carried by ``x`` (``tf_dpkit.make_private(...).fit_arguments()``) run first.
    """
    args = list(args)
    callbacks = _with_carried_callbacks(
        x, args[3] if len(args) > 3 else kwargs.get("callbacks"))
    if callbacks is not None:
      if len(args) > 3:
        args[3] = callbacks
      else:
        kwargs["callbacks"] = callbacks
    if not allow_unaccounted_training_metrics:
      _check_no_decisions_on_training_logs(callbacks)
    # Keras batches in-memory arrays itself (fixed-size, shuffled batches): recorded so that a
    # PrivacyBudget never accounts such batches as Poisson samples.
    self._dp_keras_batches_arrays = x is not None and not isinstance(
        x, (tf.data.Dataset, tf.distribute.DistributedDataset, keras.utils.PyDataset)) and not callable(getattr(x, "__next__", None))
    # What a tf_dpkit pipeline says it is (PrivacyBudget checks it against its own numbers).
    self._dp_fit_pipeline = pipeline_of(x)
    classes = getattr(self, "_dp_class_count", None)
    if classes is not None:  # class ids outside [0, K) would fail deep inside the loss op
      labels = y if self._dp_keras_batches_arrays else getattr(
          getattr(self.optimizer, "_dp_plan", None), "labels", None)
      if labels is not None:
        check_class_labels(labels, classes, name="y")
    if self._dp_keras_batches_arrays:
      _check_array_batches_split_into_microbatches(self, x, args, kwargs)
      sizes = _array_fit_sizes(x, args, kwargs)
      if sizes is not None:  # virtual batches must not straddle two epochs' permutations
        accumulation.check_array_epochs(self.optimizer, *sizes)
    replicas = self.distribute_strategy.num_replicas_in_sync
    pipeline = self._dp_fit_pipeline
    accumulation.check_fit(self, pipeline)  # virtual batches (gradient_accumulation_steps)
    if (pipeline is not None and pipeline.sampling == "poisson"
        and pipeline.replicas != replicas):
      raise ValueError(
          f"x: Poisson batches made for {pipeline.replicas} replica(s), but the model trains "
          f"under {type(self.distribute_strategy).__name__} with {replicas} replicas. Under a "
          "strategy pass tf_dpkit.data.distributed_poisson_batches(strategy, ...): it gives "
          "every replica its own part of each Poisson batch (tf.distribute cannot split "
          "batches of varying size, and splitting them by worker would break the sampling).")
    # Privacy callbacks (tf_dpkit.budget.PrivacyBudget) run first: the saved ledger is then
    # current when checkpointing callbacks save, and `epsilon` is in the logs every later
    # callback (CSVLogger, TensorBoard) sees, whatever order the user listed them in.
    if len(args) > 3:  # fit(x, y, batch_size, epochs, verbose, callbacks, ...)
      args[3] = _privacy_callbacks_first(args[3])
    elif "callbacks" in kwargs:
      kwargs["callbacks"] = _privacy_callbacks_first(kwargs["callbacks"])
    plan = getattr(self.optimizer, "_dp_plan", None)  # an optimizer from make_private
    if plan is not None:
      plan.check_fit(pipeline, args[3] if len(args) > 3 else kwargs.get("callbacks"))
    return super().fit(x, y, *args, **kwargs)

  def __call__(self, *args, **kwargs):
    """Keras's call; under a recording ``tf.GradientTape`` with ``training=True`` a model whose
    layer graph the fast path can use runs its forward pass by the layer rules and keeps the
    record, so that a DP optimizer's ``minimize(vector_loss, model.trainable_variables,
    tape=tape)`` clips on the per-layer fast path (``tf_dpkit.clipping.swap``).  The outputs
    are the same."""
    if swap.should_trace(self, args, kwargs):
      return swap.traced_call(self, args[0])
    return super().__call__(*args, **kwargs)

  # How per-microbatch gradients are computed: "auto" (fast per-layer path when the model is a
  # layer graph, else whole-model vectorized_map), "fast" or "vectorized".  Not a DP setting.
  per_example_method = "auto"

  @property
  def augmentation(self):
    """The :class:`tf_dpkit.AugmentationMultiplicity` given to ``compile`` (None: none)."""
    return getattr(self, "_dp_augmentation", None)

  def train_step(self, data):
    _keras_internals.build_from_batch(self, data)
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    optimizer = self.optimizer
    variables = self.trainable_variables
    self._check_no_activity_regularizers()
    batch = tf.shape(tf.nest.flatten(x)[0])[0]  # examples (before augmentation)
    # With augmentation: B examples -> B*K rows, each example's copies one clipped unit.
    x, y, sample_weight, microbatch_size = augmentation_lib.rows_for_step(
        self.augmentation, x, y, sample_weight, optimizer.iterations)
    _check_inputs_match_model(self, x, augmented=self.augmentation is not None)
    clipped, y_pred = clipped_sum_for_model(
        self, self._dp_per_example_loss, x, y, sample_weight, optimizer.l2_norm_clip_for_step(),
        optimizer.replica_num_microbatches(), self.per_example_method,
        loss_scale=optimizer.static_loss_scale(self), microbatch_size=microbatch_size)
    self._check_no_added_losses()
    mean_loss = tf.reduce_mean(clipped.losses)
    with tf.GradientTape() as tape:
      regularization = _weight_regularization(variables)
    reg_grads = None
    if regularization is not None:
      reg_grads = tape.gradient(regularization, variables)
      mean_loss = mean_loss + regularization
    grads = optimizer.privatize(clipped, data_independent_grads=reg_grads)
    optimizer.apply(grads, variables)
    self._loss_tracker.update_state(mean_loss, sample_weight=batch)
    logs = self.compute_metrics(x, y, y_pred, sample_weight=sample_weight)
    logs.update(optimizer.dp_logs())  # the adaptive clip norm, if any
    if _keras_internals.multi_worker(self):
      logs = _keras_internals.logs_for_multi_worker(logs)
    return logs

  def test_step(self, data):  # pylint: disable=missing-function-docstring
    logs = super().test_step(data)
    if _keras_internals.multi_worker(self):
      logs = _keras_internals.logs_for_multi_worker(logs)
    return logs

  def _maybe_symbolic_build(self, iterator=None, data_batch=None):
    # Keras 3.15 builds from the replicas' first batches averaged (strategy.reduce), which
    # fails under several workers and for per-replica batches of different sizes (Poisson
    # parts, tf_dpkit.data.distributed_poisson_batches): build from one local batch instead.
    if (self.distribute_strategy.num_replicas_in_sync == 1
        and not _keras_internals.multi_worker(self)):
      return super()._maybe_symbolic_build(iterator=iterator, data_batch=data_batch)
    return _keras_internals.symbolic_build_from_local_batch(self, iterator, data_batch)


@functools.lru_cache(maxsize=None)
def make_dp_model_class(cls):
  """Returns a subclass of the Keras model class ``cls`` whose ``fit`` runs DP-SGD.

  The DP settings come from the optimizer passed to ``compile`` (it must be a tf_dpkit DP
  optimizer).  Per-microbatch gradients use ``tf.vectorized_map``; see the module docstring
  for the step.  The class is cached per ``cls`` and registered for ``.keras`` serialization.
  """
  if not (isinstance(cls, type) and issubclass(cls, keras.Model)):
    raise TypeError(f"make_dp_model_class expects a subclass of keras.Model, got {cls!r}.")
  if issubclass(cls, _DPTrainStep):
    return cls
  name = "DP" + cls.__name__ if cls.__name__ != "Model" else "DPModel"
  dp_cls = type(name, (_DPTrainStep, cls), {"__doc__": f"{cls.__name__} trained with DP-SGD "
                                            "in ``fit`` (see ``tf_dpkit.dp_models``)."})
  return keras.saving.register_keras_serializable(package="tf_dpkit", name=name)(dp_cls)


DPModel = make_dp_model_class(keras.Model)
DPSequential = make_dp_model_class(keras.Sequential)
