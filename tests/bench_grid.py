"""The reduced bench.yml grids of the controller's test and the local rig's.

128 fits; 4096 + 16 exceeds the servers' max-model-len 2048; concurrency 8 exceeds their
max-num-seqs 4. REDUCED_GRID (tests/controller/test_bench.py, which checks the sweep itself):
six cells, four of them infeasible, to prove those are recorded, not dropped; each feasible cell
and the decode run repeated. RIG_GRID (tests/e2e/test_50_bench.py, which checks that the rig's
own run is read and labelled right): one cell of each kind, once, and one counted decode run.
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

RIG_GRID = {
    **REDUCED_GRID,
    "bench_concurrency": [1, 8],
    "bench_repeats": 1,
    "bench_decode_runs": 2,  # the first run warms up and is not counted
}
