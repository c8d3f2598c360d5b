"""The seed tutorial's MNIST CNN, with no dependency but the ``keras`` module passed in (so the
peer benchmark can build it under Keras 2 as well)."""


def cnn_layers(keras):
  """Conv2D 16x8x8 stride 2 same, MaxPool 2/1, Conv2D 32x4x4 stride 2 valid, MaxPool 2/1,
  Flatten, Dense 32 relu, Dense 10 (logits)."""
  return [
      keras.Input((28, 28, 1)),
      keras.layers.Conv2D(16, 8, strides=2, padding="same", activation="relu"),
      keras.layers.MaxPool2D(2, 1),
      keras.layers.Conv2D(32, 4, strides=2, padding="valid", activation="relu"),
      keras.layers.MaxPool2D(2, 1),
      keras.layers.Flatten(),
      keras.layers.Dense(32, activation="relu"),
      keras.layers.Dense(10),
  ]
