"""`vllmwatch status`: ask the running daemon's /status and print a summary (or the raw JSON).
The summary itself is status/view.py's.

Whatever the URL, the network or the answer, it prints one line saying what went wrong and
exits with a documented code; never a traceback.
"""

from __future__ import annotations

import http.client
import json
import os
import sys
from typing import Any, TextIO
from urllib.parse import urlsplit, urlunsplit

from vllmwatch import bounded_http
from vllmwatch.config.convert import printable
from vllmwatch.config.hosts import connect_host, parse_listen, url_host
from vllmwatch.config.redact import REDACT
from vllmwatch.config.schema import COMMAND_LINE, ConfigError, config_path, load
from vllmwatch.core import exitcodes
from vllmwatch.status import stopped
from vllmwatch.status.stopped import IncidentFinder
from vllmwatch.status.view import render as render  # the human summary (tests use it here)

TIMEOUT_S = 3.0
MAX_BODY = 1 << 20
# 3 as in `systemctl status`: not running; 2 as everywhere in vllmwatch: fix config or usage.
EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_NOT_RUNNING = 0, 1, 2, 3
# Keys every vllmwatch /status document has; JSON without them is someone else's.
REQUIRED_KEYS = ("state", "ready", "vllmwatch_version", "restarts_by_reason")


class StatusError(Exception):
    """A problem to report in one line, with the exit code it means."""

    def __init__(self, message: str, code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.code = code


def main(config_arg: str | None, url: str | None, as_json: bool,
         find_incident: IncidentFinder | None = None) -> int:
    """Fetch /status and print it; 3 when the daemon does not answer, 2 for a bad config or
    --url, 1 on other errors (including an answer that is not vllmwatch's)."""
    try:
        target = status_url(url) if url else status_url(url_from_config(config_arg))
        body = fetch(target)
        data = parse(body, target)
        # The answer as it came, unless the redactor changed it (an older vllmwatch may
        # answer unredacted): then the redacted document
        text = (body if json.loads(body) == data else json.dumps(data, indent=2)) \
            if as_json else _shown(data, target) + _earlier(data, config_arg, find_incident)
    except StatusError as exc:
        if exc.code == EXIT_NOT_RUNNING:
            print(REDACT.text(_not_running(str(exc), config_arg, find_incident)),
                  file=sys.stderr)
        else:
            print(REDACT.text(f"vllmwatch status: {exc}"), file=sys.stderr)
        return exc.code
    except Exception as exc:  # a last net: the one line, never a traceback
        print(REDACT.text(f"vllmwatch status: unexpected error: {type(exc).__name__}: "
                          f"{exc}"), file=sys.stderr)
        return EXIT_ERROR
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")  # a lone surrogate
    try:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        sys.stdout.flush()
    except BrokenPipeError:  # `vllmwatch status | head`: the reader left
        pass
    return EXIT_OK


def _earlier(data: dict[str, Any], config_arg: str | None,
             find_incident: IncidentFinder | None) -> str:
    """The unit's newest incident record when this vllmwatch wrote none: systemd restarted
    it 10 s after a crash-loop give-up (exit 75), and status read "restarts 0" with no
    incident row, as if nothing had happened (each figure counts this vllmwatch's life).
    Its age is said: the newest record may be last month's, no cause of today's start."""
    if find_incident is None or data.get("last_incident") or data.get("incidents_total"):
        return ""  # its own last record is the document's incident row
    try:
        found = find_incident(stopped.unit_name(os.path.abspath(config_path(config_arg))))
    except Exception:  # a folder that cannot be read: the status itself was answered
        return ""
    if not found or found.get("denied") or not found.get("id"):
        return ""
    rid = printable(str(found["id"]), False)
    return REDACT.text(f"\nbefore    incident {rid}{stopped.written(found)}, before this "
                       "vllmwatch started (the restarts above count from its start): "
                       f"{found.get('reason')}"
                       + (f": {found['detail']}" if found.get("detail") else "")
                       + f"\n          read it: vllmwatch incidents show {rid}")


def _not_running(url: str, config_arg: str | None, find_incident: IncidentFinder | None
                 ) -> str:
    """When and why it stopped (systemd's last exit, the last incident), where it can be
    known; else the plain line."""
    try:
        path = config_path(config_arg)
        unit = stopped.unit_name(path)
        booted = stopped.systemd_booted()
        return stopped.explain(url, path, stopped.systemd_view(unit, booted=booted),
                               find_incident(unit) if find_incident else None, booted)
    except Exception as exc:  # the diagnosis must never hide the one line that matters
        user = exitcodes.Unit(user=True)  # the manager is not known either: both said
        return (f"vllmwatch is not running (no answer at {url}); start it with "
                f"`{exitcodes.systemctl(None, 'start')}` (`{exitcodes.systemctl(user, 'start')}` "
                f"under a user's manager) (no more detail: {type(exc).__name__}: {exc})")


def url_from_config(config_arg: str | None) -> str:
    """The base URL from the config's status.listen; StatusError when it cannot be had."""
    try:
        path = config_path(config_arg)
        config = load(path)
    except ConfigError as exc:
        if exc.path != COMMAND_LINE and os.path.isfile(path) and not os.access(path, os.R_OK):
            # `init` as root writes it 0640 root:vllmwatch: a good file, not one to fix
            raise StatusError(f"cannot read {path} as this user (permission denied; the "
                              "config `vllmwatch init` writes is for root and the vllmwatch "
                              "group), so the status address is unknown: run `sudo vllmwatch "
                              "status`, or pass --url http://HOST:PORT", EXIT_USAGE) from None
        raise StatusError(f"cannot load the config, so the status address is unknown: {exc}"
                          "\n(fix the config, or pass --url http://HOST:PORT)", EXIT_USAGE
                          ) from None
    parsed = parse_listen(config.status.listen)
    if parsed is None:
        raise StatusError(f'{config.path}: status.listen = "" disables the status listener; '
                          "set it (e.g. \"127.0.0.1:9101\") or pass --url", EXIT_USAGE)
    host, port = parsed
    return f"http://{url_host(connect_host(host))}:{port}"


def status_url(base: str) -> str:
    """Accept a bare base URL ("http://host:port", "host:port") or the full /status URL;
    StatusError for anything else."""
    text = base.strip()
    if "://" not in text:
        text = "http://" + text
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:
        raise StatusError(f"bad --url {base!r}: {exc}; expected e.g. "
                          "http://127.0.0.1:9101", EXIT_USAGE) from None
    if parts.scheme not in ("http", "https") or not parts.hostname or any(
            c.isspace() for c in text):
        raise StatusError(f"bad --url {base!r}: expected http://HOST:PORT, e.g. "
                          "http://127.0.0.1:9101", EXIT_USAGE)
    if port == 0:
        raise StatusError(f"bad --url {base!r}: port 0", EXIT_USAGE)
    try:  # what the resolver does with it: else "cannot read" and 1, as if it were down
        parts.hostname.encode("idna")
    except UnicodeError as exc:
        raise StatusError(f"bad --url {base!r}: {parts.hostname!r} is no host name "
                          f"({exc.__cause__ or exc}); expected e.g. http://127.0.0.1:9101",
                          EXIT_USAGE) from None
    # (rebuilt from its parts: "http://h:1#x" + "/status" was a fragment, and GET asked /)
    path = "/status" if parts.path in ("", "/") else parts.path
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def fetch(url: str) -> str:
    """GET url within TIMEOUT_S in all (not per read); no proxy (the daemon is local)."""
    parts = urlsplit(url)
    try:
        code, raw = bounded_http.request(
            parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80),
            "GET", (parts.path or "/") + (f"?{parts.query}" if parts.query else ""),
            timeout=TIMEOUT_S, max_body=MAX_BODY, tls=parts.scheme == "https")
    except ConnectionRefusedError:
        raise StatusError(url, EXIT_NOT_RUNNING) from None  # the message: _not_running
    except bounded_http.BodyTooLarge:
        raise StatusError(f"{url} answered more than {MAX_BODY} bytes; that is not "
                          "vllmwatch's /status") from None
    except (OSError, ValueError, http.client.HTTPException) as exc:
        raise StatusError(f"cannot read {url}: {_reason(exc)}") from None
    if code != 200:
        reason = http.client.responses.get(code, "")
        raise StatusError(f"cannot read {url}: HTTP {code} {reason}".rstrip())
    try:
        return str(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise StatusError(f"{url} did not answer UTF-8 text; is another service on this "
                          "port?") from None


def parse(body: str, url: str) -> dict[str, Any]:
    """The /status document; StatusError for non-JSON or JSON that is not vllmwatch's."""
    try:
        data = json.loads(body)
    except ValueError as exc:
        raise StatusError(f"{url} did not return JSON ({exc}); is another service on this "
                          "port?") from None
    except RecursionError:  # [[[[...]]]] past Python's stack: no /status is nested so
        raise StatusError(f"{url} returned JSON nested deeper than any /status; is another "
                          "service on this port?") from None
    missing = [k for k in REQUIRED_KEYS if not isinstance(data, dict) or k not in data]
    if missing or not isinstance(data.get("state"), str):
        raise StatusError(f"{url} returned JSON that is not vllmwatch's /status (missing "
                          f"{', '.join(missing) or 'a text state'}); is another service on "
                          "this port? Pass --url to the vllmwatch status listener")
    # An older vllmwatch (or another service) may answer unredacted: the same rules here.
    document: dict[str, Any] = REDACT.deep(data)
    return document


def _shown(data: dict[str, Any], url: str) -> str:
    """The document in lines; a field of a type or size vllmwatch never writes (another
    service, another version: 1e999 as a count, a list as a state) is one StatusError."""
    try:
        return render(data, colour=use_colour(sys.stdout))
    except (TypeError, ValueError, OverflowError, KeyError, AttributeError, IndexError,
            RecursionError) as exc:
        raise StatusError(f"{url} returned a /status this vllmwatch cannot show "
                          f"({type(exc).__name__}: {REDACT.head(str(exc), 120)}); is it another "
                          "service, "
                          "or another vllmwatch version? `vllmwatch status --json` prints "
                          "it as it came") from None


def use_colour(stream: TextIO) -> bool:
    """Colour only on a terminal, and never when NO_COLOR is set (no-color.org)."""
    return stream.isatty() and "NO_COLOR" not in os.environ


def _reason(exc: object) -> str:
    if isinstance(exc, TimeoutError):  # the whole request, however fast each read was
        return f"no complete answer within {TIMEOUT_S:g}s"
    return str(exc) or type(exc).__name__
