"""tf_dpkit: differentially private training (DP-SGD) for TensorFlow 2 / Keras 3.

One configuration builds the DP optimizer, the batches and the privacy budget::

    private = tf_dpkit.make_private((x, y), batch_size=256, epochs=60, l2_norm_clip=1.0,
                                    target_epsilon=3.0, delta=1e-5)
    model.compile(optimizer=private.optimizer(keras.optimizers.SGD, learning_rate=0.15), ...)
    model.fit(**private.fit_arguments())

Or swap a Keras optimizer for its DP version and pass a vector loss::

    optimizer = tf_dpkit.DPAdamGaussianOptimizer(
        l2_norm_clip=1.0, noise_multiplier=1.1, learning_rate=1e-3)
    optimizer.minimize(vector_loss, model.trainable_variables, tape=tape)

or train with ``model.fit`` through ``tf_dpkit.DPSequential`` / ``tf_dpkit.DPModel``.
Privacy accounting lives in the top-level ``analysis`` package.
"""
import importlib

# First: fail with a clear message if `analysis` is some other package (see the module).
from tf_dpkit import _analysis_guard  # noqa: F401  pylint: disable=unused-import
from tf_dpkit import v1
from tf_dpkit import pate
from tf_dpkit.augmentation import AugmentationMultiplicity
from tf_dpkit.dp_models import DPModel, DPSequential, make_dp_model_class
from tf_dpkit.dp_gradients import private_gradients
from tf_dpkit.training import DPTraining, make_private
from tf_dpkit.optimizers.adaptive_clipping import AdaptiveClipping
from tf_dpkit.optimizers import (
    DPAdagradGaussianOptimizer,
    DPAdamGaussianOptimizer,
    DPAdamWGaussianOptimizer,
    DPGradientDescentGaussianOptimizer,
    DPRMSPropGaussianOptimizer,
    is_dp_optimizer,
    make_gaussian_optimizer_class,
)

__version__ = "0.1.0"

__all__ = [
    "DPTraining", "make_private", "v1", "pate", "private_gradients", "DPModel", "DPSequential", "make_dp_model_class", "make_gaussian_optimizer_class",
    "is_dp_optimizer", "DPGradientDescentGaussianOptimizer", "DPAdamGaussianOptimizer",
    "DPAdamWGaussianOptimizer", "DPAdagradGaussianOptimizer", "DPRMSPropGaussianOptimizer",
    "AdaptiveClipping", "AugmentationMultiplicity",
]


def __getattr__(name):
  """Loads the deprecated aliases of renamed modules (models, model_gradients) on first use."""
  if name in ("models", "model_gradients"):
    return importlib.import_module(f"{__name__}.{name}")
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
