"""Checkpoint converters: Google's Gemma 4 QAT release to the builds the rig serves.

The release stores bf16 values that already lie on a 4-bit Q4_0 grid (groups of 32 along the
input axis). Every tool here recovers that grid and never re-quantizes.
"""

__version__ = "1.0.0"
