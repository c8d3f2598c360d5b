"""Searching written bytes for a secret (noise key, sampling seed): the one search every
secrecy test uses, so a form a file could hold the secret in is never forgotten in one of them.

An int64 secret can appear in a file as 8 raw bytes (either byte order), as a protobuf varint
(TensorFlow's graph and checkpoint formats) or as decimal text (configs, JSON, reprs).
"""
import os
import zipfile


def _varint(value: int) -> bytes:
  out = bytearray()
  while True:
    low, value = value & 0x7F, value >> 7
    out.append(low | (0x80 if value else 0))
    if not value:
      return bytes(out)


def byte_patterns(value: int) -> list:
  """The byte forms of the non-negative int64 ``value`` searched for."""
  return [value.to_bytes(8, "little"), value.to_bytes(8, "big"), _varint(value),
          str(value).encode()]


def written_bytes(directory):
  """Yields ``(path, bytes)`` of every file under ``directory``, zip members (``.keras``)
  unpacked as ``path:member``."""
  for root, _, files in os.walk(directory):
    for name in files:
      path = os.path.join(root, name)
      with open(path, "rb") as handle:
        data = handle.read()
      yield path, data
      if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
          for member in archive.namelist():
            yield f"{path}:{member}", archive.read(member)


def files_holding(directory, value: int) -> list:
  """Sorted paths (and ``path:member`` for zip members) under ``directory`` holding ``value``
  in any of :func:`byte_patterns`' forms."""
  patterns = byte_patterns(value)
  return sorted({path for path, data in written_bytes(directory)
                 if any(pattern in data for pattern in patterns)})
