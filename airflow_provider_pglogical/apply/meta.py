"""The prefix of the apply's own working columns, below every module that names one: planning refuses a replicated
column starting with it (pure, without I/O) while the Spark frames (``batches``, ``transforms``) add them."""

from __future__ import annotations

# Every staged metadata column gets this prefix in the working frame so a source column named
# e.g. "op" can never collide with it.
META = "_pgl_"
