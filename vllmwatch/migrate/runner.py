"""`vllmwatch init`: read the line or the running vLLM, learn this vLLM's flags, write the
config (never over an existing one without --force; 0640 root:vllmwatch as root), say what
changed and what to do, then run `check` on the result.

Exit codes: 0 written (or printed), 2 nothing written (bad input, or the file exists).
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TextIO

from vllmwatch.config import serveline, vllmflags, vllminfo
from vllmwatch.config.command import redact_argv
from vllmwatch.config.redact import REDACT
from vllmwatch.config.schema import Config
from vllmwatch.migrate import deliver, proc, render, translate, yamlconf
from vllmwatch.migrate.draft import Facts
from vllmwatch.shell import child

CONFIG, OK = deliver.CONFIG, deliver.OK


@dataclass(frozen=True)
class Request:
    """What the person asked for."""

    words: list[str]
    from_pid: int | None
    output: str
    stdout: bool = False
    force: bool = False
    fast: bool = False
    api_key_file: str = ""
    gate: bool = False


def main(req: Request, environ: Mapping[str, str], out: TextIO | None = None,
         err: TextIO | None = None) -> int:
    """Run init; 0 when the config was written (or printed), 2 when nothing was."""
    out, err = out or sys.stdout, err or sys.stderr
    if not req.stdout and os.path.lexists(req.output) and not req.force:
        if not deliver.package_default(req.output):
            print(f"vllmwatch init: {req.output} exists; not replaced (--force replaces it, "
                  "--stdout prints the new config instead)", file=err)
            return CONFIG
        print(f"note: {req.output} is the package's example config, unedited: replaced",
              file=err)
    try:
        line, source, facts, notes = _read(req, environ, err)
    except (serveline.LineError, proc.ProcError) as exc:
        print(REDACT.text(f"vllmwatch init: {exc}"), file=err)
        return CONFIG
    draft = translate.translate(line, facts)
    text = render.render(draft, source)
    for note in notes:
        print(f"note: {note}", file=err)
    how = deliver.Out(req.output, req.stdout, req.force, facts.known is not None and
                      not req.fast)
    return deliver.deliver(how, text, draft, facts, out, err)


def _utf8_only(line: serveline.ServeLine) -> None:
    """A config is UTF-8 TOML: a word that is not UTF-8 (a path in another encoding) cannot
    reach vLLM unchanged through it. Refused, naming it (a value of the environment by its
    name only), never written with a stand-in character nor a traceback."""
    def bad(text: str) -> bool:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False

    words = [*line.command, *line.rest]
    shown = REDACT.argv(words)  # each word read after its flag: alone, a key was only a word
    for i, word in enumerate(words):
        if bad(word):
            raise serveline.LineError(f"word {i + 1} of the command line, "
                                      f"{REDACT.text(ascii(shown[i]))}, is not UTF-8 text: a "
                                      "config could not pass it to vLLM unchanged; rename "
                                      "what it names, then run init again")
    for name, value in line.env.items():
        if bad(name) or bad(value):
            raise serveline.LineError(f"the environment variable {name!a} is not UTF-8 "
                                      "text (its value is not shown): a config could not "
                                      "pass it unchanged; set it in UTF-8, then run init again")


# init's own options, none of them a flag of vLLM: after the command words argparse hands them
# to the line (its words take the rest), so `-c PATH` there wrote the default path
_OWN = ("-c", "--config", "--stdout", "--force", "--fast", "--api-key-file", "--gate",
        "--from-pid")


def _own_options_first(words: list[str]) -> None:
    """Refuse init's own options among the command words (`--config` only after a one-string
    line, as vLLM has a --config of its own), naming them and the order that works."""
    quoted = " " in words[0]  # `init "vllm serve /m" -c x.toml`: the line is the one string
    own = [w for w in (words[1:] if quoted else words) if w.split("=", 1)[0] in _OWN and (
        quoted or w.split("=", 1)[0] != "--config")]
    if own:
        raise serveline.LineError(
            f"{' '.join(own)} after the command line is read as part of it (init's options go "
            "first): vllmwatch init -c PATH [--stdout] ... -- vllm serve MODEL ...; "
            "nothing written")


def _read(req: Request, environ: Mapping[str, str], err: TextIO
          ) -> tuple[serveline.ServeLine, str, Facts, list[str]]:
    notes: list[str] = []
    cwd: str | None = os.getcwd()
    path = environ.get("PATH", "")
    supervised, injected = False, {}
    if req.from_pid is not None:
        running = proc.read(req.from_pid, marker=child.MARKER)
        supervised, injected = running.supervised, running.injected
        if running.supervised:
            notes.append(f"pid {running.pid} is already supervised by a vllmwatch")
        line = serveline.parse(running.argv)
        cwd, path, notes = running.cwd, running.path or path, notes + running.notes
        line = serveline.ServeLine({**running.env, **line.env},
                                   proc.script_form(line.command, cwd, path), line.rest,
                                   line.wrappers)
        source = f"pid {running.pid}: " + shlex.join(redact_argv(running.argv))
    else:
        words = req.words[1:] if req.words[:1] == ["--"] else req.words
        if not words:
            raise serveline.LineError("give the command line: vllmwatch init -- vllm serve "
                                      "MODEL ..., or --from-pid PID")
        _own_options_first(words)
        text = " ".join(words) if len(words) == 1 else shlex.join(words)
        line = serveline.parse(serveline.split_text(text) if len(words) == 1 else words)
        source = shlex.join(redact_argv([*line.command, *line.rest]))
    _utf8_only(line)
    rest, yaml_path = yamlconf.fold(line.rest, cwd)
    if yaml_path is not None:
        notes.append(f"--config {yaml_path}: its keys are read as flags before the line's own "
                     "(which win, as in vLLM)")
    elif rest != line.rest:
        notes.append("--config=FILE dropped: vLLM reads its YAML only as `--config FILE`, and "
                     "ignored this one")
    line = serveline.ServeLine(line.env, line.command, rest, line.wrappers)
    source = REDACT.text(source)  # a URL's password: the comment names the flag, not it
    command = list(line.command)
    full = proc.which(command[0], path, cwd) if not command[0].startswith("/") else None
    known = _known([full or command[0], *command[1:]], req.fast, err)
    default_key, env_file = secret_paths(req.output)
    key_file = os.path.abspath(req.api_key_file) if req.api_key_file else ""  # (the service
    facts = Facts(known=known, api_key_file=key_file or default_key,  # runs elsewhere, not here)
                  env_file=env_file,
                  supervised=supervised, injected=injected, gate=req.gate, searched=True,
                  has_gpu=os.path.exists("/dev/nvidiactl"), cwd=cwd,
                  gpu_index=_gpu_index(), resolve=lambda w: full if w == command[0] else None,
                  exists=os.path.exists)
    return line, source, facts, notes


UNIT_CONFIG = "vllmwatch.toml"  # vllmwatch.service's; vllmwatch@NAME.service reads NAME.toml


def secret_paths(output: str) -> tuple[str, str]:
    """Where init puts the API key and the other secrets of the config at `output`: beside it,
    `api-key` and `secrets.env` for the unit's vllmwatch.toml, `NAME.api-key` and
    `NAME.secrets.env` for any other NAME.toml. One pair for every config of a folder made
    each template instance's init name the same files: the second instance's init found them
    there, said "--force replaces it", and the --force put its key over the first
    instance's, whose clients got 401 from its next launch on."""
    here, name = os.path.split(os.path.abspath(output))
    if name == UNIT_CONFIG:
        return os.path.join(here, "api-key"), os.path.join(here, "secrets.env")
    stem = name.removesuffix(".toml") or name
    return os.path.join(here, f"{stem}.api-key"), os.path.join(here, f"{stem}.secrets.env")


def _known(command: list[str], fast: bool, err: TextIO) -> vllmflags.FlagSet | None:
    """This vLLM's flag list: cached, else asked (unless --fast)."""
    version = vllminfo.version(command)
    cache = vllmflags.default_cache_dir(Config(), os.environ)
    known = vllmflags.known_flags(command, version, cache, ask=False)
    if (known is None or not known.kinds) and version is not None and not fast:
        print(f"vllmwatch init: asking vLLM {version} for its flags (once per version)...",
              file=err)
        known = vllmflags.known_flags(command, version, cache) or known
    if known is None:
        print("vllmwatch init: vLLM's flag list is unknown here (not installed for "
              f"{command[0]!r}, or --fast with nothing cached): flags typed by their looks "
              "and not checked", file=err)
    return known


def _gpu_index() -> dict[str, int]:
    """GPU UUID -> index, from NVML when there is one."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no driver, no library: no UUIDs to map
        return {}
    try:
        out = {}
        for i in range(pynvml.nvmlDeviceGetCount()):
            uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i))
            out[uuid.decode() if isinstance(uuid, bytes) else str(uuid)] = i
        return out
    except Exception:
        return {}
    finally:
        pynvml.nvmlShutdown()
