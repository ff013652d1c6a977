"""Names and paths in the config are what vLLM and the service can use: a model, served name
or host printable and without a space at an end or a leading '-' (an ESC in `host` reached
the terminal through `check`; `served_model_name = "--enable-auto-tool-choice"` passed), a
host vLLM can bind, and the files and folder the service reads absolute (`api_key_file =
"mykey"` passed `check` in its folder and failed from /; `cache_dir = ""` put the caches in
whatever folder the service started in)."""

from __future__ import annotations

import pytest

from vllmwatch.config.schema import ConfigError, from_dict


@pytest.mark.parametrize(("section", "key", "value", "says"), [
    ("vllm", "host", "127.0.0.1\x1b]0;pwned\x07", "control character"),
    ("vllm", "host", "0.0.0.0\n", "control character"),
    ("vllm", "host", "my host", "expected a host name or IP address"),
    ("vllm", "host", " 127.0.0.1", "a space at an end"),
    ("vllm", "served_model_name", "--enable-auto-tool-choice", "starts with '-'"),
    ("vllm", "served_model_name", "qwen\r", "control character"),
    ("vllm", "model", " /srv/models/q", "a space at an end"),
    ("vllm", "model", "Qwen/Qwen3-8B ", "a space at an end"),
    ("vllm", "api_key_file", "mykey", "a relative path"),
    ("vllm", "env_file", "./secrets.env", "a relative path"),
    ("prewarm", "cache_dir", "", "empty"),
    ("prewarm", "cache_dir", "cache", "a relative path"),
])
def test_a_name_or_path_the_service_cannot_use_is_refused_saying_why(
        section: str, key: str, value: str, says: str) -> None:
    data: dict[str, dict[str, object]] = {"vllm": {"model": "/m"}}
    data.setdefault(section, {})[key] = value
    with pytest.raises(ConfigError) as got:
        from_dict(data)
    text = str(got.value)
    assert f"{section}.{key}" in text and says in text, text
    assert "\x1b" not in text and "\r" not in text


@pytest.mark.parametrize(("section", "key", "value"), [
    ("vllm", "host", "0.0.0.0"), ("vllm", "host", "::"), ("vllm", "host", "gpu-1.lan"),
    ("vllm", "host", "fe80::1"), ("vllm", "model", "Qwen/Qwen3-8B"),
    ("vllm", "served_model_name", "qwen-3.5 9b"), ("vllm", "api_key_file", ""),
    ("vllm", "api_key_file", "/etc/vllmwatch/api-key"), ("prewarm", "cache_dir", "/srv/c"),
])
def test_names_and_paths_people_use_load(section: str, key: str, value: str) -> None:
    data: dict[str, dict[str, object]] = {"vllm": {"model": "/m"}}
    data.setdefault(section, {})[key] = value
    from_dict(data)
