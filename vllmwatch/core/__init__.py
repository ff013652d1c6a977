"""The pure core: states and their transition table, events (events.py) and actions
(actions.py), step(), the restart ladder's decisions (ladder.py: `begin_restart`, and `halt`,
the one way out) and the take-down it drives (stopping.py), the typed names with their tables
(names.py: `Reason`, `ProbeKind`), serving verdicts, leak rules, policies, the GPU release
gate, sample types, the canary kinds (canary.py) and the GPU hardware-fault verdict
(gpufault.py), and what a SIGHUP does (reload.py, imported only at a reload).

No I/O, no clock, no logging: time comes in as an argument, effects go out as data.
May import: vllmwatch.config and the stdlib's pure parts (tests/test_architecture.py enforces
it).
"""
