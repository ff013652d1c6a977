"""Pure: a hand-run `vllm serve` line -> a draft vllmwatch config, each change explained.

Every flag lands in [vllm.args] typed by its kind (vLLM's flag list when known, a guess
otherwise); the checks `run` and `check` apply (config/flags.py, config/vllmflags.py) decide
what is broken, so init and the daemon never disagree about a flag.
"""

from __future__ import annotations

import os

from vllmwatch.config import flags
from vllmwatch.config.flagnames import SWITCHES
from vllmwatch.config.flags import ARG_PREFIX, DASHES, flag_name
from vllmwatch.config.launch import INJECTED_FLAGS
from vllmwatch.config.redact import REDACT, is_secret_name
from vllmwatch.config.serveline import ServeLine, is_number
from vllmwatch.config.vllmflags import flag_problem as known_problem
from vllmwatch.migrate import addresses, envwords, refusals, relaxed, smokeplan, wrapwords
from vllmwatch.migrate.draft import Draft, Entry, Facts
from vllmwatch.migrate.flagwords import Given, read, refused_value
from vllmwatch.migrate.refusals import OWNED


def translate(line: ServeLine, facts: Facts) -> Draft:
    """The draft config for one `vllm serve` line."""
    draft = Draft()
    _command(line.command, draft, facts)
    words = read(line.rest, facts.known)
    if words.model is not None:
        _model(words.model, draft, facts, "the positional MODEL")
        draft.positional_model = True
    for word in words.stray:  # (a word the redactor would hide is not shown: a secret)
        shown = word if not envwords.holds_secret("", word) else "a word (not shown: it may " \
            "be a secret)"
        draft.errors.append(f"{shown} follows no flag (vLLM would refuse it); not written")
        draft.dropped.append(f"the line's {shown} follows no flag (after a switch, or a second "
                             "model): vLLM refused the line; dropped")
    for name in words.hidden:  # a secret init cannot carry: the rule's exception (refusals)
        draft.fatal.append(f"the word after `--{name}` (not shown: it may be the secret) "
                           "follows no flag: vLLM refuses the line (a value that starts with "
                           f"a dash is a flag to it: join `--{name}` and its value with = in "
                           "one word)")
    counts: dict[str, list[Given]] = {}
    for given in words.flags:
        counts.setdefault(given.name, []).append(given)
    envwords.apply(line.env, draft, facts)  # before the flags: --device cpu wins
    for all_given in counts.values():
        if not _repeated(all_given, draft, facts):
            _flag(all_given[-1], draft, facts, all_given[:-1])
    if "model" not in draft.vllm:
        draft.errors.append("no model: set vllm.model to the model directory or hub id")
    if "gpus" not in draft.vllm and facts.has_gpu is False:
        # The line asked for vLLM's default, every GPU: the config says what the line said,
        # not what this machine (maybe not the one that serves) happens to have.
        draft.said.append("no NVIDIA GPU is visible here; the config asks for every GPU, as "
                          "the line did: for a CPU deployment add `--device cpu` to the line "
                          "(or set vllm.gpus = [])")
    draft.todo += wrapwords.todo(line.wrappers)  # `sudo -u`, `numactl`: the unit's words
    addresses.keep(draft, facts)
    smokeplan.propose(draft)  # [[smoke]] checks for the endpoints its flags serve
    return draft


def _command(command: list[str], draft: Draft, facts: Facts) -> None:
    out = list(command)
    full = facts.resolve(out[0]) if not out[0].startswith("/") else None
    note = ""
    if full:
        note = (f"{out[0]} resolved to {full}: the service's PATH is not your shell's")
        out[0] = full
    elif "/" not in out[0] and facts.searched:
        draft.errors.append(f"{out[0]!r} is not on this PATH, and systemd's PATH is not your "
                            "shell's: set vllm.command to its full path (e.g. "
                            f'["/opt/vllm/bin/{out[0]}", ...]), or run init where it is found')
    draft.set("command", out, note)


def _model(value: str, draft: Draft, facts: Facts, source: str) -> None:
    if facts.cwd and not value.startswith("/") and (
            value.startswith(("./", "../")) or facts.exists(f"{facts.cwd}/{value}")):
        path = f"{facts.cwd.rstrip('/')}/{value.removeprefix('./')}"
        draft.set("model", path, f"{source} {value!r} was relative to {facts.cwd}; the "
                  "service starts elsewhere")
        return
    draft.set("model", value)


def _flag(given: Given, draft: Draft, facts: Facts, earlier: list[Given]) -> None:
    """One flag (its last occurrence) into the draft."""
    note = ""
    if earlier:
        note = REDACT.text(f"given {len(earlier) + 1} times ("
                           f"{', '.join(g.raw for g in earlier)} before {given.raw}); the last "
                           "counts, as in vLLM. ")
    name, base = given.name, given.name.split(".")[0]
    value: object = _joined(given.values)
    _spelling(given, draft)
    if (refused := refusals.judge(given, facts.known)) is not None:
        refusals.apply(given, refused, draft, facts.known, note)  # (migrate/refusals.py)
        return
    if base in OWNED:
        _owned(given, value, draft, facts)
    elif base in flags.SECRET_FLAGS:
        envwords.secret_flag(given, draft, facts)
    elif isinstance(value, str) and "." not in name and _kind(base, value, facts) and (
            (is_secret_name(name) and not is_number(value)) or envwords.holds_secret("", value)):
        # A password in the value (--otlp-traces-endpoint https://user:pw@collector), or a
        # flag the redactor hides the value of (--ssl-keyfile-password: it sat in clear in
        # the TOML and init's output; a number is none): passed from vllm.env_file, so the
        # TOML holds no secret and still works. A flag this vLLM lacks is dropped (_typed).
        envwords.to_env_file(ARG_PREFIX + name.upper().replace("-", "_"), value,
                             f"the line's `--{name} {REDACT.text(value)}`", draft, facts)
    elif base == "device":
        _device(given, value, draft)
    elif base in ("rope-scaling", "rope-theta"):
        relaxed.rope(given, value, draft)
    elif base in INJECTED_FLAGS and relaxed.injected(given, value, draft, facts.supervised):
        pass  # (--shutdown-timeout N: restart.drain_timeout = N)
    elif base in flags.REMOVED:
        _drop(given, draft, _why(base, value, facts))
    elif base in flags.OFF_THE_PROBES and value is not False:
        _drop(given, draft, f"it {flags.OFF_THE_PROBES[base]}, so no probe would reach it")
        draft.errors.append(f"--{base}: the hand-run vLLM's clients {_reached(base)}; under "
                            "vllmwatch vLLM serves plain HTTP on vllm.host:vllm.port: put a "
                            "TLS proxy in front of it (or of [gate]) for clients that need it")
    else:
        _typed(given, value, draft, facts, note)
        return
    if note and draft.args and draft.args[-1].key == name:
        draft.args[-1].note = note + draft.args[-1].note


def _reached(flag: str) -> str:
    return {"uds": "reached it on a Unix socket", "headless": "reached no API server"}.get(
        flag, "used TLS (https)")


def _spelling(given: Given, draft: Draft) -> None:
    """Say how a flag the line spelt otherwise was read (never with its value). (No flag
    name before a space and a word here: the redactor would take the word for its value.)"""
    word = given.raw.split(" ", 1)[0].partition("=")[0]
    if word[:1] in DASHES:
        draft.said.append(f"the line's `{word}` has a typographic dash (copied from a web "
                          f"page?): read as --{given.name}, which vLLM would otherwise have "
                          "refused")
    elif word.startswith("--") and flag_name(word) != given.name:
        draft.said.append(f"the line's `{word}` is vLLM's --{given.name}, abbreviated (its "
                          "parser takes a prefix): written in full")


def _repeated(all_given: list[Given], draft: Draft, facts: Facts) -> bool:
    """A flag vLLM appends (flags.APPEND_FLAGS: --middleware) given more than once goes to
    extra_args as the line had each: keeping the last, as for every other flag, dropped the
    others from what vLLM received."""
    last = all_given[-1]
    if len(all_given) < 2 or last.name not in flags.APPEND_FLAGS:
        return False
    if any(envwords.holds_secret("", v) for g in all_given for v in g.values):
        envwords.repeated_to_env_file(ARG_PREFIX + last.name.upper().replace("-", "_"),
                                      [" ".join(g.values) for g in all_given], last.name,
                                      draft, facts)
        return True
    for given in all_given:
        draft.extra_args += [f"--{given.name}", *given.values]
    draft.said.append(f"--{last.name} is given {len(all_given)} times: vLLM keeps each, so "
                      "they are passed as the line had them, in vllm.extra_args")
    return True


def _joined(values: tuple[str, ...]) -> object:
    if not values:
        return True
    return values[0] if len(values) == 1 else list(values)


def _why(name: str, value: object, facts: Facts) -> str:
    version = facts.known.version if facts.known else None
    problem = flags.flag_problem(name, value, f"vllm.args.{name}", version)
    return problem.problem if problem else ""


def _drop(given: Given, draft: Draft, why: str) -> None:
    draft.arg(Entry(given.name, None, f"the line had `{given.raw}`: dropped: {why}", False))


def _owned(given: Given, value: object, draft: Draft, facts: Facts) -> None:
    key = OWNED[given.name]
    text = value[0] if isinstance(value, list) else value
    if key == "model" and draft.positional_model:
        # vLLM refuses the model given twice: since 2024 (vllm#7347) an error, since 0.11
        # (vllm#25967) its parser moves --model's value to the front, and the positional
        # MODEL is then an extra word ("unrecognized arguments", seen with vLLM 0.32)
        draft.arg(Entry(given.name, None, f"the line had `{given.raw}`: dropped", False))
        draft.fatal.append(f"the line names its model twice, {draft.vllm['model']!r} and "
                            f"`{given.raw}`: vLLM refuses that line (`unrecognized "
                            "arguments`); keep one, positionally (`vllm serve MODEL ...`)")
        draft.changed += 1
        return
    if key == "model":
        _model(str(text), draft, facts, "--model")
        return
    note = f"the line's `{given.raw}`: vllmwatch passes --{given.name} itself"
    if isinstance(value, list):
        note += f"; only the first name is used ({', '.join(value[1:])} dropped)"
        draft.changed += 1
        if key == "served_model_name":  # said aloud, not only in a comment: their calls 404
            draft.errors.append(f"--served-model-name gives {len(value)} names; vllmwatch "
                                f"serves one ({value[0]!r}): clients that call "
                                f"{', '.join(map(repr, value[1:]))} will get 404 (point them "
                                "at the first name, or keep one name on the line)")
    draft.set(key, _port(text) if key == "port" else str(text), note)


def _port(text: object) -> int | str:
    """The port as vLLM reads it (argparse's int(): '٨٠٠٠' is 8000 there, '²' an error);
    a word vLLM refuses stays text, for the config's load to name."""
    try:
        return int(str(text))
    except ValueError:
        return str(text)


def _device(given: Given, value: object, draft: Draft) -> None:
    if value == "cpu":
        before = draft.vllm.get("gpus")
        was = f" (instead of gpus = {before} from CUDA_VISIBLE_DEVICES)" if before else ""
        draft.set("gpus", [], f"the line's `{given.raw}`: --device was removed from vLLM; "
                  f"gpus = [] is a CPU deployment{was}")
        draft.changed += 1
        return
    _drop(given, draft, flags.REMOVED["device"])


def _kind(name: str, value: object, facts: Facts) -> str | None:
    """bool, number, json or text; None for a flag this vLLM lacks."""
    if facts.known is not None:
        return facts.known.kind(name)
    if value is True or name in SWITCHES or (isinstance(value, str) and value.lower() in (
            "true", "false")):  # (a switch in every vLLM: `--enforce-eager=foo` is one too)
        return "bool"
    if name in flags.BUILTIN_JSON:
        return "json"
    return "number" if isinstance(value, str) and is_number(value) else "text"


def _typed(given: Given, value: object, draft: Draft, facts: Facts, note: str) -> None:
    name, base = given.name, given.name.split(".")[0]
    kind = _kind(base, value, facts) if "." not in name else "json"
    if kind is None and facts.known is not None:
        problem = known_problem(name, value, f"vllm.args.{name}", facts.known)
        refusals.refuse(given, _number(_plain(value)), problem.problem if problem else
                        "unknown flag", draft, facts.known, note)
        return
    if kind == "bool":
        _switch(given, value, draft, facts, note)
    elif kind == "json" and "." not in name:
        relaxed.json_flag(given, value, draft, facts, note)
    elif isinstance(value, list) and (why := next(filter(None, (
            refused_value(name, w, facts.known) for w in value)), None)) is not None:
        refusals.refuse(given, _plain(value), why, draft, facts.known, note)  # (each word)
    elif isinstance(value, list):  # (`--lora-modules a=./x b=./y`: each word's path too)
        moved: list[str] = []
        draft.extra_args += [f"--{name}", *(relaxed.absolute_text(w, facts, name, moved)
                                             for w in value)]
        draft.changed += bool(note)
        if moved:
            draft.said.append(f"{', '.join(moved)} relative to {facts.cwd}; the service "
                              "starts elsewhere")
    else:  # a value vLLM's reader refuses is commented out, as the file's header says
        written = value if kind == "text" else _number(value, facts.known is None)
        if (why := refused_value(name, written, facts.known)) is not None:
            refusals.refuse(given, written, why, draft, facts.known, note)
        else:
            _text(given, written, draft, facts, note)


def _plain(value: object) -> object:
    return " ".join(value) if isinstance(value, list) else value


def _number(value: object, guessed: bool = False) -> object:
    """The number a text means. `guessed` (vLLM's flag list unknown: typed by its looks):
    only where TOML writes it back as the line had it ("8192", "0.9"); else the text as
    written, which vLLM gets unchanged ("0123", a revision, stays "0123", not 123)."""
    if isinstance(value, str) and is_number(value):
        number = float(value)
        whole = number.is_integer() and "." not in value
        got: int | float = int(number) if whole else number
        if not guessed or str(got) == value:
            return got
    return value


def _text(given: Given, value: object, draft: Draft, facts: Facts, note: str) -> None:
    name = given.name
    if name == "kv-cache-dtype" and isinstance(value, str) and value not in \
            flags.KV_CACHE_DTYPES:  # (bare: vLLM refuses it; dropped, as the rule says)
        draft.arg(Entry(name, "auto", f"{note}the line had `{given.raw}`: "
                        f"{_why(name, value, facts)}"))
        return
    draft.arg(Entry(name, *_absolute(name, value, facts, note)))


_DIRS = ("tokenizer", "hf-config-path", "generation-config", "download-dir")  # a folder's name


def _absolute(name: str, value: object, facts: Facts, note: str) -> tuple[object, str]:
    """A path relative to the line's folder made absolute, as _model does: vLLM opens it from
    the service's WorkingDirectory (`--chat-template ./t.jinja` stopped each start there,
    `--download-dir d` filled another folder). A word with no / or . is a path only to a
    flag's value by chance (`--dtype auto` beside a file named auto), unless the flag names a
    folder (`--tokenizer tok`: vLLM looks there before the hub): kept as written."""
    moved: list[str] = []  # JSON text, `NAME=./path` (--lora-modules): the paths in it
    if isinstance(value, str) and (got := relaxed.absolute_text(value, facts, name, moved)
                                   ) != value:
        return got, f"{note}{', '.join(moved)} relative to {facts.cwd}; the service starts " \
            "elsewhere"
    if not isinstance(value, str) or not facts.cwd or value.startswith("/") or not (
            value.startswith(("./", "../")) or (("/" in value or "." in value or name in _DIRS)
                                                and facts.exists(f"{facts.cwd}/{value}"))):
        return value, note
    path = os.path.normpath(os.path.join(facts.cwd, value))
    return path, f"{note}{value!r} was relative to {facts.cwd}; the service starts elsewhere"


def _switch(given: Given, value: object, draft: Draft, facts: Facts, note: str) -> None:
    name, word = given.name, str(value).lower()
    if value is True or word == "true":
        extra = "" if value is True else (f"the line had `{given.raw}`: a switch takes no "
                                          f"value; {name} = true passes --{name}")
        draft.arg(Entry(name, True, note + extra))
        return
    has_no = facts.known is not None and f"no-{name}" in facts.known.flags
    if word == "false" and has_no:
        draft.arg(Entry(name, False, f"{note}the line had `{given.raw}`: a switch takes no "
                        f"value; {name} = false passes --no-{name}"))
    elif word == "false":
        _drop(given, draft, f"a switch takes no value and {given.values[0]} means off, the "
              f"default (this vLLM has no --no-{name})" if facts.known else
              f"a switch takes no value and {given.values[0]} means off, the default; "
              f"write {name} = false (--no-{name}) if off is not the default")
    else:  # vLLM refused the line (`ignored explicit argument`): dropped, as the rule says
        shown = refusals.shown(given, facts.known)
        draft.errors.append(f"{shown}: `--{name}` is a switch and takes no value (vLLM refused "
                            f"this line); dropped: write {name} = true if you meant it on")
        draft.arg(Entry(name, True, f"{note}the line had {shown}: `--{name}` is a switch and "
                        "takes no value (vLLM refused this line); dropped: uncomment this "
                        "line if you meant it on", False))
