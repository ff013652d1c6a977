"""Pure: what a SIGHUP that changes [[adapters]] or [lora] does (issue 38).

Live (vLLM's /v1/load_lora_adapter and /v1/unload_lora_adapter, on with `[lora] live =
true`) only when the running vLLM can take the change as it is: it was launched with LoRA
on (so not for the first adapter), with a max-lora-rank that holds the new adapters and, when
max-loras follows the adapters' count, room for them. Anything else is a planned restart
through the ladder (drained, the gate holds requests), and the next launch carries the new
adapters on its command line. A live change is made only while READY: a start under way
restarts with the new flags (the old ones are on its command line), a restart under way
launches with them anyway. Also: a start vLLM ended because it refused an adapter
(start_refused). Imported only when adapters or [lora] change (core/reload.py), or a start
with adapters fails (core/machine.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from vllmwatch.config import adapters as adaptercfg
from vllmwatch.config.redact import REDACT
from vllmwatch.config.sections import AdapterConfig, Config
from vllmwatch.core import exitcodes
from vllmwatch.core.actions import Action, Log
from vllmwatch.core.state import WatchState


@dataclass(frozen=True)
class AdapterChange:
    """A reload's adapter change and how it is applied."""

    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    repointed: tuple[str, ...] = ()  # same name, another path or rank
    how: str = "none"  # none | live | restart
    why: str = ""
    load: tuple[AdapterConfig, ...] = ()  # live: added and repointed (in place)
    unload: tuple[str, ...] = ()  # live: removed

    @property
    def changed(self) -> bool:
        """Adapters were added, removed or repointed."""
        return bool(self.added or self.removed or self.repointed)

    def fields(self) -> dict[str, object]:
        """The config.reloaded fields that say what changed and how."""
        return {"adapters_added": list(self.added), "adapters_removed": list(self.removed),
                "adapters_repointed": list(self.repointed), "how": self.how,
                "adapters_why": self.why}


def decide(old: Config, new: Config, ready: bool) -> AdapterChange:
    """The change from the running config to the new one; how is "none" when nothing of
    the adapters or [lora] changed."""
    before = {a.name: a for a in old.adapters}
    after = {a.name: a for a in new.adapters}
    added = tuple(n for n in after if n not in before)
    removed = tuple(n for n in before if n not in after)
    # path or rank: `required` is the smoke check's, nothing vLLM is launched or loaded with
    repointed = tuple(n for n in after if n in before and (after[n].path, after[n].rank)
                      != (before[n].path, before[n].rank))
    change = AdapterChange(added, removed, repointed)
    if not change.changed and (old.lora == new.lora or not new.adapters):
        return change  # [lora] alone does nothing to a launch without adapters
    why = _why_restart(old, new, ready)
    if why:
        return AdapterChange(added, removed, repointed, "restart", why)
    return AdapterChange(added, removed, repointed, "live", "lora.live = true",
                         load=tuple(after[n] for n in (*added, *repointed)), unload=removed)


def _why_restart(old: Config, new: Config, ready: bool) -> str:
    if old.lora != new.lora:
        return "[lora] changed: its flags and environment are on vLLM's command line"
    if not new.lora.live:
        return "lora.live = false: adapters are applied by a launch"
    if not old.adapters:
        return "the first adapter: vLLM runs without --enable-lora"
    if not ready:
        return "not READY: the launch under way or next carries the new adapters"
    was, now = adaptercfg.plan(old), adaptercfg.plan(new)
    if now.max_lora_rank > was.max_lora_rank:
        return (f"rank {now.largest_r} needs --max-lora-rank {now.max_lora_rank}; vLLM runs "
                f"with {was.max_lora_rank}")
    if not new.lora.max_loras and now.max_loras > was.max_loras:
        return (f"{now.max_loras} adapters, above --max-loras {was.max_loras} (set "
                "lora.max_loras to leave room for live adds)")
    return ""


# What vLLM 0.32 says when an adapter on --lora-modules cannot be loaded at start
# (init_static_loras raises; seen on the CPU vLLM): the start fails as a whole.
START_REFUSED = ("Call to add_lora method failed", "init_static_loras", "No adapter found for")


def start_refused(s: WatchState, lines: tuple[str, ...]) -> tuple[WatchState, list[Action]]:
    """A start vLLM ended because it refused an adapter: the next launch leaves out the
    adapters with `required = false` (vLLM does not say which one it refused, so all of
    them), and says so with vLLM's line. A SIGHUP puts them back (they count as added). A
    required adapter stays: its start fails again and the crash-loop guard decides."""
    said = next((ln for ln in reversed(lines) if any(m in ln for m in START_REFUSED)), None)
    if said is None:
        return s, []
    optional = tuple(a.name for a in s.config.adapters if not a.required)
    kept = tuple(a for a in s.config.adapters if a.required)
    fields: dict[str, object] = {"error": REDACT.head(said.strip(), 300),
                                 "left_out": list(optional)}
    if not optional:
        fields["detail"] = ("every adapter is required: the start fails; fix the adapter or set "
                            f"required = false, then {exitcodes.systemctl(s.unit, 'reload')}")
        return s, [Log("error", "lora.start_refused", fields)]
    fields["detail"] = ("vLLM refused an adapter at start; the next launch leaves out the "
                        "adapters with required = false; fix it, then "
                        f"{exitcodes.systemctl(s.unit, 'reload')} to bring them back")
    s = replace(s, config=replace(s.config, adapters=kept))
    return s, [Log("error", "lora.start_refused", fields)]
