"""The reduced bench.yml grid the controller and local-rig tests share.

128 fits; 4096 + 16 exceeds the servers' max-model-len 2048; concurrency 8 exceeds their
max-num-seqs 4: six cells, four of them infeasible, to prove those are recorded, not dropped.
"""

REDUCED_GRID = {
    "bench_input_lens": [128, 4096],
    "bench_concurrency": [1, 2, 8],
    "bench_output_len": 16,
    "bench_repeats": 2,
    "bench_decode_runs": 3,
    "bench_decode_output_len": 32,
    "bench_decode_input_len": 64,
}
