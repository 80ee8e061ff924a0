"""Paired multiple-choice accuracy of two builds behind OpenAI-compatible (vLLM) endpoints.

Each record ``{"question", "choices", "label"}`` is scored by the log-probability the model gives
each choice as the continuation of ``"Question: <q>\\nAnswer:"`` (vLLM ``/v1/completions`` with
``echo`` and ``logprobs``: the prompt's own token log-probabilities). A record is correct when the
label's choice scores strictly highest. Two builds are compared record for record: the difference
in accuracy (B - A, percentage points) with a seeded 95% paired bootstrap interval, written like
``+0.3 (-0.7 to +1.3)``.

Scoring uses the standard library only, so the accuracy role runs it on a rig's python3
(``--score URL --out FILE``) and compares the fetched scores on the controller.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

PROMPT = "Question: {question}\nAnswer:"


class AccuracyError(RuntimeError):
    """Bad input or an endpoint that does not answer as expected; the message says which."""


# Headers every request sends: the bearer token, when --api-key-env-file names a file holding one.
AUTH_HEADERS: dict[str, str] = {}


def api_key_from_env_file(path: Path) -> str:
    """VLLM_API_KEY from a systemd EnvironmentFile such as the rig's tpu.env ("" when absent).

    Read from the file rather than taken as an argument or from the environment that Ansible sets:
    both would put the key into a command line that `ps` shows.
    """
    for line in path.read_text().splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and key.strip() == "VLLM_API_KEY":
            value = value.strip()
            if len(value) >= 2 and value[0] == value[-1] == '"':
                value = value[1:-1].replace('\\"', '"').replace("\\\\", "\\")
            return value
    return ""


def load_records(path: Path) -> list[dict[str, Any]]:
    """Read and check a JSONL of multiple-choice records; errors name the line."""
    if not path.is_file():
        raise AccuracyError(f"data file not found: {path}")
    records = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise AccuracyError(f"{path}:{n}: not JSON: {exc}") from exc
        q, choices, label = rec.get("question"), rec.get("choices"), rec.get("label")
        prompt = rec.get("prompt")
        if not isinstance(q, str) or not q:
            raise AccuracyError(f"{path}:{n}: 'question' must be a non-empty string")
        if prompt is not None and (not isinstance(prompt, str) or not prompt):
            raise AccuracyError(f"{path}:{n}: 'prompt', when given, must be a non-empty string")
        if (
            not isinstance(choices, list)
            or len(choices) < 2
            or not all(isinstance(c, str) and c for c in choices)
        ):
            raise AccuracyError(f"{path}:{n}: 'choices' must be a list of at least 2 non-empty strings")
        if not isinstance(label, int) or isinstance(label, bool) or not 0 <= label < len(choices):
            raise AccuracyError(
                f"{path}:{n}: 'label' must be an index into 'choices' (0..{len(choices) - 1})"
            )
        records.append({"question": q, "choices": choices, "label": label})
        if prompt is not None:
            records[-1]["prompt"] = prompt
    if not records:
        raise AccuracyError(f"{path}: no records")
    return records


def _post(url: str, path: str, payload: dict[str, Any], timeout: float) -> Any:
    req = urllib.request.Request(
        url.rstrip("/") + path,
        json.dumps(payload).encode(),
        {"Content-Type": "application/json", **AUTH_HEADERS},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        raise AccuracyError(f"{url}{path}: HTTP {exc.code}: {exc.read()[:300]!r}") from exc
    except (urllib.error.URLError, OSError) as exc:
        raise AccuracyError(f"{url}{path}: {exc}") from exc


def discover_model(url: str, timeout: float = 30.0) -> str:
    """The first model /v1/models lists."""
    try:
        req = urllib.request.Request(url.rstrip("/") + "/v1/models", headers=AUTH_HEADERS)
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            data = json.loads(resp.read())["data"]
    except (urllib.error.URLError, OSError, KeyError, ValueError) as exc:
        raise AccuracyError(f"cannot list models at {url}/v1/models: {exc}") from exc
    if not data:
        raise AccuracyError(f"{url}/v1/models lists no model")
    return data[0]["id"]


def continuation_logprob(choice: dict[str, Any], continuation_len: int) -> float:
    """Sum the log-probabilities of the echoed tokens that cover the last ``continuation_len`` characters.

    The last token is the one generated (max_tokens=1), not part of the scored text; its offset is
    where the echoed prompt ends. Counting back from there keeps a BOS token the server may echo
    at the front from shifting the boundary. A token that straddles the boundary counts, since the
    tokenizer merged it with the continuation.
    """
    lp = choice["logprobs"]
    offsets, values = lp["text_offset"][:-1], lp["token_logprobs"][:-1]
    end_of_prompt = lp["text_offset"][-1]
    boundary = end_of_prompt - continuation_len
    ends = [*offsets[1:], end_of_prompt]
    picked = [v for end, v in zip(ends, values, strict=True) if end > boundary]
    if not picked or any(v is None for v in picked):
        raise AccuracyError("the endpoint returned no log-probability for the continuation")
    return float(sum(picked))


def score_record(url: str, model: str, record: dict[str, Any], timeout: float = 300.0) -> list[float]:
    """Log-probability of each choice as the continuation of the record's prompt.

    A record's own ``prompt`` (a model's chat template already applied, say) is sent verbatim and
    each choice follows it as written; otherwise the prompt is ``PROMPT`` and a space precedes
    each choice.
    """
    if "prompt" in record:
        prompt, conts = record["prompt"], list(record["choices"])
    else:
        prompt = PROMPT.format(question=record["question"])
        conts = [f" {c}" for c in record["choices"]]
    texts = [prompt + c for c in conts]
    payload = {
        "model": model,
        "prompt": texts,
        "max_tokens": 1,
        "temperature": 0.0,
        "echo": True,
        "logprobs": 0,
    }
    resp = _post(url, "/v1/completions", payload, timeout)
    choices = sorted(resp.get("choices") or [], key=lambda c: c["index"])
    if len(choices) != len(texts):
        raise AccuracyError(f"asked for {len(texts)} completions, got {len(choices)}")
    return [continuation_logprob(c, len(t)) for c, t in zip(choices, conts, strict=True)]


def is_correct(scores: list[float], label: int) -> bool:
    """True when the label's choice scores strictly above every other choice."""
    return all(scores[label] > s for i, s in enumerate(scores) if i != label)


def score_endpoint(url: str, records: list[dict[str, Any]], model: str | None = None, name: str = "") -> dict:
    """Score every record on one endpoint, showing progress on stderr."""
    model = model or discover_model(url)
    out = []
    step = max(1, len(records) // 10)
    for i, rec in enumerate(records, 1):
        out.append(score_record(url, model, rec))
        if i % step == 0 or i == len(records):
            print(f"[accuracy] {name or model}: {i}/{len(records)} records", file=sys.stderr, flush=True)
    return {"model": model, "url": url, "scores": out}


def paired_bootstrap(a: list[bool], b: list[bool], n_boot: int = 10_000, seed: int = 0) -> dict[str, float]:
    """Accuracy of A and B, B - A in percentage points, and its 95% paired bootstrap interval."""
    if len(a) != len(b) or not a:
        raise AccuracyError(f"paired comparison needs equal, non-empty record lists ({len(a)} vs {len(b)})")
    import numpy as np  # only the comparison needs it; scoring on a rig stays stdlib-only

    n = len(a)
    diffs = np.array([int(y) - int(x) for x, y in zip(a, b, strict=True)], dtype=np.int64)
    rng = np.random.default_rng(seed)
    # Resample records (not builds): each draw keeps a record's two answers together.
    boots = np.concatenate(
        [
            diffs[rng.integers(0, n, size=(min(1000, n_boot - i), n))].mean(axis=1)
            for i in range(0, n_boot, 1000)
        ]
    )
    lo, hi = (float(v) * 100 for v in np.quantile(boots, [0.025, 0.975]))
    return {
        "records": n,
        "acc_a": sum(a) / n * 100,
        "acc_b": sum(b) / n * 100,
        "diff": float(diffs.mean()) * 100,
        "ci_low": lo,
        "ci_high": hi,
        "seed": seed,
        "n_boot": n_boot,
    }


def format_diff(result: dict[str, float]) -> str:
    """``+0.3 (-0.7 to +1.3)``."""
    return f"{result['diff']:+.1f} ({result['ci_low']:+.1f} to {result['ci_high']:+.1f})"


def compare(records: list[dict[str, Any]], sa: dict, sb: dict, n_boot: int, seed: int) -> dict[str, Any]:
    """Paired result of two score sets over the same records."""
    for s, name in ((sa, "A"), (sb, "B")):
        if len(s["scores"]) != len(records):
            raise AccuracyError(
                f"scores of {name} cover {len(s['scores'])} records, the data has {len(records)}"
            )
    ca = [is_correct(s, r["label"]) for s, r in zip(sa["scores"], records, strict=True)]
    cb = [is_correct(s, r["label"]) for s, r in zip(sb["scores"], records, strict=True)]
    return {"a": sa["model"], "b": sb["model"], **paired_bootstrap(ca, cb, n_boot, seed)}


def _scores(arg: str, records: list[dict[str, Any]], model: str | None, name: str) -> dict:
    if arg.startswith(("http://", "https://")):
        return score_endpoint(arg, records, model, name)
    path = Path(arg)
    if not path.is_file():
        raise AccuracyError(f"--{name.lower()} is neither a URL nor a scores file: {arg}")
    return json.loads(path.read_text())


def main(argv: list[str] | None = None) -> int:
    """CLI entry point."""
    ap = argparse.ArgumentParser(
        prog="accuracy.py",
        description="Paired multiple-choice accuracy of two builds (B - A, 95%% bootstrap interval). "
        "--a/--b take a server URL or a scores file written by --score.",
    )
    ap.add_argument("--data", type=Path, required=True, help="JSONL of {question, choices, label}")
    ap.add_argument("--a", help="build A: URL (e.g. http://HOST:PORT) or scores JSON")
    ap.add_argument("--b", help="build B: URL or scores JSON")
    ap.add_argument("--model-a", help="model name at A (default: from /v1/models)")
    ap.add_argument("--model-b", help="model name at B (default: from /v1/models)")
    ap.add_argument("--score", metavar="URL", help="only score this endpoint and write --out (no comparison)")
    ap.add_argument("--model", help="model name for --score")
    ap.add_argument("--n-boot", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, help="write the result (or scores, with --score) as JSON here")
    ap.add_argument("--api-key-env-file", type=Path,
                    help="send VLLM_API_KEY from this EnvironmentFile (the rig's tpu.env) as a bearer token")  # fmt: skip
    args = ap.parse_args(argv)
    if args.api_key_env_file:
        try:
            key = api_key_from_env_file(args.api_key_env_file)
        except OSError as exc:
            ap.error(f"--api-key-env-file: {exc}")
        if key:
            AUTH_HEADERS["Authorization"] = f"Bearer {key}"
    if not args.score and not (args.a and args.b):
        ap.error("give --a and --b (paired comparison) or --score URL --out FILE")
    if args.score and not args.out:
        ap.error("--score needs --out")
    try:
        records = load_records(args.data)
        if args.score:
            result: dict[str, Any] = score_endpoint(args.score, records, args.model)
            result["dataset"] = args.data.name
        else:
            sa = _scores(args.a, records, args.model_a, "A")
            sb = _scores(args.b, records, args.model_b, "B")
            result = {**compare(records, sa, sb, args.n_boot, args.seed), "dataset": args.data.name}
            print(
                f"{result['b']} vs {result['a']} on {result['records']} records: "
                f"{result['acc_a']:.1f}% -> {result['acc_b']:.1f}%, difference {format_diff(result)} "
                f"(95% paired bootstrap, {args.n_boot} resamples, seed {args.seed})"
            )
    except AccuracyError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
