"""ConfigError: every problem of a config file, each with file:line, key, value and remedy."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from vllmwatch.config.secretnames import is_secret_name


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a config: the dotted key, what is wrong, and the line if known."""

    key: str
    problem: str
    line: int | None = None

    def render(self, path: str) -> str:
        """'path:line: key: problem', the form editors jump to. A secret's name in backticks
        ('`vllm.env.HF_TOKEN` sets HF_TOKEN a second time'): every writer passes the redactor,
        which reads `HF_TOKEN: word` and `HF_TOKEN word` as a secret and its value, and hid
        the problem's first word (`vllm.env.HF_TOKEN <redacted> HF_TOKEN a second time`)."""
        place = f"{path}:{self.line}" if self.line else path
        name = self.key if len(self.key) <= MAX_KEY_SHOWN else _cut(self.key)  # a 300 kB typo
        key = f"`{name}` " if is_secret_name(self.key) else f"{name}: "
        return f"{place}: {key}{self.problem}" if self.key else f"{place}: {self.problem}"


class ConfigError(Exception):
    """A config a person must fix. It carries every problem found, so one edit cycle is enough.

    `key`, `problem` and `line` name the first problem; `problems` holds all of them.
    """

    def __init__(self, path: str, key: str, problem: str, line: int | None = None,
                 more: Sequence[Problem] = ()) -> None:
        self.path, self.key, self.problem, self.line = path, key, problem, line
        self.problems: tuple[Problem, ...] = (Problem(key, problem, line), *more)
        if len(self.problems) == 1:
            text = self.problems[0].render(path)
        else:  # the first MAX_SHOWN: a file of 60000 unknown keys said each (megabytes)
            left = len(self.problems) - MAX_SHOWN
            text = f"{path}: {len(self.problems)} problems:\n" + "\n".join(
                "  " + p.render(path) for p in self.problems[:MAX_SHOWN]) + (
                f"\n  ... and {left} more (fix these first)" if left > 0 else "")
        super().__init__(text)

    @classmethod
    def of(cls, path: str, problems: Sequence[Problem]) -> ConfigError:
        """One error for several problems (at least one)."""
        first, *rest = problems
        return cls(path, first.key, first.problem, first.line, rest)

    def with_lines(self, text: str) -> ConfigError:
        """The same problems, each placed at the line of the file text that sets its key."""
        lines = _Lines(text)  # read once: a search of the text per problem took minutes
        placed = [p if p.line is not None or not p.key else Problem(p.key, p.problem,
                                                                    lines.nearest(p.key))
                  for p in self.problems]
        placed.sort(key=lambda p: p.line if p.line is not None else 1 << 30)  # file order
        return type(self).of(self.path, placed)


MAX_SHOWN = 50  # problems a message lists; the count says how many more


def cut_name(name: str) -> str:
    """A key's name as a message shows it: a long one cut, its length said."""
    return name if len(name) <= MAX_KEY_SHOWN else _cut(name)


def _cut(name: str) -> str:
    # Never inside a word: a secret pasted as a key that crosses the cut would lose the
    # length the redactor's patterns need (every message passes it when printed), and its
    # first part would show. The word the cut falls in goes whole.
    head = name[:MAX_KEY_SHOWN]
    if _WORD.match(name, MAX_KEY_SHOWN):
        head = _WORD_END.sub("", head)
    return f"{head}... ({len(name)} characters)"


_TOKEN_CHAR = r"[^\s\"'`,;:()\[\]{}<>]"  # what a token may hold: all but these
_WORD, _WORD_END = re.compile(_TOKEN_CHAR), re.compile(_TOKEN_CHAR + "+$")


MAX_KEY_SHOWN = 120  # characters of a key's name (convert.SHOW_CHARS of a value)


def raise_all(path: str, problems: Sequence[Problem]) -> None:
    """Raise one ConfigError listing all problems; do nothing when there are none."""
    if problems:
        raise ConfigError.of(path, problems)


def nearest(name: str, known: Iterable[str]) -> str | None:
    """The known name a misspelt one most likely meant: the same but for case, `-` or `_`
    (`MAX_RESTARTS`, `[VLLM]`, `Endpoint`: difflib alone, which tells case apart, found none
    for the first two), else difflib's closest; None when nothing is close."""
    by = {_fold(k): k for k in known}
    if _fold(name) in by:
        return by[_fold(name)]
    close = difflib.get_close_matches(_fold(name), list(by), n=1, cutoff=0.6)
    return by[close[0]] if close else None


def _fold(name: str) -> str:
    return name.lower().replace("-", "_")


def same_key(a: str, b: str) -> bool:
    """The same name but for case, `-` or `_` (`env-file` is env_file)."""
    return _fold(a) == _fold(b)


def unknown(prefix: str, name: str, known: Sequence[str], what: str = "key") -> Problem:
    """An unknown key (or section) of a table: the known one it most likely meant, else the
    known ones, in the order given. Every table of the config says it so ([vllm], [[smoke]],
    [[adapters]])."""
    close = nearest(name, known)
    hint = f"did you mean {prefix}{close}?" if close else f"known: {', '.join(known)}"
    return Problem(prefix + name, f"unknown {what}; {hint}")


def line_of(text: str, key: str) -> int | None:
    """The line that sets a dotted key ("memory.gpu_limit") or opens a table ("memory").

    Also finds keys inside sub-tables such as "vllm.args.max-model-len", and in the Nth table
    of an array of tables: "smoke[2].endpoint" (N counts the `[[smoke]]` headers from 1).
    """
    return _Lines(text).line(key)


class _Lines:
    """Where a text's headers and keys are, read in one pass: the first line of each header
    (`[[smoke]]`'s Nth as smoke[N], its first as smoke too), of each key under each header
    (quoted or not), and of each key above the first header."""

    def __init__(self, text: str) -> None:
        self.headers: dict[str, int] = {}
        self.keys: dict[tuple[str, str], int] = {}
        current = ""
        arrays: dict[str, int] = {}
        for number, line in enumerate(text.splitlines(), 1):
            stripped = line.strip()
            array = re.match(r"^\[\[\s*([\w.-]+)\s*\]\]", stripped)
            header = None if array else re.match(r"^\[\s*([\w.-]+)\s*\]", stripped)
            if array:
                arrays[array[1]] = arrays.get(array[1], 0) + 1
                current = f"{array[1]}[{arrays[array[1]]}]"
                self.headers.setdefault(array[1], number)
            elif header:
                current = header[1]
            if array or header:
                self.headers.setdefault(current, number)
                continue
            key = re.match(r"^[\"']?(.+?)[\"']?\s*=", stripped)
            if key:
                self.keys.setdefault((current, key[1]), number)

    def line(self, key: str) -> int | None:
        parts = re.split(r"\.(?![^\[]*\])", key)
        name = re.split(r"\[", parts[-1])[0] if len(parts) > 1 else ""
        table = ".".join(parts[:-1]) if len(parts) > 1 else parts[0]
        section = parts[0]
        found = [self.headers.get(key), self.keys.get(("", section))]
        if name:
            found += [self.keys.get((table, name)), self.keys.get((section, name))]
        return min((n for n in found if n is not None), default=None)

    def nearest(self, key: str) -> int | None:
        """The line of the key, else of the table that holds it (an inline table, say)."""
        while key:
            line = self.line(key)
            if line is not None:
                return line
            key = key.rpartition(".")[0]
        return None
