"""Keep secrets out of incident records: they get attached to bug reports.

The rules of `print-command` (config/command.py: secret-looking flag and variable names)
plus the values themselves: every secret the daemon knows (the API key, secret-like
[vllm.env] values, secret flag values) is replaced wherever it appears, and text that looks
like a credential (`Authorization: Bearer ...`, `--api-key X`, `hf_...`, `sk-...`) too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from vllmwatch.config.command import REDACTED, is_secret_name, redact_argv

# A name counts when it ENDS in a secret word: `--api-key X`, `HF_TOKEN=...`, but not
# `--max-num-batched-tokens 2048` or `prompt_tokens=...` (vLLM prints those all the time).
_WORD = r"[\w-]*(?:key|token|secret|password|passwd|credential)s?\b"
_PATTERNS = (
    re.compile(r"(?i)(authorization\s*[:=]\s*(?:bearer|basic|token)?\s*)[^\s'\",]+"),
    re.compile(r"(?i)(--" + _WORD.replace("s?", "") + r"(?:=|\s+))[^\s'\",]+"),
    re.compile(r"(?i)(\b" + _WORD.replace("s?", "") + r"['\"]?\s*[=:]\s*\[?['\"]?)"
               r"[^\s'\",\]]+"),
    re.compile(r"()\bhf_[A-Za-z0-9]{20,}"),
    re.compile(r"()\bsk-[A-Za-z0-9_-]{16,}"),
)
_MIN_SECRET = 4  # shorter "secrets" would redact ordinary words


class Redactor:
    """Replaces known secret values and credential-looking text."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self._values = sorted({v for v in secrets if v and len(v) >= _MIN_SECRET},
                              key=len, reverse=True)

    def text(self, text: str) -> str:
        """One string, redacted."""
        for value in self._values:
            text = text.replace(value, REDACTED)
        for pattern in _PATTERNS:
            text = pattern.sub(lambda m: m.group(1) + REDACTED, text)
        return text

    def lines(self, lines: Iterable[str]) -> list[str]:
        """Many lines, redacted."""
        return [self.text(line) for line in lines]

    def argv(self, argv: Iterable[str]) -> list[str]:
        """A command line: secret flags' values, then any known value."""
        return [self.text(a) for a in redact_argv(list(argv))]

    def env(self, env: Mapping[str, str]) -> dict[str, str]:
        """Variables: secret-looking names hide their value."""
        return {k: REDACTED if is_secret_name(k) else self.text(v) for k, v in env.items()}

    def deep(self, value: Any) -> Any:
        """Any JSON-ready value: strings redacted, secret-looking keys hidden."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, Mapping):
            return {k: REDACTED if isinstance(k, str) and is_secret_name(k)
                    and isinstance(v, str) else self.deep(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.deep(v) for v in value]
        return value


def secrets_of(env: Mapping[str, str], api_key: str | None) -> list[str]:
    """The secret values of a child's environment (by name, as print-command hides them)."""
    found = [v for k, v in env.items() if is_secret_name(k)]
    return [*found, api_key] if api_key else found
