"""The gate never reuses an idle connection to vLLM that vLLM is closing, whatever vLLM's own
keep-alive (VLLM_HTTP_TIMEOUT_KEEP_ALIVE, 5 s by default; operators set it from 0 to 600): the
gate's figure is 0.4 x vLLM's, at most 2 s, none at 0 or at a value vLLM cannot parse; it is
read from the environment vLLM is started with (the daemon's, [vllm.env], vllm.env_file, in
that order), and a reload only ever shortens it. A reused connection that vLLM closes looks
like the engine's death: a healthy engine's client was held for a replay and got 503."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.shell.test_gate_replay import OK
from tests.shell.test_gate_review import ClosingUpstream, post
from tests.support import free_port, wait_for
from vllmwatch.config.schema import from_dict
from vllmwatch.gate import exchange
from vllmwatch.gate.door import Readiness
from vllmwatch.gate.exchange import child_env, keepalive_of, upstream_keepalive
from vllmwatch.gate.runner import Gate

VAR = exchange.VLLM_VAR


@pytest.mark.parametrize(("value", "seconds"), [
    (None, 2.0), ("5", 2.0), ("600", 2.0), ("4", 1.6), ("2", 0.8), ("1", 0.4), (" 3 ", 1.2),
    ("0", 0.0), ("-7", 0.0), ("2.5", 0.0), ("", 0.0), ("five", 0.0)])
def test_the_figure_follows_vllms_own(value: str | None, seconds: float) -> None:
    env = {} if value is None else {VAR: value}
    assert upstream_keepalive(env) == pytest.approx(seconds)


@given(st.one_of(st.none(), st.integers(-10**6, 10**6).map(str), st.text(max_size=8)))
def test_the_gate_always_lets_go_first(value: str | None) -> None:
    """The invariant: an idle connection the gate may still reuse is one vLLM keeps open
    (with a share of its figure left for the gate's clock, which starts after vLLM's)."""
    env = {} if value is None else {VAR: value}
    got = upstream_keepalive(env)
    assert 0.0 <= got <= exchange.KEEPALIVE
    try:
        vllm = int(value.strip()) if value is not None else exchange.VLLM_DEFAULT
    except ValueError:
        assert got == 0.0  # vLLM cannot parse it: never reused
        return
    assert got == 0.0 or got <= 0.4 * vllm


def test_the_environment_is_vllms_in_the_order_the_launch_builds_it(tmp_path: Path) -> None:
    env_file = tmp_path / "vllm.env"
    env_file.write_text(f"HF_TOKEN=secret\n{VAR}=1\n")
    base = {VAR: "600", "PATH": "/usr/bin"}
    only_env = from_dict({"vllm": {"model": "/m", "env": {VAR: "3"}}})
    assert child_env(only_env, base)[VAR] == "3"  # [vllm.env] over the daemon's own
    both = from_dict({"vllm": {"model": "/m", "env": {VAR: "3"}, "env_file": str(env_file)}})
    assert child_env(both, base)[VAR] == "1"  # the env file last, as config/command.build
    missing = from_dict({"vllm": {"model": "/m", "env_file": str(tmp_path / "absent")}})
    assert child_env(missing, base)[VAR] == "600"  # unreadable: the launch says so, not this
    assert keepalive_of(both) == pytest.approx(0.4)


def _gate(upstream_port: int, seconds: float | None = None) -> Gate:
    g = Gate(f"127.0.0.1:{free_port()}", f"http://127.0.0.1:{upstream_port}",
             lambda: Readiness.OPEN, 5.0, retry_after=1, generation=lambda: 1)
    if seconds is not None:
        g.forwarder.upstreams.keepalive = seconds  # as start_gate sets it from the config
    return g


@pytest.mark.parametrize("vllm_keepalive", [1, 2])
def test_a_short_vllm_keepalive_is_never_met_by_a_reuse(vllm_keepalive: int) -> None:
    """vLLM closes idle connections after 1 or 2 s: the gate's own 2 s was longer or equal,
    and the request after an idle of vLLM's figure met the close (503 after hold_timeout)."""
    with ClosingUpstream(idle=vllm_keepalive) as up:
        g = _gate(up.port, upstream_keepalive({VAR: str(vllm_keepalive)}))
        g.start()
        try:
            assert post(g.port) == (200, OK)
            mark = time.monotonic()
            wait_for(lambda: time.monotonic() - mark > vllm_keepalive + 0.2, 10,
                     "the connection to idle past vLLM's keep-alive")
            assert post(g.port) == (200, OK)
            assert up.closed == 0, "the gate reused a connection vLLM closes"
            assert (g.stats.failed_midrequest, g.stats.replayed) == (0, 0)
        finally:
            g.stop()


def test_vllm_keepalive_zero_means_no_reuse() -> None:
    """VLLM_HTTP_TIMEOUT_KEEP_ALIVE=0: uvicorn closes a connection right after its answer;
    any reuse, however soon, meets it. The gate opens a connection per request."""
    with ClosingUpstream(idle=0.0) as up:
        g = _gate(up.port, upstream_keepalive({VAR: "0"}))
        g.start()
        try:
            for _ in range(3):
                assert post(g.port) == (200, OK)
            assert up.closed == 0, "the gate reused a connection vLLM closes at once"
            assert g.stats.failed_midrequest == 0
        finally:
            g.stop()


def test_a_reload_shortens_the_keepalive_and_never_lengthens_it() -> None:
    """A reload that sets a shorter VLLM_HTTP_TIMEOUT_KEEP_ALIVE (the engine restarts with
    it) is taken at once; a longer one is not (the engine still running may have the old)."""
    with ClosingUpstream(idle=1.0) as up:
        g = _gate(up.port)
        g.start()
        try:
            assert post(g.port) == (200, OK)
            g.reconfigure(5.0, 1, True, 1, upstream_keepalive({VAR: "1"}))
            ups = g.forwarder.upstreams
            wait_for(lambda: ups.keepalive == pytest.approx(0.4), 10,
                     "the reload's keep-alive to be taken on the gate's loop")
            g.reconfigure(5.0, 1, True, 1, upstream_keepalive({VAR: "600"}))
            assert post(g.port) == (200, OK)  # after the second reload: its apply ran first
            assert ups.keepalive == pytest.approx(0.4)
            mark = time.monotonic()
            wait_for(lambda: time.monotonic() - mark > 1.2, 10, "an idle past vLLM's 1 s")
            assert post(g.port) == (200, OK)
            assert up.closed == 0, "the gate reused a connection vLLM closes"
            assert len(ups.retired) == 1  # the old session, kept for exchanges under way
        finally:
            g.stop()
        assert all(s.closed for s in (ups.main, *ups.retired) if s is not None)
