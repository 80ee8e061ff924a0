"""``python -m tests.fake_compute``: serve the fake Compute API in the foreground."""

from tests.fake_compute.server import main

main()
