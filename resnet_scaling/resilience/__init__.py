"""The run's resilience: what keeps a run going, or ends it in one true line, when something around it fails.

| module | job |
|---|---|
| `distributed.py` | joining a multi-process job (flags, environment, SLURM, TPU VMs); the peer watchdog |
| `preemption.py` | SIGTERM and Ctrl-C: every process stops at the same step, so the run saves and ends |
| `divergence.py` | no checkpoint holds a diverged state; the error names the newest sound one |
| `state_checks.py` | content fingerprints of a checkpointed state; its health before a save |

Each guard of the run, the failure it handles and the test that proves it: docs/how_it_works.md, "The run's
guards". None of them changes what a step computes.
"""
