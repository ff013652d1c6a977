"""The canary follows the model: kind order, request shapes, and the prober against the fake."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support import fake
from vllmwatch.config.schema import ConfigError, ProbeConfig, from_dict
from vllmwatch.core import canary
from vllmwatch.shell.probes import Endpoint, HttpProber, prober_for


@pytest.mark.parametrize("kind,args,extra,first", [
    ("auto", {}, (), "completions"),
    ("auto", {"runner": "pooling"}, (), "embeddings"),
    ("auto", {"convert": "embed"}, (), "embeddings"),
    ("auto", {}, ("--runner", "pooling"), "embeddings"),
    ("auto", {}, ("--runner=pooling",), "embeddings"),
    ("auto", {"convert": "classify"}, (), "score"),
    ("auto", {"task": "embed"}, (), "embeddings"),
    ("auto", {"runner": "generate"}, (), "completions"),
    ("chat", {"runner": "pooling"}, (), "chat"),
    ("rerank", {}, (), "rerank"),
])
def test_order(kind: str, args: dict[str, object], extra: tuple[str, ...], first: str) -> None:
    got = canary.order(kind, args, extra)
    assert got[0] == first
    assert len(got) == (len(set(got)))
    if kind == "auto":  # auto always ends up trying every built-in kind it knows
        assert set(got) == {"completions", "embeddings", "score", "classify", "pooling"}


@pytest.mark.parametrize("kind,path,keys", [
    ("completions", "/v1/completions", {"model", "prompt", "max_tokens", "temperature"}),
    ("chat", "/v1/chat/completions", {"model", "messages", "max_tokens", "temperature"}),
    ("embeddings", "/v1/embeddings", {"model", "input"}),
    ("score", "/v1/score", {"model", "text_1", "text_2"}),
    ("rerank", "/v1/rerank", {"model", "query", "documents"}),
    ("classify", "/classify", {"model", "input"}),
    ("pooling", "/pooling", {"model", "input"}),
])
def test_request_shapes(kind: str, path: str, keys: set[str]) -> None:
    got_path, payload = canary.request(kind, "m", "Hello")
    assert got_path == path and set(payload) == keys and payload["model"] == "m"


def test_custom_request_is_sent_as_written() -> None:
    assert canary.request("custom", "m", "x", "/v2/embed", '{"texts": ["a"]}') == (
        "/v2/embed", {"texts": ["a"]})


@pytest.mark.parametrize("status,body,missing", [
    (404, b'{"detail":"Not Found"}', True),  # FastAPI: no such route
    (404, b'{"object":"error","message":"The model `x` does not exist."}', False),
    (404, b"not json", False),
    (405, b"", True),
    (501, b'{"error": "The model does not support Embeddings API"}', True),
    (400, b'{"detail":"Not Found"}', False),
    (500, b"", False),
    (None, b"", False),
])
def test_route_missing(status: int | None, body: bytes, missing: bool) -> None:
    assert canary.route_missing(status, body) is missing


def _prober(port: int, log: Any = None, **probe: Any) -> HttpProber:
    settings = ProbeConfig(timeout=2.0, canary_timeout=5.0, **probe)
    return HttpProber(Endpoint("127.0.0.1", port, "fake"), settings, log=log)


@pytest.mark.parametrize("flags,chosen", [
    ((), "completions"),
    (("--runner", "pooling"), "embeddings"),
    (("--convert", "classify"), "score"),
])
def test_auto_finds_the_models_kind(tmp_path: Path, flags: tuple[str, ...], chosen: str
                                    ) -> None:
    logged: list[tuple[str, dict[str, Any]]] = []
    with fake(tmp_path, *flags) as f:
        prober = _prober(f.port, log=lambda level, ev, **kw: logged.append((ev, kw)))
        first = prober.canary()
        assert first.ok, first.error
        assert prober.chosen == chosen and first.kind == chosen  # the core keeps it
        assert prober.canary().ok and prober.canary(warmup=True).ok
    assert logged == [("probe.canary_chosen", {"kind": chosen,
                                               "path": canary.PATHS[chosen]})]


@pytest.mark.parametrize("kind,flags", [
    ("completions", ()), ("chat", ()), ("embeddings", ("--runner", "pooling")),
    ("score", ("--runner", "pooling")), ("rerank", ("--convert", "classify")),
    ("classify", ("--convert", "classify")), ("pooling", ("--runner", "pooling")),
])
def test_every_fixed_kind_serves_its_model(tmp_path: Path, kind: str,
                                           flags: tuple[str, ...]) -> None:
    with fake(tmp_path, *flags) as f:
        prober = _prober(f.port, canary=kind)
        got, warm = prober.canary(), prober.canary(warmup=True)
        assert got.ok and warm.ok, (got.error, warm.error)
        assert prober.chosen == kind


def test_a_fixed_kind_does_not_wander(tmp_path: Path) -> None:
    with fake(tmp_path, "--runner", "pooling") as f:
        got = _prober(f.port, canary="completions").canary()
        assert not got.ok and not got.timed_out
        assert "HTTP 404 from /v1/completions" in got.error


def test_custom_kind(tmp_path: Path) -> None:
    with fake(tmp_path, "--runner", "pooling") as f:
        body = json.dumps({"model": "fake", "input": "ping"})
        assert _prober(f.port, canary="custom", canary_path="/pooling",
                       canary_body=body).canary().ok
        bad = _prober(f.port, canary="custom", canary_path="/v1/nope", canary_body=body)
        assert not bad.canary().ok


def test_auto_says_what_to_set_when_nothing_answers(tmp_path: Path) -> None:
    with fake(tmp_path, "--runner", "pooling") as f:
        # Only the completion routes are tried: a generating guess with nothing behind it.
        prober = _prober(f.port)
        prober._order = ("completions",)
        got = prober.canary()
    assert not got.ok and "probe.canary" in got.error and prober.chosen is None


def _cfg(probe: dict[str, object]) -> dict[str, object]:
    return {"vllm": {"model": "m", "args": {"runner": "pooling"}}, "probe": probe}


def test_config_builds_the_prober() -> None:
    config = from_dict(_cfg({"canary": "auto"}))
    prober = prober_for(config, None)
    assert prober.canary_kind == "auto" and prober._order[0] == "embeddings"


@pytest.mark.parametrize("probe,key,says", [
    ({"canary": "custom"}, "probe.canary_path", "needs a path"),
    ({"canary": "custom", "canary_path": "v1/x"}, "probe.canary_path", "needs a path"),
    ({"canary": "custom", "canary_path": "/x", "canary_body": "{"}, "probe.canary_body",
     "not JSON"),
    ({"canary": "custom", "canary_path": "/x", "canary_body": "[1]"}, "probe.canary_body",
     "JSON object"),
    ({"canary_path": "/x"}, "probe.canary", 'probe.canary = "custom"'),
    ({"canary": "custom", "canary_path": "/v1/my endpoint"}, "probe.canary_path",
     "percent-encode"),
    ({"canary": "custom", "canary_path": "/v1/e\tx"}, "probe.canary_path", "percent-encode"),
    ({"canary": "custom", "canary_path": "/v1/é"}, "probe.canary_path", "percent-encode"),
    ({"canary": "custom", "canary_path": "/x", "canary_body": '{"t": NaN}'},
     "probe.canary_body", "not JSON"),
    ({"canary": "embedding"}, "probe.canary", "'embeddings'"),
])
def test_config_errors(probe: dict[str, object], key: str, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        from_dict(_cfg(probe))
    assert err.value.key == key and says in str(err.value)


