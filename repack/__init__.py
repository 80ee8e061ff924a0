"""Checkpoint converters: Google's Gemma 4 QAT release to the builds the rig serves.

The release stores bf16 values that already lie on a 4-bit Q4_0 grid (groups of 32 along the
input axis). Every tool here recovers that grid and never re-quantizes.
"""

# Recorded in every repack.json; `build --status`/`--if-stale` rebuild an output stamped with
# another version. 1.1.0: W8A8 scales are bf16 (were float32), so older W8A8 builds are stale.
__version__ = "1.1.0"
