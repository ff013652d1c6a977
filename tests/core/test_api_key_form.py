"""An API key that vLLM takes but that cannot do its job is refused before any launch, from
every source a key comes from: an empty one (vLLM then serves every client without
authentication: `[key for key in ... if key]` in vLLM 0.32's middleware/register.py) and one
no client can send (spaces at an end, a control character, non-ASCII: every client 401 while
/health, which needs no key, says healthy). The message names the source, never the key."""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vllmwatch.config import keyform
from vllmwatch.config.command import build, load_for_reload, read_api_key
from vllmwatch.config.schema import ConfigError, from_dict


def cfg(tmp: Path, **vllm: Any) -> Any:
    return from_dict({"vllm": {"model": "/m", **vllm}})


def secret_file(tmp: Path, name: str, text: str) -> str:
    path = tmp / name
    path.write_text(text)
    path.chmod(0o600)
    return str(path)


# Each source of the key: (where the message points, the config for key K, the base env)
SOURCES = {
    "vllm.args.api-key": lambda tmp, k: ({"args": {"api-key": k}}, {}),
    "vllm.extra_args (two words)": lambda tmp, k: ({"extra_args": ["--api-key", k]}, {}),
    "vllm.extra_args (=)": lambda tmp, k: ({"extra_args": [f"--api-key={k}"]}, {}),
    "vllm.env.VLLM_API_KEY": lambda tmp, k: ({"env": {"VLLM_API_KEY": k}}, {}),
    "vllm.env_file: VLLM_API_KEY": lambda tmp, k: (
        {"env_file": secret_file(tmp, "env", f"VLLM_API_KEY={k}\n")}, {}),
    "vllm.env_file: --api-key": lambda tmp, k: (
        {"env_file": secret_file(tmp, "env", f"VLLMWATCH_ARG_API_KEY={k}\n")}, {}),
    "vllm.api_key_file": lambda tmp, k: (
        {"api_key_file": secret_file(tmp, "key", k + "\n")}, {}),
    "VLLM_API_KEY in vllmwatch's own environment": lambda tmp, k: ({}, {"VLLM_API_KEY": k}),
}
UNUSABLE = {"": "is empty", " ": "spaces or line ends", " lead9Key": "spaces or line ends",
            "trail9Key ": "spaces or line ends", "ta\tb9Key": "control character",
            "p\u00e4sswort9": "non-ASCII", "\u5bc6\u94a5key9": "non-ASCII"}


def launch(tmp: Path, source: str, key: str) -> Any:
    vllm, base = SOURCES[source](tmp, key)
    config = cfg(tmp, **vllm)
    return build(config, base, api_key=read_api_key(config))  # (as every launch reads it)


@pytest.mark.parametrize("source", sorted(SOURCES))
@pytest.mark.parametrize("key", sorted(UNUSABLE))
def test_an_unusable_key_is_refused_from_every_source(tmp_path: Path, source: str,
                                                      key: str) -> None:
    if source == "vllm.api_key_file" and key.strip() != key:
        return  # (the file's key is its text stripped: a line end is no part of it)
    if source.startswith("vllm.env_file") and key != key.strip():
        return  # (a line's value is trimmed as a shell's .env is read)
    if key == "" and source.endswith("own environment"):
        return  # (test_an_empty_key_inherited_by_vllmwatch_is_no_key)
    if key == "" and source == "vllm.api_key_file":
        return  # (refused by its own words, as a rotation in progress)
    with pytest.raises(ConfigError) as err:
        launch(tmp_path, source, key)
    said = str(err.value)
    assert UNUSABLE[key] in said and source.partition(" (")[0] in said, said
    assert key.strip() == "" or key.strip() not in said


@pytest.mark.parametrize("source", sorted(SOURCES))
def test_a_good_key_from_every_source_reaches_vllm_and_our_clients(tmp_path: Path,
                                                                    source: str) -> None:
    cmd = launch(tmp_path, source, "Zq7-good_key.9~")
    assert cmd.env["VLLM_API_KEY"] == "Zq7-good_key.9~" == cmd.api_key


def test_an_empty_key_inherited_by_vllmwatch_is_no_key(tmp_path: Path) -> None:
    """`Environment=VLLM_API_KEY=` in a unit clears a key: no key, as vLLM reads it."""
    assert launch(tmp_path, "VLLM_API_KEY in vllmwatch's own environment", "").api_key is None


def test_a_reload_refuses_the_key_as_the_launch_would(tmp_path: Path) -> None:
    path = tmp_path / "vllmwatch.toml"
    path.write_text('[vllm]\nmodel = "/m"\n[vllm.args]\napi-key = ""\n')
    with pytest.raises(ConfigError) as err:
        load_for_reload(str(path))
    assert "is empty" in str(err.value)


@given(st.text(min_size=0, max_size=24))
def test_the_judgement_is_exactly_what_a_client_can_send(key: str) -> None:
    """Usable iff non-empty, visible ASCII and inner spaces only, no space at either end;
    and the reason never quotes the key."""
    usable = (key != "" and key == key.strip() and all(
        c in string.printable and c not in "\t\n\r\x0b\x0c" for c in key))
    why = keyform.why_unusable(key)
    assert (why is None) == usable
    if why is not None and len(key.strip()) >= 4:
        assert key.strip() not in why


@given(st.text(min_size=0, max_size=16).filter(lambda k: "\0" not in k))
def test_the_launch_refuses_exactly_the_keys_judged_unusable(key: str) -> None:
    """build() loads the judgement only for a key its quick test doubts (the daemon's import
    count): the quick test and the judgement agree on every key."""
    config = from_dict({"vllm": {"model": "/m", "env": {"VLLM_API_KEY": key}}})
    try:
        build(config, {})
        refused = False
    except ConfigError:
        refused = True
    assert refused == (keyform.why_unusable(key) is not None)
