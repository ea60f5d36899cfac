"""The llama.cpp every build path compiles: llama-cpp-python's sdist with our patches applied.

    python packaging/llama_source.py WORKDIR     prints the patched source folder (pip can build it)
    python packaging/llama_source.py --key       prints what identifies the build (version and patches' hash)
    python packaging/llama_source.py --version   prints the llama-cpp-python version it builds
    python packaging/llama_source.py --cmake-args
                                                 prints the CMake options every build adds: only the
                                                 libraries the app loads (llama, ggml), not mtmd or common

setup-venv.sh and the bundle scripts (Linux, macOS, Windows) build llama-cpp-python from the folder this
prints, so the app, the tests and the bundles all run the same kernels. The patches
(``packaging/llama-cpp-patches/``: ``series`` lists them in order, each has its reasoning at its top) are made
on one llama.cpp: the files they change are checked against the hashes in ``series`` first, then each patch is
applied with ``git apply``, which refuses a patch whose context no longer matches. A llama-cpp-python update
that changes the patched files stops the build here, with the reason, instead of building something else.

The app loads only libllama and ggml: every build also passes ``--cmake-args``, which leaves out the
multimodal library (``LLAVA_BUILD``) and llama.cpp's ``common`` library (``llama-core-only.cmake``), about
half of the objects a default build compiles.
"""

from __future__ import annotations

import hashlib
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

VERSION = "0.3.36"
PATCHES = Path(__file__).with_name("llama-cpp-patches")
SERIES = PATCHES / "series"
CORE_ONLY = Path(__file__).with_name("llama-core-only.cmake")
VENDORED = "vendor/llama.cpp"  # where the sdist keeps llama.cpp; the patch's paths are relative to it
CORE_ONLY_FLAGS = ["-DLLAVA_BUILD=OFF"]  # with CORE_ONLY included after llama.cpp's project()


def series() -> tuple[dict[str, str], list[Path]]:
    """What ``series`` lists: the sha256 of each file the patches change, before them, and the patches in order."""
    base: dict[str, str] = {}
    patches: list[Path] = []
    for number, line in enumerate(SERIES.read_text(encoding="utf-8").splitlines(), 1):
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        if words[0] == "base" and len(words) == 3:
            base[words[2]] = words[1]
        elif words[0] == "patch" and len(words) == 2:
            patches.append(PATCHES / words[1])
        else:
            fail(f"{SERIES}:{number}: expected 'base SHA256 PATH' or 'patch FILE', found {line!r}")
    return base, patches


def key() -> str:
    """The version and a hash of the patches and of the build options every path adds: other inputs, another build.

    The files are hashed by their content, not their paths, so two clones of the repo share a build.
    """
    _, patches = series()
    inputs = b"".join(patch.read_bytes() for patch in patches)
    inputs += CORE_ONLY.read_bytes() + " ".join(CORE_ONLY_FLAGS).encode()
    return f"{VERSION}+{hashlib.sha256(inputs).hexdigest()[:12]}"


def cmake_args() -> str:
    """The CMake options every build path adds to its own: build only the libraries the app loads."""
    include = f"-DCMAKE_PROJECT_llama.cpp_INCLUDE={CORE_ONLY.resolve().as_posix()}"
    return " ".join(shlex.quote(arg) for arg in [*CORE_ONLY_FLAGS, include])


def fail(message: str) -> None:
    sys.exit(f"llama_source.py: {message}")


def download_sdist(into: Path) -> Path:
    """The sdist from the package index (pip's own cache serves it again without a download)."""
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
           f"llama-cpp-python=={VERSION}", "-d", str(into)]
    run = subprocess.run(cmd, capture_output=True, text=True)
    found = sorted(into.glob(f"llama_cpp_python-{VERSION}.tar.gz"))
    if run.returncode != 0 or not found:
        fail(f"could not download llama-cpp-python {VERSION}'s source:\n{run.stderr.strip()}")
    return found[0]


def unpack(sdist: Path, into: Path) -> Path:
    with tarfile.open(sdist) as tar:
        if sys.version_info >= (3, 12):
            tar.extractall(into, filter="data")
        else:  # the sdist comes from the package index over TLS and its members are checked below
            for member in tar.getmembers():
                if member.name.startswith(("/", "..")) or ".." in Path(member.name).parts:
                    fail(f"unsafe path in {sdist.name}: {member.name}")
            tar.extractall(into)
    return into / f"llama_cpp_python-{VERSION}"


def apply_patches(source: Path) -> None:
    git = shutil.which("git")
    if git is None:
        fail("git is needed to apply the llama.cpp patches (git apply); install git and run again")
    vendored = source / VENDORED
    base, patches = series()
    changed = []
    for path, sha256 in base.items():
        file = vendored / path
        found = hashlib.sha256(file.read_bytes()).hexdigest() if file.is_file() else "no such file"
        if found != sha256:
            changed.append(f"  {path} is not the file the patches were made on ({sha256}; found {found})")
    if changed:
        fail(f"llama-cpp-python {VERSION}'s {VENDORED} is not the llama.cpp in {SERIES}; port the patches "
             "and update its base lines:\n" + "\n".join(changed))
    for patch in patches:
        check = subprocess.run([git, "apply", "--check", "--verbose", str(patch)], cwd=vendored,
                               capture_output=True, text=True)
        if check.returncode != 0:
            fail(f"{patch.name} no longer applies to llama-cpp-python {VERSION}'s llama.cpp; "
                 f"port it or drop it:\n{check.stderr.strip()}")
        subprocess.run([git, "apply", str(patch)], cwd=vendored, check=True)


def main(argv: list[str]) -> int:
    answers = {"--key": key, "--version": lambda: VERSION, "--cmake-args": cmake_args}
    if len(argv) == 1 and argv[0] in answers:
        print(answers[argv[0]]())
        return 0
    if len(argv) != 1 or argv[0].startswith("-"):
        print("usage: llama_source.py WORKDIR | --key | --version | --cmake-args", file=sys.stderr)
        return 2
    workdir = Path(argv[0]).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    target = workdir / f"llama_cpp_python-{key()}"
    if (target / ".patched").is_file():
        print(target)
        return 0
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        source = unpack(download_sdist(Path(tmp)), Path(tmp))
        apply_patches(source)
        (source / ".patched").write_text(key() + "\n", encoding="utf-8")
        if target.exists():
            shutil.rmtree(target)
        source.rename(target)
    print(target)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
