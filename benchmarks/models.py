"""The benchmark models: the MNIST CNN, a Dense-only MLP, an Embedding+Dense text model and a
small Transformer block.  Each entry builds ``(layers_fn, make_batch)``."""
from __future__ import annotations

import os
import sys

import keras
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "tutorials"))
from mnist_cnn import cnn_layers  # noqa: E402  (the tutorials' MNIST CNN, one definition)


def mnist_cnn():
  return keras.Sequential(cnn_layers(keras))


def mlp():
  return keras.Sequential([
      keras.Input((784,)), keras.layers.Dense(512, activation="relu"),
      keras.layers.Dense(256, activation="relu"), keras.layers.Dense(10)])


def text():
  return keras.Sequential([
      keras.Input((64,), dtype="int32"), keras.layers.Embedding(10000, 64),
      keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(64, activation="relu"),
      keras.layers.Dense(2)])


def transformer():
  inputs = keras.Input((32,), dtype="int32")
  h = keras.layers.Embedding(10000, 64)(inputs)
  attention = keras.layers.MultiHeadAttention(num_heads=4, key_dim=16)(h, h)
  h = keras.layers.LayerNormalization()(h + attention)
  ffn = keras.layers.Dense(64)(keras.layers.Dense(128, activation="relu")(h))
  h = keras.layers.LayerNormalization()(h + ffn)
  outputs = keras.layers.Dense(2)(keras.layers.GlobalAveragePooling1D()(h))
  return keras.Model(inputs, outputs)


def batch_for(name, batch_size, seed=0):
  rng = np.random.default_rng(seed)
  if name == "mnist_cnn":
    return rng.random((batch_size, 28, 28, 1), np.float32), rng.integers(0, 10, batch_size)
  if name == "mlp":
    return rng.random((batch_size, 784), np.float32), rng.integers(0, 10, batch_size)
  length = 64 if name == "text" else 32
  return (rng.integers(0, 10000, (batch_size, length)).astype(np.int32),
          rng.integers(0, 2, batch_size))


MODELS = {"mnist_cnn": mnist_cnn, "mlp": mlp, "text": text, "transformer": transformer}
