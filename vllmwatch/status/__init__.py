"""What the outside sees: the read-only status endpoint over the latest snapshot, its HTTP
guard, Prometheus metrics (metrics.py; the gate's, the spare's and the adapters' in
gatemetrics.py, sparemetrics.py and adaptermetrics.py, imported only when those are on), the
one-line STATUS text, and the `vllmwatch status` CLI (cli.py) with its human view (view.py).

May import: core (read-only types), config, logfn, bounded_http (the CLI's HTTP client).
"""
