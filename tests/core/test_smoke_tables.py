"""[[smoke]] (issue 38.2) as tables: the config's errors, each endpoint's request, and which
answers pass (shaped as vLLM 0.32's response models) and why the others fail."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from vllmwatch.config.schema import ConfigError, from_dict, load
from vllmwatch.config.smoke import SmokeCheck, adapter_check, parse
from vllmwatch.core import smokeanswers as answers


def _check(**kw: Any) -> SmokeCheck:
    checks, problems = parse([kw])
    assert not problems, problems
    return checks[0]


@pytest.mark.parametrize(("table", "key", "words"), [
    ({}, "smoke[1].endpoint", "missing; expected one of 'chat', 'tools', 'messages'"),
    ({"endpoint": "rerank"}, "smoke[1].endpoint", "bad value 'rerank'"),
    ({"endpoint": "chat", "tools": []}, "smoke[1].tools", "accepted with endpoint = 'tools'"),
    ({"endpoint": "chat", "expect": "any"}, "smoke[1].expect", "not used by endpoint"),
    ({"endpoint": "tools", "expect": "some"}, "smoke[1].expect", "\"tool_calls\""),
    ({"endpoint": "tools", "tools": [{"type": "function"}]}, "smoke[1].tools",
     "OpenAI tool tables"),
    ({"endpoint": "embeddings", "max_tokens": 3}, "smoke[1].max_tokens", "not used"),
    ({"endpoint": "chat", "max_tokens": 0}, "smoke[1].max_tokens", "1-4096"),
    ({"endpoint": "chat", "timeout": "soon"}, "smoke[1].timeout", "0.1 s to 1 h"),
    ({"endpoint": "chat", "required": "yes"}, "smoke[1].required", "true (a failure holds"),
    ({"endpoint": "chat", "messages": [{"role": "robot", "content": "x"}]},
     "smoke[1].messages", "role one of system, user, assistant"),
    ({"endpoint": "chat", "prompt": "a", "messages": [{"role": "user", "content": "b"}]},
     "smoke[1].prompt", "not both"),
    ({"endpoint": "chat", "colour": 1}, "smoke[1].colour", "unknown key; known: name"),
])
def test_config_errors_name_the_key_the_value_and_what_is_accepted(
        table: dict[str, Any], key: str, words: str) -> None:
    with pytest.raises(ConfigError) as err:
        from_dict({"vllm": {"model": "/m"}, "smoke": [table]})
    assert any(p.key == key and words in p.problem for p in err.value.problems), \
        err.value.problems


def test_config_errors_carry_the_line_of_the_nth_table(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[vllm]\nmodel = "/m"\n\n[[smoke]]\nendpoint = "chat"\n\n[[smoke]]\n'
                    'endpoint = "chat"\nrequired = 3\n\n[[smoke]]\nendpoint = "chat"\n')
    with pytest.raises(ConfigError) as err:
        load(str(path))
    lines = {p.key: p.line for p in err.value.problems}
    assert lines == {"smoke[2].required": 9, "smoke[3].name": 11}, err.value.problems
    assert "give each a distinct name" in str(err.value)


def test_not_an_array_of_tables_and_too_many() -> None:
    with pytest.raises(ConfigError, match="expected \\[\\[smoke\\]\\] tables"):
        from_dict({"vllm": {"model": "/m"}, "smoke": {"endpoint": "chat"}})
    with pytest.raises(ConfigError, match="at most 64"):
        from_dict({"vllm": {"model": "/m"},
                   "smoke": [{"endpoint": "chat", "name": str(i)} for i in range(65)]})


def test_defaults() -> None:
    c = from_dict({"vllm": {"model": "/m"}, "smoke": [{"endpoint": "tools"},
                                                       {"endpoint": "chat", "model": "a"}]})
    tools, chat = c.smoke
    assert (tools.name, tools.expect, tools.required, tools.timeout) == \
        ("tools", "tool_calls", True, None)
    assert json.loads(tools.tools)[0]["function"]["name"] == "get_weather"
    assert (chat.name, chat.model, chat.max_tokens) == ("chat", "a", 8)
    assert from_dict({"vllm": {"model": "/m"}}).smoke == ()
    a = adapter_check("sql", required=False)
    assert (a.endpoint, a.model, a.max_tokens, a.required) == ("completions", "sql", 1, False)


@pytest.mark.parametrize(("endpoint", "path", "keys"), [
    ("chat", "/v1/chat/completions", {"model", "messages", "max_tokens", "temperature"}),
    ("tools", "/v1/chat/completions",
     {"model", "messages", "max_tokens", "temperature", "tools", "tool_choice"}),
    ("messages", "/v1/messages", {"model", "messages", "max_tokens", "temperature"}),
    ("embeddings", "/v1/embeddings", {"model", "input"}),
    ("completions", "/v1/completions", {"model", "prompt", "max_tokens", "temperature"}),
])
def test_requests(endpoint: str, path: str, keys: set[str]) -> None:
    got_path, body = answers.request(_check(endpoint=endpoint), "served")
    assert got_path == path and set(body) == keys and body["model"] == "served"
    if endpoint == "tools":
        assert body["tool_choice"] == "auto"  # what clients send; it needs the parser


def _chat(message: dict[str, Any], finish: str = "length") -> dict[str, Any]:
    return {"id": "c", "object": "chat.completion", "choices": [
        {"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}]}


CALL = {"id": "t", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
NO_PARSER = {"error": {"message": '"auto" tool choice requires --enable-auto-tool-choice and '
                       "--tool-call-parser to be set", "type": "BadRequestError",
                       "param": None, "code": 400}}


@pytest.mark.parametrize(("check", "status", "answer", "words"), [
    ({"endpoint": "chat"}, 200, _chat({"content": "OK"}), ""),
    ({"endpoint": "chat"}, 200, _chat({"content": None, "reasoning": "hm"}), ""),
    ({"endpoint": "chat"}, 200, _chat({"content": None}), "content is null"),
    ({"endpoint": "chat"}, 200, {"choices": []}, "no choices[0]"),
    ({"endpoint": "chat"}, 400, {"error": {"message": "As of transformers v4.44, default chat "
                                           "template is no longer allowed"}},
     "--chat-template"),
    ({"endpoint": "tools"}, 200, _chat({"content": None, "tool_calls": [CALL]}, "tool_calls"),
     ""),
    ({"endpoint": "tools"}, 200, _chat({"content": "sunny", "tool_calls": []}),
     "no tool_calls (finish_reason 'length'"),
    ({"endpoint": "tools", "expect": "any"}, 200, _chat({"content": "sunny",
                                                          "tool_calls": []}), ""),
    ({"endpoint": "tools", "expect": "any"}, 200, _chat({"content": None, "tool_calls": [
        {**CALL, "function": {"name": "get_weather", "arguments": "{city: Paris"}}]}),
     "arguments is not a JSON string"),
    ({"endpoint": "tools"}, 200, _chat({"tool_calls": [
        {**CALL, "function": {"name": "rm_rf", "arguments": "{}"}}]}), "not a tool it was"),
    ({"endpoint": "tools"}, 400, NO_PARSER,
     "--enable-auto-tool-choice --tool-call-parser NAME"),
    ({"endpoint": "messages"}, 200, {"type": "message", "content": [
        {"type": "text", "text": "OK"}], "stop_reason": "max_tokens"}, ""),
    ({"endpoint": "messages"}, 200, {"type": "message", "content": [
        {"type": "text", "text": ""}], "stop_reason": "end_turn"}, ""),
    ({"endpoint": "messages"}, 200, {"content": [{"type": "text"}],
                                     "stop_reason": "end_turn"}, "content[0].text"),
    ({"endpoint": "messages"}, 200, {"content": [], "stop_reason": "length"}, "stop_reason"),
    ({"endpoint": "messages"}, 404, {"detail": "Not Found"}, "has no such route"),
    ({"endpoint": "messages"}, 400, {"type": "error", "error": {
        "type": "BadRequestError", "message": "The model does not support Messages API"}},
     "does not support Messages API"),
    ({"endpoint": "embeddings"}, 200, {"data": [{"embedding": [0.1, 2]}]}, ""),
    ({"endpoint": "embeddings"}, 200, {"data": [{"embedding": "AAAA"}]},
     "expected a list of numbers"),
    ({"endpoint": "completions", "model": "sql"}, 200, {"choices": [{"text": ""}]}, ""),
    ({"endpoint": "completions", "model": "sql"}, 404, {"error": {
        "message": "The model `sql` does not exist.", "code": 404}}, "no model named 'sql'"),
    ({"endpoint": "completions"}, 200, {"choices": [{"text": None}]}, "choices[0].text"),
])
def test_answers(check: dict[str, Any], status: int, answer: Any, words: str) -> None:
    why = answers.problem(_check(**check), status, json.dumps(answer).encode())
    assert (why == "") if not words else (words in why), why


def test_not_json_and_not_an_object() -> None:
    c = _check(endpoint="chat")
    assert "not JSON" in answers.problem(c, 200, b"<html>")
    assert "not a JSON object" in answers.problem(c, 200, b"[1]")
    assert answers.problem(c, 502, b"<html>bad gateway</html>") == \
        "HTTP 502 from /v1/chat/completions"


@pytest.mark.parametrize(("kind", "path", "keys"), [
    (None, "/v1/completions", {"model", "prompt", "max_tokens", "temperature"}),
    ("chat", "/v1/completions", {"model", "prompt", "max_tokens", "temperature"}),
    ("embeddings", "/v1/embeddings", {"model", "input"}),
    ("classify", "/classify", {"model", "input"}),
    ("score", "/v1/score", {"model", "text_1", "text_2"}),
])
def test_an_adapters_check_asks_the_route_the_model_answers(kind: str | None, path: str,
                                                            keys: set[str]) -> None:
    """A pooling model has no /v1/completions: its adapters' checks ask the canary's route."""
    a = adapter_check("sql", required=True, kind=kind)
    got, body = answers.request(a, "sql")
    assert (got, a.path, set(body), body["model"]) == (path, path, keys, "sql")
    if kind in ("classify", "score"):
        assert answers.problem(a, 200, json.dumps({"data": [{"index": 0}]}).encode()) == ""
        assert "no 'data' list" in answers.problem(a, 200, b'{"data": []}')
