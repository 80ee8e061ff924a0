"""Keep secrets out of tool results and the server's log.

Playbooks already log nothing of a task that carries the API key (no_log); this is the second
line: any text a tool returns passes through ``redact`` first. It masks bearer tokens,
``NAME=value`` / ``"NAME": "value"`` pairs whose NAME matches the inventory's
``rig_secret_name_patterns``, and any literal secret value the server was told about.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

MASK = "<redacted>"
# The project's defaults (inventory/group_vars/all/rig.yml rig_secret_name_patterns).
DEFAULT_PATTERNS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "(^|_)KEY$", "API_?KEY", "AUTH")


class Redactor:
    """Masks secrets in strings, and in every string inside lists and dicts."""

    def __init__(self, patterns: Iterable[str] = DEFAULT_PATTERNS, values: Iterable[str] = ()) -> None:
        self.name = re.compile("|".join(f"(?:{p})" for p in patterns), re.IGNORECASE)
        self.values = sorted({v for v in values if v and len(v) >= 4}, key=len, reverse=True)

    def _pair(self, match: re.Match[str]) -> str:
        key = match.group("key")
        return f"{match.group('head')}{MASK}" if self.name.search(key) else match.group(0)

    def text(self, value: str) -> str:
        for secret in self.values:
            value = value.replace(secret, MASK)
        value = re.sub(r"(?i)(bearer\s+)\S+", rf"\g<1>{MASK}", value)
        # NAME=value (tpu.env lines, environments) and "NAME": "value" (JSON, YAML dumps).
        value = re.sub(r"(?P<head>\b(?P<key>[A-Za-z_][A-Za-z0-9_]*)=)[^\s'\",]+", self._pair, value)
        return re.sub(
            r"(?P<head>[\"']?(?P<key>[A-Za-z_][A-Za-z0-9_]*)[\"']?\s*:\s*)[\"'][^\"']*[\"']",
            self._pair,
            value,
        )

    def __call__(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, list | tuple):
            return [self(v) for v in value]
        if isinstance(value, dict):
            return {
                k: (MASK if isinstance(k, str) and self.name.search(k) and isinstance(v, str) else self(v))
                for k, v in value.items()
            }
        return value
