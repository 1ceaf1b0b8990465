"""The NVIDIA GPUs this machine compiles for without having one: XLA's target descriptions, shipped as data.

JAX compiles ahead of time for a GPU it does not have ("deviceless AOT"): the CUDA plugin describes the
devices from a `GpuTargetConfigProto` in text form, and XLA's GPU compiler builds the program for them with
a CUDA 12 `ptxas` (from `nvidia-cuda-nvcc-cu12`); no driver, cuDNN, cuBLAS or NCCL is loaded. The
descriptions are XLA's own (`gpu_targets/*.txtpb`, each with its source and commit), trimmed to the fields
the pinned jaxlib's proto has. Nothing is autotuned without the card: cuDNN's algorithms and workspaces,
cuBLAS's and Triton's tiles are XLA's defaults (docs/compiling_for_gpus.md).
"""

from __future__ import annotations

import pathlib
from typing import TYPE_CHECKING

from resnet_scaling.job import native_noise
from resnet_scaling.job.errors import MissingExtraError, RunError

if TYPE_CHECKING:
    import jax

TARGETS_DIR = pathlib.Path(__file__).with_name("gpu_targets")

# A lowercase substring of the card's name (`config.system.device_kind`, as `jax.Device.device_kind` spells
# it) -> its description. The first match wins: the 32 GB V100 before the 16 GB one, the A100's 80 GB before
# its 40 GB. The PCIe H100 is not here: XLA's description of it is not trimmed and checked yet.
TARGET_FILES: tuple[tuple[str, str], ...] = (
    ("v100-sxm2-32gb", "v100_32gb.txtpb"),
    ("v100", "v100.txtpb"),
    ("a100-sxm4-80gb", "a100_sxm_80.txtpb"),
    ("a100 80gb", "a100_sxm_80.txtpb"),
    ("a100", "a100_sxm_40.txtpb"),
    ("h100 80gb hbm3", "h100_sxm.txtpb"),
    ("h100 sxm", "h100_sxm.txtpb"),
    ("h200", "h200.txtpb"),
)
# GPUs per host in a multi-node target (NVIDIA's 8-GPU nodes).
GPUS_PER_HOST = 8
GPU_EXTRA = "gpu_compile"


class UnknownGpuError(RunError, ValueError):
    """A card with no shipped target description."""


def known_cards() -> list[str]:
    """The card names the shipped descriptions give (`device_description_str`), in table order."""
    names = []
    for _, filename in TARGET_FILES:
        name = _description_name((TARGETS_DIR / filename).read_text())
        if name not in names:
            names.append(name)
    return names


def _description_name(text: str) -> str:
    line = next(line for line in text.splitlines() if line.startswith("device_description_str:"))
    return line.split(":", 1)[1].strip().strip('"')


def _target_file(device_kind: str) -> str | None:
    kind = device_kind.lower()
    return next((f for substring, f in TARGET_FILES if substring in kind), None)


def is_known_card(device_kind: str) -> bool:
    """Whether a shipped description matches the card `device_kind`."""
    return _target_file(device_kind) is not None


def target_config(device_kind: str) -> str:
    """The `GpuTargetConfigProto` text of the card named `device_kind` ("Tesla V100-SXM2-16GB").

    Raises:
      UnknownGpuError: no shipped description matches (the message names the known cards).
    """
    filename = _target_file(device_kind)
    if filename is None:
        raise UnknownGpuError(f"no GPU target description for {device_kind!r}; known cards: "
                              f"{', '.join(known_cards())} (config.system.device_kind).")
    return (TARGETS_DIR / filename).read_text()


def topology_name(num_devices: int) -> str:
    """The plugin's topology name for `num_devices` GPUs: slices x hosts x GPUs per host."""
    if num_devices <= GPUS_PER_HOST:
        return f"1x1x{num_devices}"
    if num_devices % GPUS_PER_HOST:
        raise RunError(f"{num_devices} GPUs do not fill nodes of {GPUS_PER_HOST}: compile for a multiple of "
                       f"{GPUS_PER_HOST}.")
    return f"1x{num_devices // GPUS_PER_HOST}x{GPUS_PER_HOST}"


def gpu_devices(device_kind: str, num_devices: int) -> list[jax.Device]:
    """`num_devices` GPUs of the card `device_kind`, described for the compiler (no GPU needed).

    Raises:
      MissingExtraError: the CUDA plugin is not installed (the `gpu_compile` extra).
      UnknownGpuError: a card with no shipped description.
    """
    text = target_config(device_kind)  # An unknown card is said first, with or without the plugin.
    if not native_noise.cuda_plugin_installed():
        raise MissingExtraError(
            f"ahead-of-time compilation for a GPU needs JAX's CUDA 12 plugin and ptxas, which are not "
            f"installed: pip install 'resnet_scaling[{GPU_EXTRA}]' (from a checkout: pip install -e "
            f"'.[{GPU_EXTRA}]'); no GPU is needed.")
    native_noise.import_jax_quietly()  # The planning package imports JAX only where it is needed.
    from jax.experimental import topologies

    # platform "cuda", not "gpu": the latter is not a plugin's name (jax issue 23971).
    with native_noise.filtered_stderr(native_noise.CUDA_PLUGIN_NOISE):  # The plugin's "no driver" lines.
        description = topologies.get_topology_desc(platform="cuda", target_config=text,
                                                   topology=topology_name(num_devices))
    return list(description.devices)
