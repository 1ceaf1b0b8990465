"""The multi-process job: joining it, watching its peers and leaving it, with one true line when it fails.

| module | job |
|---|---|
| `distributed.py` | joining a multi-process job (flags, environment, SLURM, TPU VMs); the peer watchdog |

Each guard of the run (the job's here, the checkpoints' in checkpointing/, the workdir's in workdir.py), the
failure it handles and the test that proves it: docs/how_it_works.md, "The run's guards".
"""
