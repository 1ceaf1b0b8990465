"""Planning a run on hardware you may not have: the compiled step, its cost and time to accuracy. The
training path imports nothing from here (`python -m resnet_scaling.compile` and `planner` do).

| module | job |
|---|---|
| `aot.py` | the real train step compiled ahead of time for a TPU topology this machine does not have |
| `hlo.py` | the collectives of a compiled program and the bytes they move |
| `convergence.py` | epochs to MLPerf's ResNet target at a global batch, from MLPerf's reference runs |
| `step_model.py` | seconds per step from a compiled program, calibrated per chip generation |
| `estimates.py` | time and cost to the target on a system, from its predicted step (`planner.py`) |
| `shipped_reports.py` | the shipped TPU configs' compile reports (`compile --shipped`), kept while current |

Data: `compiled_reports/` (the shipped reports), `step_calibration.json` (the step model's fits),
`prices.json` (dated accelerator prices).
"""
