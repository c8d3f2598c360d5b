"""Deprecated alias of :mod:`tf_dpkit.generative.networks`, removed in the next release.

The generator and discriminator builders moved to ``tf_dpkit.generative.networks``, so that
the name tells them apart from the DP Keras models (``tf_dpkit.dp_models``).  Use
``tf_dpkit.generative.mlp_generator`` etc. or import from ``tf_dpkit.generative.networks``;
the names below are the same objects.
"""
from tf_dpkit.generative.networks import (CONDITIONINGS, ROW_STATISTICS, RowStatistics,
                                          conv_discriminator, conv_generator,
                                          mlp_discriminator, mlp_generator,
                                          sequence_discriminator, sequence_generator,
                                          statistics_discriminator)

__all__ = ["CONDITIONINGS", "ROW_STATISTICS", "RowStatistics", "conv_discriminator",
           "conv_generator", "mlp_discriminator", "mlp_generator", "sequence_discriminator",
           "sequence_generator", "statistics_discriminator"]
