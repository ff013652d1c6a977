"""Pure: a smoke check's request, and whether its answer has what clients read (issue 38.2).

Field names are vLLM's own response models (0.32: entrypoints/openai/chat_completion,
entrypoints/anthropic/protocol.py; 0.26 the same names): chat `choices[0].message`
(`content`, `tool_calls`, `reasoning` / older `reasoning_content`), a tool call's
`function.name` and `function.arguments` (a JSON string), the Anthropic Messages API's
`content[*].type` / `.text` and `stop_reason`, `data[0].embedding`, `choices[0].text`.
Errors are vLLM's `{"error": {"message": ...}}` (older `{"object": "error", "message": ...}`)
or, on /v1/messages, Anthropic's `{"type": "error", "error": {"message": ...}}`.
"""

from __future__ import annotations

import json
from typing import Any

from vllmwatch.config.redact import REDACT
from vllmwatch.config.smoke import POOLED, SmokeCheck
from vllmwatch.core import canary

STOP_REASONS = ("end_turn", "max_tokens", "stop_sequence", "tool_use")
# vLLM's 400 for tool_choice "auto" without the parser (renderers/online_renderer.py, 0.32):
# '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'.
TOOL_FLAGS_HINT = ("start vLLM with --enable-auto-tool-choice --tool-call-parser NAME (the "
                   "model's parser, e.g. hermes for Qwen): in [vllm] args, "
                   "enable-auto-tool-choice = true and tool-call-parser = \"hermes\"")
TEMPLATE_HINT = ("the tokenizer has no chat template: set one with --chat-template PATH "
                 "([vllm] args chat-template = \"/path/template.jinja\")")


def request(check: SmokeCheck, model: str) -> tuple[str, dict[str, Any]]:
    """(path, JSON payload) of the check's one request."""
    if check.endpoint == "embeddings":
        return check.path, {"model": model, "input": check.prompt}
    if check.endpoint in POOLED:  # an adapter's check on a pooling model: the canary's request
        return canary.request(check.endpoint, model, check.prompt)
    if check.endpoint == "completions":
        return check.path, {"model": model, "prompt": check.prompt,
                            "max_tokens": check.max_tokens, "temperature": 0}
    messages = [{"role": r, "content": c} for r, c in check.messages] or [
        {"role": "user", "content": check.prompt}]
    body: dict[str, Any] = {"model": model, "messages": messages,
                            "max_tokens": check.max_tokens, "temperature": 0}
    if check.endpoint == "tools":  # what tool-calling clients send (and the guide's check)
        body.update(tools=json.loads(check.tools), tool_choice="auto")
    return check.path, body


def vllm_error(body: bytes) -> str:
    """vLLM's own error message in an error answer ('' when there is none)."""
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):  # (RecursionError: [[[[...]]]] past the stack)
        return ""
    if not isinstance(parsed, dict):
        return ""
    inner = parsed.get("error")
    if isinstance(inner, dict) and isinstance(inner.get("message"), str):
        return str(inner["message"])
    for key in ("message", "detail"):  # older vLLM; FastAPI's 404 / 422
        if isinstance(parsed.get(key), (str, list)):
            return REDACT.head(str(parsed[key]), 500)
    return ""


def problem(check: SmokeCheck, status: int, body: bytes) -> str:
    """Why the answer is not what clients read ('' when the check passes)."""
    if status != 200:
        said = vllm_error(body)
        return f"HTTP {status} from {check.path}" + (f": {said}" if said else "") \
            + _hint(check, status, said)
    if check.endpoint in POOLED:  # the canary's judgement of that route's answer
        why = canary.answer_problem(check.endpoint, body)
        return f"HTTP 200 from {check.path} but {why}" if why else ""
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):  # (RecursionError: [[[[...]]]] past the stack)
        return f"HTTP 200 from {check.path} but not JSON"
    if not isinstance(parsed, dict):
        return f"HTTP 200 from {check.path} but not a JSON object"
    why = _SHAPES[check.endpoint](check, parsed)
    return f"HTTP 200 from {check.path} but {why}" if why else ""


def _hint(check: SmokeCheck, status: int, said: str) -> str:
    low = said.lower()
    if "enable-auto-tool-choice" in low or "tool-call-parser" in low:
        return f" ({TOOL_FLAGS_HINT})"
    if "chat template" in low or "chat_template" in low:
        return f" ({TEMPLATE_HINT})"
    if status == 404 and "does not exist" in low:
        return f" (no model named {check.model!r} is served: --served-model-name, or an " \
               "adapter that did not load)" if check.model else ""
    if status == 404 and said == "Not Found":
        return " (this vLLM has no such route: too old for it, or the model's task has none)"
    return ""


def _message(parsed: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    choices = parsed.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None, "no choices[0]"
    message = choices[0].get("message")
    if not isinstance(message, dict):
        return None, "no choices[0].message"
    return message, ""


def _chat(check: SmokeCheck, parsed: dict[str, Any]) -> str:
    message, why = _message(parsed)
    if message is None:
        return why
    content = message.get("content")
    if isinstance(content, str) or message.get("tool_calls"):
        return ""
    reasoning = message.get("reasoning", message.get("reasoning_content"))
    if content is None and isinstance(reasoning, str):
        return ""  # a reasoning model that spent max_tokens thinking: still a chat answer
    return f"choices[0].message.content is {_short(content)}, expected text"


def _tools(check: SmokeCheck, parsed: dict[str, Any]) -> str:
    message, why = _message(parsed)
    if message is None:
        return why
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list):
        return f"choices[0].message.tool_calls is {_short(calls)}, expected a list"
    offered = {t["function"]["name"] for t in json.loads(check.tools)}
    for i, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        at = f"tool_calls[{i}].function"
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            return f"{at}.name is missing"
        if fn["name"] not in offered:
            return f"{at}.name is {fn['name']!r}, not a tool it was offered " \
                   f"({', '.join(sorted(offered))})"
        args = fn.get("arguments")
        try:
            json.loads(args) if isinstance(args, str) else None
        except (ValueError, RecursionError):  # (RecursionError: [[[[...]]]] past the stack)
            args = None
        if not isinstance(args, str):
            return f"{at}.arguments is not a JSON string: {_short(fn.get('arguments'))}"
    if calls:
        return ""
    if check.expect == "any":
        return _chat(check, parsed)
    finish = (parsed.get("choices") or [{}])[0].get("finish_reason")
    return (f"no tool_calls (finish_reason {finish!r}, content "
            f"{_short(message.get('content'))}): the model answered in text; check that "
            "--tool-call-parser matches the model, or set expect = \"any\"")


def _messages(check: SmokeCheck, parsed: dict[str, Any]) -> str:
    content = parsed.get("content")
    if not isinstance(content, list):
        return f"content is {_short(content)}, expected a list of blocks"
    for i, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            return f"content[{i}].type is missing"
        if block["type"] == "text" and not isinstance(block.get("text"), str):
            return f"content[{i}].text is {_short(block.get('text'))}, expected text"
    stop = parsed.get("stop_reason")
    if stop not in STOP_REASONS:
        return f"stop_reason is {_short(stop)}, expected one of {', '.join(STOP_REASONS)}"
    return ""


def _embeddings(check: SmokeCheck, parsed: dict[str, Any]) -> str:
    data = parsed.get("data")
    if not isinstance(data, list) or not data or not isinstance(data[0], dict):
        return "no data[0]"
    vector = data[0].get("embedding")
    if not isinstance(vector, list) or not vector or not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) for x in vector):
        return f"data[0].embedding is {_short(vector)}, expected a list of numbers"
    return ""


def _completions(check: SmokeCheck, parsed: dict[str, Any]) -> str:
    choices = parsed.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return "no choices[0]"
    text = choices[0].get("text")
    return "" if isinstance(text, str) else f"choices[0].text is {_short(text)}, expected text"


def _short(value: object) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 80 else REDACT.head(text, 77) + "..."


_SHAPES = {"chat": _chat, "tools": _tools, "messages": _messages, "embeddings": _embeddings,
           "completions": _completions}
