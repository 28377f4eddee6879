"""A copy of the working tree with the request path compiled by mypyc, for its tests and benchmarks.

    python tools/compiled_tree.py build/compiled

Copies the files git tracks or would track (edits included, ignored files not) into the destination,
writing only what changed so that the next build recompiles only what changed, removes what the tree no
longer has, then builds the modules ``pyproject.toml`` lists as ``setup.py`` does for the image, beside
their sources in the copy. The tree itself never holds a compiled module (``tests/unit/test_compiled.py``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MARK = "COMPILED"
"""Left in the copy by a build that succeeded: ``tests/unit/test_compiled.py`` then expects every listed
module to load compiled there."""
KEPT = {"build", ".mypy_cache", MARK}  # the copy's own build products, reused by the next build


def tree_files(root: Path) -> list[str]:
    """The tree's files as git sees them: tracked or untracked-not-ignored, deleted ones left out."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=root,
        check=True,
        capture_output=True,
    ).stdout
    return [name for name in out.decode().split("\0") if name and (root / name).is_file()]


def sync(root: Path, dest: Path, names: list[str]) -> int:
    """Make ``dest`` hold exactly ``names`` from ``root`` (plus its build products); return how many were written."""
    wanted = set(names)
    written = 0
    for name in names:
        src, dst = root / name, dest / name
        data = src.read_bytes()
        if dst.is_file() and dst.read_bytes() == data:
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_bytes(data)
        shutil.copymode(src, dst)
        written += 1
    for path in dest.rglob("*"):
        rel = path.relative_to(dest)
        if rel.parts[0] in KEPT or "__pycache__" in rel.parts or path.suffix == ".so" or not path.is_file():
            continue
        if rel.as_posix() not in wanted:
            path.unlink()
    return written


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dest", type=Path, help="where the compiled copy lives (build/compiled)")
    args = parser.parse_args()
    dest = args.dest.resolve()
    if dest == ROOT or (ROOT in dest.parents and dest.relative_to(ROOT).parts[0] != "build"):
        parser.error("the copy goes under build/ or outside the tree, never over the sources")
    dest.mkdir(parents=True, exist_ok=True)
    written = sync(ROOT, dest, tree_files(ROOT))
    print(f"compiled_tree: {written} files updated in {dest}", flush=True)
    env = {**os.environ, "ENGINEGATE_COMPILE": "1"}
    build = [sys.executable, "setup.py", "--quiet", "build_ext", "--inplace"]
    (dest / MARK).unlink(missing_ok=True)
    for stale in dest.rglob("*.so"):  # a module no longer listed must not stay compiled (the build puts back the rest)
        if stale.relative_to(dest).parts[0] not in KEPT:
            stale.unlink()
    code = subprocess.run(build, cwd=dest, env=env, check=False).returncode
    if code == 0:
        (dest / MARK).write_text("built by tools/compiled_tree.py: the listed modules are compiled here\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
