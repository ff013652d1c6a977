"""The preflight checklist (`vllmwatch check`): base types and the runner, then one module per
group of checks (model, max-model-len, GPUs).

May import: config, shell (child/port helpers), prewarm (cache locations).
"""
