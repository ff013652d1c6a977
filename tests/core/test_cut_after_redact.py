"""Every excerpt of outside text is redacted before it is cut (issue 37: one redactor for
all that leaves). Cut first, a secret across the cut keeps its first part: too short for a
rule, not equal to the known value, so it leaves. `Redactor.head`/`tail` redact a window past
the cut, then cut; this test finds every other cut in vllmwatch/ and makes each new one a
decision written down here."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support.secrets import known_key
from vllmwatch.core import canary, smokeanswers

ROOT = Path(__file__).resolve().parents[2] / "vllmwatch"
SMALL = 20  # [:3], [:12] (a hash), [-5:]: items or ids, never an excerpt of text
# Excerpt-sized cuts that are not text leaving the daemon, or cut text already redacted.
NOT_EXCERPTS = {
    "(*c.verdicts, (now, what))[-VERDICTS_KEPT:]": "a list of verdicts",
    "(*history, seconds)[-HISTORY:]": "a list of seconds",
    "history[-HISTORY:]": "a list of seconds",
    "(*m.recent, (now, judged, host_mib))[-MEM_RECENT:]": "a list of samples",
    "[*scrapes, (wall, text)][-KEEP:]": "a list of scrapes (the record redacts each whole)",
    "[f for f in frames if is_vllm(f)][:VLLM_FRAMES]": "a list of frames",
    "points[-2 * MAX_POINTS:]": "a list of points",
    "series.points[-SAMPLES_KEPT:]": "a list of points",
    "value[:MAX_ADAPTERS]": "a list of adapters",
    "self.problems[:MAX_SHOWN]": "a list of a config's problems",
    "bad[:MAX_BAD]": "a list of a table's bad entries",
    "name[:MAX_KEY_SHOWN]": "a config key's name past 120 characters, cut before the word "
                            "the cut falls in (errors._cut: a secret there goes whole); "
                            "every writer redacts the message whole",
    "proc.stdout.splitlines()[:len(PROPERTIES) * 2]": "a list of lines",
    "recent[-12:]": "a list of samples",
    "line[:80]": "childlog.level_of looks for the level word; nothing leaves",
    "seen[-TAIL:]": "gate/exchange: a stream's last bytes, kept to find its markers; "
                    "nothing leaves",
    "name[:64]": "a journal field name: [A-Z0-9_] made from ours",
    "data[:MAX_VALUE - 15]": "a journal value: shell/logs.py redacted the event whole first",
    'str(data.get("reason", "?"))[:40]': "a stored record: redacted whole when written",
    'f"{type(exc).__name__}: {exc}"[:300]': "the standby interpreter imports only the "
    "stdlib; the daemon redacts its pipe's text before it leaves",
    "head[-WORD:]": "config/units.brief looks for a space in text redacted; nothing leaves",
    "end[:WORD]": "config/units.brief looks for a space in text redacted; nothing leaves",
    "end[:WORD + 1]": "config/units.brief looks for a space in text redacted",
    "end[WORD:]": "config/units.brief: the end of text redacted (REDACT.tail), at a word",
    "tuple(sorted(kept.items()))[:MEMBERS_MAX]": "the group file's tree members: (pid, start) "
    "pairs, numbers, no text",
}


def _excerpt_bound(bound: ast.expr | None) -> bool:
    """A bound that can cut text mid-word: a literal of SMALL or more, or a named limit."""
    if bound is None:
        return False
    if isinstance(bound, ast.UnaryOp) and isinstance(bound.op, ast.USub):
        bound = bound.operand
    if isinstance(bound, ast.Constant):
        return isinstance(bound.value, int) and bound.value >= SMALL
    return any(isinstance(n, ast.Name) and n.id.isupper() for n in ast.walk(bound)) or any(
        isinstance(n, ast.Constant) and isinstance(n.value, int) and n.value >= SMALL
        for n in ast.walk(bound))


def _cuts() -> list[tuple[str, str]]:
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        if "testing" in path.parts or path.name == "redact.py":  # the fakes; the redactor
            continue
        src = path.read_text()
        for node in ast.walk(ast.parse(src)):
            if not (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Slice)):
                continue
            sl = node.slice
            head = sl.lower is None and _excerpt_bound(sl.upper)
            tail = sl.upper is None and isinstance(sl.lower, ast.UnaryOp) \
                and _excerpt_bound(sl.lower)
            if sl.step is None and (head or tail):
                found.append((f"{path.relative_to(ROOT.parent)}:{node.lineno}",
                              ast.get_source_segment(src, node) or "?"))
    return found


def test_no_excerpt_of_text_is_cut_before_the_redactor() -> None:
    cuts = _cuts()
    assert len(cuts) >= len(NOT_EXCERPTS) // 2, "the scan found almost nothing: broken?"
    bad = [f"{where}: {seg}" for where, seg in cuts if seg not in NOT_EXCERPTS]
    assert not bad, "cut with REDACT.head(text, n) / REDACT.tail(text, n), or name the cut " \
        "in NOT_EXCERPTS with why it is not outside text:\n" + "\n".join(bad)


def test_the_scan_sees_a_cut_of_text() -> None:
    tree = ast.parse("x = said[:300]\ny = lines[-LIMIT:]\nz = token[2:]\nw = digest[:8]\n")
    subs = [n for n in ast.walk(tree) if isinstance(n, ast.Subscript)]
    flagged = [ast.unparse(n) for n in subs if isinstance(n.slice, ast.Slice) and (
        (n.slice.lower is None and _excerpt_bound(n.slice.upper))
        or (n.slice.upper is None and isinstance(n.slice.lower, ast.UnaryOp)
            and _excerpt_bound(n.slice.lower)))]
    assert flagged == ["said[:300]", "lines[-LIMIT:]"]


def _leaks(text: str, secret: str) -> bool:
    """Whether any 6 characters of the secret survive."""
    return any(secret[i:i + 6] in text for i in range(len(secret) - 5))


@pytest.mark.parametrize("at", [1, 6, 12, 20])
def test_excerpts_in_the_core_hide_a_secret_across_their_cut(monkeypatch: pytest.MonkeyPatch,
                                                             at: int) -> None:
    key = known_key(monkeypatch)
    # vLLM's error message, cut at 500; the key starts `at` characters before the cut.
    message = "x" * (500 - at) + key + " more"
    said = smokeanswers.vllm_error(b'{"detail": "%s"}' % message.encode())
    assert len(said) <= 500 and said.startswith("x" * (500 - at)) and not _leaks(said, key)
    # A canary's answer that is not JSON, cut at 80.
    body = b"<html>" + b"y" * (74 - at) + key.encode() + b"</html>"
    why = canary.answer_problem("chat", body)
    assert "y" * (74 - at) in why and not _leaks(why, key)
