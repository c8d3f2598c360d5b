"""The build a benchmark number comes from, stated in every result's header.

:func:`header` gives one markdown paragraph: date, command, CPU model and core count, whether
the CPU has AVX-512 (``avx512f`` in /proc/cpuinfo; without it TensorFlow leaves oneDNN off by
default), TensorFlow / Keras / Python versions, whether oneDNN is on in this process (and the
``TF_ENABLE_ONEDNN_OPTS`` setting), and whether tf_dpkit's compiled CPU kernels are on
(``TF_DPKIT_NATIVE``) and loaded for each family.  Call it after the timed steps ran: the
compiled kernels are loaded on first use, so their state is known only then.
"""
from __future__ import annotations

import os
import platform
import resource
import sys
import time


def cpu_model() -> str:
  try:
    with open("/proc/cpuinfo") as f:
      return next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
  except (OSError, StopIteration):
    return platform.processor() or "unknown CPU"


def has_avx512() -> bool:
  try:
    with open("/proc/cpuinfo") as f:
      return any("avx512f" in l.split() for l in f if l.startswith("flags"))
  except OSError:
    return False


def onednn_on() -> bool:
  from tf_dpkit.clipping.rules.conv import onednn_enabled  # noqa: PLC0415
  return onednn_enabled()


def native_state() -> str:
  """``on (noise: loaded, ...)`` or ``off (TF_DPKIT_NATIVE=0)``."""
  from tf_dpkit import native  # noqa: PLC0415
  if not native.enabled():
    return f"off ({native.SWITCH_VARIABLE}={os.environ.get(native.SWITCH_VARIABLE)})"
  parts = []
  for family in native.FAMILIES:
    if native.status(family) == "not tried yet":
      parts.append(f"{family}: not used")
    else:  # already tried: kernels() only reports
      parts.append(f"{family}: {'loaded' if native.kernels(family) is not None else 'unavailable'}")
  return "on (" + "; ".join(parts) + ")"


# Environment variables that change what a benchmark measures, stated in its command line:
# oneDNN on/off, tf_dpkit's compiled kernels on/off and how they are built (CXX, e.g.
# benchmarks/cxx_avx2), and TensorFlow's BFC allocator on the CPU
# (with oneDNN off TensorFlow keeps no allocator statistics unless it is set to true).
_RECORDED_VARIABLES = ("TF_ENABLE_ONEDNN_OPTS", "TF_DPKIT_NATIVE", "TF_CPU_ALLOCATOR_USE_BFC", "CXX",
                       "TF_DPKIT_CACHE_DIR")


def build() -> dict:
  import keras  # noqa: PLC0415
  import tensorflow as tf  # noqa: PLC0415
  return {
      "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
      "command": "".join(f"{k}={os.environ[k]} " for k in _RECORDED_VARIABLES
                         if k in os.environ) + "python " + " ".join(sys.argv),
      "cpu": f"{cpu_model()}, {os.cpu_count()} CPUs, AVX-512 {'yes' if has_avx512() else 'no'}",
      "versions": f"TensorFlow {tf.__version__}, Keras {keras.__version__}, "
                  f"Python {platform.python_version()}",
      "onednn": f"{'on' if onednn_on() else 'off'} (TF_ENABLE_ONEDNN_OPTS="
                f"{os.environ.get('TF_ENABLE_ONEDNN_OPTS', 'unset')})",
      "native": native_state(),
  }


def header() -> str:
  """The markdown paragraph stating the build (module docstring)."""
  b = build()
  return (f"Command: `{b['command']}`  \nDate: {b['date']}  \nMachine: {b['cpu']}  \n"
          f"{b['versions']}  \noneDNN: {b['onednn']}  \ntf_dpkit compiled kernels: "
          f"{b['native']}\n")


def peak_rss_mb() -> float:
  """This process's resident-set high-water mark (MB): ``VmHWM`` of ``/proc/self/status``
  where there is one (Linux).  Not ``getrusage``'s ``ru_maxrss``: Linux keeps that across
  ``execve``, so a child started by a process that had already used more memory reports the
  parent's peak, not its own."""
  try:
    with open("/proc/self/status") as status:
      for line in status:
        if line.startswith("VmHWM:"):
          return int(line.split()[1]) / 1024
  except OSError:
    pass
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def with_allocator_peak(fn):
  """``(fn(), peak MB of TensorFlow's CPU allocator while fn ran)``; the peak is None where the
  build keeps no CPU allocator statistics (TensorFlow 2.21 keeps them with oneDNN on, or with
  ``TF_CPU_ALLOCATOR_USE_BFC=true``)."""
  import tensorflow as tf  # noqa: PLC0415
  try:
    tf.config.experimental.reset_memory_stats("CPU:0")
  except ValueError:
    return fn(), None
  result = fn()
  return result, tf.config.experimental.get_memory_info("CPU:0")["peak"] / 2**20


def report(method_note: str, lines, out=None) -> str:
  """The results text (build header, ``method_note``, the table ``lines``); printed, and
  written to ``out`` when given."""
  text = header() + f"\n{method_note}\n\n" + "\n".join(lines) + "\n"
  print(text)
  if out:
    with open(out, "w") as f:
      f.write(text)
  return text
