"""Incident records: the evidence of an unplanned restart, written before the tree is killed.

record.py builds one (the sections of docs/operations/incidents.md "Incidents"), dumpers.py
reads the Python stacks (py-spy, faulthandler through hook/sitecustomize.py), the one
redactor (config/redact.py) keeps secrets out, store.py places and prunes records, report.py
renders one for a person, cli.py is `vllmwatch incidents`. The shell (shell/effects.py)
gathers the live inputs and runs a capture in a worker thread; the core decides when
(core/incidents.py).
May import: config, core (types), logfn.
"""
