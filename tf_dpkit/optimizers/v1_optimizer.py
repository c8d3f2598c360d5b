"""DP versions of ``tf.compat.v1.train`` optimizers (graph mode, sessions, and TF2 with a tape).

In a ``tf.compat.v1`` graph the vector loss needs no tape: the ops between the batch's inputs
(placeholders, ``tf.data`` iterator outputs) and the loss are replayed on each microbatch alone
and differentiated with ``tf.vectorized_map`` (``tf_dpkit.clipping.graph_replay``: about the cost
of one batched backward pass, and each step checks the replay reproduces the loss).  A graph the
replay cannot reproduce takes the exact Jacobian path (rows of the batch loss's Jacobian, about
``B`` backward passes) and says so once.  Because a graph is run many times, the noise
is keyed by a counter variable (``dp_noise_step``, see ``DPSettings.next_noise_draw``)
incremented by every gradient computation, so each ``session.run`` draws fresh noise; initialise
it with the other variables.
"""
from __future__ import annotations

import tensorflow as tf

from tf_dpkit import _autograph
from tf_dpkit.clipping import clipped_sum_from_vector_loss
from tf_dpkit.clipping import graph_replay
from tf_dpkit.clipping import swap
from tf_dpkit.optimizers.base import CONSTRUCTOR_ARGS_DOC, DPOptimizerBase

_V1 = tf.compat.v1


def make_v1_dp_class(base):
  """Builds the DP subclass of the ``tf.compat.v1.train.Optimizer`` subclass ``base``."""

  class V1DPOptimizer(DPOptimizerBase, base):
    __doc__ = f"""Differentially private ``tf.compat.v1.train.{base.__name__}``.

    {CONSTRUCTOR_ARGS_DOC.format(base="tf.compat.v1.train." + base.__name__)}

    ``minimize(loss=vector_loss)`` works in a v1 graph without a tape; in eager mode or inside
    ``tf.function`` pass ``tape=`` or a callable loss.
    """

    _dp_base_class = base
    _supports_replicas = False  # tf.compat.v1 graphs: one replica

    def __init__(self, l2_norm_clip, noise_multiplier, num_microbatches=None, *args,
                 seed=None, expected_batch_size=None, **kwargs):
      if kwargs.pop("adaptive_clipping", None) is not None:
        raise ValueError("adaptive_clipping is supported by the Keras 3 DP optimizers only "
                         "(tf_dpkit.DP...GaussianOptimizer), not by the tf.compat.v1 ones.")
      settings = self._validated_settings(args, kwargs, l2_norm_clip, noise_multiplier,
                                          num_microbatches, expected_batch_size, seed)
      if settings.scheduled:
        raise ValueError("l2_norm_clip / noise_multiplier schedules are supported by the Keras 3 "
                         "DP optimizers only (they follow the optimizer's step counter).")
      self._attach_dp(settings)
      super().__init__(*args, **kwargs)

    @_autograph.graph_code
    def compute_gradients(self, loss, var_list=None, gate_gradients=base.GATE_OP,
                          aggregation_method=None, colocate_gradients_with_ops=False,
                          grad_loss=None, tape=None):
      """Private ``[(grad, var), ...]`` for a vector loss (see the class docstring)."""
      del gate_gradients, aggregation_method, colocate_gradients_with_ops
      if grad_loss is not None:
        raise ValueError("grad_loss is not supported by DP optimizers (it would bypass clipping).")
      if callable(loss):
        if var_list is None:
          raise ValueError("A callable loss needs an explicit var_list.")
        with tf.GradientTape() as tape:
          loss = _autograph.user_function(loss)()
      if var_list is None:
        var_list = (_V1.trainable_variables() +
                    _V1.get_collection(_V1.GraphKeys.TRAINABLE_RESOURCE_VARIABLES))
      var_list = list(var_list)
      if not var_list:
        raise ValueError("No variables to optimize.")
      # With a tape, a DP model's traced call takes the per-layer fast path
      # (tf_dpkit.clipping.swap); in a v1 graph (no tape) the per-example replay
      # (tf_dpkit.clipping.graph_replay); else the Jacobian path.
      if tape is not None:
        clipped = swap.clipped_sum_for_optimizer(
            self, loss, var_list, tape, self._dp.l2_norm_clip, self._dp.num_microbatches)
      elif not tf.executing_eagerly():
        clipped = graph_replay.clipped_sum_for_v1_optimizer(
            self, loss, var_list, self._dp.l2_norm_clip, self._dp.num_microbatches)
      else:
        clipped = None
      if clipped is None:
        clipped = clipped_sum_from_vector_loss(
            loss, var_list, self._dp.l2_norm_clip, self._dp.num_microbatches, tape=tape)
      return list(zip(self.privatize(clipped), var_list))

    @_autograph.graph_code
    def minimize(self, loss, global_step=None, var_list=None, gate_gradients=base.GATE_OP,
                 aggregation_method=None, colocate_gradients_with_ops=False, name=None,
                 grad_loss=None, tape=None):
      """Private ``compute_gradients`` then ``apply_gradients``; returns the train op."""
      grads_and_vars = self.compute_gradients(
          loss, var_list=var_list, grad_loss=grad_loss, tape=tape)
      return self.apply_gradients(grads_and_vars, global_step=global_step, name=name)

    @_autograph.graph_code
    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
      grads_and_vars = list(grads_and_vars)
      self._check_certified([g for g, _ in grads_and_vars])
      return super().apply_gradients(grads_and_vars, global_step=global_step, name=name)

  V1DPOptimizer.__name__ = f"DP{base.__name__}"
  V1DPOptimizer.__qualname__ = V1DPOptimizer.__name__
  return V1DPOptimizer
