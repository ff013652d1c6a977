"""`[[smoke]]`: the checks that must pass before READY=1, one request each (issue 38.2).

The canary proves the engine answers one request; a smoke check proves an endpoint that
clients call answers the way they read it (a chat template, a tool parser, the Anthropic
Messages API, an embedding route, an adapter's name). Parsed here, run by core/smoke.py
(when) and shell/smoke.py (how). Imported only when a config has `[[smoke]]` (or
`[[adapters]]`): the daemon's import count at the defaults (tests/daemon/test_import_count.py).

Keys are named `smoke[N].key`, N counting the tables from 1, as errors.line_of finds them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from vllmwatch.config import units
from vllmwatch.config.convert import show
from vllmwatch.config.errors import Problem, unknown
from vllmwatch.config.redact import REDACT

ENDPOINTS = ("chat", "tools", "messages", "embeddings", "completions")
PATHS = {"chat": "/v1/chat/completions", "tools": "/v1/chat/completions",
         "messages": "/v1/messages", "embeddings": "/v1/embeddings",
         "completions": "/v1/completions"}
# The routes of a pooling model's canary kinds (core/canary.py) an adapter's check asks when
# the canary found the model answers one of them: adapter_check's only, no [[smoke]] endpoint.
POOLED = {"score": "/v1/score", "rerank": "/v1/rerank", "classify": "/classify",
          "pooling": "/pooling"}
PATHS.update(POOLED)
EXPECTS = ("tool_calls", "any")  # tools: a tool call, or a tool call or a plain answer
MAX_CHECKS = 64  # each runs once per start, one after the other, before READY
MAX_TEXT = 16 * 1024  # a prompt or a message: a smoke check is a small request
MAX_TOOLS_JSON = 64 * 1024
DEFAULT_PROMPT = {
    "chat": "Say OK.",
    "messages": "Say OK.",
    "tools": "What is the weather in Paris? Use the get_weather tool.",
    "embeddings": "vllmwatch smoke check",
    "completions": "The capital of France is",
}
# A tool-free answer to a chat with max_tokens 1 is still a chat answer: the shape is the
# proof, not the text. A tool call needs room for its JSON arguments.
DEFAULT_MAX_TOKENS = {"chat": 8, "messages": 8, "tools": 256, "completions": 1}
DEFAULT_TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "The city, e.g. Paris"}},
        "required": ["city"]}}}]
_ROLES = {"chat": ("system", "user", "assistant"), "tools": ("system", "user", "assistant"),
          "messages": ("user", "assistant")}
_ONLY = {"tools": ("tools",), "expect": ("tools",), "messages": ("chat", "tools", "messages"),
         "max_tokens": ("chat", "tools", "messages", "completions")}
KEYS = ("name", "endpoint", "model", "prompt", "messages", "tools", "expect", "max_tokens",
        "timeout", "required")


@dataclass(frozen=True)
class SmokeCheck:
    """One check: a request to `endpoint` under `model` ('' = the served model name).

    `messages` are (role, content) pairs (else one user message of `prompt`); `tools` is the
    JSON text of the OpenAI tools array; `timeout` None means probe.canary_timeout; a check
    with `required` False that fails is reported and does not hold READY.
    """

    name: str
    endpoint: str
    model: str = ""
    prompt: str = ""
    messages: tuple[tuple[str, str], ...] = ()
    tools: str = ""
    expect: str = "tool_calls"
    max_tokens: int = 0
    timeout: float | None = None
    required: bool = True

    @property
    def path(self) -> str:
        """The route this check asks."""
        return PATHS[self.endpoint]


def adapter_check(adapter: str, required: bool, timeout: float | None = None,
                  kind: str | None = None) -> SmokeCheck:
    """An adapter's check before READY: one request under its name (issue 38.1), on the
    route of the canary's `kind` (what the model answers): a 1-token completion for a
    generating model, an embedding or the pooling route for a pooling one (it has no
    /v1/completions: every adapter's check was a 404 and no start reached READY)."""
    endpoint = kind if kind == "embeddings" or kind in POOLED else "completions"
    generate = endpoint == "completions"
    return SmokeCheck(name=f"adapter:{adapter}", endpoint=endpoint, model=adapter,
                      prompt=DEFAULT_PROMPT["completions" if generate else "embeddings"],
                      max_tokens=1 if generate else 0, timeout=timeout, required=required)


def parse(value: object, config: object = None
          ) -> tuple[tuple[SmokeCheck, ...], list[Problem]]:
    """The `smoke` value of a parsed TOML document: its checks and every problem found
    (`config`: the rest of the file, as [[adapters]]' parse takes it; checks need none)."""
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        return (), [Problem("smoke", f"expected [[smoke]] tables, got {show(value)}")]
    if len(value) > MAX_CHECKS:
        return (), [Problem("smoke", f"{len(value)} checks; at most {MAX_CHECKS} are "
                            "accepted (each runs before every READY)")]
    checks: list[tuple[int, SmokeCheck]] = []
    problems: list[Problem] = []
    for n, table in enumerate(value, 1):
        check = _check(table, f"smoke[{n}]", problems)
        if check is not None:
            checks.append((n, check))
    seen: dict[str, int] = {}
    for n, c in checks:
        if c.name in seen:
            problems.append(Problem(f"smoke[{n}].name", f"{c.name!r} names two checks "
                                    f"(also smoke[{seen[c.name]}]); give each a distinct "
                                    "name = \"...\""))
        seen.setdefault(c.name, n)
    return tuple(c for _, c in checks), problems


def _check(t: Mapping[str, object], at: str, problems: list[Problem]) -> SmokeCheck | None:
    before = len(problems)
    problems += [unknown(f"{at}.", key, KEYS) for key in t if key not in KEYS]
    endpoint = t.get("endpoint")
    if not isinstance(endpoint, str) or endpoint not in ENDPOINTS:
        problems.append(Problem(f"{at}.endpoint", (f"bad value {show(endpoint)}" if endpoint
                                is not None else "missing") + "; expected one of "
                                + ", ".join(repr(e) for e in ENDPOINTS)))
        return None
    for key, allowed in _ONLY.items():
        if key in t and endpoint not in allowed:
            problems.append(Problem(f"{at}.{key}", f"not used by endpoint = {endpoint!r}; "
                                    "accepted with endpoint = "
                                    + " or ".join(repr(e) for e in allowed)))
    name = _text(t, "name", at, problems, 200) or endpoint
    model = _text(t, "model", at, problems, 1000)
    prompt = _text(t, "prompt", at, problems, MAX_TEXT)
    messages = _messages(t.get("messages"), endpoint, at, problems)
    if prompt and messages:
        problems.append(Problem(f"{at}.prompt", "set prompt or messages, not both"))
    tools = _tools(t.get("tools"), at, problems) if endpoint == "tools" else ""
    expect = t.get("expect", "tool_calls")
    if expect not in EXPECTS:
        problems.append(Problem(f"{at}.expect", f"bad value {show(expect)}; expected "
                                "\"tool_calls\" (the answer must call a tool) or \"any\" "
                                "(a tool call or a plain answer)"))
    raw = t.get("max_tokens", DEFAULT_MAX_TOKENS.get(endpoint, 0))
    max_tokens = raw if isinstance(raw, int) and not isinstance(raw, bool) else -1
    if endpoint != "embeddings" and not 1 <= max_tokens <= 4096:
        problems.append(Problem(f"{at}.max_tokens", f"bad value {show(raw)}; expected "
                                "a whole number 1-4096"))
    timeout = _timeout(t, at, problems)
    required = t.get("required", True)
    if not isinstance(required, bool):
        problems.append(Problem(f"{at}.required", f"bad value {show(required)}; expected "
                                "true (a failure holds READY) or false (reported only)"))
    if len(problems) > before:
        return None
    return SmokeCheck(name=name, endpoint=endpoint, model=model,
                      prompt=prompt or ("" if messages else DEFAULT_PROMPT[endpoint]),
                      messages=messages, tools=tools, expect=str(expect),
                      max_tokens=max(max_tokens, 0),
                      timeout=timeout, required=bool(required))


def _text(t: Mapping[str, object], key: str, at: str, problems: list[Problem],
          limit: int) -> str:
    value = t.get(key, "")
    if not isinstance(value, str) or len(value) > limit:
        problems.append(Problem(f"{at}.{key}", f"bad value {REDACT.head(show(value), 80)}; "
                                f"expected a string of at most {limit} characters"))
        return ""
    return value


def _messages(value: object, endpoint: str, at: str, problems: list[Problem]
              ) -> tuple[tuple[str, str], ...]:
    if value is None or endpoint not in _ROLES:
        return ()
    roles = _ROLES[endpoint]
    ok = isinstance(value, list) and value and all(
        isinstance(m, dict) and set(m) == {"role", "content"} and m["role"] in roles
        and isinstance(m["content"], str) and len(m["content"]) <= MAX_TEXT for m in value)
    if not ok or not isinstance(value, list):
        problems.append(Problem(f"{at}.messages", f"bad value {show(value)}; expected an "
                                "array of {role = \"...\", content = \"...\"} with role one "
                                "of " + ", ".join(roles)))
        return ()
    return tuple((str(m["role"]), str(m["content"])) for m in value)


def _tools(value: object, at: str, problems: list[Problem]) -> str:
    if value is None:
        return json.dumps(DEFAULT_TOOLS)
    ok = isinstance(value, list) and value and all(
        isinstance(x, dict) and x.get("type", "function") == "function"
        and isinstance(x.get("function"), dict) and isinstance(x["function"].get("name"), str)
        for x in value)
    text = json.dumps(value) if ok else ""
    if not ok or len(text) > MAX_TOOLS_JSON:
        problems.append(Problem(f"{at}.tools", "expected an array of OpenAI tool tables, "
                                "each {type = \"function\", function = {name = \"...\", "
                                "parameters = {...}}}, at most 64 KiB as JSON; leave it out "
                                "for the built-in get_weather tool"))
        return ""
    return text


def _timeout(t: Mapping[str, object], at: str, problems: list[Problem]) -> float | None:
    if "timeout" not in t:
        return None
    value = t["timeout"]
    try:
        seconds = units.parse_duration(value)
    except (ValueError, TypeError):
        seconds = -1.0
    if not 0.1 <= seconds <= 3600:
        problems.append(Problem(f"{at}.timeout", f"bad value {show(value)}; expected "
                                f"{units.DURATION_HELP}, 0.1 s to 1 h"))
        return None
    return seconds
