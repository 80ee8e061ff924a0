"""Evidence: read vLLM's start-up log, build and keep the records of the runs.

Modules:
    logs      - facts from the unit's journal (``python -m evidence.logs``)
    report    - run.json (validated by schema/run.schema.json), REPORT.md and plots for one run
    index     - evidence/INDEX.md over every run (``python -m evidence.index``)
    mcdata    - the accuracy role's multiple-choice data sets (``python -m evidence.mcdata``)

The clients that run on a rig ship in their roles: roles/bench/files/bench.py, the serving
benchmark, and roles/accuracy/files/accuracy.py, the multiple-choice scorer and comparison.
"""

from pathlib import Path

EVIDENCE_DIR = Path(__file__).resolve().parent
RUNS_DIR = EVIDENCE_DIR / "runs"
SCHEMA_PATH = EVIDENCE_DIR / "schema" / "run.schema.json"
