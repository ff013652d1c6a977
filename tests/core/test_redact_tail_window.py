"""The end of a text (Redactor.tail: a process's last output in a record, a detail's end)
hid a secret only when its name was within EXCERPT_MARGIN of the cut: a longer value, or a
private key longer than that, showed its end (helper-135's pass). The window now reaches back
to the start of the line, or to the key's BEGIN (secretvalues.tail_window)."""

from __future__ import annotations

import secrets

import pytest

from vllmwatch.config.redact import EXCERPT_MARGIN, REDACT
from vllmwatch.config.secretvalues import LINE_CAP, tail_window

LONG = EXCERPT_MARGIN + 900  # past the margin: the name is cut off


def _pem(lines: int) -> str:
    body = "\n".join(secrets.token_urlsafe(48)[:64] for _ in range(lines))
    return f"-----BEGIN RSA PRIVATE KEY-----\n{body}\n-----END RSA PRIVATE KEY-----"


@pytest.mark.parametrize(("before", "after"), [
    ("INFO args: --api-key ", " --port 8000\nINFO last line"),
    ("api_key=", ""),
    ("Authorization: Bearer ", " done"),
    ("{'api_key': '", "'}\nnext"),
    ("HF_TOKEN=", "\n"),
])
@pytest.mark.parametrize("keep", [10, 60, 300])
def test_a_long_value_s_end_is_hidden_whatever_the_cut(before: str, after: str,
                                                       keep: int) -> None:
    value = secrets.token_hex(LONG // 2) + "SECRETEND"
    if "--api-key" in before:  # several keys, as vLLM's nargs="+" takes them
        value = " ".join(secrets.token_hex(20) for _ in range(LONG // 40)) + " SECRETEND7x"
    out = REDACT.tail(f"INFO start\n{before}{value}{after}", keep + len(after))
    assert "SECRETEND" not in out and value[-12:] not in out, out


@pytest.mark.parametrize("lines", [80, 140, 400])  # 5 KiB to 26 KiB of key
@pytest.mark.parametrize("keep", [20, 200, 2000])
def test_a_private_key_longer_than_the_margin_is_hidden(lines: int, keep: int) -> None:
    key = _pem(lines)
    out = REDACT.tail(f"INFO loading\n{key}\nINFO after", keep + len("\nINFO after"))
    body = key.splitlines()[1:-1]
    assert not [line for line in body if line[-20:] in out], out
    assert out.endswith("\nINFO after")


def test_a_key_s_end_with_its_begin_out_of_reach_hides_all_before_it() -> None:
    text = "-----BEGIN PRIVATE KEY-----\n" + "A" * (LINE_CAP + EXCERPT_MARGIN + 100) \
        + "tailOFkey\n-----END PRIVATE KEY-----\nok"
    out = REDACT.tail(text, 50)
    assert "tailOFkey" not in out and out.endswith("-----END PRIVATE KEY-----\nok")


def test_ordinary_output_keeps_its_end() -> None:
    text = "x" * 20_000 + "\nINFO Application startup complete.\nINFO done"
    assert REDACT.tail(text, 9) == "INFO done"
    assert REDACT.tail(text, 44) == "INFO Application startup complete.\nINFO done"
    assert tail_window("short", 100) == "short"
    # the window is bounded: a line longer than LINE_CAP is read from LINE_CAP back
    assert len(tail_window("y" * (3 * LINE_CAP), 10)) == LINE_CAP + 10
