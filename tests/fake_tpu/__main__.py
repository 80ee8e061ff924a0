"""``python -m tests.fake_tpu``: serve the fake Cloud TPU API in the foreground."""

from tests.fake_tpu.server import main

main()
