"""DP optimizers: the factory and the ready Keras 3 classes (``tf_dpkit.v1`` has the v1 ones)."""
import keras

from tf_dpkit.optimizers.factory import make_gaussian_optimizer_class

DPGradientDescentGaussianOptimizer = make_gaussian_optimizer_class(keras.optimizers.SGD)
DPAdamGaussianOptimizer = make_gaussian_optimizer_class(keras.optimizers.Adam)
DPAdamWGaussianOptimizer = make_gaussian_optimizer_class(keras.optimizers.AdamW)
DPAdagradGaussianOptimizer = make_gaussian_optimizer_class(keras.optimizers.Adagrad)
DPRMSPropGaussianOptimizer = make_gaussian_optimizer_class(keras.optimizers.RMSprop)


def is_dp_optimizer(optimizer) -> bool:
  """True when ``optimizer`` is an instance of a class made by ``make_gaussian_optimizer_class``."""
  return hasattr(type(optimizer), "_dp_base_class")


__all__ = [
    "make_gaussian_optimizer_class", "is_dp_optimizer", "DPGradientDescentGaussianOptimizer",
    "DPAdamGaussianOptimizer", "DPAdamWGaussianOptimizer", "DPAdagradGaussianOptimizer",
    "DPRMSPropGaussianOptimizer",
]
