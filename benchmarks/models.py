"""The benchmark models: the MNIST CNN, a Dense-only MLP, an Embedding+Dense text model, a
small Transformer block, a text CNN (Embedding 20k x 64 -> Conv1D -> global max pool -> Dense)
and a CIFAR-10-sized tanh CNN with GroupNormalization.  ``MODELS[name]()`` builds the Keras
model, ``batch_for(name, B)`` a random batch for it."""
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


TEXT_CNN_LENGTH = 128


def text_cnn():
  return keras.Sequential([
      keras.Input((TEXT_CNN_LENGTH,), dtype="int32"), keras.layers.Embedding(20000, 64),
      keras.layers.Conv1D(128, 5, activation="relu"), keras.layers.GlobalMaxPooling1D(),
      keras.layers.Dense(2)])


def cifar_groupnorm():
  return keras.Sequential([
      keras.Input((32, 32, 3)), keras.layers.Conv2D(32, 3, padding="same"),
      keras.layers.GroupNormalization(groups=8), keras.layers.Activation("tanh"),
      keras.layers.MaxPooling2D(), keras.layers.Conv2D(64, 3, padding="same", activation="tanh"),
      keras.layers.MaxPooling2D(), keras.layers.Conv2D(64, 3, padding="same", activation="tanh"),
      keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)])


def text_lstm():
  """Not in the suite (``MODELS``): the recurrent layer has no fast-path rule and is replayed
  per example; timed on request (``--models=text_lstm``) to state that fallback's cost."""
  return keras.Sequential([
      keras.Input((64,), dtype="int32"), keras.layers.Embedding(20000, 64),
      keras.layers.LSTM(64), keras.layers.Dense(2)])


def batch_for(name, batch_size, seed=0):
  rng = np.random.default_rng(seed)
  if name == "mnist_cnn":
    return rng.random((batch_size, 28, 28, 1), np.float32), rng.integers(0, 10, batch_size)
  if name == "mlp":
    return rng.random((batch_size, 784), np.float32), rng.integers(0, 10, batch_size)
  if name == "cifar_groupnorm":
    return rng.random((batch_size, 32, 32, 3), np.float32), rng.integers(0, 10, batch_size)
  if name == "text_lstm":
    return (rng.integers(0, 20000, (batch_size, 64)).astype(np.int32),
            rng.integers(0, 2, batch_size))
  if name == "text_cnn":
    return (rng.integers(0, 20000, (batch_size, TEXT_CNN_LENGTH)).astype(np.int32),
            rng.integers(0, 2, batch_size))
  length = 64 if name == "text" else 32
  return (rng.integers(0, 10000, (batch_size, length)).astype(np.int32),
          rng.integers(0, 2, batch_size))


MODELS = {"mnist_cnn": mnist_cnn, "mlp": mlp, "text": text, "transformer": transformer,
          "text_cnn": text_cnn, "cifar_groupnorm": cifar_groupnorm}
# Models outside the suite, built by name on request.
OTHER_MODELS = {"text_lstm": text_lstm}


def build(name):
  """The model ``name`` of ``MODELS`` or ``OTHER_MODELS``."""
  return {**MODELS, **OTHER_MODELS}[name]()
