"""Deprecated alias of :mod:`tf_dpkit.dp_models`, removed in the next release.

The Keras models whose ``fit`` runs DP-SGD moved to ``tf_dpkit.dp_models``, so that the name
tells them apart from the generator/discriminator builders (``tf_dpkit.generative.networks``)
and the per-model gradients (``tf_dpkit.dp_gradients``).  Use ``tf_dpkit.DPModel`` etc. or
import from ``tf_dpkit.dp_models``; the names below are the same objects.
"""
from tf_dpkit.dp_models import DPModel, DPSequential, make_dp_model_class

__all__ = ["DPModel", "DPSequential", "make_dp_model_class"]
