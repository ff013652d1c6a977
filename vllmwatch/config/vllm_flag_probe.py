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


for mod, cls in (("vllm.entrypoints.launchers.cli_args", "vllm.utils.argparse_utils"),
                 ("vllm.entrypoints.openai.cli_args", "vllm.utils.argparse_utils"),
                 ("vllm.entrypoints.openai.cli_args", "vllm.utils")):
    try:
        make = importlib.import_module(mod).make_arg_parser
        parser_cls = importlib.import_module(cls).FlexibleArgumentParser
    except (ImportError, AttributeError):
        continue
    parser = make(parser_cls(prog="vllm serve"))
    kinds, aliases, lists, ints, choices = {}, {}, [], [], {}
    for a in parser._actions:
        longs = [s[2:] for s in a.option_strings if s.startswith("--")]
        kinds.update((s, kind(a)) for s in longs)
        if kinds.get(longs[0] if longs else "") == "number" and whole(a):
            ints += longs
        if a.choices and a.type in (None, str) and all(isinstance(c, str) for c in a.choices):
            choices.update((s, sorted(a.choices)) for s in longs)
        aliases.update((s, longs[0]) for s in a.option_strings if longs and s[1] != "-")
        if a.nargs in ("+", "*") or (isinstance(a.nargs, int) and a.nargs > 1):
            lists += longs
    print(MARK + json.dumps({"kinds": kinds, "aliases": aliases, "lists": lists,
                               "integers": ints, "choices": choices}), flush=True)
    break
