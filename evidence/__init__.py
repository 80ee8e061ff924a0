"""Evidence: read vLLM's start-up log, benchmark a rig, compare builds for accuracy, keep the records.

Modules:
    logs      - facts from the unit's journal (``python -m evidence.logs``)
    bench     - the serving benchmark client, stdlib only so it runs on any rig's python3
    report    - run.json (validated by schema/run.schema.json), REPORT.md and plots for one run
    index     - evidence/INDEX.md over every run (``python -m evidence.index``)
    accuracy  - paired multiple-choice accuracy of two builds (``python -m evidence.accuracy``)
"""

from pathlib import Path

EVIDENCE_DIR = Path(__file__).resolve().parent
RUNS_DIR = EVIDENCE_DIR / "runs"
SCHEMA_PATH = EVIDENCE_DIR / "schema" / "run.schema.json"
