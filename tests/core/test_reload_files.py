"""A key file or vllm.env_file rewritten in place (a rotation: same path, new contents) and
SIGHUP relaunches the serving engine, drained, so it answers the new key; the config's text
did not change, so only what the launch read is compared (config/command.file_inputs, the
shell's digests in Spawned.inputs and ReloadRequested.serving_inputs). A part unknown on
either side (a file mid-rotation) is not compared: the next launch reads it."""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from tests.core.test_core_properties import CONFIG, CoreMachine, _ready
from vllmwatch.core.events import Event, ReloadRequested, Spawned

PARTS = ("the API key", "vllm.env_file's contents")
LAUNCHED = tuple((p, "a" * 64) for p in PARTS)


class FilesWorld(CoreMachine):
    """Launches report what they read (as the shell's Spawned does)."""

    def _launch(self) -> Event:
        ev = super()._launch()
        return dataclasses.replace(ev, inputs=LAUNCHED) if isinstance(ev, Spawned) else ev


def _reload(now: dict[str, str]) -> FilesWorld:
    m = FilesWorld()
    _ready(m)
    assert m.s.child is not None and m.s.child.proc.inputs == LAUNCHED
    m._step(ReloadRequested(CONFIG, serving_inputs=tuple(now.items())))
    return m


def _restarts(m: FilesWorld) -> list[dict[str, object]]:
    return [a.fields for a in m.history
            if getattr(a, "event", None) == "restart.begin"]


@given(st.dictionaries(st.sampled_from(PARTS), st.sampled_from(["a" * 64, "b" * 64])))
def test_a_reload_relaunches_exactly_when_a_file_it_read_changed(now: dict[str, str]) -> None:
    m = _reload(now)
    differs = [p for p, sha in now.items() if sha != "a" * 64]
    begun = _restarts(m)
    reloaded = [a.fields for a in m.history if getattr(a, "event", None) == "config.reloaded"]
    assert reloaded[-1]["restart_needed"] is bool(differs)
    if differs:
        assert [b["reason"] for b in begun] == ["reload"], begun
        assert all(p in str(begun[0]["detail"]) for p in differs), begun
    else:
        assert not begun


def test_the_key_rotated_is_named_and_drains() -> None:
    m = _reload({"the API key": "b" * 64, "vllm.env_file's contents": "a" * 64})
    begin = _restarts(m)[0]
    assert begin["detail"] == "the API key changed"
    assert any(getattr(a, "event", None) == "drain.begin" for a in m.history)


def test_unknown_files_are_no_change() -> None:
    assert not _restarts(_reload({}))  # both unreadable at the reload
