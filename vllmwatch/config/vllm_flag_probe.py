"""What vLLM's own argument parser says of each `vllm serve` flag, printed as one JSON line.

Run by the interpreter of vllm.command (config/vllmflags.py `_ask`, with `python -I -c`); never
imported by vllmwatch. vLLM moved make_arg_parser between releases: the known homes are
tried, newest first.
"""
# mypy: ignore-errors
# (vLLM's parser objects are untyped; this runs where vLLM is, not where vllmwatch is checked)

import importlib
import json
import sys

MARK = sys.argv[1]  # the caller's marker: the line it reads among vLLM's own output
if len(sys.argv) > 2:  # the asking vllmwatch's pid: die with the thread that asked
    # (PR_SET_PDEATHSIG, SIGKILL), and leave at once if it is gone already: an ask imports
    # torch for up to 120 s, and a vllmwatch that stops meanwhile must leave nothing running
    import contextlib
    import ctypes
    import os
    import signal
    with contextlib.suppress(OSError, AttributeError):  # (not Linux: no such guard)
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != int(sys.argv[2]):
        os._exit(0)


def worker(a):
    # The function that reads this flag's value: vLLM wraps its parsers (optional_type(
    # parse_type(json.loads))), so follow the closures down to the one that does the work.
    f = a.type
    for _ in range(6):
        name = getattr(f, "__name__", "")
        if f in (json.loads, int, float) or name in ("union_dict_and_str", "parse_dataclass") \
                or name.startswith("human_readable_int"):
            return f
        cells = [c.cell_contents for c in (getattr(f, "__closure__", None) or ())]
        f = next((c for c in cells if callable(c)), None)
        if f is None:
            break
    return None


def kind(a):
    # What a value of this flag is
    if a.nargs == 0:
        return "bool"
    f = worker(a)
    if f is None:
        return "text"
    return "number" if f in (int, float) or f.__name__.startswith("human_readable_int") \
        else "json"


def whole(a):
    # int or human_readable_int(_or_auto), not float
    f = worker(a)
    return f is int or getattr(f, "__name__", "").startswith("human_readable_int")


def chain(a):
    # The readers a flag's word goes through, outermost first (optional_type(parse_type(int))
    # is _optional_type, _parse_type, int)
    out, f = [], a.type
    for _ in range(6):
        if f is None:
            break
        out.append(f)
        cells = [c.cell_contents for c in (getattr(f, "__closure__", None) or ())]
        f = next((c for c in cells if callable(c)), None)
    return out


def reader_spec(a):
    # Which of vLLM's readers turns the word into the value: int, float, hr_int (vLLM's
    # human_readable_int), hr_int_auto (its _or_auto), str, or fold (a reader that lowers the
    # word and turns - into _, as --moe-backend's); "?" after one wrapped in optional_type
    # ("" and "None" are no value). None for a reader not known here: its values are not
    # judged (vllmflags says so rather than guess)
    if a.nargs in (0, "?"):  # no value, or one it may go without (--hf-token alone)
        return None
    readers = chain(a)
    names = [getattr(f, "__name__", "") for f in readers]
    last = readers[-1] if readers else str
    opt = "?" if "_optional_type" in names else ""
    if type(a).__name__ == "LoRAParserAction":  # NAME=PATH or JSON, read by the action
        return "lora" + opt
    if getattr(last, "__name__", "") == "parse_dataclass" and hasattr(
            (getattr(last, "__defaults__", None) or (None,))[0], "from_cli"):
        return None  # a class that reads its own words (vLLM < 0.11's CompilationConfig
        # took a bare level, `-O3`): not judged here
    # JSON: json.loads (any JSON), a config class (an object), a dict or a word
    spec = {int: "int", float: "float", str: "str", json.loads: "json"}.get(last) or {
        "human_readable_int": "hr_int", "human_readable_int_or_auto": "hr_int_auto",
        "parse_dataclass": "object"}.get(getattr(last, "__name__", "")) or (
            "dict_or_str" if "union_dict_and_str" in names else None)
    if spec is None and a.choices and len(readers) == 1:
        words = [c for c in a.choices if isinstance(c, str)]
        try:
            if words and len(words) == len(a.choices) and a.type("A-b") == "a_b" and all(
                    a.type(c.upper().replace("_", "-")) == c for c in words):
                spec = "fold"
        except Exception:  # a reader of another kind: not judged
            spec = None
    if spec == "json" and dict_only(a.dest):
        spec = "jsonobj"
    return None if spec is None else spec + opt


def dict_only(dest):
    # A json.loads flag whose field is a dict and nothing else (`speculative_config: dict[str,
    # Any] | None`): vLLM's parser takes any JSON, then its start calls the dict's methods
    # (`--speculative-config 5`: 5.items(), a traceback at each start)
    kind = FIELD_TYPES.get(dest, "")
    parts = [p.strip() for p in kind.split("|") if p.strip() not in ("None", "NoneType")]
    return bool(parts) and all(p.startswith(("dict[", "Dict[", "typing.Dict[")) for p in parts)


def keys(a, spec):
    # The keys a config class or --lora-modules' JSON takes, where vLLM refuses any other
    # ("unexpected keyword argument"); None where that is not known. A class is judged only
    # where vLLM itself takes {} and refuses a key no class has.
    if spec.startswith("lora"):
        cls = getattr(sys.modules.get(type(a).__module__), "LoRAModulePath", None)
    else:
        cls = (getattr(chain(a)[-1], "__defaults__", None) or (None,))[0]  # parse_dataclass'
        try:
            a.type("{}")
        except Exception:
            return None
        try:
            a.type('{"vllmwatch_no_such_key": 0}')
            return None  # taken: this class takes any key
        except Exception:
            pass
    names = set(getattr(cls, "__dataclass_fields__", None) or ())  # InitVars too
    for info in (getattr(cls, "__pydantic_fields__", None) or {}).values():
        names.update(n for n in (getattr(info, "alias", None),
                                 getattr(info, "validation_alias", None)) if isinstance(n, str))
    return sorted(names) or None


for mod, cls in (("vllm.entrypoints.launchers.cli_args", "vllm.utils.argparse_utils"),
                 ("vllm.entrypoints.openai.cli_args", "vllm.utils.argparse_utils"),
                 ("vllm.entrypoints.openai.cli_args", "vllm.utils")):
    try:
        make = importlib.import_module(mod).make_arg_parser
        parser_cls = importlib.import_module(cls).FlexibleArgumentParser
    except (ImportError, AttributeError):
        continue
    parser = make(parser_cls(prog="vllm serve"))
    FIELD_TYPES = {}  # the fields of the argument classes, by name: what a dest is typed as
    for home in ("vllm.engine.arg_utils", mod):
        try:
            names = list(vars(importlib.import_module(home)).items())
        except ImportError:  # (a vLLM that keeps its EngineArgs elsewhere: no dict is known)
            continue
        for cls_name, obj in names:
            if not cls_name.endswith("Args"):  # (VllmConfig's speculative_config is a class)
                continue
            for name, f in (getattr(obj, "__dataclass_fields__", None) or {}).items():
                FIELD_TYPES.setdefault(name, str(f.type))
    kinds, aliases, lists, ints, choices, parsers, fields = {}, {}, [], [], {}, {}, {}
    for a in parser._actions:
        longs = [s[2:] for s in a.option_strings if s.startswith("--")]
        kinds.update((s, kind(a)) for s in longs)
        if kinds.get(longs[0] if longs else "") == "number" and whole(a):
            ints += longs
        spec = reader_spec(a)
        if spec is not None:
            parsers.update((s, spec) for s in longs)
        if spec is not None and spec.startswith(("object", "lora")):
            names = keys(a, spec)
            if names is not None:
                fields.update((s, names) for s in longs)
        if a.choices and spec is not None:  # as words; None (optional_type's) is "None", ""
            choices.update((s, [str(c) for c in a.choices if c is not None]) for s in longs)
        aliases.update((s, longs[0]) for s in a.option_strings if longs and s[1] != "-")
        if a.nargs in ("+", "*") or (isinstance(a.nargs, int) and a.nargs > 1):
            lists += longs
    print(MARK + json.dumps({"kinds": kinds, "aliases": aliases, "lists": lists,
                               "integers": ints, "choices": choices,
                               "parsers": parsers, "fields": fields}), flush=True)
    break
