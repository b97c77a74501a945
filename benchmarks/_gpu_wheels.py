"""The wheels a bare GPU machine lacks for ``make gpu-check`` (``make gpu-wheels`` fetches them where pip reaches an
index; the check installs them there, with no network), and the import check of each step's needs."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WHEELS = REPO / ".whl"
SITE = REPO / "benchmarks" / "work" / "gpu-site"

# what the GPU machines' python lacks of our runtime's imports, by distribution name; ``--download-wheels`` fetches
# them at the versions installed here (the ones our tests ran with): 13 MB, far under the 64 MiB the tree may carry
DEVICE_LACKS = ("zarr", "numcodecs", "crc32c", "google-crc32c", "donfig", "pydantic", "pydantic-core",
                "annotated-types", "typing-inspection", "typing-extensions", "pymetis")
# the modules a step may need that those wheels provide; any other a step lacks (tensorboard) the machine must have
CARRIED_MODULES = ("zarr", "numcodecs", "pydantic", "pymetis")
DEVICE_PYTHON = "3.12"
DEVICE_PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
                    "manylinux2014_x86_64", "manylinux1_x86_64")


def download_wheels() -> int:
    """Fetch DEVICE_LACKS for the GPU machines' platform into ``.whl/`` (run where pip reaches an index)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        pins = [f"{name}=={version(name)}" for name in DEVICE_LACKS]
    except PackageNotFoundError as err:
        print(f"error: {err.name} is not installed in {sys.executable}; run `make venv` first", file=sys.stderr)
        return 2
    platform = [arg for p in DEVICE_PLATFORMS for arg in ("--platform", p)]
    WHEELS.mkdir(exist_ok=True)
    for stale in WHEELS.glob("*.whl"):   # one version of each: two would stop the install on the GPU machine
        stale.unlink()
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--implementation",
           "cp", "--python-version", DEVICE_PYTHON, *platform, "-d", str(WHEELS), *pins]
    subprocess.run(cmd, check=True)
    size = sum(w.stat().st_size for w in WHEELS.glob("*.whl"))
    print(f"gpu-wheels: {len(pins)} wheels, {size / 2**20:.1f} MiB in {WHEELS}")
    return 0


def lacking_status(lacking: list[str]) -> str:
    """A step's status when its python cannot import ``lacking``: what fetches each (the wheels, or a pip install)."""
    carried = [m for m in lacking if m in CARRIED_MODULES]
    other = [m for m in lacking if m not in CARRIED_MODULES]
    fixes = ([f"`make gpu-wheels` where pip works carries {', '.join(carried)}"] if carried else []) + \
        ([f"`make gpu-wheels` does not carry {', '.join(other)}: pip install it there"] if other else [])
    return f"skipped: no {', '.join(lacking)} ({'; '.join(fixes)})"


def missing(modules: tuple[str, ...], env: dict[str, str]) -> list[str]:
    """Which of ``modules`` the steps' python cannot import under ``env`` (its PYTHONPATH)."""
    code = "import importlib.util, sys; print(','.join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))"
    out = subprocess.run([sys.executable, "-c", code, *modules], env=env, capture_output=True, text=True, check=True)
    return [m for m in out.stdout.strip().split(",") if m]


def install_wheels(env: dict[str, str], needed: tuple[str, ...], log: Callable[[str], None]) -> None:
    """When the steps' python lacks some of ``needed``: install ``.whl/*.whl`` into SITE (no index, no dependencies:
    the folder holds them all) and prepend SITE to the steps' PYTHONPATH. A failed install is logged; the steps
    that still lack a module then skip, saying which."""
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    if not missing(needed, env):
        return
    wheels = sorted(WHEELS.glob("*.whl"))
    if wheels and not (SITE / ".installed").exists():
        log(f"installing {len(wheels)} wheels from {WHEELS} into {SITE}")
        done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                               "--no-cache-dir", "--upgrade", "--target", str(SITE), *map(str, wheels)],
                              capture_output=True, text=True)
        if done.returncode:
            log(f"the wheels did not install: {done.stderr.strip().splitlines()[-1:]}")
            return
        (SITE / ".installed").touch()
    if SITE.exists():
        env["PYTHONPATH"] = os.pathsep.join((str(SITE), env["PYTHONPATH"]))
