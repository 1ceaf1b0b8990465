"""The process a command runs in: its job, its devices, its workdir, its signals. The bottom layer: it
imports nothing else of the package.

| module | job |
|---|---|
| `process_setup.py` | `start_process` (platform, flags, CPU memory, a job); `start_host_compiler` |
| `distributed.py` | a multi-process job: joining it (TPU slices, SLURM, local), a lost peer named |
| `stopping.py` | SIGINT, SIGTERM from a command's first line: any phase stops within seconds, in one line |
| `mesh.py` | the device mesh, batch shardings, host-local batches made global arrays |
| `errors.py` | the errors a user can act on (`RunError` and its kinds), each one line |
| `workdir.py` | the run's folder: its lock, atomic files, local or gs:// |
| `xla_flags.py` | XLA, libtpu and NCCL flags for throughput per backend; no TPU probe without a TPU |
| `memory.py` | CPU steps: glibc keeps what a step frees for the next, instead of faulting it in again |
| `tf_import.py` | TensorFlow, imported late and quietly (no Keras), where tf.data or `gs://` needs it |
| `hardware.py` | one table of peak FLOP/s, HBM and link bandwidths per device kind; the host's CPU |
| `console.py` | the console: our lines, other libraries' warnings, a bounded exit after an error |
| `native_noise.py` | native libraries' loading lines kept off the console (oneDNN; CUDA without a GPU) |
"""
