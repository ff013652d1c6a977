"""Run vllmflags' probe script in this process against a stand-in for vLLM's parser."""

from __future__ import annotations

import argparse
import json
import sys
import types
from collections.abc import Callable

import pytest

from vllmwatch.config import vllmflags


def probe_with(parser: Callable[[], argparse.ArgumentParser], monkeypatch: pytest.MonkeyPatch,
               capsys: pytest.CaptureFixture[str]) -> vllmflags.FlagSet | None:
    """What the probe records of `parser`, as the daemon reads its answer: the modules it
    imports are stand-ins whose make_arg_parser returns `parser()`."""
    cli = types.ModuleType("vllm.entrypoints.launchers.cli_args")
    cli.make_arg_parser = lambda _: parser()  # type: ignore[attr-defined]
    utils = types.ModuleType("vllm.utils.argparse_utils")
    utils.FlexibleArgumentParser = argparse.ArgumentParser  # type: ignore[attr-defined]
    for name in ("vllm", "vllm.entrypoints", "vllm.entrypoints.launchers", "vllm.utils"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, cli.__name__, cli)
    monkeypatch.setitem(sys.modules, utils.__name__, utils)
    monkeypatch.setattr(sys, "argv", ["-c", "MARK "])
    exec(compile(vllmflags._PROBE_FILE.read_text(), "probe", "exec"), {"__name__": "__main__"})
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("MARK "))
    return vllmflags._from_probe("0.99.0", json.loads(line[5:]))
