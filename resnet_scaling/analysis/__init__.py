"""What the library knows about hardware and compiled programs: for reports, not for training.

| module | job |
|---|---|
| `hardware.py` | one table of peak FLOP/s and HBM per device kind (MFU, AOT memory fit); the host's CPU |
| `aot.py` | the real train step compiled ahead of time for a TPU topology this machine does not have |
| `hlo.py` | the collectives of a compiled program and the bytes they move |
"""
