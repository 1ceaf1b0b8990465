"""Training-preprocessing throughput per host CPU core: the library's pipeline against a naive one.

Generates ImageNet-like JPEGs (500x375 pixels, quality 90, ~107 KiB: smooth regions, edges and fine
texture), holds them in memory (so disk and network are out of the measurement) and runs, in one
process and alternating, each variant as a tf.data pipeline with `--threads` threads:

- `library`: `resnet_scaling.data.preprocessing.preprocess_for_train` (fused decode-and-crop of a random
  area, resize to 224, flip), uint8 batches: what the trainer's input pipeline runs per image.
- `full_decode_uint8`: decode the whole JPEG, then the same crop, resize and flip, uint8 batches.
- `naive`: decode the whole JPEG, crop, resize, flip, and normalise to float32 (mean/std) on the host.

Each figure is the median over `--repeats` timed runs of `--images` images after a warm-up run.

    python benchmarks/input_pipeline.py --threads=1 --repeats=5
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from resnet_scaling.config import IMAGENET_MEAN_RGB, IMAGENET_STDDEV_RGB  # noqa: E402
from resnet_scaling.data import preprocessing  # noqa: E402

TPU_V2_CHIP_IMAGES_PER_SEC = 950  # The case study's per-chip rate (docs/case_study.md).
CHIPS_PER_TPU_V2_HOST = 4


def make_jpegs(count: int, width: int = 500, height: int = 375, quality: int = 90,
               seed: int = 0, texture_sigma: float = 60.0) -> list[bytes]:
    """Photo-like JPEGs: a smooth colour field, a few hard-edged shapes, and fine texture.

    The default texture makes ~107 KiB files at 500x375, quality 90: ImageNet's training JPEGs average
    about 110 KB, and decoding time follows the compressed size.
    """
    from PIL import Image, ImageDraw, ImageFilter

    rng = np.random.default_rng(seed)
    images = []
    for _ in range(count):
        coarse = rng.uniform(0, 255, (6, 8, 3)).astype(np.uint8)
        field = np.asarray(Image.fromarray(coarse).resize((width, height), Image.BICUBIC), np.float32)
        pil = Image.fromarray(field.astype(np.uint8))
        draw = ImageDraw.Draw(pil)
        for _ in range(6):
            x0, y0 = rng.integers(0, width), rng.integers(0, height)
            x1, y1 = x0 + rng.integers(20, 200), y0 + rng.integers(20, 150)
            colour = tuple(int(c) for c in rng.integers(0, 256, 3))
            (draw.ellipse if rng.random() < 0.5 else draw.rectangle)([x0, y0, x1, y1], fill=colour)
        texture = rng.normal(0, texture_sigma, (height, width, 3))
        texture = np.asarray(Image.fromarray(np.clip(texture + 128, 0, 255).astype(np.uint8))
                             .filter(ImageFilter.GaussianBlur(0.7)), np.float32) - 128
        pixels = np.clip(np.asarray(pil, np.float32) + texture, 0, 255).astype(np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, "JPEG", quality=quality)
        images.append(buffer.getvalue())
    return images


def _full_decode_crop(image_bytes, seed, config):
    crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    image = tf.io.decode_jpeg(image_bytes, channels=3)
    window = preprocessing.random_crop_window(tf.shape(image), crop_seed, config)
    image = tf.image.crop_to_bounding_box(image, window[0], window[1], window[2], window[3])
    image = tf.image.resize(image, [config.image_size, config.image_size], method=config.resize_method)
    return tf.image.stateless_random_flip_left_right(image, flip_seed)


def variants(config: preprocessing.PreprocessConfig) -> dict:
    mean = tf.constant(IMAGENET_MEAN_RGB) * 255
    std = tf.constant(IMAGENET_STDDEV_RGB) * 255
    return {
        "library": lambda b, s: preprocessing.preprocess_for_train(b, s, config),
        "full_decode_uint8": lambda b, s: tf.cast(
            tf.clip_by_value(tf.round(_full_decode_crop(b, s, config)), 0, 255), tf.uint8),
        "naive": lambda b, s: (_full_decode_crop(b, s, config) - mean) / std,
    }


def pipeline(jpegs: list[bytes], fn, threads: int, batch_size: int) -> tf.data.Dataset:
    ds = tf.data.Dataset.from_tensor_slices(jpegs).repeat().enumerate()
    ds = ds.map(lambda i, b: fn(b, tf.stack([tf.constant(0, tf.int64), i])), num_parallel_calls=threads)
    # No prefetch buffer: while the other variants are timed, a paused pipeline must not bank batches
    # that its next timed run would then get for free.
    ds = ds.batch(batch_size, drop_remainder=True)
    options = tf.data.Options()
    options.threading.private_threadpool_size = threads
    options.threading.max_intra_op_parallelism = 1
    options.autotune.enabled = False  # Exactly `threads` threads: a per-core figure, not autotuned.
    return ds.with_options(options)


def time_run(iterator, num_batches: int, batch_size: int) -> float:
    next(iterator)  # Untimed: takes what the map thread decoded while this variant waited.
    start = time.perf_counter()
    for _ in range(num_batches):
        next(iterator)
    return num_batches * batch_size / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1, help="decoding threads (host cores used)")
    parser.add_argument("--images", type=int, default=1024, help="images per timed run")
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--num_jpegs", type=int, default=256, help="distinct generated JPEGs, cycled")
    parser.add_argument("--output", default="benchmarks/results/input_pipeline.json")
    args = parser.parse_args()

    jpegs = make_jpegs(args.num_jpegs)
    config = preprocessing.PreprocessConfig()
    num_batches = max(1, args.images // args.batch_size)
    iterators = {name: iter(pipeline(jpegs, fn, args.threads, args.batch_size))
                 for name, fn in variants(config).items()}
    for iterator in iterators.values():  # Warm-up: tracing, thread start, allocator.
        time_run(iterator, num_batches, args.batch_size)
    runs = {name: [] for name in iterators}
    for _ in range(args.repeats):  # Alternate variants so drifts in machine load hit them alike.
        for name, iterator in iterators.items():
            runs[name].append(time_run(iterator, num_batches, args.batch_size))
    median = {name: statistics.median(r) for name, r in runs.items()}
    per_core = {name: m / args.threads for name, m in median.items()}
    cores_per_chip = TPU_V2_CHIP_IMAGES_PER_SEC / per_core["library"]
    result = {
        "command": "python benchmarks/input_pipeline.py " + " ".join(
            f"--{k}={v}" for k, v in vars(args).items() if k != "output"),
        "machine": {"processor": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
                    "tensorflow": tf.__version__},
        "jpegs": {"count": len(jpegs), "width": 500, "height": 375, "quality": 90,
                  "mean_kib": round(float(np.mean([len(j) for j in jpegs])) / 1024, 1)},
        "threads": args.threads,
        "images_per_sec": median,
        "images_per_sec_per_core": per_core,
        "runs": runs,
        "speedup_over_naive": median["library"] / median["naive"],
        "host_to_device_bytes_per_image": {"library": 224 * 224 * 3, "naive": 224 * 224 * 3 * 4},
        "cores_to_feed_one_tpu_v2_chip": cores_per_chip,
        "cores_to_feed_one_tpu_v2_host": cores_per_chip * CHIPS_PER_TPU_V2_HOST,
    }
    print(f"{len(jpegs)} JPEGs 500x375 q90, mean {result['jpegs']['mean_kib']} KiB; "
          f"{args.threads} thread(s); "
          f"median of {args.repeats} runs of {num_batches * args.batch_size} images")
    print(f"{'variant':<20}{'images/sec':>12}{'per core':>12}{'vs naive':>10}")
    for name in median:
        ratio = median[name] / median["naive"]
        print(f"{name:<20}{median[name]:>12.1f}{per_core[name]:>12.1f}{ratio:>9.2f}x")
    print(f"cores to feed one TPU v2 chip at {TPU_V2_CHIP_IMAGES_PER_SEC} images/sec: {cores_per_chip:.1f} "
          f"({cores_per_chip * CHIPS_PER_TPU_V2_HOST:.0f} per 4-chip host)")
    os.makedirs(os.path.dirname(args.output) or ".", exist_ok=True)
    with open(args.output, "w") as f:
        json.dump(result, f, indent=2)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
