"""Two Cloud TPU v5e-256 slices joined by the data-center network (multislice): 512 chips, global batch 32768.

Each slice is a full v5e pod (16x16 chips, 16 GiB HBM each, 4 per host); no single v5e slice is larger.
`system.num_slices = 2` makes the mesh ("dcn", "data") = (2, 256) and splits the batch over both axes,
slice-major. XLA reduces the gradients inside each slice over ICI, all-reduces a piece per chip between the
two slices over DCN and reassembles the pieces over ICI: 2.04 MiB per chip cross DCN per step, against 48.6
MiB of bfloat16 gradients (benchmarks/README.md quotes the compiled step's report).

Recipe (`recipes.use_case_study_recipe` at 32,768 images per step, the case study's pod batch: 64 per chip):
the case study's r1.12 LARS (34 over 12 warm-up epochs), label smoothing 0.1, bfloat16 compute; 91 epochs:
3,558 steps. Batch norm over groups of 128 images (2 chips), as the pod-scale MLPerf runs normalised; a
group never leaves a slice.

Compile it on any machine with libtpu: `python -m resnet_scaling.compile --config=tpu_v5e_2slices`.
"""

from resnet_scaling.config import get_base_config, recipes


def get_config():
    config = get_base_config()
    recipes.set_system(config, name="2 x Cloud TPU v5e-256 (multislice, 512 chips)",
                       device_kind="TPU v5 lite", num_devices=512, topology="v5e:16x16")
    config.system.num_slices = 2  # `topology` is each slice's; the mesh spans both.
    config.model.compute_dtype = "bfloat16"
    config.model.bn_group_size = 128  # 2 chips x 64 images, inside one slice.
    config.training.global_batch_size = 32_768
    config.eval.global_batch_size = 32_768
    return recipes.use_case_study_recipe(config)
