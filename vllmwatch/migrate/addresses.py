"""Pure: the address clients used stays theirs (issue 36.1).

A line without `--host` bound every interface (vLLM's default), unlike vllmwatch's default of
127.0.0.1: written as it was, else every client on the network loses the API. With `init
--gate`, vllmwatch's front door takes that address and vLLM moves to loopback on a private
port: never vLLM's own port on the network beside the gate.
"""

from __future__ import annotations

from vllmwatch.migrate.draft import Draft, Facts

VLLM_DEFAULT_PORT = 8000  # vLLM's --port default
ALL = "0.0.0.0"  # what vLLM binds without --host (the IPv4 wildcard)


def joined(host: str, port: int) -> str:
    """HOST:PORT, with an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def shown(host: str, port: int) -> str:
    """The address in words for the person: the wildcard is every interface."""
    if host in (ALL, "::", ""):
        return f"port {port} on every interface"
    return joined(host, port)


def keep(draft: Draft, facts: Facts) -> None:
    """vllm.host (and [gate], with --gate) so that clients reach the same address, and
    status.listen off the ports they take."""
    _addresses(draft, facts)
    taken = {p for p in (draft.vllm.get("port", VLLM_DEFAULT_PORT),
                         _port_of(draft.sections.get("gate", {}).get("listen")))
             if isinstance(p, int)}
    if STATUS_PORT in taken:  # the config would not load: "also vllm.port"
        free = next(p for p in range(STATUS_PORT + 1, 65536) if p not in taken)
        draft.put("status", "listen", f"127.0.0.1:{free}", f"vllmwatch's status port (its "
                  f"default {STATUS_PORT} is the line's port, which clients keep)")
        draft.changed += 1


STATUS_PORT = 9101  # status.listen's default port (config/sections.py)


def _port_of(put: object) -> int | None:
    """The port of a draft's (value, note) listen entry."""
    if not isinstance(put, tuple) or not isinstance(put[0], str):
        return None
    tail = put[0].rpartition(":")[2]
    return int(tail) if tail.isdigit() else None


def _addresses(draft: Draft, facts: Facts) -> None:
    given = "host" in draft.vllm
    host = str(draft.vllm.get("host", ALL))
    port = draft.vllm.get("port", VLLM_DEFAULT_PORT)
    port = port if isinstance(port, int) else VLLM_DEFAULT_PORT
    if not facts.gate:
        if not given:
            draft.set("host", ALL, "the line had no --host: vLLM then listens on every "
                      "interface, and clients on other machines may use it; kept (write "
                      '"127.0.0.1" to serve this machine only)')
            draft.changed += 1
        draft.said.append(f"clients keep {shown(host, port)}: vLLM binds it as the hand-run "
                          "line did (`init --gate` puts vllmwatch's front door there "
                          "instead, holding requests while vLLM restarts)")
        return
    private = port + 1 if port < 65535 else port - 1
    draft.put("gate", "enabled", True, "init --gate: vllmwatch's front door holds requests "
              "while vLLM starts or restarts instead of refusing them")
    draft.put("gate", "listen", joined(host, port), "the address the hand-run vLLM had "
              f"({shown(host, port)}{'' if given else ', its default'}): clients keep it")
    draft.put("drain", "deregister_delay", "0s", "no balancer to wait for: the gate holds "
              "requests at once")
    draft.set("host", "127.0.0.1", "behind the gate vLLM listens on loopback only (never "
              "its own port on the network beside the gate)")
    draft.set("port", private, f"vLLM's private port behind the gate (the line's {port} is "
              "gate.listen's); any free port will do")
    draft.changed += 2
    draft.said.append(f"clients keep {shown(host, port)}: the gate listens there; vLLM moves "
                      f"to 127.0.0.1:{private}")
