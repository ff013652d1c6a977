"""Pure: the [[smoke]] checks `vllmwatch init` proposes for a `vllm serve` line (issue 38.2).

A flag says which endpoint its clients call, so the check that proves it goes in the draft:
`--enable-auto-tool-choice` (tool-calling clients: a tools check), `--chat-template` (chat
clients: a chat check), a pooling model (`--runner pooling`, `--convert embed`, `--task
embed`: an embeddings check). A generating model also gets a commented-out `messages` check
(Claude Code and other Anthropic-API clients call /v1/messages; vLLM serves it from 0.1x,
but not for every model), for the operator to turn on. Only flags the draft keeps count:
one that init commented out proves nothing about the server it will run.
"""

from __future__ import annotations

from vllmwatch.migrate.draft import Draft

POOLING = {"runner": ("pooling",), "convert": ("embed",), "task": ("embed", "embedding")}


def propose(draft: Draft) -> None:
    """Add the checks that fit the draft's active flags (Draft.smoke), each with its reason."""
    args = {e.key: e.value for e in draft.args if e.active}
    if any(str(args.get(flag, "")).lower() in kinds for flag, kinds in POOLING.items()):
        draft.smoke.append(({"endpoint": "embeddings"}, "a pooling model (--runner/--convert/"
                            "--task): READY waits until /v1/embeddings answers a vector", True))
        return
    if args.get("enable-auto-tool-choice") is True:
        parser = args.get("tool-call-parser")
        draft.smoke.append(({"endpoint": "tools", "expect": "tool_calls"},
                            "--enable-auto-tool-choice"
                            + (f" --tool-call-parser {parser}" if parser else "")
                            + ": READY waits until a chat with tools comes back with "
                            "tool_calls (set expect = \"any\" to accept a plain answer too)",
                            True))
    if "chat-template" in args:
        draft.smoke.append(({"endpoint": "chat"}, "--chat-template: READY waits until "
                            "/v1/chat/completions answers with that template", True))
    draft.smoke.append(({"endpoint": "messages", "required": True},
                        "Claude Code and other Anthropic Messages API clients call "
                        "/v1/messages: uncomment to prove it before READY", False))
