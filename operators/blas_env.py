"""OpenBLAS's idle workers sleep within about 0.4 ms of their last job, not 0.1 s.

Imported first by ``operators`` (and so by ``runtime`` and ``iron_spec``), before numpy
loads OpenBLAS, which reads the variable once. A decode step runs on the decode pool
(``operators.native``), not on OpenBLAS; a worker still spinning from the prompt chunk's
GEMMs holds a core the pool needs, so the first 0.1 s of decoding ran at one core's
bandwidth (decode of 64 tokens after a 512-token prompt: 71.5 tok/s, against 75.8 with the
workers asleep; prefill 728 against 726 tok/s). A value already set is kept; a process that
loaded numpy before this keeps OpenBLAS's default, and is left as it is.
"""

import os
import sys

# Only where it can still act (numpy not loaded yet) and the user set no value of their own.
# Subprocesses inherit it, as any variable of this process.
if "numpy" not in sys.modules and not os.environ.get("OPENBLAS_THREAD_TIMEOUT", "").strip():
    os.environ["OPENBLAS_THREAD_TIMEOUT"] = "20"  # 2 ** 20 cycles of spinning
