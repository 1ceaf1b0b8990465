"""The run's resilience: what keeps a run going, or ends it in one true line, when something around it fails.

| guard | the failure it handles | module | tests/ |
|---|---|---|---|
| joining | a peer never starts or reaches the coordinator; a taken port | `distributed.py` | `test_launch` |
| dead peer | a process killed (kill -9, OOM) or frozen later | `distributed.py` | `test_multiprocess` |
| preemption | SIGTERM, Ctrl-C: all save at one step, exit 0 | `preemption.py` | `test_checkpointing` |
| SLURM jobs | no srun step; a task killed under `--kill-on-bad-exit` | `distributed.py` | `test_slurm` |
| divergence | a NaN or exploding state: never kept | `divergence.py` | `test_faults` |
| integrity | bytes changed silently (a flipped bit) | `state_checks.py` | `test_faults` |
| one run | a second run on a live workdir; a stale or damaged lock | `workdir.py` | `test_workdir_lock` |
| disks | an unwritable workdir; a full, over-quota or read-only disk | `workdir.py` | `test_faults` |
| run files | a run file (`goodput.json`) cut short | `workdir.py` | `test_workdir_files` |

In more detail: joining is `maybe_initialize` (one `error:` line where JAX would abort), the dead peer the
`PeerWatchdog` (also `test_dead_peer`; once the job is stopping, after a preemption notice or a failure in
this process, it names a silent peer after 10 s, within SLURM's KillWait), preemption the `PreemptionWatcher`
(jax's preemption sync point with several processes, then `distributed.leave`, so that process 0's coordinator
outlives the others' last calls; SIGTERM and SIGKILL at random steps resume bit for bit), integrity the
fingerprints that `checkpointing.py` checks on restore, the lock `WorkdirLock`, disks `check_writable` and
`is_storage_full` (also `test_failure_exits`), run files `read_json` and `set_aside`. None of them changes
what a step computes.
"""
