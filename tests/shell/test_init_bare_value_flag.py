"""init with no flag list (--fast, nothing cached) reads a bare flag by its looks: one that
vLLM takes a value for in every version we know must never be written as a switch
(`max-model-len = true`, which vLLM refuses at each start), but named as the line's mistake."""

from __future__ import annotations

import pytest

from tests.shell.test_init import init, known
from vllmwatch.config import flags
from vllmwatch.migrate.draft import Facts
from vllmwatch.migrate.flagwords import VALUE_FLAGS


def test_every_value_flag_takes_a_value_in_the_vllm_we_know() -> None:
    """The built-in list is checked against a real vLLM's own parser (0.32.0's flag list):
    a name there that vLLM reads as a switch would refuse a line that runs."""
    flag_set = known()
    switches = sorted(n for n in VALUE_FLAGS | flags.BUILTIN_JSON
                      if flag_set.kind(n) in (None, "bool"))
    assert switches == ["device"]  # (gone from 0.32: init drops it with its own words)


@pytest.mark.parametrize("name", sorted((VALUE_FLAGS | flags.BUILTIN_JSON) - {
    "model", "host", "device"}))  # (owned by vllmwatch, or removed from vLLM: their own words)
def test_a_bare_value_flag_is_an_error_not_a_switch(name: str) -> None:
    vllm, toml, draft = init(f"vllm serve /m --{name} --enforce-eager", Facts())
    assert name not in vllm.get("args", {}), toml
    assert vllm["args"]["enforce-eager"] is True  # a real switch stays one
    assert any(e.startswith(f"`--{name}`: no value on the line") for e in draft.errors), \
        draft.errors


def test_a_number_sh_takes_for_a_descriptor_leaves_the_flag_bare() -> None:
    """`--max-model-len 4096>>x.log`: sh redirects descriptor 4096, vLLM sees no value."""
    vllm, toml, draft = init("vllm serve /m --max-model-len 4096>>x.log", Facts())
    assert "max-model-len" not in vllm.get("args", {}), toml
    assert "# max-model-len (dropped)" in toml
    assert any("max-model-len = VALUE" in e for e in draft.errors), draft.errors


def test_a_flag_with_its_value_is_unchanged() -> None:
    vllm, _, draft = init("vllm serve /m --max-model-len 4096 --seed=0", Facts())
    assert vllm["args"] == {"max-model-len": 4096, "seed": 0}
    assert not draft.errors
