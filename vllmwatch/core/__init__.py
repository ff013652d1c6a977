"""The pure core: states and their transition table, events and actions, step(), the restart
ladder, serving verdicts, leak rules, policies, the GPU release decision, sample types, the
canary kinds (canary.py) and the GPU hardware-fault verdict (gpufault.py).

No I/O, no clock, no logging: time comes in as an argument, effects go out as data.
May import: vllmwatch.config and the stdlib's pure parts (tests/test_purity.py enforces it).
"""
