"""Handcrafted features for DP training: the scattering transform (no privacy cost: fixed,
per-example) and private per-channel normalisation statistics (a Gaussian mechanism whose event
is returned and recorded).  Design: docs/design/features.md; recipe: docs/guides/published_accuracy.md.
"""
from tf_dpkit.features.normalization import ChannelNormalization, private_channel_normalization
from tf_dpkit.features.scattering import (scattering_2d, scattering_channels,
                                          scattering_output_shape)

__all__ = ["ChannelNormalization", "private_channel_normalization", "scattering_2d",
           "scattering_channels", "scattering_output_shape"]
