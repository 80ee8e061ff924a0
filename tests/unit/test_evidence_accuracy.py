"""Accuracy tool logic: record parsing, continuation scoring on a real vLLM response, paired bootstrap."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from evidence.mcdata import DATA_FILES, DEFAULT_OUT, TINY_FACTS_OUT, generate
from repack import tiny_facts
from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "roles" / "accuracy" / "files"))
import accuracy  # the role's scorer, copied to the rig as a plain file

FIX = Path(__file__).parent / "evidence_fixtures"


def test_continuation_scoring_on_a_real_echo_response() -> None:
    resp = json.loads((FIX / "cpu_tiny_echo_logprobs.json").read_text())
    paris, rome = sorted(resp["choices"], key=lambda c: c["index"])
    # The continuation is one token in this tokenizer: its log-probability alone is the score.
    assert accuracy.continuation_logprob(paris, len(" Paris")) == paris["logprobs"]["token_logprobs"][-2]
    assert accuracy.continuation_logprob(rome, len(" Rome")) == rome["logprobs"]["token_logprobs"][-2]
    # A longer continuation takes in the tokens before it, and the generated token never counts.
    lp = paris["logprobs"]["token_logprobs"]
    assert accuracy.continuation_logprob(paris, len(": Paris")) == pytest.approx(lp[-3] + lp[-2])


def test_leading_bos_does_not_shift_the_boundary() -> None:
    choice = {
        "logprobs": {"text_offset": [0, 5, 8, 12, 17], "token_logprobs": [None, -1.0, -2.0, -3.0, -9.0]}
    }
    # "<bos>" "Q: " "ab:" " cat" + generated: the continuation " cat" is the 4th token only.
    assert accuracy.continuation_logprob(choice, 4) == -3.0


def test_missing_logprob_is_an_error() -> None:
    choice = {"logprobs": {"text_offset": [0, 4], "token_logprobs": [None, -1.0]}}
    with pytest.raises(accuracy.AccuracyError):
        accuracy.continuation_logprob(choice, 4)


def test_correct_only_when_label_strictly_highest() -> None:
    assert accuracy.is_correct([-1.0, -2.0, -3.0], 0)
    assert not accuracy.is_correct([-1.0, -2.0, -3.0], 1)
    assert not accuracy.is_correct([-1.0, -1.0], 0)  # a tie is not a win


def test_identical_builds_give_exactly_zero() -> None:
    flags = [True, False, True, True, False] * 20
    r = accuracy.paired_bootstrap(flags, list(flags))
    assert (r["diff"], r["ci_low"], r["ci_high"]) == (0.0, 0.0, 0.0)
    assert accuracy.format_diff(r) == "+0.0 (+0.0 to +0.0)"


def test_bootstrap_interval_is_seeded_and_brackets_the_difference() -> None:
    a = [i % 3 == 0 for i in range(300)]
    b = [i % 3 == 0 or i % 7 == 0 for i in range(300)]
    r1 = accuracy.paired_bootstrap(a, b, seed=1)
    assert r1 == accuracy.paired_bootstrap(a, b, seed=1)
    assert r1["ci_low"] < r1["diff"] < r1["ci_high"]
    assert r1["diff"] == pytest.approx((sum(b) - sum(a)) / 3)
    # Paired: a difference that is the same on every record has no spread at all.
    assert accuracy.paired_bootstrap([False] * 50, [True] * 50)["ci_low"] == 100.0
    assert accuracy.paired_bootstrap(a, b, seed=2) != r1


def test_format_diff_like_the_w8a8_card() -> None:
    assert accuracy.format_diff({"diff": 0.3, "ci_low": -0.7, "ci_high": 1.3}) == "+0.3 (-0.7 to +1.3)"


def test_compare_refuses_unpaired_scores() -> None:
    recs = [{"question": "q", "choices": ["a", "b"], "label": 0}] * 2
    sa = {"model": "a", "scores": [[0.0, -1.0]] * 2}
    with pytest.raises(accuracy.AccuracyError, match="cover 1 records"):
        accuracy.compare(recs, sa, {"model": "b", "scores": [[0.0, -1.0]]}, 100, 0)


@pytest.mark.parametrize(
    ("line", "msg"),
    [
        ("not json", "not JSON"),
        ('{"question": "", "choices": ["a", "b"], "label": 0}', "'question'"),
        ('{"question": "q", "choices": ["a"], "label": 0}', "'choices'"),
        ('{"question": "q", "choices": ["a", "b"], "label": 2}', "'label'"),
        ('{"question": "q", "choices": ["a", "b"], "label": true}', "'label'"),
    ],
)
def test_bad_records_name_the_line(tmp_path: Path, line: str, msg: str) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text('{"question": "q", "choices": ["a", "b"], "label": 1}\n' + line + "\n")
    with pytest.raises(accuracy.AccuracyError, match=f"d.jsonl:2: .*{msg}"):
        accuracy.load_records(data)


def test_cli_errors(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        accuracy.main(["--data", str(DEFAULT_OUT), "--a", "http://x"])
    assert "--a and --b" in capsys.readouterr().err
    assert accuracy.main(["--data", str(tmp_path / "none.jsonl"), "--a", "x", "--b", "y"]) == 1
    assert "not found" in capsys.readouterr().err
    assert (
        accuracy.main(["--data", str(DEFAULT_OUT), "--a", "http://127.0.0.1:9", "--b", "http://127.0.0.1:9"])
        == 1
    )
    assert "cannot list models" in capsys.readouterr().err


def test_cli_compares_saved_scores(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    recs = accuracy.load_records(DEFAULT_OUT)
    right = [[0.0 if i == r["label"] else -1.0 for i in range(len(r["choices"]))] for r in recs]
    wrong = [[-1.0 if i == r["label"] else 0.0 for i in range(len(r["choices"]))] for r in recs]
    (tmp_path / "a.json").write_text(json.dumps({"model": "A", "scores": wrong}))
    (tmp_path / "b.json").write_text(json.dumps({"model": "B", "scores": right}))
    out = tmp_path / "r.json"
    rc = accuracy.main(["--data", str(DEFAULT_OUT), "--a", str(tmp_path / "a.json"), "--b", str(tmp_path / "b.json"),
                        "--out", str(out)])  # fmt: skip
    assert rc == 0
    r = json.loads(out.read_text())
    assert (r["acc_a"], r["acc_b"], r["diff"], r["records"]) == (0.0, 100.0, 100.0, len(recs))
    assert "+100.0 (+100.0 to +100.0)" in capsys.readouterr().out


def test_committed_data_is_current_and_valid() -> None:
    assert DEFAULT_OUT.read_text() == "".join(json.dumps(r) + "\n" for r in generate())
    recs = accuracy.load_records(DEFAULT_OUT)
    assert len(recs) == 90
    # Labels spread over positions, so "always pick A" cannot score well.
    positions = {r["label"] for r in recs}
    assert positions == {0, 1, 2, 3}


@pytest.mark.parametrize("path", sorted(DATA_FILES), ids=lambda p: p.name)
def test_every_committed_data_file_is_what_mcdata_writes(path: Path) -> None:
    assert path.read_text() == "".join(json.dumps(r) + "\n" for r in DATA_FILES[path]())


def test_tiny_facts_records_ask_each_fact_by_letter_in_the_chat_template() -> None:
    recs = accuracy.load_records(TINY_FACTS_OUT)
    assert len(recs) == len(tiny_facts.FACTS) >= 30
    for rec, form in zip(recs, tiny_facts.choices(), strict=True):
        assert rec["prompt"].startswith("<bos><|turn>user\n" + form.fact.question + "\nA. ")
        assert rec["prompt"].endswith("<turn|>\n<|turn>model\n")
        assert rec["choices"] == ["A", "B", "C", "D"]
        assert form.options[rec["label"]] == form.fact.answer
    assert {r["label"] for r in recs} == {0, 1, 2, 3}


def test_a_records_own_prompt_is_sent_verbatim_and_its_choices_unspaced(monkeypatch) -> None:
    sent = {}

    def fake_post(url: str, path: str, payload: dict, timeout: float) -> dict:
        sent.update(payload)
        # Echo: all up to the last line break as one token, the rest as the next, then a generated one.
        choices = []
        for i, text in enumerate(payload["prompt"]):
            cut = text.rindex("\n") + 1
            choices.append(
                {
                    "index": i,
                    "logprobs": {
                        "text_offset": [0, cut, len(text)],
                        "token_logprobs": [None, -float(i), -9.0],
                    },
                }
            )
        return {"choices": choices}

    monkeypatch.setattr(accuracy, "_post", fake_post)
    rec = {"question": "q", "prompt": "<bos>P\n", "choices": ["A", "B"], "label": 0}
    assert accuracy.score_record("http://x", "m", rec) == [0.0, -1.0]
    assert sent["prompt"] == ["<bos>P\nA", "<bos>P\nB"]
    plain = {"question": "q", "choices": ["A", "B"], "label": 0}
    accuracy.score_record("http://x", "m", plain)
    assert sent["prompt"] == ["Question: q\nAnswer: A", "Question: q\nAnswer: B"]
