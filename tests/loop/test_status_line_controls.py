"""systemd's STATUS= line shows no raw control character: `systemctl status` prints it to
the operator's terminal, and vLLM's own words reach it (the line vLLM refused its arguments
with, once vllmwatch leaves for it: an ANSI colour code, a bell, a bidi override). status_line
joined whitespace and redacted, but let ESC and the rest through, where every other surface
(the journal, `vllmwatch status`, reports) shows them as escapes."""

from __future__ import annotations

from tests.loop.test_incident_loop import BASE
from vllmwatch.core import exitcodes
from vllmwatch.core.events import ChildExited, Tick
from vllmwatch.core.state import S
from vllmwatch.shell.notify import status_line
from vllmwatch.testing.driver import Driver, World

RAW = ("\x1b", "\x07", "\x9b", "\u202e", "\r")


def test_status_line_escapes_every_control_character() -> None:
    line = status_line("x \x1b[31mred\x1b[0m \x07 \x9b1m \u202eevil y")
    assert line.startswith("STATUS=x ") and not any(c in line for c in RAW), repr(line)
    assert "\\x1b[31mred" in line  # visible, as in the journal


def test_a_refused_command_lines_colour_codes_stay_off_the_status_line() -> None:
    d = Driver(BASE, world=World(canary_ok=False))
    assert d.run_until(lambda: d.state.state == S.STARTING and d.state.pid is not None, 60)
    pid = d.state.pid
    assert pid is not None
    d.world.child_alive = False
    said = "vllm: error: \x1b[1;31munrecognized arguments: --bogus\x1b[0m\x07"
    d.fx.exited = ChildExited(pid, 2, None, last_lines=(said,))
    d.send(Tick())
    assert d.run_until(lambda: d.exit_code is not None, 120)
    assert d.exit_code == exitcodes.CONFIG
    lines = d.notifier.sent("STATUS=")
    quoted = [line for line in lines if "unrecognized arguments" in line]
    assert quoted, lines  # vLLM's words are on it (exiting 78: config (...))
    assert not any(c in line for line in lines for c in RAW), quoted


def test_a_status_line_is_redacted_as_its_lines_were_written() -> None:
    """STATUS= made its text one line before redacting it: a value at a line's end
    (`HF_TOKEN zkabc` then `starting server` on the next line) read as a word of a sentence
    (`NAME value value`) and `systemctl status` showed it to every local user."""
    for text in ("vLLM exited: HF_TOKEN zkabcd\nstarting server",
                 "vLLM exited: api_key zkabcd\r\nthe end"):
        line = status_line(text)
        assert "zkabcd" not in line and "<redacted>" in line, line
        assert line.endswith(text.split()[-1]) and "\n" not in line
