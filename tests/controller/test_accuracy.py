"""The accuracy tool against real vLLM CPU servers on the controller, two different tiny models.

Same build against itself: exactly zero difference and a zero-width interval. Two builds (same
architecture, different weights): a difference with a 95% interval around it. Also
playbooks/accuracy.yml: scoring on a "rig" (the controller, system python3) and the paired
comparison on the controller.

The tool's arithmetic is the subject, not the data: the first SUBSET records of mc-small keep
every scoring pass to seconds (each record is one request; the full file is three times longer).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from evidence.mcdata import DEFAULT_OUT
from tests.ansible_run import run_playbook
from tests.conftest import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.vllm]


SUBSET = 30


@pytest.fixture(scope="module")
def urls(servers) -> tuple[str, str]:
    """tests/controller/conftest.py's two servers: tiny-a and tiny-b."""
    return tuple(s.url for s in servers)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("data") / "mc-subset.jsonl"
    path.write_text("".join(DEFAULT_OUT.read_text().splitlines(keepends=True)[:SUBSET]))
    return path


@pytest.fixture(scope="module")
def scored(urls, data: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Each build scored once (--score), for the tests that read the same scores."""
    out = tmp_path_factory.mktemp("scored")
    for name, url in zip("ab", urls, strict=True):
        _cli("--score", url, "--data", str(data), "--out", str(out / f"{name}.json"))
    return out / "a.json", out / "b.json"


def _cli(*args: str) -> tuple[dict, str]:
    out = Path(args[args.index("--out") + 1])
    proc = subprocess.run(
        [sys.executable, str(ROOT / "roles" / "accuracy" / "files" / "accuracy.py"), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(out.read_text()), proc.stdout


def test_same_build_against_itself_is_exactly_zero(urls, data: Path, tmp_path: Path, figure) -> None:
    a, _ = urls
    res, line = _cli("--a", a, "--b", a, "--data", str(data), "--out", str(tmp_path / "r.json"))
    assert (res["diff"], res["ci_low"], res["ci_high"]) == (0.0, 0.0, 0.0)
    assert res["a"] == res["b"] == "tiny-a" and res["records"] == SUBSET
    assert "difference +0.0 (+0.0 to +0.0)" in line
    figure("accuracy, tiny-a vs itself", line.strip())


def test_two_builds_give_a_difference_with_an_interval(urls, data: Path, tmp_path: Path, figure) -> None:
    a, b = urls
    res, line = _cli("--a", a, "--b", b, "--data", str(data), "--out", str(tmp_path / "r.json"))
    assert (res["a"], res["b"]) == ("tiny-a", "tiny-b")
    assert res["ci_low"] <= res["diff"] <= res["ci_high"] and res["ci_low"] < res["ci_high"]
    assert res["diff"] == pytest.approx(res["acc_b"] - res["acc_a"])
    assert re.search(r"difference [+-]\d+\.\d \([+-]\d+\.\d to [+-]\d+\.\d\)", line)
    figure("accuracy, tiny-b vs tiny-a on mc-small", line.strip())


def test_scores_are_per_choice_and_differ_between_builds(urls, data: Path, scored, tmp_path: Path) -> None:
    a, _ = urls
    sa, sb = (json.loads(p.read_text()) for p in scored)
    recs = [json.loads(x) for x in data.read_text().splitlines()]
    assert [len(s) for s in sa["scores"]] == [len(r["choices"]) for r in recs]
    assert all(v < 0 for s in sa["scores"] for v in s)  # log-probabilities
    assert sa["scores"] != sb["scores"]
    # Scoring is deterministic: a second pass over the same build gives the same numbers.
    again, _ = _cli("--score", a, "--data", str(data), "--out", str(tmp_path / "a2.json"))
    assert again["scores"] == sa["scores"]


def test_accuracy_playbook_scores_on_the_rig_and_compares(urls, data: Path, scored, tmp_path: Path) -> None:
    a, b = urls
    fetch = tmp_path / "acc"

    def inventory(name: str, url: str) -> Path:
        port = int(url.rsplit(":", 1)[1])
        path = tmp_path / f"{name}.yml"
        host = {"ansible_connection": "local", "ansible_python_interpreter": "/usr/bin/python3",
                "rig_model": name, "rig_listen_address": "127.0.0.1", "rig_port": port}  # fmt: skip
        path.write_text(json.dumps({"rigs": {"hosts": {"ctl": host}}}))
        return path

    first = run_playbook(
        "playbooks/accuracy.yml", inventory=inventory("tiny-a", a),
        extra_vars={"accuracy_fetch_root": str(fetch), "accuracy_data": str(data)}, timeout=900,
    )  # fmt: skip
    assert first.rc == 0, first.output[-6000:]
    assert (fetch / "ctl-tiny-a.json").is_file()
    second = run_playbook(
        "playbooks/accuracy.yml", inventory=inventory("tiny-b", b),
        extra_vars={"accuracy_fetch_root": str(fetch), "accuracy_compare_with": str(fetch / "ctl-tiny-a.json"),
                    "accuracy_data": str(data)},  # untrained models: mc-small, not their facts
        timeout=900,
    )  # fmt: skip
    assert second.rc == 0, second.output[-6000:]
    res = json.loads((fetch / "ctl-tiny-b.compare.json").read_text())
    # The playbook's split (score on the rig, compare on the controller) gives what the tool gives
    # from each build's own scores.
    direct, _ = _cli(
        "--a", str(scored[0]), "--b", str(scored[1]), "--data", str(data), "--out", str(tmp_path / "d.json")
    )
    assert {k: res[k] for k in ("diff", "ci_low", "ci_high", "acc_a", "acc_b")} == {
        k: direct[k] for k in ("diff", "ci_low", "ci_high", "acc_a", "acc_b")
    }
    assert "tiny-b vs tiny-a" in second.output
