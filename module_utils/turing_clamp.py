"""The Turing clamp for vLLM 0.29.0's Triton unified attention: the patch and the check.

Gemma 4's global layers have head size 512. At that size vLLM's Triton unified attention kernel
asks for ~96 KiB of shared memory per block, and Turing (sm75) allows 64 KiB, so the first
prefill dies with ``OutOfResources``. The clamp shrinks the KV tile sizes until the kernel fits
``smem_budget`` bytes and launches it with one pipeline stage, only when the device's major
capability is below 8; on Ampere and newer, and where the capability is unknown (the CPU build),
it does nothing.

This file has one job with two users, so it must stay free of Ansible imports:

* ``library/turing_clamp.py`` (the Ansible module) imports it as
  ``ansible.module_utils.turing_clamp``;
* that module's ``checker`` option writes this very file to the rig as ``clamp-check``, which the
  service runs as ``ExecStartPre`` (``main`` below): exit 0 only when the clamp is present exactly
  once in the installed vLLM (a reinstall or upgrade silently removes it).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from dataclasses import dataclass

# The file, relative to the installed ``vllm`` package directory.
RELATIVE_PATH = "v1/attention/ops/triton_unified_attention.py"
DEFAULT_SMEM_BUDGET = 60000
# The smallest tile the clamp will go down to (vLLM's own decode default for 16-bit types).
TILE_FLOOR = 16

BEGIN_MARKER = "    # >>> gemma-rig turing clamp"
END_MARKER = "    # <<< gemma-rig turing clamp <<<\n"

# Anchors: code the clamp relies on, each expected exactly once in vLLM 0.29.0's file. If one is
# missing or repeated, the file is another version and patching it blind could break serving.
INSERT_AFTER = (
    "    if use_td:\n"
    "        TILE_SIZE_PREFILL = min(TILE_SIZE_PREFILL, block_size)\n"
    "        TILE_SIZE_DECODE = min(TILE_SIZE_DECODE, block_size)\n"
)
ANCHORS: dict[str, str] = {
    "tile size helper": "def _get_tile_size(\n",
    "head size": "    head_size = q.shape[2]\n",
    "BLOCK_M": "    BLOCK_M = (\n",
    "launch_num_stages declaration": "    launch_num_stages: int | None = None\n",
    "prefill tile size": "    TILE_SIZE_PREFILL = _get_tile_size(\n",
    "decode tile size": "    TILE_SIZE_DECODE = _get_tile_size(\n",
    "use_td tile clamp (insertion point)": INSERT_AFTER,
    "num_stages launch kwarg": '        launch_kwargs["num_stages"] = launch_num_stages\n',
}


class ClampError(Exception):
    """The file cannot be patched or checked; the message says why."""


def clamp_block(smem_budget: int = DEFAULT_SMEM_BUDGET) -> str:
    """The code inserted into ``unified_attention`` (marker lines included)."""
    if smem_budget < 1:
        raise ClampError(f"smem_budget must be a positive number of bytes, got {smem_budget}")
    return (
        f"{BEGIN_MARKER} (smem_budget={smem_budget}) >>>\n"
        "    # Turing (sm75) allows 64 KiB of shared memory per block; head size 512 needs ~96 KiB\n"
        "    # at vLLM's tile sizes. Halve the KV tiles until they fit and use one stage.\n"
        "    # No-op on major >= 8 and where the capability is unknown (CPU build).\n"
        "    _rig_cap = current_platform.get_device_capability()\n"
        "    if _rig_cap is not None and _rig_cap[0] < 8:\n"
        "        _rig_elem = q.element_size()\n"
        f"        while TILE_SIZE_PREFILL > {TILE_FLOOR} and (\n"
        f"            (BLOCK_M + 2 * TILE_SIZE_PREFILL) * head_size * _rig_elem > {smem_budget}\n"
        "        ):\n"
        "            TILE_SIZE_PREFILL //= 2\n"
        f"        while TILE_SIZE_DECODE > {TILE_FLOOR} and (\n"
        f"            (BLOCK_M + 2 * TILE_SIZE_DECODE) * head_size * _rig_elem > {smem_budget}\n"
        "        ):\n"
        "            TILE_SIZE_DECODE //= 2\n"
        "        launch_num_stages = 1\n"
        f"{END_MARKER}"
    )


@dataclass(frozen=True)
class Block:
    """One clamp block found in a file: character offsets [start, end) and its full text."""

    start: int
    end: int
    text: str


def find_blocks(text: str) -> list[Block]:
    """Every complete clamp block in ``text``; raises on an unterminated or nested marker."""
    blocks: list[Block] = []
    pos = 0
    while True:
        start = text.find(BEGIN_MARKER, pos)
        if start < 0:
            return blocks
        if start > 0 and text[start - 1] != "\n":
            raise ClampError(f"clamp begin marker at offset {start} is not at the start of a line")
        end = text.find(END_MARKER, start)
        nested = text.find(BEGIN_MARKER, start + len(BEGIN_MARKER))
        if end < 0 or (0 <= nested < end):
            raise ClampError("a clamp begin marker has no matching end marker (file edited by hand?)")
        end += len(END_MARKER)
        blocks.append(Block(start, end, text[start:end]))
        pos = end


def count(text: str) -> int:
    """How many clamp blocks ``text`` holds."""
    return len(find_blocks(text))


def remove(text: str) -> str:
    """``text`` with every clamp block cut out: the original bytes, since insertion only adds."""
    out, pos = [], 0
    for block in find_blocks(text):
        out.append(text[pos : block.start])
        pos = block.end
    out.append(text[pos:])
    return "".join(out)


def check_anchors(original: str) -> None:
    """Raise naming the first anchor that is missing or not unique in the unpatched text."""
    for name, anchor in ANCHORS.items():
        found = original.count(anchor)
        if found != 1:
            state = "missing" if found == 0 else f"found {found} times"
            raise ClampError(
                f"anchor '{name}' is {state} in the file: it is not vLLM 0.29.0's "
                f"triton_unified_attention.py, so it was left unchanged (expected: {anchor.strip()!r})"
            )


def apply(text: str, smem_budget: int = DEFAULT_SMEM_BUDGET) -> str:
    """``text`` with exactly one clamp block for ``smem_budget``, after the anchors check out."""
    original = remove(text)
    check_anchors(original)
    patched = original.replace(INSERT_AFTER, INSERT_AFTER + clamp_block(smem_budget), 1)
    compile(patched, RELATIVE_PATH, "exec")  # a SyntaxError here means a bug in the block
    return patched


def locate(python: str, timeout: float = 60.0) -> str:
    """The clamp's target file in the vLLM installed for ``python``, found without importing vLLM.

    ``importlib.util.find_spec`` on a top-level package reads its location only; importing vLLM
    would take seconds and initialise torch.
    """
    code = (
        "import importlib.util, sys\n"
        "s = importlib.util.find_spec('vllm')\n"
        "sys.exit('vllm is not installed for ' + sys.executable) if s is None else None\n"
        "print(list(s.submodule_search_locations)[0])\n"
    )
    try:
        res = subprocess.run(
            [python, "-I", "-c", code], capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ClampError(f"cannot run {python}: {exc}") from exc
    if res.returncode != 0:
        raise ClampError(f"cannot locate vllm with {python}: {(res.stderr or res.stdout).strip()}")
    return f"{res.stdout.strip()}/{RELATIVE_PATH}"


def check_file(path: str) -> tuple[bool, str]:
    """(ok, message): ok only when the file holds the clamp exactly once."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
        found = count(text)
    except (OSError, UnicodeDecodeError, ClampError) as exc:
        return False, f"clamp check failed for {path}: {exc}"
    if found == 1:
        return True, f"turing clamp present once in {path}"
    if found == 0:
        return False, (
            f"turing clamp missing from {path} (vLLM reinstalled or upgraded?); "
            "re-run the vllm role to apply it"
        )
    return False, f"turing clamp present {found} times in {path}; expected exactly once"


def main(argv: list[str] | None = None) -> int:
    """CLI: ``check [--python PY | --path FILE]``; exit 0 only when the clamp is there once."""
    parser = argparse.ArgumentParser(
        prog="clamp-check",
        description="Check that vLLM's Triton unified attention carries the gemma-rig Turing clamp "
        "exactly once (the vllm service's ExecStartPre).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    chk = sub.add_parser("check", help="exit 0 only when the clamp is present exactly once")
    where = chk.add_mutually_exclusive_group()
    where.add_argument(
        "--python", help="interpreter whose installed vLLM to check (default: the one running this)"
    )
    where.add_argument("--path", help="check this triton_unified_attention.py directly")
    args = parser.parse_args(argv)

    try:
        path = args.path or locate(args.python or sys.executable)
    except ClampError as exc:
        print(f"clamp-check: {exc}", file=sys.stderr)
        return 2
    ok, message = check_file(path)
    print(f"clamp-check: {message}", file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
