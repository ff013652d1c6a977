"""What the outside sees: the read-only status endpoint over the latest snapshot, its HTTP
guard, Prometheus metrics, the one-line STATUS text, and the `vllmwatch status` CLI
(cli.py) with its human view (view.py).

May import: core (read-only types), config, logfn, bounded_http (the CLI's HTTP client).
"""
