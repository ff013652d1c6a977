"""What a SIGHUP would apply, checked the way the daemon checks it.

Shared by the daemon's reload (on its worker thread) and `vllmwatch check --config-only`,
which the units run as the first `ExecReload=` before the signal: a config the daemon would
refuse then fails `systemctl reload` itself (non-zero, shown by `systemctl status`), instead
of a reload that "succeeds" while the daemon keeps the old config and only logs why.
"""

from __future__ import annotations

from vllmwatch.config import command
from vllmwatch.config.schema import Config, load


def load_for_reload(path: str) -> Config:
    """The config at path, loaded and validated; ConfigError when a reload would refuse it.

    The API key file is read too: a key file that can never work (a directory, a FIFO) is
    refused now, not at the next launch; one that is briefly missing or empty (a key rotation
    replaces the file) is not refused, as the daemon retries it.
    """
    config = load(path)
    try:
        command.read_api_key(config)
    except command.KeyFileError as exc:
        if not exc.transient:
            raise
    return config
