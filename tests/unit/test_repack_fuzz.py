"""The rule, not the list: random corruptions of a valid checkpoint never give a traceback.

Seeded and bounded: each case breaks a copy of the micro checkpoint one random way (bytes of a
shard's header or data, a header entry's fields, the header's length, the file's length,
config.json or the index) and runs a random converter on it. Whatever the input, the tool
either writes a valid output (exit 0) or refuses with exactly one line ``<tool>: error: ...``
and exit 2 or 3, leaving no OUT and no temporary directory; never a traceback and never the
last-resort "internal error" (exit 1), which would mean an input the code does not expect.
"""

from __future__ import annotations

import json
import random
import struct
from pathlib import Path

import pytest

from repack.st_io import read_header
from tests.unit.repack_micro import SHARD, TOWER_SHARD, header, put, split, write_micro_qat
from tests.unit.test_repack_bad_inputs import run

CASES = 240
RUNS = [
    ("repack_q4_0.py", "repack", "SRC", "OUT"),
    ("repack_q4_0.py", "check", "SRC"),
    ("repack_q4_0.py", "build", "SRC", "OUT", "--target", "w8a8"),
    ("repack_q4_0.py", "build", "SRC", "OUT", "--target", "emb4"),
    ("repack_q4_0.py", "build", "SRC", "OUT", "--target", "text"),
    ("text_only.py", "SRC", "OUT"),
    ("embed_int4.py", "SRC", "OUT", "--embed-tokens"),
    ("w8a8_from_qat.py", "SRC", "OUT"),
]
VALUES = [
    None, True, False, 0, 1, -1, 7, 2**31, 2**63, -(2**40), 1.5, float("nan"), "", "ab", "BF16", "F16",
    "I8", "F8_E4M3", "gemma4", [], [0], [1, 2], [-1, 3], [64, 128], [2**62, 2], ["a", 1], {}, {"a": 1},
    [[1]], "../x.safetensors", "model-00002-of-00002.safetensors",
]  # fmt: skip


def _pick_path(rng: random.Random, doc: object, depth: int = 0) -> list:
    """A random path of keys/indexes into a JSON document (possibly empty: the whole document)."""
    path: list = []
    node = doc
    while isinstance(node, dict | list) and node and rng.random() < 0.8 and depth < 4:
        key = rng.choice(list(node)) if isinstance(node, dict) else rng.randrange(len(node))
        path.append(key)
        node = node[key]
        depth += 1
    return path


def _mutate_json(rng: random.Random, doc: object) -> object:
    """Replace, delete or add one thing somewhere in ``doc``."""
    path = _pick_path(rng, doc)
    if not path:
        return rng.choice(VALUES)
    parent = doc
    for k in path[:-1]:
        parent = parent[k]
    last = path[-1]
    op = rng.random()
    if op < 0.6:
        parent[last] = rng.choice(VALUES)
    elif op < 0.8:
        del parent[last]
    elif isinstance(parent, dict):
        parent[rng.choice(["dtype", "shape", "data_offsets", "extra", "__metadata__"])] = rng.choice(VALUES)
    else:
        parent.append(rng.choice(VALUES))
    return doc


def _mutate_entry(rng: random.Random, head: dict) -> dict:
    """Break one tensor's entry: the whole of it, one field, or its numbers nudged."""
    name = rng.choice([k for k in head if k != "__metadata__"])
    entry = head[name]
    field = rng.choice(["dtype", "shape", "data_offsets"])
    op = rng.randrange(5)
    if op == 0:
        head[name] = rng.choice(VALUES)
    elif op == 1:
        entry[field] = rng.choice(VALUES)
    elif op == 2:
        del entry[field]
    elif op == 3 and field != "dtype" and entry[field]:
        i = rng.randrange(len(entry[field]))
        entry[field][i] += rng.choice([-(2**20), -64, -8, -2, -1, 1, 2, 8, 64, 2**20])
    else:
        entry["dtype"] = rng.choice(["BF16", "F16", "F32", "F64", "I8", "U8", "I32", "I64", "BOOL", "I16"])
    return head


def _corrupt(rng: random.Random, src: Path) -> str:
    """Break ``src`` one random way; say how (for the failure message)."""
    shard = src / rng.choice([SHARD, SHARD, TOWER_SHARD])
    kind = rng.choice(
        ["header-bytes", "header-json", "entry", "entry", "data-bytes", "length", "size", "config", "index"]
    )
    if kind == "header-bytes":
        raw = bytearray(shard.read_bytes())
        (n,) = struct.unpack("<Q", raw[:8])
        for _ in range(rng.randint(1, 4)):
            raw[8 + rng.randrange(n)] = rng.randrange(256)
        shard.write_bytes(bytes(raw))
    elif kind == "header-json":
        put(shard, json.dumps(_mutate_json(rng, header(shard))))
    elif kind == "entry":
        put(shard, json.dumps(_mutate_entry(rng, header(shard))))
    elif kind == "data-bytes":
        head, data = split(shard)
        data = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        put(shard, head, bytes(data))
    elif kind == "length":
        raw = bytearray(shard.read_bytes())
        (n,) = struct.unpack("<Q", raw[:8])
        raw[:8] = struct.pack("<Q", max(0, n + rng.choice([-9, -8, -1, 1, 8, 1 << 20, 1 << 62])))
        shard.write_bytes(bytes(raw))
    elif kind == "size":
        raw = shard.read_bytes()
        cut = rng.randrange(len(raw) + 64)
        shard.write_bytes(raw[:cut] if cut < len(raw) else raw + bytes(cut - len(raw)))
    else:
        f = src / ("config.json" if kind == "config" else "model.safetensors.index.json")
        f.write_text(json.dumps(_mutate_json(rng, json.loads(f.read_text()))))
    return f"{kind} of {shard.name}"


def _valid_output(out: Path) -> None:
    """What a run that succeeded wrote reads back: a config and shards with valid headers."""
    assert isinstance(json.loads((out / "config.json").read_text()), dict)
    shards = sorted(out.glob("*.safetensors"))
    assert shards
    for s in shards:
        read_header(s)


@pytest.fixture(scope="module")
def micro(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("fuzz") / "micro"
    write_micro_qat(d)
    return d


@pytest.mark.parametrize("seed", range(CASES))
def test_random_corruption_gives_one_line_or_a_valid_output(seed: int, micro: Path, tmp_path: Path):
    rng = random.Random(seed)
    argv = rng.choice(RUNS)
    how: list[str] = []
    r = run(argv, lambda src, tmp: how.append(_corrupt(rng, src)), micro, tmp_path)
    context = f"{how[0]}, {' '.join(argv)}: {r.stderr[-1500:]}"
    assert "Traceback" not in r.stderr, context
    assert r.code in (0, 2, 3), context
    lines = r.stderr.strip().splitlines()
    if r.code:
        assert len(lines) == 1 and lines[0].startswith(f"{argv[0]}"), context
        assert ": error: " in lines[0], context
        assert not (tmp_path / "out").exists(), context
    elif "OUT" in argv:
        _valid_output(tmp_path / "out")
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name or ".old-" in p.name], context
