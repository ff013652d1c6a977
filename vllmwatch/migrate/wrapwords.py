"""Pure: the programs a hand-run line ran vLLM under -> what the service says instead.

`sudo -u alice`, `numactl -N 0 -m 0`, `taskset -c 0-15`, `nice -n 5`, `ionice -c 3`,
`chrt -f 50` each changed how vLLM ran; the service runs `vllm serve` itself, as the unit's
User= and with its own scheduling, so init cannot keep them in the config. Each becomes a
"to do" naming the unit directive that says the same (systemd.exec(5)), to put in a drop-in;
`nohup`, `setsid`, `exec`, `time`, `stdbuf` and `env` mean nothing under systemd and go
without a word.
"""

from __future__ import annotations

from collections.abc import Sequence

from vllmwatch.config.serveline import WRAPPERS
from vllmwatch.migrate.draft import SERVICE_USER

DROP_IN = "in a drop-in (sudo systemctl edit vllmwatch)"
_CHRT = {"-f": "fifo", "--fifo": "fifo", "-r": "rr", "--rr": "rr", "-b": "batch",
         "--batch": "batch", "-i": "idle", "--idle": "idle", "-o": "other", "--other": "other"}
_IONICE = {"1": "realtime", "2": "best-effort", "3": "idle", "realtime": "realtime",
           "best-effort": "best-effort", "idle": "idle"}


def _options(words: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    """`-u vllm --group=g -c 0-3 mask` -> ({"-u": "vllm", "--group": "g", "-c": ""}, ["mask"])
    (a flag's value is the next word when the flag is known to take one: `takes`)."""
    opts: dict[str, str] = {}
    rest: list[str] = []
    for word in words:
        if word.startswith("-") and len(word) > 1:
            name, eq, value = word.partition("=")
            opts[name] = value if eq else ""
        else:
            rest.append(word)
    return opts, rest


def _pairs(words: Sequence[str], takes: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    """Options with their values (the next word for those in `takes`), and the operands."""
    joined: list[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        short = word[:2]
        if short in takes and len(word) > 2 and not word.startswith("--"):
            word = f"{short}={word[2:]}"  # `-uvllm`: the value attached
        elif word in takes and i + 1 < len(words):
            joined.append(f"{word}={words[i + 1]}")
            i += 2
            continue
        joined.append(word)
        i += 1
    return _options(joined)


def cpu_list(mask: str) -> str | None:
    """taskset's hex mask -> the CPU list CPUAffinity= takes (`0xf0` -> `4-7`); None if
    it is no mask."""
    try:
        bits = int(mask, 16)
    except ValueError:
        return None
    cpus = [i for i in range(bits.bit_length()) if bits >> i & 1]
    spans: list[str] = []
    for cpu in cpus:
        if spans and cpu - 1 == int(spans[-1].rsplit("-", 1)[-1]):
            spans[-1] = f"{spans[-1].split('-')[0]}-{cpu}"
        else:
            spans.append(str(cpu))
    return " ".join(spans) or None


def _sudo(opts: dict[str, str]) -> list[str]:
    user = opts.get("-u") or opts.get("--user") or "root"
    group = opts.get("-g") or opts.get("--group")
    said = [f"the line ran vLLM as {user!r} (sudo); the service runs it as User={SERVICE_USER}: "
            f"give {SERVICE_USER} read access to the model and its caches"
            + (f", or set User={user} {DROP_IN}" if user != "root" else
               " (vLLM needs no root)")]
    if group:
        said.append(f"the line ran vLLM in group {group!r} (sudo -g): set Group={group} or "
                    f"SupplementaryGroups={group} {DROP_IN}")
    return said


def _numactl(opts: dict[str, str], words: str) -> list[str]:
    cpus = opts.get("-C") or opts.get("--physcpubind")
    nodes = opts.get("-N") or opts.get("--cpunodebind")
    mem = [(p, opts.get(s) or opts.get(ln)) for p, s, ln in (
        ("bind", "-m", "--membind"), ("interleave", "-i", "--interleave"),
        ("preferred", "-p", "--preferred"))]
    lines = [f"CPUAffinity={cpus.replace(',', ' ')}"] if cpus else []
    lines += [f"NUMAPolicy={p}\nNUMAMask={v.replace(',', ' ')}" for p, v in mem if v]
    if nodes:
        lines.append(f"CPUAffinity= the CPUs of NUMA node(s) {nodes} (`lscpu -e` lists them)")
    return [f"the line ran vLLM under `{words}`; the service does not: set "
            + ("; ".join(x.replace("\n", ", ") for x in lines) or "the same placement")
            + f" {DROP_IN}"]


def _taskset(opts: dict[str, str], operands: list[str], words: str) -> list[str]:
    first = operands[0] if operands else ""
    cpus = first if ("-c" in opts or "--cpu-list" in opts) else cpu_list(first)
    return [f"the line ran vLLM under `{words}`; the service does not: set CPUAffinity="
            f"{(cpus or '?').replace(',', ' ')} {DROP_IN}"]


def _nice(opts: dict[str, str]) -> list[str]:
    value = opts.get("-n") or opts.get("--adjustment")
    if value is None:  # `nice -5`: the old form; plain `nice`: 10
        value = next((k[1:] for k in opts if k[1:].isdigit()), "10")
    return [f"the line ran vLLM at nice {value}; set Nice={value} {DROP_IN}"]


def _ionice(opts: dict[str, str]) -> list[str]:
    klass = _IONICE.get(opts.get("-c") or opts.get("--class") or "2", "best-effort")
    level = opts.get("-n") or opts.get("--classdata")
    return [f"the line ran vLLM at I/O class {klass}; set IOSchedulingClass={klass}"
            + (f" and IOSchedulingPriority={level}" if level else "") + f" {DROP_IN}"]


def _chrt(opts: dict[str, str], operands: list[str]) -> list[str]:
    policy = next((_CHRT[k] for k in opts if k in _CHRT), "rr")
    level = operands[0] if operands else "0"
    return [f"the line ran vLLM with scheduling {policy} {level} (chrt); set "
            f"CPUSchedulingPolicy={policy} and CPUSchedulingPriority={level} {DROP_IN}"]


def todo(wrappers: Sequence[Sequence[str]]) -> list[str]:
    """One line per wrapper that changed how vLLM ran: the unit directive that says it."""
    out: list[str] = []
    for words in wrappers:
        program, args = words[0], list(words[1:])
        shown = " ".join(words)
        if program == "sudo":
            out += _sudo(_pairs(args, WRAPPERS[program])[0])
        elif program == "numactl":
            out += _numactl(_pairs(args, WRAPPERS[program])[0], shown)
        elif program == "taskset":
            opts, operands = _options(args)
            out += _taskset(opts, operands, shown)
        elif program == "nice":
            out += _nice(_pairs(args, WRAPPERS[program])[0])
        elif program == "ionice":
            out += _ionice(_pairs(args, WRAPPERS[program])[0])
        elif program == "chrt":
            opts, operands = _options(args)
            out += _chrt(opts, operands)
    return out
