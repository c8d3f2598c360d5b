"""Per-layer (group-wise) clipping: a clip norm per group of layers.

The trainable layers of a model are partitioned into groups ``G_1 .. G_L`` with clip norms
``C_1 .. C_L > 0``.  Each microbatch's (example's) gradient restricted to the variables of
group ``l``, ``g_{j,l}``, is clipped to ``C_l`` on its own:

    S_l = sum_j g_{j,l} min(1, C_l / ||g_{j,l}||_2).

Sensitivity.  The clipped gradient of one example is the concatenation of its clipped group
parts, so its L2 norm is at most ``C = sqrt(C_1^2 + ... + C_L^2)``: removing (or adding) one
example moves ``S = (S_1, ..., S_L)`` by at most ``C`` -- the same bound as global clipping to
``C``, and the bound is reached (an example whose every group part is at least ``C_l`` long).
A DP optimizer built with per-layer clip norms therefore uses ``l2_norm_clip = C`` (the total)
for everything else: the noise ``N(0, sigma^2 C^2 I)`` on the whole sum, the certificate that
the sum was clipped at no more than ``C``, and the accounting, whose noise multiplier is
``sigma`` (``analysis.dp_sgd``: one Gaussian event of sensitivity ``C`` per step; with
microbatches of several examples ``2C``, as for global clipping).

Groups are named by the model's top-level layers (``model.layers`` names): a key is a layer name
(a group of one layer) or a tuple of layer names (one group).  Every trainable variable of the
model must belong to exactly one group; a nested model or a composite layer
(``MultiHeadAttention``) is one layer here.  Used by DP models' ``fit`` and
``tf_dpkit.private_gradients`` (fast and vectorized paths), and by a custom loop's
``optimizer.compute_gradients(loss, var_list, tape)`` on the swap path (a DP model called under
the tape, ``tf_dpkit.clipping.swap``); on its Jacobian path there are no layers to group by and
it refuses them.
"""
from __future__ import annotations

import math

import tensorflow as tf

from analysis import _checks
from tf_dpkit.clipping.clipped_sum import clip_factors


class LayerClipNorms:
  """Clip norms per layer group (module docstring).

  Args:
    clip_norms: a non-empty dict ``{layer name or tuple of layer names: C_l}``, each ``C_l`` a
      finite number > 0; no layer may be named twice.

  Attributes:
    groups: tuple of ``(layer names tuple, C_l)`` in the order given.
    total: ``C = sqrt(sum_l C_l^2)``, the sensitivity of the clipped sum (float).
  """

  def __init__(self, clip_norms):
    if isinstance(clip_norms, LayerClipNorms):
      clip_norms = dict(clip_norms.groups)
    if not isinstance(clip_norms, dict) or not clip_norms:
      raise TypeError("Per-layer clip norms must be a non-empty dict {layer name or tuple of "
                      f"layer names: clip norm > 0}}, got {clip_norms!r}.")
    groups, seen = [], set()
    for key, value in clip_norms.items():
      names = (key,) if isinstance(key, str) else key
      if (not isinstance(names, (tuple, list)) or not names
          or not all(isinstance(n, str) for n in names)):
        raise TypeError(f"Per-layer clip norm key {key!r}: a layer name or a non-empty tuple of "
                        "layer names.")
      twice = sorted(set(names) & seen) or sorted({n for n in names if names.count(n) > 1})
      if twice:
        raise ValueError(f"Per-layer clip norms name layer(s) {twice} twice; each layer belongs "
                         "to one group.")
      seen.update(names)
      clip = _checks.check_finite_positive(f"clip norm of {key!r}", value)
      groups.append((tuple(names), clip))
    self.groups = tuple(groups)
    self.total = math.sqrt(math.fsum(c * c for _, c in self.groups))

  def __repr__(self):
    return f"LayerClipNorms({dict(self.groups)!r}, total={self.total:.6g})"

  def __eq__(self, other):
    return isinstance(other, LayerClipNorms) and other.groups == self.groups

  def __hash__(self):
    return hash(self.groups)

  def config(self) -> list:
    """JSON-serialisable form: ``[[[names...], C_l], ...]`` (``from_config`` inverts it)."""
    return [[list(names), clip] for names, clip in self.groups]

  @classmethod
  def from_config(cls, config) -> LayerClipNorms:
    return cls({tuple(names): clip for names, clip in config})

  def resolve(self, model) -> ResolvedGroups:
    """The group of each of ``model.trainable_variables`` (checked: every trainable variable in
    exactly one named group, every named layer a trainable top-level layer of ``model``)."""
    layers = {layer.name: layer for layer in getattr(model, "layers", [])}
    group_of = {}
    for index, (names, _) in enumerate(self.groups):
      for name in names:
        if name not in layers:
          raise ValueError(f"Per-layer clip norms name layer {name!r}, which is not a top-level "
                           f"layer of {model.name!r} (its layers: {sorted(layers)}).")
        variables = layers[name].trainable_variables
        if not variables:
          raise ValueError(f"Per-layer clip norms name layer {name!r}, which has no trainable "
                           "variables.")
        for v in variables:
          if id(v) in group_of and group_of[id(v)] != index:
            raise ValueError(f"Variable {v.name!r} belongs to layers of two clip groups.")
          group_of[id(v)] = index
    variables = model.trainable_variables
    missing = [v.path if hasattr(v, "path") else v.name for v in variables
               if id(v) not in group_of]
    if missing:
      raise ValueError(
          f"Per-layer clip norms leave the trainable variables {missing} of {model.name!r} "
          "without a clip norm; name every trainable layer (or its group).")
    return ResolvedGroups(self, [group_of[id(v)] for v in variables], variables)


class ResolvedGroups:
  """:class:`LayerClipNorms` bound to a variable list: what the clipping paths take as their
  ``l2_norm_clip`` (``total`` is what the :class:`ClippedSum` records)."""

  def __init__(self, clip_norms: LayerClipNorms, variable_groups, variables):
    self.clip_norms = clip_norms
    self.clips = tuple(c for _, c in clip_norms.groups)
    self.total = clip_norms.total
    self.variable_groups = list(variable_groups)
    self._group_of = {id(v): g for v, g in zip(variables, self.variable_groups)}

  def group_of(self, variables) -> int:
    """The one group the given variables (of one layer) belong to."""
    groups = {self._group_of[id(v)] for v in variables}
    if len(groups) != 1:
      raise ValueError(f"The variables {[v.name for v in variables]} of one layer belong to "
                       f"{len(groups)} clip groups.")
    return groups.pop()

  def factors(self, squared_by_group):
    """Per-group clip factors ``min(1, C_l / ||g_{j,l}||)`` from ``[M]`` squared norms per group."""
    return [clip_factors(tf.sqrt(tf.maximum(sq, 0.0)), c)
            for sq, c in zip(squared_by_group, self.clips)]

  def clip_and_sum(self, per_microbatch_grads):
    """``clip_and_sum`` with group-wise clipping, for grads aligned with the resolved variables:
    returns ``(summed, norms)``, ``norms`` the [M] norms of the whole (unclipped) gradients."""
    squares = [None if g is None else
               tf.reduce_sum(tf.reshape(tf.square(g), [tf.shape(g)[0], -1]), axis=1)
               for g in per_microbatch_grads]
    present = [s for s in squares if s is not None]
    if not present:
      raise ValueError("No variable has a gradient: nothing to clip.")
    zero = tf.zeros_like(present[0])
    by_group = [tf.add_n([zero] + [s for s, k in zip(squares, self.variable_groups)
                                   if s is not None and k == group])
                for group in range(len(self.clips))]
    factors = self.factors(by_group)
    summed = [None if g is None else
              tf.tensordot(tf.cast(factors[k], g.dtype), g, axes=[[0], [0]])
              for g, k in zip(per_microbatch_grads, self.variable_groups)]
    return summed, tf.sqrt(tf.add_n(by_group))


def as_layer_clip_norms(value):
  """``value`` when it is a :class:`LayerClipNorms`, else None (a plain clip norm)."""
  return value if isinstance(value, LayerClipNorms) else None


def split_clip_argument(l2_norm_clip, layer_clip_norms=None):
  """A DP optimizer's clip arguments as ``(LayerClipNorms or None, the clip norm C)``.

  ``l2_norm_clip`` may be a :class:`LayerClipNorms` (then ``C`` is its total); or
  ``layer_clip_norms`` (a ``LayerClipNorms``, a dict for its constructor, or its ``config()``
  list -- how ``get_config`` saves it) is given beside ``l2_norm_clip`` = its total (or None).
  Anything else is returned unchanged for the optimizer's own checks.

  Raises:
    ValueError: both forms at once, or an ``l2_norm_clip`` that is not the total of the given
      ``layer_clip_norms`` (the noise would be calibrated to another sensitivity).
  """
  if isinstance(l2_norm_clip, LayerClipNorms):
    if layer_clip_norms is not None:
      raise ValueError("Give per-layer clip norms once: as l2_norm_clip or as layer_clip_norms.")
    return l2_norm_clip, l2_norm_clip.total
  if layer_clip_norms is None:
    return None, l2_norm_clip
  if isinstance(layer_clip_norms, list):
    clips = LayerClipNorms.from_config(layer_clip_norms)
  else:
    clips = LayerClipNorms(layer_clip_norms)
  if l2_norm_clip is not None and not (
      isinstance(l2_norm_clip, (int, float)) and not isinstance(l2_norm_clip, bool)
      and math.isclose(l2_norm_clip, clips.total, rel_tol=1e-12)):
    raise ValueError(
        f"l2_norm_clip={l2_norm_clip!r} is not the total sqrt(sum C_l^2) = {clips.total!r} of "
        "layer_clip_norms, the sensitivity the noise must be calibrated to; pass "
        "l2_norm_clip=None (or LayerClipNorms(...) as l2_norm_clip).")
  return clips, clips.total
