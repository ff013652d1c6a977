"""vllmwatch: a systemd-supervised watchdog that keeps one vLLM server healthy."""

__version__ = "0.1.0"
