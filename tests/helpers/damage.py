"""Seeded damaged copies of a GGUF file, and how the command line takes them.

Damage the way downloads and disks do it, all within the first 2 MB (header, metadata, tensor
table): a few bytes flipped, an 8-byte field overwritten with 0, 2^31, 2^40 or all ones (at a real
8-byte field of the file half the time, anywhere the other half), 64 bytes zeroed, or the file cut
short. Each copy is opened with ``python -m engine generate --model COPY --prompt Hi --max-tokens 4``
with the model probe on and a fresh cache dir, and the outcome is sorted: answered (exit 0),
refused (exit 2), another exit code, killed by a signal, hung; plus a traceback on stderr and a
refusal longer than one line, which must never happen.

    .venv/bin/python -m tests.helpers.damage --count 1000 --jobs 2 --seed 1
    .venv/bin/python -m tests.helpers.damage --seed 1 --case 417      # one copy again, with its whole stderr
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 2 * 1024 * 1024  # damage stays in the header, metadata and tensor table (and the first weights)
FIELD_VALUES = (0, 2**31, 2**40, 2**64 - 1)
KINDS = ("flip", "field", "zero", "cut")
RUN_TIMEOUT = 240.0  # beyond the probe's own limit for a file of the bundled size (about 65 s)


# --- where a GGUF keeps its 8-byte fields ------------------------------------------------------


def u64_fields(data: bytes) -> list[int]:
    """Offsets of the 8-byte fields in a GGUF header read from ``data`` (the file's first bytes).

    Counts, string and array lengths, 64-bit values, tensor dimensions and offsets: the fields
    whose damage changes how the rest of the file is read. Stops where ``data`` ends.
    """
    scalar = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    out = [8, 16]
    pos = 24
    u32 = struct.Struct("<I").unpack_from
    u64 = struct.Struct("<Q").unpack_from

    def string() -> None:
        nonlocal pos
        out.append(pos)
        pos += 8 + u64(data, pos)[0]

    def value(vtype: int) -> None:
        nonlocal pos
        if vtype in scalar:
            if scalar[vtype] == 8:
                out.append(pos)
            pos += scalar[vtype]
        elif vtype == 8:
            string()
        elif vtype == 9:
            item = u32(data, pos)[0]
            out.append(pos + 4)
            count = u64(data, pos + 4)[0]
            pos += 12
            if item in scalar:
                if scalar[item] == 8:
                    out.extend(range(pos, pos + 8 * count, 8))
                pos += scalar[item] * count
            else:
                for _ in range(count):
                    value(item)
        else:
            raise ValueError(vtype)

    try:
        n_tensors, n_kv = u64(data, 8)[0], u64(data, 16)[0]
        for _ in range(n_kv):
            string()
            vtype = u32(data, pos)[0]
            pos += 4
            value(vtype)
        for _ in range(n_tensors):
            string()
            n_dims = u32(data, pos)[0]
            pos += 4
            out.extend(range(pos, pos + 8 * n_dims, 8))
            pos += 8 * n_dims + 4
            out.append(pos)
            pos += 8
    except (struct.error, ValueError):
        pass  # the rest lies beyond ``data``
    return [p for p in out if p + 8 <= len(data)]


# --- damage ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Damage:
    """One damaged copy: bytes written at offsets, or the length the file is cut to."""

    index: int
    kind: str
    patches: tuple[tuple[int, bytes], ...] = ()
    cut_to: int | None = None

    def describe(self) -> str:
        if self.cut_to is not None:
            return f"#{self.index} cut to {self.cut_to} bytes"
        if self.kind == "field":
            (off, raw), = self.patches
            return f"#{self.index} 8-byte field at {off} set to {int.from_bytes(raw, 'little'):#x}"
        if self.kind == "zero":
            return f"#{self.index} 64 bytes zeroed at {self.patches[0][0]}"
        return f"#{self.index} bytes flipped at " + ", ".join(f"{off} (to {raw.hex()})" for off, raw in self.patches)


def make_damage(index: int, seed: int, original: bytes, fields: list[int], file_size: int) -> Damage:
    """The ``index``-th damage of a run seeded with ``seed``; ``original`` holds the file's first LIMIT bytes."""
    rng = random.Random(f"{seed}:{index}")
    span = min(LIMIT, file_size)
    kind = rng.choice(KINDS)
    if kind == "cut":
        return Damage(index, kind, cut_to=rng.randrange(0, span))
    if kind == "field":
        off = rng.choice(fields) if fields and rng.random() < 0.5 else rng.randrange(0, span - 8)
        return Damage(index, kind, ((off, rng.choice(FIELD_VALUES).to_bytes(8, "little")),))
    if kind == "zero":
        return Damage(index, kind, ((rng.randrange(0, span - 64), bytes(64)),))
    patches = []
    for off in sorted(rng.sample(range(span), rng.randint(1, 4))):
        patches.append((off, bytes([original[off] ^ rng.randrange(1, 256)])))
    return Damage(index, kind, tuple(patches))


def write_damaged_copy(src: Path, dst: Path, damage: Damage) -> Path:
    """A copy of ``src`` at ``dst`` with ``damage`` applied."""
    shutil.copyfile(src, dst)
    apply_damage(dst, damage)
    return dst


def apply_damage(path: Path, damage: Damage) -> None:
    with open(path, "r+b") as fh:
        if damage.cut_to is not None:
            fh.truncate(damage.cut_to)
        for off, raw in damage.patches:
            fh.seek(off)
            fh.write(raw)


# --- one file of each kind a person may try to open ------------------------------------------------------

PREFIX = 64 * 1024  # enough of the file for the header checks that stop at its first fields


def _prefix_copy(src: Path, dst: Path, patches: tuple[tuple[int, bytes], ...] = (), size: int = PREFIX) -> Path:
    """The first ``size`` bytes of ``src`` at ``dst``, with ``patches`` written over them."""
    with open(src, "rb") as fh:
        data = bytearray(fh.read(size))
    for off, raw in patches:
        data[off : off + len(raw)] = raw
    dst.write_bytes(bytes(data))
    return dst


def bad_model_files(model: Path, folder: Path) -> dict[str, Path]:
    """A file of each kind that is not a model the app can open, made from ``model`` (the bundled one) in ``folder``.

    Not a GGUF (notes renamed .gguf), cut short in its weights (its first 5,000,000 bytes) and in its
    header (its first 1,000 bytes), a GGUF version newer than llama.cpp reads (4), the old version 1, a
    big-endian GGUF, an empty file, a folder named like a model, and a path with nothing there.
    """
    folder.mkdir(parents=True, exist_ok=True)
    notes = folder / "notes.gguf"
    notes.write_text("These are my notes, not a model.\n" * 20)
    empty = folder / "empty.gguf"
    empty.write_bytes(b"")
    directory = folder / "folder.gguf"
    directory.mkdir(exist_ok=True)
    return {
        "not gguf": notes,
        "cut in its weights": _prefix_copy(model, folder / "cut-weights.gguf", size=5_000_000),
        "cut in its header": _prefix_copy(model, folder / "cut-header.gguf", size=1000),
        "newer version": _prefix_copy(model, folder / "v4.gguf", ((4, struct.pack("<I", 4)),)),
        "version 1": _prefix_copy(model, folder / "v1.gguf", ((4, struct.pack("<I", 1)),)),
        "big-endian": _prefix_copy(model, folder / "big-endian.gguf", ((4, struct.pack(">I", 3)),)),
        "empty": empty,
        "folder": directory,
        "missing": folder / "moved-away.gguf",
    }


# --- running the command line on a copy ---------------------------------------------------------------


@dataclass(frozen=True)
class CopyOutcome:
    """How ``python -m engine generate`` ended on one damaged copy."""

    damage: Damage
    returncode: int | None  # None: hung (killed after the timeout)
    stderr: str
    seconds: float

    @property
    def outcome(self) -> str:
        rc = self.returncode
        if rc is None:
            return "hung (timeout)"
        if rc < 0:
            return "killed by a signal"
        return {0: "answered (exit 0)", 2: "refused (exit 2)"}.get(rc, "other exit code")

    @property
    def has_traceback(self) -> bool:
        return "Traceback" in self.stderr

    @property
    def long_refusal(self) -> bool:
        """A refusal must be exactly one line starting with "error: " and of a readable length."""
        if self.returncode != 2:
            return False
        lines = [ln for ln in self.stderr.splitlines() if ln.strip()]
        return len(lines) != 1 or not lines[0].startswith("error: ") or len(lines[0]) > 400

    def problems(self) -> list[str]:
        """What is wrong with this outcome ([] when it is an answer or a one-line refusal)."""
        found = []
        if self.outcome not in ("answered (exit 0)", "refused (exit 2)"):
            rc = self.returncode
            what = "hung" if rc is None else (signal.Signals(-rc).name if rc < 0 else f"exit {rc}")
            found.append(what)
        if self.has_traceback:
            found.append("traceback")
        if self.long_refusal:
            found.append("refusal not one short line")
        return found

    def message(self, copy_name: str = "") -> str:
        """The stderr's error line with paths and numbers blanked, to group similar messages."""
        lines = [ln.strip() for ln in self.stderr.splitlines() if ln.strip()]
        if self.returncode == 0:
            return "(answered)"
        errors = [ln for ln in lines if ln.startswith("error: ")]
        text = (errors or lines or ["(no stderr)"])[-1]
        text = re.sub(r"/\S+\.gguf", "COPY", text)
        text = re.sub(r"'[^']*'", "'…'", text)
        text = re.sub(r"\b(0x[0-9a-f]+|\d+)\b", "N", text)
        return text[:160]


_ENV_LOCK = threading.Lock()


def _threads_of(args: Iterable[str]) -> int:
    """The ``--threads`` among CLI arguments, else the CLI's default."""
    args = list(args)
    if "--threads" in args:
        return int(args[args.index("--threads") + 1])
    from engine.decoding.runtime import default_threads

    return default_threads()


def seed_cost_curve(copy: Path, home: Path, threads: int) -> None:
    """Give ``copy`` the reference cost curve in ``home``'s cache, as if this machine had been measured.

    Otherwise every copy that loads is first measured for Auto (6 s or more, far more on a busy
    machine), which tests the measurement, not the damage. The probe's own cache stays empty.
    """
    from engine.costs import curve

    with _ENV_LOCK:  # cache_dir() reads the environment; two workers seed at once
        old = os.environ.get("LOOKAHEAD_CHAT_HOME")
        os.environ["LOOKAHEAD_CHAT_HOME"] = str(home)
        try:
            curve.save_cached(str(copy), threads, curve.DEFAULT_CURVE)
        except OSError:
            pass  # a copy cut before its header cannot be keyed; the CLI refuses it anyway
        finally:
            if old is None:
                os.environ.pop("LOOKAHEAD_CHAT_HOME", None)
            else:
                os.environ["LOOKAHEAD_CHAT_HOME"] = old


def run_copy(model: Path, damage: Damage, workdir: Path, timeout: float = RUN_TIMEOUT,
             extra_args: Iterable[str] = (), measure: bool = False) -> CopyOutcome:
    """Write the damaged copy in ``workdir`` and run the CLI on it with the probe on and a fresh cache dir.

    Unless ``measure``, the copy's cost curve is seeded (see ``seed_cost_curve``).
    """
    workdir.mkdir(parents=True, exist_ok=True)
    copy = write_damaged_copy(model, workdir / "damaged.gguf", damage)
    home = Path(tempfile.mkdtemp(prefix="home-", dir=workdir))
    if not measure:
        seed_cost_curve(copy, home, _threads_of(extra_args))
    env = dict(os.environ, PYTHONPATH=str(ROOT), LOOKAHEAD_CHAT_HOME=str(home))
    env.pop("LOOKAHEAD_NO_PROBE", None)
    cmd = [sys.executable, "-m", "engine", "generate", "--model", str(copy), "--prompt", "Hi", "--max-tokens", "4",
           *extra_args]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env=env, cwd=ROOT, start_new_session=True)
    try:
        _, err = proc.communicate(timeout=timeout)
        rc: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the CLI and its probe child
        _, err = proc.communicate()
        rc = None
    seconds = time.perf_counter() - t0
    shutil.rmtree(home, ignore_errors=True)
    copy.unlink(missing_ok=True)
    return CopyOutcome(damage, rc, err.decode("utf-8", errors="replace"), seconds)


def run_copies(model: Path, count: int, seed: int, jobs: int = 2, timeout: float = RUN_TIMEOUT,
               on_done: Callable[[CopyOutcome], None] | None = None, indices: Iterable[int] | None = None,
               extra_args: Iterable[str] = (), measure: bool = False) -> list[CopyOutcome]:
    """Run ``count`` seeded damaged copies (or just ``indices``), ``jobs`` at a time; outcomes in index order."""
    size = model.stat().st_size
    with open(model, "rb") as fh:
        head = fh.read(LIMIT)
    fields = u64_fields(head)
    wanted = list(indices) if indices is not None else list(range(count))
    damages = [make_damage(i, seed, head, fields, size) for i in wanted]
    base = Path(tempfile.mkdtemp(prefix="damaged-models-"))
    slots = [base / f"slot{k}" for k in range(max(1, jobs))]
    free = list(slots)
    lock = threading.Lock()

    def one(d: Damage) -> CopyOutcome:
        with lock:
            slot = free.pop()
        try:
            out = run_copy(model, d, slot, timeout, extra_args, measure)
        finally:
            with lock:
                free.append(slot)
        if on_done is not None:
            on_done(out)
        return out

    try:
        with ThreadPoolExecutor(max_workers=len(slots)) as pool:
            return list(pool.map(one, damages))
    finally:
        shutil.rmtree(base, ignore_errors=True)


def summary(outcomes: list[CopyOutcome]) -> str:
    """Counts by outcome and by message, then every problem with how to run it again."""
    order = ["answered (exit 0)", "refused (exit 2)", "other exit code", "killed by a signal", "hung (timeout)"]
    by_outcome = Counter(o.outcome for o in outcomes)
    lines = ["by outcome:"]
    lines += [f"  {name:<32} {by_outcome.get(name, 0):>5}" for name in order]
    lines.append(f"  {'traceback in stderr':<32} {sum(o.has_traceback for o in outcomes):>5}")
    lines.append(f"  {'refusal longer than one line':<32} {sum(o.long_refusal for o in outcomes):>5}")
    lines.append("by message:")
    for msg, n in Counter(o.message() for o in outcomes).most_common():
        lines.append(f"  {n:>5}  {msg}")
    lines.append("by kind of damage (answered / refused / other):")
    for kind in KINDS:
        mine = [o for o in outcomes if o.damage.kind == kind]
        a = sum(o.returncode == 0 for o in mine)
        r = sum(o.returncode == 2 for o in mine)
        lines.append(f"  {kind:<6} {len(mine):>5}: {a} / {r} / {len(mine) - a - r}")
    bad = [o for o in outcomes if o.problems()]
    lines.append(f"problems: {len(bad)}")
    for o in bad:
        tail = " | ".join(ln.strip() for ln in o.stderr.strip().splitlines()[-3:])
        lines.append(f"  {o.damage.describe()}: {', '.join(o.problems())}: {tail[:300]}")
    secs = [o.seconds for o in outcomes]
    if secs:
        lines.append(f"seconds per copy: median {sorted(secs)[len(secs) // 2]:.1f}, max {max(secs):.1f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the damaged copies and print the summary; exit 1 if any copy died, hung or misreported."""
    parser = argparse.ArgumentParser(prog="python -m tests.helpers.damage", description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=100)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--model", help="GGUF file to damage (default: the bundled model)")
    parser.add_argument("--timeout", type=float, default=RUN_TIMEOUT, help="seconds before a copy counts as hung")
    parser.add_argument("--case", type=int, action="append", help="run only this copy (repeatable); prints its stderr")
    parser.add_argument("--threads", type=int, default=1,
                        help="llama.cpp threads per copy (default 1: jobs x threads should not exceed the cores)")
    parser.add_argument("--measure", action="store_true",
                        help="let the CLI measure this machine for Auto on every copy that loads (slow)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    if args.model:
        model = Path(args.model)
    else:
        from engine import default_model_path

        model = default_model_path()
    t0 = time.perf_counter()
    done = [0]
    total = len(args.case) if args.case else args.count

    def progress(o: CopyOutcome) -> None:
        done[0] += 1
        flag = f"  <-- {', '.join(o.problems())}" if o.problems() else ""
        print(f"[{done[0]}/{total}] {o.damage.describe()}: {o.outcome} in {o.seconds:.1f} s{flag}", file=sys.stderr,
              flush=True)
        if args.case:
            print(o.stderr, file=sys.stderr)

    outcomes = run_copies(model, args.count, args.seed, args.jobs, args.timeout, progress, indices=args.case,
                          extra_args=("--threads", str(args.threads)), measure=args.measure)
    print(f"damaged copies of {model.name}: {len(outcomes)} (seed {args.seed}), {args.jobs} at a time, "
          f"{time.perf_counter() - t0:.0f} s")
    print(summary(outcomes))
    return 1 if any(o.problems() for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
