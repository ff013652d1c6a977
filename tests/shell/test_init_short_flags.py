"""A short flag reads the same to `vllmwatch init` and to the checks (migrate/flagwords and
config/flags.long_form share one reading): `-tp 2`, `-O3`, `-O=3`, `-cc=...`, and on a vLLM
older than --optimization-level, `-O3` as --compilation-config 3 (what vLLM's own parser made
of it); a migrated line is a config the checks pass."""

from __future__ import annotations

import dataclasses

import pytest

from tests.shell.test_init import init, known, tomllib
from vllmwatch.config import flags, vllmflags
from vllmwatch.config.schema import from_dict
from vllmwatch.migrate import flagwords
from vllmwatch.migrate.draft import Facts


def old_vllm() -> vllmflags.FlagSet:
    """A vLLM before --optimization-level: -O was --compilation-config's level (read by its
    CompilationConfig.from_cli, a reader the probe leaves unjudged)."""
    k = known()
    return dataclasses.replace(
        k, flags=k.flags - {"optimization-level"},
        kinds={n: v for n, v in k.kinds.items() if n != "optimization-level"},
        aliases={a: n for a, n in k.aliases.items() if n != "optimization-level"},
        parsers={n: v for n, v in (k.parsers or {}).items() if n != "compilation-config"},
        fields={n: v for n, v in (k.fields or {}).items() if n != "compilation-config"})


WORDS = [*(s if n in known().switches else f"{s} 2" for s, n in flags.SHORT_FLAGS.items()
           if s != "-O"), "-tp=2", "-O3", "-O=3", "-O 3", "-Odecode"]


@pytest.mark.parametrize("old", [False, True], ids=["vllm-0.32", "before-optimization-level"])
@pytest.mark.parametrize("words", WORDS)
def test_init_and_the_checks_read_a_short_flag_as_one(words: str, old: bool) -> None:
    k = old_vllm() if old else known()
    got = flagwords.read(words.split(), k)
    level = {"-O": "compilation-config"} if old else {}
    checked = flags.long_forms(words.split(), {**k.aliases, **level})
    name, _, inline = checked[0][2:].partition("=")
    values = (inline,) if inline else tuple(checked[1:])
    assert [(g.name, g.values) for g in got.flags] == [(name, values)], (got, checked)
    assert not got.stray


@pytest.mark.parametrize("line", ["vllm serve m -O3", "vllm serve m -O=3 -tp 1"])
def test_before_optimization_level_a_migrated_o3_passes_the_checks(line: str) -> None:
    vllm, toml, draft = init(line, Facts(known=old_vllm()))
    assert vllm["args"]["compilation-config"] == 3, (vllm, draft.errors)
    assert "optimization-level" not in vllm["args"]
    config = from_dict(tomllib.loads(toml))
    assert vllmflags.validate_args(config, old_vllm()) == []
