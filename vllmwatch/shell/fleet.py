"""Fleet-safe settings: the per-host key that spreads quiet-hours restarts across a fleet."""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Callable, Sequence

from vllmwatch.config.schema import Config
from vllmwatch.config.units import spread

MACHINE_ID_PATHS = ("/etc/machine-id", "/var/lib/dbus/machine-id")


def host_key(instance: str, paths: Sequence[str] = MACHINE_ID_PATHS) -> str:
    """machine-id (else the hostname) plus the instance: stable, and distinct per instance.

    Containers often share an empty or baked-in machine-id; the hostname (the pod name)
    differs there, so it is part of the key too.
    """
    machine = ""
    for path in paths:
        try:
            with open(path) as f:
                machine = f.read().strip()
        except OSError:
            continue
        if machine:
            break
    return f"{machine}:{socket.gethostname()}:{instance}"


def spread_config(config: Config, log: Callable[..., None], key: str | None = None) -> Config:
    """The config with restart.quiet_hours moved to this host's slot inside the window."""
    r = config.restart
    if not r.quiet_hours or r.quiet_hours_spread <= 0:
        return config
    key = host_key(f"{config.vllm.port}") if key is None else key
    window = spread(r.quiet_hours, key, r.quiet_hours_spread)
    log("info", "quiet_hours.spread", configured=r.quiet_hours, this_host=window,
        spread=r.quiet_hours_spread)
    return dataclasses.replace(config, restart=dataclasses.replace(r, quiet_hours=window))
