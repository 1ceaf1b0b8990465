"""Training-preprocessing throughput per host CPU core: the library's pipeline against the flax ImageNet
example's and a naive one.

Generates ImageNet-like JPEGs (by default 500x375 pixels, quality 90, ~107 KiB: smooth regions, edges and
fine texture), holds them in memory (so disk and network are out of the measurement) and runs, in one
process and alternating, each variant as a tf.data pipeline with `--threads` threads:

- `library`: `resnet_scaling.data.preprocessing.preprocess_for_train` (decode only a random area of the JPEG,
  at reduced DCT scale when that area is at least 2x the output on both sides; resize to 224 in one
  bilinear op; flip), uint8 batches: what the trainer's input pipeline runs per image.
- `library_full_scale`: the same with `decode_at_reduced_scale=False` (identical to `library` unless a
  window reaches 2 x 224 on both sides, which 500x375 images never allow; see `--width`, `--height`).
- `flax_example`: the flax ImageNet example's `preprocess_for_train`, as written there
  (`flax_example_preprocess_for_train` below): the same decode-and-crop of a random area, bicubic resize,
  flip, mean/std normalisation on the host, float32 batches.
- `decode_crop_only`: not a pipeline, a floor: the library's window and decode-and-crop, nothing else
  (no resize, no flip; a constant image goes into the batch). Any pipeline that decodes the same windows
  with libjpeg needs at least this long.
- `full_decode_uint8`: decode the whole JPEG, then the same crop, resize and flip, uint8 batches.
- `naive`: decode the whole JPEG, crop, resize, flip, and normalise to float32 (mean/std) on the host.
- `previous` (with `--previous_file`): `preprocess_for_train` of another copy of preprocessing.py, e.g. the
  last commit's, for a before/after comparison in one run.

Each figure is the median over `--repeats` timed runs of `--images` images after a warm-up run; a ratio to
the flax example is the median over the repeats of the ratio within each repeat.

    python benchmarks/input_pipeline.py --threads=1 --repeats=5
    git show HEAD:resnet_scaling/data/preprocessing.py > /tmp/previous_preprocessing.py
    python benchmarks/input_pipeline.py --previous_file=/tmp/previous_preprocessing.py

On a machine shared with other jobs, timings drift with their load. `--count_instructions=VARIANT` counts
instead the CPU instructions one variant executes per image (128 images after a warm-up), which no other
job changes; it runs under valgrind's callgrind, one variant per process, whose counts callgrind writes
to the current folder:

    valgrind --tool=callgrind --instr-atstart=no "$(python -c 'import sys; print(sys.executable)')" \
        benchmarks/input_pipeline.py --count_instructions=library
"""

from __future__ import annotations

import argparse
import functools
import glob
import importlib.util
import io
import os
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import harness  # noqa: E402  (beside this script)
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from resnet_scaling.config import IMAGENET_MEAN_RGB, IMAGENET_STDDEV_RGB  # noqa: E402
from resnet_scaling.data import preprocessing  # noqa: E402

TPU_V2_CHIP_IMAGES_PER_SEC = 950  # The case study's per-chip rate (docs/case_study.md).
CHIPS_PER_TPU_V2_HOST = 4
VARIANTS = ("library", "library_full_scale", "flax_example", "decode_crop_only", "full_decode_uint8",
            "naive")


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


def flax_example_preprocess_for_train(image_bytes: tf.Tensor, image_size: int = 224) -> tf.Tensor:
    """The flax ImageNet example's training preprocessing, op for op.

    From google/flax examples/imagenet/input_pipeline.py (`preprocess_for_train` with its helpers
    `_decode_and_random_crop`, `distorted_bounding_box_crop`, `_decode_and_center_crop`, `_resize`,
    `normalize_image`), inlined, with dtype=float32: stateful random ops, a fused decode-and-crop of a
    random 8-100% area with aspect 3/4-4/3 and 10 attempts, the centre crop (224/256 of the shorter side)
    when the sampled box is the whole image, bicubic resize in float32, random flip, mean/std normalisation.
    """
    mean_rgb = [0.485 * 255, 0.456 * 255, 0.406 * 255]
    stddev_rgb = [0.229 * 255, 0.224 * 255, 0.225 * 255]
    crop_padding = 32

    def resize(image):
        return tf.image.resize([image], [image_size, image_size], method=tf.image.ResizeMethod.BICUBIC)[0]

    def decode_and_center_crop():
        shape = tf.io.extract_jpeg_shape(image_bytes)
        image_height, image_width = shape[0], shape[1]
        padded_center_crop_size = tf.cast(
            ((image_size / (image_size + crop_padding))
             * tf.cast(tf.minimum(image_height, image_width), tf.float32)), tf.int32)
        offset_height = ((image_height - padded_center_crop_size) + 1) // 2
        offset_width = ((image_width - padded_center_crop_size) + 1) // 2
        crop_window = tf.stack([offset_height, offset_width,
                                padded_center_crop_size, padded_center_crop_size])
        return resize(tf.io.decode_and_crop_jpeg(image_bytes, crop_window, channels=3))

    # _decode_and_random_crop -> distorted_bounding_box_crop
    bbox = tf.constant([0.0, 0.0, 1.0, 1.0], dtype=tf.float32, shape=[1, 1, 4])
    shape = tf.io.extract_jpeg_shape(image_bytes)
    bbox_begin, bbox_size, _ = tf.image.sample_distorted_bounding_box(
        shape, bounding_boxes=bbox, min_object_covered=0.1, aspect_ratio_range=(3.0 / 4, 4.0 / 3.0),
        area_range=(0.08, 1.0), max_attempts=10, use_image_if_no_bounding_boxes=True)
    offset_y, offset_x, _ = tf.unstack(bbox_begin)
    target_height, target_width, _ = tf.unstack(bbox_size)
    crop_window = tf.stack([offset_y, offset_x, target_height, target_width])
    image = tf.io.decode_and_crop_jpeg(image_bytes, crop_window, channels=3)
    original_shape = tf.io.extract_jpeg_shape(image_bytes)
    bad = tf.greater_equal(tf.reduce_sum(tf.cast(tf.equal(original_shape, tf.shape(image)), tf.int32)), 3)
    image = tf.cond(bad, decode_and_center_crop, lambda: resize(image))
    # preprocess_for_train
    image = tf.reshape(image, [image_size, image_size, 3])
    image = tf.image.random_flip_left_right(image)
    image -= tf.constant(mean_rgb, shape=[1, 1, 3], dtype=image.dtype)
    image /= tf.constant(stddev_rgb, shape=[1, 1, 3], dtype=image.dtype)
    return tf.image.convert_image_dtype(image, dtype=tf.float32)


def _full_decode_crop(image_bytes, seed, config):
    crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    image = tf.io.decode_jpeg(image_bytes, channels=3)
    window = preprocessing.random_crop_window(tf.shape(image), crop_seed, config)
    image = tf.image.crop_to_bounding_box(image, window[0], window[1], window[2], window[3])
    image = tf.image.resize(image, [config.image_size, config.image_size], method=config.resize_method)
    return tf.image.stateless_random_flip_left_right(image, flip_seed)


def _decode_crop_only(image_bytes, seed, config):
    crop_seed, _ = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    window = preprocessing.random_crop_window(tf.io.extract_jpeg_shape(image_bytes), crop_seed, config)
    image = tf.io.decode_and_crop_jpeg(image_bytes, window, channels=3)
    # Depends on the decode (so it runs) without touching more than one pixel of it.
    return tf.fill([config.image_size, config.image_size, 3], image[0, 0, 0])


def load_previous(path: str):
    """`preprocess_for_train` and a default `PreprocessConfig` from another copy of preprocessing.py."""
    spec = importlib.util.spec_from_file_location("previous_preprocessing", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # Dataclasses look their module up there.
    spec.loader.exec_module(module)
    config = module.PreprocessConfig()
    return lambda b, s: module.preprocess_for_train(b, s, config)


def variants(config: preprocessing.PreprocessConfig, names=VARIANTS) -> dict:
    """{name: fn(image_bytes, seed) -> image} for the named variants."""
    mean = tf.constant(IMAGENET_MEAN_RGB) * 255
    std = tf.constant(IMAGENET_STDDEV_RGB) * 255
    full_scale = preprocessing.PreprocessConfig(decode_at_reduced_scale=False)
    fns = {
        "library": lambda b, s: preprocessing.preprocess_for_train(b, s, config),
        "library_full_scale": lambda b, s: preprocessing.preprocess_for_train(b, s, full_scale),
        "flax_example": lambda b, s: flax_example_preprocess_for_train(b, config.image_size),
        "decode_crop_only": lambda b, s: _decode_crop_only(b, s, config),
        "full_decode_uint8": lambda b, s: tf.cast(
            tf.clip_by_value(tf.round(_full_decode_crop(b, s, config)), 0, 255), tf.uint8),
        "naive": lambda b, s: (_full_decode_crop(b, s, config) - mean) / std,
    }
    return {name: fns[name] for name in names}


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


def count_instructions(jpegs: list[bytes], fn, batch_size: int, num_batches: int) -> float:
    """Instructions per image that `fn` costs in a one-thread pipeline, from valgrind's callgrind.

    The process must run under `valgrind --tool=callgrind --instr-atstart=no`, with callgrind's default
    output file (`callgrind.out.<pid>`) in the current folder; `callgrind_control` switches counting on for
    `num_batches` batches after a warm-up and dumps the totals.
    """
    iterator = iter(pipeline(jpegs, fn, 1, batch_size))
    for _ in range(3):  # Tracing, allocator, thread start.
        next(iterator)
    pid = str(os.getpid())

    def control(*flags):
        subprocess.run(["callgrind_control", *flags, pid], check=True, capture_output=True)

    control("--instr=on")
    control("--zero")
    for _ in range(num_batches):
        next(iterator)
    control("--dump=input_pipeline")
    control("--instr=off")
    dumps = sorted(glob.glob(f"callgrind.out.{pid}.*"), key=lambda path: int(path.rsplit(".", 1)[1]))
    if not dumps:
        raise SystemExit(f"No callgrind.out.{pid}.* here: run under valgrind --tool=callgrind (see --help).")
    with open(dumps[-1]) as f:
        totals = next(line for line in f if line.startswith("totals:"))
    return int(totals.split()[1]) / (num_batches * batch_size)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1, help="decoding threads (host cores used)")
    parser.add_argument("--images", type=int, default=1024, help="images per timed run")
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--num_jpegs", type=int, default=256, help="distinct generated JPEGs, cycled")
    parser.add_argument("--width", type=int, default=500, help="generated JPEGs' width")
    parser.add_argument("--height", type=int, default=375, help="generated JPEGs' height")
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help="comma-separated names from VARIANTS; library and flax_example always run")
    parser.add_argument("--previous_file", default=None,
                        help="another copy of preprocessing.py, timed as the `previous` variant")
    parser.add_argument("--count_instructions", default=None, metavar="VARIANT",
                        help="count one variant's instructions per image under callgrind instead of timing")
    harness.add_flags(parser, repeats=5, json_out="benchmarks/results/input_pipeline.json")
    args = parser.parse_args(argv)
    names = [n for n in args.variants.split(",") if n]
    if args.count_instructions and args.count_instructions not in (*VARIANTS, "previous"):
        parser.error(f"--count_instructions: choose from {', '.join(VARIANTS)}, previous")
    unknown = sorted(set(names) - set(VARIANTS))
    if unknown:
        parser.error(f"--variants: unknown {', '.join(unknown)}; choose from {', '.join(VARIANTS)}")
    args.variants = ",".join(["library", "flax_example"] + [n for n in names if n not in
                                                             ("library", "flax_example")])
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    jpegs = make_jpegs(args.num_jpegs, width=args.width, height=args.height)
    config = preprocessing.PreprocessConfig()
    num_batches = max(1, args.images // args.batch_size)
    fns = variants(config, args.variants.split(","))
    if args.previous_file:
        fns["previous"] = load_previous(args.previous_file)
    if args.count_instructions:
        name = args.count_instructions
        fn = fns[name] if name in fns else variants(config, [name])[name]
        per_image = count_instructions(jpegs, fn, batch_size=32, num_batches=4)
        print(f"{name}: {per_image / 1e6:.2f} M instructions per image ({args.width}x{args.height} JPEGs)")
        return {"variant": name, "instructions_per_image": per_image}
    iterators = {name: iter(pipeline(jpegs, fn, args.threads, args.batch_size)) for name, fn in fns.items()}
    for iterator in iterators.values():  # Warm-up: tracing, thread start, allocator.
        time_run(iterator, num_batches, args.batch_size)
    runs = harness.alternate({name: functools.partial(time_run, iterator, num_batches, args.batch_size)
                              for name, iterator in iterators.items()}, args.repeats)
    median = harness.medians(runs)
    per_core = {name: m / args.threads for name, m in median.items()}
    vs_flax = {name: harness.median_ratio(r, runs["flax_example"]) for name, r in runs.items()}
    cores_per_chip = TPU_V2_CHIP_IMAGES_PER_SEC / per_core["library"]
    result = {
        "environment": harness.environment(tensorflow=tf.__version__),
        "options": {k: v for k, v in vars(args).items() if k != "json_out" and v is not None},
        "jpegs": {"count": len(jpegs), "width": args.width, "height": args.height, "quality": 90,
                  "mean_kib": round(float(np.mean([len(j) for j in jpegs])) / 1024, 1)},
        "threads": args.threads,
        "images_per_sec": median,
        "images_per_sec_per_core": per_core,
        "runs": runs,
        "speedup_over_flax_example": vs_flax,  # Median of the per-repeat ratios.
        "speedup_over_naive": median["library"] / median["naive"] if "naive" in median else None,
        "host_to_device_bytes_per_image": {"library": 224 * 224 * 3, "flax_example": 224 * 224 * 3 * 4},
        "cores_to_feed_one_tpu_v2_chip": cores_per_chip,
        "cores_to_feed_one_tpu_v2_host": cores_per_chip * CHIPS_PER_TPU_V2_HOST,
    }
    print(f"{len(jpegs)} JPEGs {args.width}x{args.height} q90, mean {result['jpegs']['mean_kib']} KiB; "
          f"{args.threads} thread(s); "
          f"median of {args.repeats} runs of {num_batches * args.batch_size} images")
    print(f"{'variant':<20}{'images/sec':>12}{'per core':>12}{'vs flax example':>17}")
    for name in median:
        print(f"{name:<20}{median[name]:>12.1f}{per_core[name]:>12.1f}{vs_flax[name]:>16.2f}x")
    print(f"cores to feed one TPU v2 chip at {TPU_V2_CHIP_IMAGES_PER_SEC} images/sec: {cores_per_chip:.1f} "
          f"({cores_per_chip * CHIPS_PER_TPU_V2_HOST:.0f} per 4-chip host)")
    if args.json_out:
        harness.write_json(args.json_out, result)
    return result


if __name__ == "__main__":
    main()
