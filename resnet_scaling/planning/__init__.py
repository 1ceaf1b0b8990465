"""Planning a run on hardware you may not have: the compiled step, its cost and time to accuracy. The
training path imports nothing from here (`python -m resnet_scaling.compile` and `planner` do).

| module | job |
|---|---|
| `aot.py` | the real train step compiled ahead of time for TPUs or GPUs this machine does not have |
| `gpu_targets.py` | the GPUs it compiles for: XLA's descriptions of them, the CUDA plugin's devices |
| `hlo.py` | the collectives of a compiled program and the bytes they move; a lowered module's FLOPs |
| `convergence.py` | epochs to MLPerf's ResNet target at a global batch, from MLPerf's reference runs |
| `step_model.py` | seconds per step from a compiled program, calibrated per chip generation |
| `estimates.py` | time and cost to the target on a system, from its predicted step (`planner.py`) |
| `shipped_reports.py` | the shipped TPU and GPU configs' compile reports (`compile --shipped`) |

Data: `compiled_reports/` (the shipped reports), `gpu_targets/` (XLA's GPU descriptions),
`step_calibration.json` (the step model's fits), `prices.json` (dated accelerator prices).

Only `aot.py` imports JAX (quietly, itself): the planner's model, its shipped reports and figures are plain
Python, so `python -m resnet_scaling.planner` starts without JAX unless a config has to be compiled.
"""

