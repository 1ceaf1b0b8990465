"""The host process: what a command sets up before JAX starts a backend, and host-side tuning.

| module | job |
|---|---|
| `process_setup.py` | `start_process` (platform, flags, CPU memory, a job); `start_host_compiler` |
| `xla_flags.py` | XLA, libtpu and NCCL flags for throughput per backend; no TPU probe without a TPU |
| `stopping.py` | SIGINT, SIGTERM from a command's first line: any phase stops within seconds, in one line |
| `memory.py` | CPU steps: glibc keeps what a step frees for the next, instead of faulting it in again |
"""
