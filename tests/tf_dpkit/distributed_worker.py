"""One process of a tf.distribute DP-SGD experiment, run by tests/tf_dpkit/test_distribute.py.

Usage: python distributed_worker.py '<json>' with keys
  strategy: "default" | "one_device" | "mirrored" | "multiworker" | "central_storage"
  replicas: logical CPU devices (mirrored, central_storage)
  ports, index: the multi-worker cluster on localhost and this worker's index
  mode: "fit" | "loop" | "private_gradients" | "shares" | "poisson_fit" | "poisson_parts" |
    "budget_fit" | "budget_stop" | "backup" | "secrets" | "resume"
  sigma, seed, batch (global; the expected batch for Poisson), steps, loss ("zero" | "mse"),
  num_microbatches; augmentation (K: compile with AugmentationMultiplicity of K identical
  copies, so K > 1 must give the update without augmentation); distributed (poisson_fit:
  distributed_poisson_batches); n, sharded
  (poisson_parts: data set size, each worker holding only its shard); target_epsilon
Prints one line "RESULT <json>": the parameter updates of every step (or, for "shares", each
replica's private gradient of every step), or "ERROR <type>: <message>".
"""
import json
import os
import sys

ARGS = json.loads(sys.argv[1])
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
from secret_search import files_holding  # noqa: E402  pylint: disable=g-import-not-at-top
if ARGS["strategy"] == "multiworker":
  os.environ["TF_CONFIG"] = json.dumps({
      "cluster": {"worker": [f"localhost:{p}" for p in ARGS["ports"]]},
      "task": {"type": "worker", "index": ARGS["index"]}})

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

if ARGS["strategy"] in ("mirrored", "central_storage"):
  cpu = tf.config.list_physical_devices("CPU")[0]
  tf.config.set_logical_device_configuration(
      cpu, [tf.config.LogicalDeviceConfiguration()] * ARGS["replicas"])


def _strategy():
  kind = ARGS["strategy"]
  if kind == "mirrored":
    return tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(ARGS["replicas"])])
  if kind == "multiworker":
    return tf.distribute.MultiWorkerMirroredStrategy()
  if kind == "one_device":
    return tf.distribute.OneDeviceStrategy("/cpu:0")
  if kind == "central_storage":
    return tf.distribute.experimental.CentralStorageStrategy(
        [f"/cpu:{i}" for i in range(ARGS["replicas"])])
  return tf.distribute.get_strategy()


STRATEGY = _strategy()

import keras  # noqa: E402  pylint: disable=g-import-not-at-top

import tf_dpkit  # noqa: E402  pylint: disable=g-import-not-at-top

B, STEPS = ARGS["batch"], ARGS["steps"]


def loss_fn(y_true, y_pred):
  if ARGS["loss"] == "zero":  # identically zero: the update is the noise alone
    return tf.reduce_sum(0.0 * y_pred, axis=-1)
  return tf.reduce_mean(tf.square(y_true - y_pred), axis=-1)


def _dataset(x, y):
  dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(B)
  if ARGS["strategy"] == "multiworker":
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    dataset = dataset.with_options(options)
  return dataset


def _poisson_parts():
  """Every local replica's example indices (weight 1) at each of STEPS steps.

  ``n`` examples, expected batch ``B``; with ``sharded`` worker w holds examples w, w + W, ...
  (its shard) and passes ``num_examples=n``.
  """
  from tf_dpkit import data  # pylint: disable=g-import-not-at-top
  n = ARGS["n"]
  index = np.arange(n, dtype=np.int64)
  kwargs = {}
  if ARGS.get("sharded"):
    workers = len(ARGS["ports"])
    index = index[ARGS["index"]::workers]
    kwargs["num_examples"] = n
  batches = data.distributed_poisson_batches(STRATEGY, (index,), expected_batch_size=B,
                                             steps=STEPS, seed=ARGS["seed"], **kwargs)
  steps = []
  for element in batches:
    parts = []
    for indices, weights in zip(STRATEGY.experimental_local_results(element[0]),
                                STRATEGY.experimental_local_results(element[1])):
      parts.append([int(i) for i, w in zip(indices.numpy(), weights.numpy()) if w > 0])
    steps.append(parts)
  return steps


def _passes_started():
  """Passes begun over every fresh-pass pipeline made in this process (tf_dpkit.data)."""
  return sum(int(p._counter.numpy()) for p in _PASSES)  # pylint: disable=protected-access


def _record_passes():
  from tf_dpkit.data import poisson  # pylint: disable=g-import-not-at-top
  init = poisson._Passes.__init__  # pylint: disable=protected-access

  def recording_init(self):
    init(self)
    _PASSES.append(self)
  poisson._Passes.__init__ = recording_init  # pylint: disable=protected-access


_PASSES = []
_record_passes()


def main():
  mode = ARGS["mode"]
  rng = np.random.default_rng(0)
  x = rng.normal(size=(B * STEPS, 3)).astype(np.float32)
  y = rng.normal(size=(B * STEPS, 2)).astype(np.float32)
  with STRATEGY.scope():
    model = tf_dpkit.DPSequential([keras.Input((3,)), keras.layers.Dense(
        2, kernel_initializer=keras.initializers.Constant(0.1))])
    optimizer = tf_dpkit.DPGradientDescentGaussianOptimizer(
        1.0, ARGS["sigma"], ARGS.get("num_microbatches"), learning_rate=1.0, seed=ARGS["seed"],
        expected_batch_size=B if mode in ("poisson_fit", "budget_stop") else None)
    augmentation = None
    if ARGS.get("augmentation"):
      augmentation = tf_dpkit.AugmentationMultiplicity(lambda example, seed: example,
                                                       ARGS["augmentation"])
    model.compile(optimizer, loss=loss_fn, augmentation=augmentation)

  def params():
    return np.concatenate([v.numpy().ravel() for v in model.trainable_variables])

  trace = [params()]
  if mode == "budget_fit":  # 2 epochs of shuffled fixed batches with a PrivacyBudget
    from tf_dpkit.budget import PrivacyBudget  # pylint: disable=g-import-not-at-top
    budget = PrivacyBudget(B / len(x), sampling="shuffle", steps_per_epoch=STEPS // 2,
                           verbose=False)
    history = model.fit(_dataset(x, y), epochs=2, steps_per_epoch=STEPS // 2, verbose=0,
                        callbacks=[budget])
    return {"epsilon": history.history["epsilon"],
            "iterations": int(model.optimizer.iterations.numpy()),
            "ledger_steps": budget.accountant.steps}
  if mode == "secrets":  # every byte written by .keras, save_weights and tf.train.Checkpoint
    import tempfile  # pylint: disable=g-import-not-at-top
    model.fit(x, y, batch_size=B, epochs=1, shuffle=False, verbose=0)
    folder = tempfile.mkdtemp()
    model.save(os.path.join(folder, "m.keras"))
    model.save_weights(os.path.join(folder, "m.weights.h5"))
    tf.train.Checkpoint(model=model, optimizer=optimizer).save(os.path.join(folder, "ckpt"))
    with open(os.path.join(folder, "control.bin"), "wb") as handle:  # positive control
      handle.write(b"xx" + ARGS["seed"].to_bytes(8, "little") + b"xx")
    return sorted({os.path.basename(path.split(":")[0])
                   for path in files_holding(folder, ARGS["seed"])})
  if mode == "resume":  # one epoch, save .keras, load under the strategy, one more epoch
    import tempfile  # pylint: disable=g-import-not-at-top
    from tf_dpkit.budget import PrivacyBudget  # pylint: disable=g-import-not-at-top
    def budget():
      return PrivacyBudget(B / len(x), sampling="shuffle", steps_per_epoch=STEPS // 2,
                           verbose=False)
    model.fit(_dataset(x, y), epochs=1, steps_per_epoch=STEPS // 2, verbose=0,
              callbacks=[budget()])
    path = os.path.join(tempfile.mkdtemp(), "m.keras")
    model.save(path)
    with STRATEGY.scope():
      restored = keras.models.load_model(path, custom_objects={"loss_fn": loss_fn})
    history = restored.fit(_dataset(x, y), epochs=1, steps_per_epoch=STEPS // 2, verbose=0,
                           callbacks=[budget()])
    return {"epsilon": history.history["epsilon"],
            "iterations": int(restored.optimizer.iterations.numpy())}
  if mode == "budget_stop":  # Poisson parts with a PrivacyBudget that stops at target_epsilon
    import contextlib  # pylint: disable=g-import-not-at-top
    import io  # pylint: disable=g-import-not-at-top
    from tf_dpkit import data  # pylint: disable=g-import-not-at-top
    from tf_dpkit.budget import PrivacyBudget  # pylint: disable=g-import-not-at-top
    batches = data.distributed_poisson_batches(STRATEGY, (x, y), expected_batch_size=B,
                                               steps=STEPS, seed=1)
    budget = PrivacyBudget(B / len(x), target_epsilon=ARGS["target_epsilon"])
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
      model.fit(batches, epochs=1, steps_per_epoch=STEPS, verbose=0, callbacks=[budget])
    return {"iterations": int(model.optimizer.iterations.numpy()),
            "stopped_at": budget.stopped_at_step, "printed": printed.getvalue()}
  if mode == "backup":  # 4 epochs with BackupAndRestore, interrupted after 2, then resumed
    import tempfile  # pylint: disable=g-import-not-at-top
    from tf_dpkit.budget import PrivacyBudget  # pylint: disable=g-import-not-at-top
    folder = tempfile.mkdtemp()

    class Interrupt(keras.callbacks.Callback):
      def on_epoch_end(self, epoch, logs=None):
        if epoch == 1:
          raise KeyboardInterrupt("preempted")

    def run(fitted, extra):
      budget = PrivacyBudget(B / len(x), sampling="shuffle", steps_per_epoch=STEPS // 4,
                             verbose=False)
      return fitted.fit(_dataset(x, y), epochs=4, steps_per_epoch=STEPS // 4, verbose=0,
                        callbacks=[budget, keras.callbacks.BackupAndRestore(folder), *extra])
    try:
      run(model, [Interrupt()])
    except KeyboardInterrupt:
      pass
    with STRATEGY.scope():  # a new process would build the same model afresh
      fresh = tf_dpkit.DPSequential([keras.Input((3,)), keras.layers.Dense(2)])
      fresh.compile(tf_dpkit.DPGradientDescentGaussianOptimizer(
          1.0, ARGS["sigma"], learning_rate=1.0, seed=ARGS["seed"]), loss=loss_fn)
    history = run(fresh, [])
    return {"epochs": history.epoch, "epsilon": history.history["epsilon"],
            "iterations": int(fresh.optimizer.iterations.numpy())}
  if mode == "poisson_parts":  # which examples every local replica gets at every step
    return _poisson_parts()
  if mode == "poisson_fit":  # plain poisson_batches, or (distributed) each replica its part
    from tf_dpkit import data  # pylint: disable=g-import-not-at-top
    from tf_dpkit.budget import PrivacyBudget  # pylint: disable=g-import-not-at-top
    n = len(x)
    if ARGS.get("distributed"):
      batches = data.distributed_poisson_batches(STRATEGY, (x, y), expected_batch_size=B,
                                                 steps=STEPS, seed=1)
    else:
      batches = data.poisson_batches((x, y), expected_batch_size=B, steps=STEPS, seed=1)

    class Record(keras.callbacks.Callback):
      def on_train_batch_end(self, batch, logs=None):
        trace.append(params())
    budget = PrivacyBudget(B / n, verbose=False)
    history = model.fit(batches, epochs=1, steps_per_epoch=STEPS, verbose=0,
                        callbacks=[budget, Record()])
    return {"updates": np.diff(np.array(trace), axis=0).tolist(),
            "epsilon": history.history["epsilon"][-1], "ledger_steps": budget.accountant.steps,
            "passes": _passes_started()}
  if mode == "fit":
    class Record(keras.callbacks.Callback):
      def on_train_batch_end(self, batch, logs=None):
        trace.append(params())
    if ARGS["strategy"] == "multiworker":  # Keras shards a dataset by worker, not arrays
      model.fit(_dataset(x, y), epochs=1, verbose=0, callbacks=[Record()])
    else:
      model.fit(x, y, batch_size=B, epochs=1, shuffle=False, verbose=0, callbacks=[Record()])
    return np.diff(np.array(trace), axis=0).tolist()
  dataset = _dataset(x, y)
  batches = STRATEGY.experimental_distribute_dataset(dataset)

  def replica_step(xb, yb):
    if mode == "private_gradients":
      grads = tf_dpkit.private_gradients(optimizer, model, loss_fn, xb, yb)
      optimizer.apply(grads, model.trainable_variables)
      return tf.constant(0.0)
    with tf.GradientTape() as tape:
      vector_loss = loss_fn(yb, model(xb, training=True))
    if mode == "shares":
      grads = [g for g, _ in optimizer.compute_gradients(vector_loss, model.trainable_variables,
                                                         tape=tape)]
      return tf.concat([tf.reshape(g, [-1]) for g in grads], axis=0)
    optimizer.minimize(vector_loss, model.trainable_variables, tape=tape)
    return tf.constant(0.0)

  @tf.function
  def step(batch):
    return STRATEGY.run(replica_step, args=batch)

  shares = []
  for batch in batches:
    out = step(batch)
    if mode == "shares":
      shares.append([t.numpy().tolist() for t in STRATEGY.experimental_local_results(out)])
    else:
      trace.append(params())
  if mode == "shares":
    return shares
  return np.diff(np.array(trace), axis=0).tolist()


if __name__ == "__main__":
  try:
    print("RESULT " + json.dumps(main()), flush=True)
  except Exception as error:  # pylint: disable=broad-except
    print(f"ERROR {type(error).__name__}: {' '.join(str(error).split())}", flush=True)
    if os.environ.get("DP_WORKER_TRACE"):
      import traceback; traceback.print_exc()
