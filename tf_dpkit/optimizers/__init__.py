"""DP optimizers: the factory and the ready Keras 3 classes (``tf_dpkit.v1`` has the v1 ones)."""
import keras

from tf_dpkit.optimizers.factory import make_gaussian_optimizer_class

DPGradientDescentGaussianOptimizer = make_gaussian_optimizer_class(keras.optimizers.SGD)
DPAdamGaussianOptimizer = make_gaussian_optimizer_class(keras.optimizers.Adam)
DPAdamWGaussianOptimizer = make_gaussian_optimizer_class(keras.optimizers.AdamW)
DPAdagradGaussianOptimizer = make_gaussian_optimizer_class(keras.optimizers.Adagrad)
DPRMSPropGaussianOptimizer = make_gaussian_optimizer_class(keras.optimizers.RMSprop)

# Errors and reprs name the class the user built (``type(self).__name__``).  Serialization is
# unaffected: the classes stay registered as ``tf_dpkit>DP<Base>`` (e.g. ``tf_dpkit>DPSGD``), the
# name saved .keras files are loaded by.
for _name in ("DPGradientDescentGaussianOptimizer", "DPAdamGaussianOptimizer",
              "DPAdamWGaussianOptimizer", "DPAdagradGaussianOptimizer",
              "DPRMSPropGaussianOptimizer"):
  globals()[_name].__name__ = globals()[_name].__qualname__ = _name
del _name


def is_dp_optimizer(optimizer) -> bool:
  """True when ``optimizer`` is an instance of a class made by ``make_gaussian_optimizer_class``."""
  return hasattr(type(optimizer), "_dp_base_class")


__all__ = [
    "make_gaussian_optimizer_class", "is_dp_optimizer", "DPGradientDescentGaussianOptimizer",
    "DPAdamGaussianOptimizer", "DPAdamWGaussianOptimizer", "DPAdagradGaussianOptimizer",
    "DPRMSPropGaussianOptimizer",
]
