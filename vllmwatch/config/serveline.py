"""Pure: a `vllm serve` command line as people have it -- pasted from a guide, typed after
`vllmwatch init --`, or read from /proc -- split into its environment, program and flags.

Shared by `vllmwatch init` (which turns it into a config) and `check` (which recognises a
hand-started vLLM among the processes and a cron or unit line that runs or kills one).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from vllmwatch.config.redact import REDACT

_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
# 2>&1, bash's &> log, >| log, <> rw, here-documents (<<EOF, <<-EOF) and here-strings (<<< x)
_REDIRECT = re.compile(r"^(\d*|&)(>\||>>?|<<<|<<-?|<>|<)(&\d+)?", re.ASCII)
# Programs a line runs vLLM under, with their options that take the next word as a value
# (`sudo -u vllm`, `nice -n 10`, `numactl -N 0`) and how many words come before the command
# (`taskset 0x3`, `taskset -c 0-7`, `chrt -f 99`).
WRAPPERS = {"nohup": (), "sudo": ("-u", "-g", "-h", "-p", "-C", "-D", "-r", "-t", "-U", "-T",
                                  "-R", "--user", "--group", "--host", "--prompt", "--chdir",
                                  "--chroot", "--role", "--type", "--close-from",
                                  "--other-user", "--command-timeout"),
             "exec": ("-a",), "time": ("-f", "-o", "--format", "--output"),
             "nice": ("-n", "--adjustment"), "setsid": (),
             "stdbuf": ("-o", "-e", "-i", "--output", "--error", "--input"),
             "numactl": ("-N", "-m", "-C", "-p", "-i", "-P", "--cpunodebind", "--membind",
                         "--physcpubind", "--preferred", "--interleave"),
             "env": ("-u", "-C", "-S", "--unset", "--chdir", "--split-string"), "taskset": (),
             "ionice": ("-c", "-n", "-p", "--class", "--classdata", "--pid"), "chrt": ()}
_OPERANDS = {"taskset": 1, "chrt": 1}
# vLLM's entry modules that serve the OpenAI API, old and new.
_MODULES = ("vllm.entrypoints.openai.api_server", "vllm.entrypoints.cli.main",
            "vllm.entrypoints.api_server")
_NUMBER = re.compile(r"^-?\d+(\.\d*)?([eE][-+]?\d+)?\Z")


class LineError(ValueError):
    """The text is not a command line we can read; the message says why."""


@dataclass(frozen=True)
class ServeLine:
    """A `vllm serve` command: KEY=value words before it, the program, what follows."""

    env: dict[str, str] = field(default_factory=dict)
    command: list[str] = field(default_factory=list)
    rest: list[str] = field(default_factory=list)
    # the programs it ran under, each with its words (`["sudo", "-u", "vllm"]`): a service
    # has its own way to say what they said (User=, CPUAffinity=), and init names it
    wrappers: list[list[str]] = field(default_factory=list)


_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")


def split_text(text: str) -> list[str]:
    """Shell words of a pasted command: `\\` continuations joined, comments and prompts
    dropped, `export X=y` lines kept as X=y words in front."""
    words: list[str] = []
    joined = re.sub(r"\\[ \t]*\r?\n", " ", text)
    lines = joined.splitlines()
    while lines:
        line, after = lines.pop(0).strip(), ""
        if not line or line.startswith("#"):
            continue
        line = re.sub(r"^[$#>] ", "", line)
        scan = _scan(line)
        if scan.expansions:
            raise LineError(f"the line uses the shell's {', '.join(dict.fromkeys(scan.expansions))}"
                            ": init cannot know what vLLM got from it; paste the line with the "
                            "values written out, or run `vllmwatch init --from-pid PID` on the "
                            "running vLLM")
        if scan.glued:  # `/m>log`, `a2>&1`: sh splits the word there; so do we, and read again
            for at in reversed(scan.glued):
                line = f"{line[:at]} {line[at:]}"
            scan = _scan(line)
        line = line[:scan.comment].rstrip() if scan.comment is not None else line
        if scan.end is not None:  # after ; && || &: the next command, as on its own line
            after = "" if line[scan.end] == "|" != line[scan.end + 1:scan.end + 2] else \
                line[scan.end:].lstrip(";&|")
            line = line[:scan.end]
        try:
            got = shlex.split(line)
        except ValueError as exc:
            raise LineError(f"cannot split {REDACT.head(line, 60)!r}...: {exc} (a quote is "
                            "not closed)") from None
        quoted = scan.quoted if scan.words == len(got) else set()
        keep = [i for i, w in enumerate(got)  # a lone \ was a continuation, unless quoted
                if (w != "\\" or i in quoted) and (i or w != "export")]
        words += strip_shell([got[i] for i in keep],
                             {n for n, i in enumerate(keep) if i in quoted})
        if after and all(_ASSIGNMENT.match(w) for w in (got[1:] if got[:1] == ["export"]
                                                         else got)):
            lines.insert(0, after)  # `export HF_HOME=/x; vllm serve ...`: the command is next
    return words


@dataclass
class _Scan:
    """A line as POSIX sh reads it, short of running it: the words whose first character it
    took literally (quoted or escaped: `'>gpt'`, `';'`, `\\|` are vLLM's words, never a
    redirection or the command's end), where a comment begins, where the command ends (an
    unquoted `;`, `|`, `&&`, `&`, also inside a word: `--port 8001;`, `/m&`), and the
    expansions it would have made (`$KEY`, `${HF_TOKEN}`, `$(hostname)`, a backtick, a
    leading `~`), and where an unquoted redirection begins inside a word (`/m>log`,
    `4096>>x.log`, `/m<in`, `/m&>log`: sh ends the word there, so vLLM never got `/m>log`;
    not after a word of digits alone, `2>&1`, which sh reads as the file descriptor)."""

    quoted: set[int] = field(default_factory=set)
    words: int = 0
    comment: int | None = None
    end: int | None = None
    expansions: list[str] = field(default_factory=list)
    glued: list[int] = field(default_factory=list)


_EXPANSION = re.compile(r"\$(?:[A-Za-z_][A-Za-z0-9_]*|\{[^}]*\}?|\([^)]*\)?)|`[^`]*`?|~[\w.-]*"
                        r"|[<>]\([^)]*\)?")  # bash's process substitution: a /dev/fd/N path


def _scan(line: str) -> _Scan:
    out = _Scan()
    in_word, quote, i, start = False, "", 0, 0
    while i < len(line):
        c = line[i]
        if quote == "'":
            quote = "" if c == "'" else quote
        elif quote == '"' and c == "\\" and line[i + 1:i + 2] in ('"', "\\", "$", "`"):
            i += 1
        elif quote == '"' and c == '"':
            quote = ""
        elif c in " \t\r\n" and not quote:  # shlex's whitespace
            out.words, in_word = out.words + in_word, False
        elif c == "#" and not quote and not in_word:
            out.comment = i
            break
        elif not quote and _ends_command(line, i):  # sh splits `8001;` into 8001 and ;
            out.end = i
            break
        else:
            if not quote and in_word and _redirection_inside(line, i, start):
                out.glued.append(i)
            if not in_word:
                start = i
            if not quote and not in_word and c in "'\"\\":
                out.quoted.add(out.words)
            if c in "$`" or (c == "~" and not in_word and not quote) or (
                    c in "<>" and not quote and line[i + 1:i + 2] == "("):
                m = _EXPANSION.match(line, i)  # (None for a lone $ or $5: sh keeps those)
                if m:
                    out.expansions.append(m.group(0))
            in_word = True
            if c in "'\"" and not quote:
                quote = c
            elif c == "\\" and not quote:
                i += 1
        i += 1
    out.words += in_word
    return out


def _redirection_inside(line: str, i: int, start: int) -> bool:
    """Whether an unquoted <, > or &> at line[i], inside the word begun at `start`, begins a
    redirection: not the second character of one (`>>`, `<&`, `&>`), nor after digits alone."""
    c, before = line[i], line[i - 1]
    if c == "&":
        return line[i + 1:i + 2] == ">" and before not in "<>"
    if c not in "<>" or before in "<>&":
        return False
    return not re.fullmatch(r"[0-9]+", line[start:i])


def _ends_command(line: str, i: int) -> bool:
    """An unquoted ;, |, & at line[i] that ends the command, not one of a redirection
    (`2>&1`, `<&0`, bash's `&> log`, `>| log`)."""
    c, before, after = line[i], line[i - 1:i], line[i + 1:i + 2]
    if c == "&":
        return before not in ("<", ">") and after != ">"
    return c == ";" or (c == "|" and before != ">")


def strip_shell(words: list[str], literal: set[int] | None = None) -> list[str]:
    """Drop what the shell, not vLLM, acts on: redirections, `&`, and all after `|`, `;`.
    Only for a line as a shell reads it (split_text): argv read from /proc, or words the
    shell already split after `init --`, are what vLLM received, each word literal."""
    out: list[str] = []
    skip = False
    for i, word in enumerate(words):
        if skip:
            skip = False
            continue
        if i in (literal or set()):
            out.append(word)
            continue
        if word in ("|", "||", "&&", ";"):
            break
        if word == "&":
            continue
        match = _REDIRECT.match(word)
        if match:
            skip = match.end() == len(word)  # `> file`: the file is the next word
            continue
        out.append(word)
    return out


def is_number(word: str) -> bool:
    """-1, 0.9, 1e3: a value, not a flag."""
    return bool(_NUMBER.match(word))


def parse(words: list[str]) -> ServeLine:
    """Find the vLLM program in the words (literal: split_text took the shell's own words
    out of a pasted line); raise LineError when there is none."""
    env: dict[str, str] = {}
    wrappers: list[list[str]] = []
    i, wrapper, operands = 0, "", 0
    while i < len(words):
        word = words[i]
        if wrapper and word.startswith("-") and len(word) > 1:
            step = 1 + (word in WRAPPERS[wrapper])  # its option, and the option's value
            wrappers[-1] += words[i:i + step]
            i += step
            continue
        if operands:  # taskset's mask, chrt's priority
            operands -= 1
            wrappers[-1].append(word)
        elif _ASSIGN.match(word):
            name, _, value = word.partition("=")
            env[name] = value
        elif word in WRAPPERS:
            wrapper, operands = word, _OPERANDS.get(word, 0)
            wrappers.append([word])
        else:
            break
        i += 1
    end = program_end(words[i:])
    if end is None:
        raise LineError("no `vllm serve` (or `python -m vllm.entrypoints.openai.api_server`) "
                        "in the command line")
    return ServeLine(env, words[i:i + end], words[i + end:], wrappers)


def program_end(argv: list[str]) -> int | None:
    """How many words of argv name the vLLM program (`vllm serve` -> 2); None if not vLLM."""
    head = argv[:5]
    for j, word in enumerate(head):
        base = word.rsplit("/", 1)[-1]
        if word == "serve" and j > 0 and any(w.rsplit("/", 1)[-1] == "vllm" or w in _MODULES
                                             for w in head[:j]):
            return j + 1
        if word in _MODULES and j > 0 and head[j - 1] == "-m":
            nxt = head[j + 1] if j + 1 < len(head) else ""
            return j + 2 if nxt == "serve" else j + 1
        if j == 0 and base != "vllm" and not base.startswith("python"):
            return None
    return None


def is_vllm_serve(argv: list[str]) -> bool:
    """True for the argv of a process that serves vLLM's API (not its engine children)."""
    return program_end(argv) is not None


def shown(argv: list[str], width: int = 100) -> str:
    """The command as people know it: from the word `vllm` (or `-m vllm...`) on."""
    start = next((i for i, w in enumerate(argv[:5]) if w.rsplit("/", 1)[-1] == "vllm"
                  or w in _MODULES), 0)
    text = " ".join(["vllm", *argv[start + 1:]] if argv[start:start + 1] and
                    argv[start].rsplit("/", 1)[-1] == "vllm" else argv[start:])
    return text if len(text) <= width else REDACT.head(text, width - 3) + "..."
