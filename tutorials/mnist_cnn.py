"""The seed tutorial's MNIST CNN, with no dependency but the ``keras`` module passed in (so the
peer benchmark can build it under Keras 2 as well)."""

ACTIVATIONS = ("relu", "tanh")


def cnn_layers(keras, activation="relu"):
  """Conv2D 16x8x8 stride 2 same, MaxPool 2/1, Conv2D 32x4x4 stride 2 valid, MaxPool 2/1,
  Flatten, Dense 32, Dense 10 (logits); the three hidden layers use ``activation``:
  ``"relu"`` (the seed tutorial's) or ``"tanh"`` (the tempered sigmoid of Papernot et al. 2020,
  bounded, which keeps gradients small and suits per-example clipping)."""
  if activation not in ACTIVATIONS:
    raise ValueError(f"activation must be one of {list(ACTIVATIONS)}, got {activation!r}.")
  return [
      keras.Input((28, 28, 1)),
      keras.layers.Conv2D(16, 8, strides=2, padding="same", activation=activation),
      keras.layers.MaxPool2D(2, 1),
      keras.layers.Conv2D(32, 4, strides=2, padding="valid", activation=activation),
      keras.layers.MaxPool2D(2, 1),
      keras.layers.Flatten(),
      keras.layers.Dense(32, activation=activation),
      keras.layers.Dense(10),
  ]


def scatternet_cnn_layers(keras, activation="tanh", channels=81):
  """Tramer & Boneh's (2021) CNN on ScatterNet features: input ``[7, 7, channels]``, Conv2D 16x3x3
  stride 2 same, Conv2D 32x3x3 stride 1 same, Flatten, Dense 32, Dense 10 (logits); the hidden
  layers use ``activation``."""
  if activation not in ACTIVATIONS:
    raise ValueError(f"activation must be one of {list(ACTIVATIONS)}, got {activation!r}.")
  return [
      keras.Input((7, 7, channels)),
      keras.layers.Conv2D(16, 3, strides=2, padding="same", activation=activation),
      keras.layers.Conv2D(32, 3, strides=1, padding="same", activation=activation),
      keras.layers.Flatten(),
      keras.layers.Dense(32, activation=activation),
      keras.layers.Dense(10),
  ]
