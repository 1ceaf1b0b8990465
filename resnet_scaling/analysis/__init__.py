"""What the library knows about hardware, compiled programs and convergence: for reports, not for training.

| module | job |
|---|---|
| `hardware.py` | one table of peak FLOP/s, HBM and link bandwidths per device kind; the host's CPU |
| `compiled.py` | FLOPs and memory per device of a compiled step, from XLA's cost and memory analyses |
| `aot.py` | the real train step compiled ahead of time for a TPU topology this machine does not have |
| `hlo.py` | the collectives of a compiled program and the bytes they move |
| `convergence.py` | epochs to MLPerf's ResNet target at a global batch, from MLPerf's reference runs |
| `step_model.py` | seconds per step from a compiled program, calibrated per chip generation |
| `planning.py` | time and cost to the target on a system, from its predicted step (`planner.py`) |
| `shipped_reports.py` | the shipped TPU configs' compile reports (`compile --shipped`), kept while current |
"""
