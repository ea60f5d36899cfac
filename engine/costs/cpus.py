"""How many CPU threads llama.cpp should use by default: one per physical performance core this process may use.

ggml ends every graph node with a spin barrier, so the slowest thread sets the pace of every token. A thread on
an SMT sibling, an efficiency core, a CPU outside the affinity mask or in a throttled cgroup shares or waits for
a core, and slows all the others; llama.cpp's maintainers advise physical performance cores only. So:

    usable CPUs  = the process affinity mask (macOS has none: all CPUs)
    cores        = physical cores with a usable CPU, SMT siblings once; on a hybrid CPU the performance cores
                   only, unless the mask holds nothing but efficiency cores
    threads      = max(1, min(cores, floor(cgroup CPU quota), MAX_THREADS))

Every OS answer comes through a ``System``, so each rule is tested against fake answers (a sysfs tree in a temp
dir, a packed Windows buffer, a dict of sysctls). The Windows and macOS calls are stdlib ctypes and run only on
those systems. Anything unreadable falls back to fewer facts (the affinity count, then ``os.cpu_count()``);
nothing here raises.
"""

from __future__ import annotations

import functools
import math
import os
import struct
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

# More threads rarely help: token generation is bound by memory bandwidth long before 8 cores are busy.
MAX_THREADS = 8


@dataclass(frozen=True)
class CpuReport:
    """The default thread count and the facts behind it; ``reason`` says why in one sentence for users."""

    threads: int
    logical: int  # logical CPUs this process may run on
    cores: int  # physical cores counted (performance cores only on a hybrid CPU)
    efficiency_cores_left_out: int
    quota: float | None  # the cgroup CPU quota in CPUs, None when there is none
    reason: str


@dataclass(frozen=True)
class Core:
    """One physical core: its logical CPUs, and whether it is a performance core (every core is, on most CPUs)."""

    cpus: frozenset[int]
    performance: bool = True


@dataclass(frozen=True)
class WindowsAnswers:
    """What kernel32 said: GetLogicalProcessorInformationEx(RelationProcessorCore) and the process affinity.

    ``affinity_mask`` is GetProcessAffinityMask's mask for processor ``group``; 0 means no single mask (the
    process spans several groups), so every CPU counts.
    """

    buffer: bytes
    affinity_mask: int
    group: int = 0
    pointer_size: int = 8  # KAFFINITY's size: 8 on 64-bit Windows, 4 on 32-bit


def _no_sysctl(name: str) -> int | None:
    return None


def _no_windows_answers() -> WindowsAnswers | None:
    return None


@dataclass(frozen=True)
class System:
    """The OS answers ``cpu_report`` works from; tests build fake ones, ``this_system()`` asks the real OS."""

    platform: str  # sys.platform: "linux", "win32", "darwin", ...
    root: Path = Path("/")  # Linux: where /sys and /proc are read
    affinity: frozenset[int] | None = None  # Linux: sched_getaffinity; None = unknown (the online CPUs count)
    cpu_count: int | None = None  # os.cpu_count(): logical CPUs on the machine
    sysctl: Callable[[str], int | None] = _no_sysctl  # macOS: an integer sysctl, None if absent
    windows: Callable[[], WindowsAnswers | None] = _no_windows_answers


def cpu_report(system: System | None = None) -> CpuReport:
    """The default thread count for ``system`` (this machine when None), with the facts and the reason."""
    system = system or this_system()
    if system.platform.startswith("linux"):
        reading = _read_linux(system)
    elif system.platform == "win32":
        reading = _read_windows(system)
    elif system.platform == "darwin":
        reading = _read_macos(system)
    else:
        reading = _Reading(logical=system.cpu_count or 1, machine=system.cpu_count or 1)
    return _decide(reading)


@functools.cache
def default_threads() -> int:
    """Threads for llama.cpp when the user has not chosen: ``cpu_report().threads``, worked out once."""
    return cpu_report().threads


# --- The rule, from whatever each platform could read --------------------------------------------------------


@dataclass(frozen=True)
class _Reading:
    """What one platform's answers say, before the rule is applied."""

    logical: int  # usable logical CPUs
    machine: int  # logical CPUs on the machine, to name an affinity mask narrower than it
    cores: int | None = None  # physical cores counted, None when the topology could not be read
    left_out: int = 0  # efficiency cores with a usable CPU, not counted
    quota: float | None = None


def _decide(r: _Reading) -> CpuReport:
    cores = r.cores if r.cores else r.logical  # topology unknown: count every usable CPU
    threads = min(cores, MAX_THREADS)
    if r.quota is not None:
        threads = min(threads, math.floor(r.quota))
    threads = max(1, threads)
    return CpuReport(threads, r.logical, cores, r.left_out, r.quota, _reason(r, threads))


def _reason(r: _Reading, threads: int) -> str:
    head = f"{_plural(threads, 'thread')}: "
    if r.quota is not None and math.floor(r.quota) < min(r.cores or r.logical, MAX_THREADS):
        cpus = "1 CPU" if r.quota == 1 else f"{r.quota:g} CPUs"
        return f"{head}this process may use {cpus} (cgroup quota)"
    restricted = r.logical < r.machine
    if r.cores is None:
        counted = _plural(r.logical, "CPU")
    elif r.left_out:
        counted = _plural(r.cores, "performance core")
    elif restricted and r.cores == r.logical and threads == r.cores:
        return f"{head}this process is allowed {_plural(r.logical, 'CPU')}"
    else:
        counted = _plural(r.cores, "core")
    notes = []
    if threads < (r.cores or r.logical):
        notes.append(f"capped at {MAX_THREADS}")
    if r.left_out:
        notes.append(f"{_plural(r.left_out, 'efficiency core')} left out")
    if restricted:
        notes.append(f"this process is allowed {r.logical} of {r.machine} CPUs")
    return head + counted + (f" ({'; '.join(notes)})" if notes else "")


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _count_cores(cores: Iterable[Core], usable: frozenset[int]) -> tuple[int, int]:
    """(cores counted, efficiency cores left out): cores with a usable CPU, the performance ones if any."""
    reachable = [core for core in cores if core.cpus & usable]
    fast = [core for core in reachable if core.performance]
    if not fast:  # the mask holds only efficiency cores: those are all there is
        return len(reachable), 0
    return len(fast), len(reachable) - len(fast)


def _reading(cores: list[Core] | None, usable: frozenset[int], machine: int, quota: float | None) -> _Reading:
    counted, left_out = _count_cores(cores, usable) if cores else (0, 0)
    logical = len(usable) or machine
    return _Reading(logical, max(machine, logical), counted or None, left_out, quota)


# --- Linux: sysfs and procfs ---------------------------------------------------------------------------------


def _read_linux(system: System) -> _Reading:
    cpu_dir = system.root / "sys/devices/system/cpu"
    usable = system.affinity or _read_cpu_list(cpu_dir / "online") or frozenset(range(system.cpu_count or 1))
    performance = _read_cpu_list(system.root / "sys/devices/cpu_core/cpus")  # P-cores; cpu_atom holds the rest
    cores = _linux_cores(cpu_dir, usable, performance)
    return _reading(cores, usable, system.cpu_count or len(usable), _cgroup_quota(system.root))


def _linux_cores(cpu_dir: Path, usable: frozenset[int], performance: frozenset[int] | None) -> list[Core] | None:
    """The cores holding the usable CPUs, or None when any CPU's core cannot be read."""
    by_core: dict[object, set[int]] = {}
    for cpu in usable:
        topology = cpu_dir / f"cpu{cpu}" / "topology"
        key: object = (
            _read_cpu_list(topology / "core_cpus_list")
            or _read_cpu_list(topology / "thread_siblings_list")  # the older name (before Linux 5.7)
            or _read_core_id(topology)
        )
        if key is None:
            return None
        by_core.setdefault(key, set()).add(cpu)
    return [Core(frozenset(cpus), performance is None or bool(cpus & performance)) for cpus in by_core.values()]


def _read_core_id(topology: Path) -> tuple[int, int] | None:
    package, core = _read_int(topology / "physical_package_id"), _read_int(topology / "core_id")
    return None if package is None or core is None else (package, core)


def _read_cpu_list(path: Path) -> frozenset[int] | None:
    """A kernel cpu list such as "0-3,8" as a set; None when missing or not a cpu list."""
    try:
        text = path.read_text(encoding="ascii").strip()
        cpus: set[int] = set()
        for part in filter(None, text.split(",")):
            first, _, last = part.partition("-")
            cpus.update(range(int(first), int(last or first) + 1))
    except (OSError, ValueError):
        return None
    return frozenset(cpus)


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text(encoding="ascii").strip())
    except (OSError, ValueError):
        return None


def _cgroup_quota(root: Path) -> float | None:
    """The smallest CPU quota (in CPUs) of this process's cgroup and its parents, v2 or v1; None if none."""
    try:
        lines = (root / "proc/self/cgroup").read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    quotas: list[float | None] = []
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":  # "0::/path": the unified (v2) hierarchy
            quotas += [_v2_quota(d) for d in _cgroup_dirs(root / "sys/fs/cgroup", path)]
        elif "cpu" in controllers.split(","):
            mount = next((m for m in _V1_CPU_MOUNTS if (root / "sys/fs/cgroup" / m).is_dir()), None)
            if mount is not None:
                quotas += [_v1_quota(d) for d in _cgroup_dirs(root / "sys/fs/cgroup" / mount, path)]
    return min((q for q in quotas if q is not None), default=None)


_V1_CPU_MOUNTS = ("cpu,cpuacct", "cpu", "cpuacct,cpu")


def _cgroup_dirs(mount: Path, path: str) -> Iterator[Path]:
    """The cgroup's directory under ``mount``, then each parent up to the mount itself.

    In a container the path is often the host's (/docker/<id>) while the mount shows only the container's own
    cgroup; the directories that do not exist are skipped, and the mount's own files still count.
    """
    parts = PurePosixPath(path).parts[1:]
    if ".." in parts:  # a cgroup outside this namespace's view: only the mount is ours to read
        parts = ()
    for depth in range(len(parts), -1, -1):
        yield mount.joinpath(*parts[:depth])


def _v2_quota(cgroup: Path) -> float | None:
    try:
        quota, period = (cgroup / "cpu.max").read_text(encoding="ascii").split()
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError, ZeroDivisionError):
        return None


def _v1_quota(cgroup: Path) -> float | None:
    quota, period = _read_int(cgroup / "cpu.cfs_quota_us"), _read_int(cgroup / "cpu.cfs_period_us")
    if quota is None or period is None or quota < 0 or period <= 0:  # -1: no quota
        return None
    return quota / period


# --- Windows: GetLogicalProcessorInformationEx -----------------------------------------------------------------

RELATION_PROCESSOR_CORE = 0
_RECORD_HEAD = struct.Struct("<II")  # Relationship, Size
_PROCESSOR_HEAD = struct.Struct("<BB20xH")  # Flags, EfficiencyClass, Reserved[20], GroupCount


def parse_processor_cores(buffer: bytes, pointer_size: int = 8) -> list[Core]:
    """The cores in a GetLogicalProcessorInformationEx buffer (its RelationProcessorCore records).

    A logical CPU is numbered group * (bits in KAFFINITY) + bit. On a hybrid CPU the cores of the highest
    EfficiencyClass are the performance ones; when every core has the same class, all are. Flags' LTP_PC_SMT is
    not needed: one record is one core, however many threads its mask holds. Raises ValueError on a buffer
    that does not hold whole records.
    """
    mask_format = struct.Struct("<QH6x" if pointer_size == 8 else "<IH6x")  # GROUP_AFFINITY: Mask, Group
    masks_at = _RECORD_HEAD.size + _PROCESSOR_HEAD.size  # 32: the masks' alignment adds no padding
    found: list[tuple[int, frozenset[int]]] = []
    offset = 0
    while offset < len(buffer):
        relationship, size = _unpack(_RECORD_HEAD, buffer, offset)
        if size < masks_at or offset + size > len(buffer):
            raise ValueError(f"processor record of {size} bytes at {offset} in a buffer of {len(buffer)}")
        if relationship == RELATION_PROCESSOR_CORE:
            _flags, efficiency_class, group_count = _unpack(_PROCESSOR_HEAD, buffer, offset + _RECORD_HEAD.size)
            cpus: frozenset[int] = frozenset()
            for i in range(group_count):
                mask, group = _unpack(mask_format, buffer, offset + masks_at + i * mask_format.size)
                cpus |= _mask_cpus(mask, group, pointer_size)
            found.append((efficiency_class, cpus))
        offset += size
    fastest = max((cls for cls, _ in found), default=0)
    return [Core(cpus, cls == fastest) for cls, cpus in found]


def _mask_cpus(mask: int, group: int, pointer_size: int) -> frozenset[int]:
    """The logical CPUs a KAFFINITY mask of processor ``group`` names."""
    bits = pointer_size * 8
    return frozenset(group * bits + bit for bit in range(bits) if mask >> bit & 1)


def _unpack(layout: struct.Struct, buffer: bytes, offset: int) -> tuple[int, ...]:
    try:
        return layout.unpack_from(buffer, offset)
    except struct.error as exc:
        raise ValueError(f"truncated processor information at {offset}") from exc


def _read_windows(system: System) -> _Reading:
    answers = system.windows()
    machine = system.cpu_count or 1
    if answers is None:
        return _Reading(logical=machine, machine=machine)
    try:
        cores = parse_processor_cores(answers.buffer, answers.pointer_size)
    except ValueError:
        cores = []
    every_cpu = frozenset().union(*(core.cpus for core in cores))
    mask = answers.affinity_mask
    usable = _mask_cpus(mask, answers.group, answers.pointer_size) if mask else every_cpu
    return _reading(cores, usable, max(machine, len(every_cpu)), None)


# --- macOS: sysctl ----------------------------------------------------------------------------------------------


def _read_macos(system: System) -> _Reading:
    logical = system.sysctl("hw.logicalcpu") or system.cpu_count or 1
    physical = system.sysctl("hw.physicalcpu")
    performance = system.sysctl("hw.perflevel0.physicalcpu")  # Apple silicon: level 0 is the fastest
    if performance:
        left_out = max(0, physical - performance) if physical else 0
        return _Reading(logical, logical, performance, left_out)
    return _Reading(logical, logical, physical or None)


# --- The real OS ---------------------------------------------------------------------------------------------


def this_system() -> System:
    """This machine; the Windows and macOS calls are made only when ``cpu_report`` reads them."""
    return System(
        platform=sys.platform,
        affinity=_linux_affinity(),
        cpu_count=os.cpu_count(),
        sysctl=_macos_sysctl,
        windows=_windows_answers,
    )


def _linux_affinity() -> frozenset[int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return frozenset(os.sched_getaffinity(0))
    except OSError:
        return None


def _macos_sysctl(name: str) -> int | None:
    """An integer sysctl (sysctlbyname), None when it does not exist or cannot be read."""
    if sys.platform != "darwin":
        return None
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        sysctlbyname = libc.sysctlbyname
        sysctlbyname.argtypes = [
            ctypes.c_char_p,  # name
            ctypes.c_void_p,  # oldp
            ctypes.POINTER(ctypes.c_size_t),  # oldlenp
            ctypes.c_void_p,  # newp
            ctypes.c_size_t,  # newlen
        ]
        sysctlbyname.restype = ctypes.c_int
        value = ctypes.create_string_buffer(8)  # hw.* counts are 4-byte ints; 8 leaves room for a 64-bit one
        size = ctypes.c_size_t(len(value))
        if sysctlbyname(name.encode("ascii"), value, ctypes.byref(size), None, 0) != 0:
            return None
    except (OSError, AttributeError):
        return None
    if size.value not in (4, 8):
        return None
    return int.from_bytes(value.raw[: size.value], sys.byteorder, signed=True)


_ERROR_INSUFFICIENT_BUFFER = 122


def _windows_answers() -> WindowsAnswers | None:
    """kernel32's processor cores and this process's affinity; None when any call fails."""
    if sys.platform != "win32":
        return None
    import ctypes
    from ctypes import wintypes

    try:
        kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)
        get_cores = kernel32.GetLogicalProcessorInformationEx
        get_cores.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(wintypes.DWORD)]
        get_cores.restype = wintypes.BOOL
        get_process = kernel32.GetCurrentProcess
        get_process.argtypes = []
        get_process.restype = wintypes.HANDLE
        get_mask = kernel32.GetProcessAffinityMask
        get_mask.argtypes = [wintypes.HANDLE, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)]
        get_mask.restype = wintypes.BOOL
        get_groups = kernel32.GetProcessGroupAffinity
        get_groups.argtypes = [wintypes.HANDLE, ctypes.POINTER(wintypes.USHORT), ctypes.POINTER(wintypes.USHORT)]
        get_groups.restype = wintypes.BOOL

        # The first call fails with ERROR_INSUFFICIENT_BUFFER and says how many bytes the records take.
        length = wintypes.DWORD(0)
        if get_cores(RELATION_PROCESSOR_CORE, None, ctypes.byref(length)):
            return None
        if ctypes.get_last_error() != _ERROR_INSUFFICIENT_BUFFER or length.value == 0:
            return None
        buffer = ctypes.create_string_buffer(length.value)
        if not get_cores(RELATION_PROCESSOR_CORE, buffer, ctypes.byref(length)):
            return None

        # The mask covers the process's one processor group (group 0 on machines of up to 64 logical CPUs);
        # a process with threads in several groups gets 0, and then every CPU counts.
        process = get_process()
        process_mask, system_mask = ctypes.c_size_t(0), ctypes.c_size_t(0)
        if not get_mask(process, ctypes.byref(process_mask), ctypes.byref(system_mask)):
            return None
        group_count, groups = wintypes.USHORT(1), (wintypes.USHORT * 1)()
        in_one_group = get_groups(process, ctypes.byref(group_count), groups) and group_count.value == 1
        return WindowsAnswers(
            buffer=buffer.raw[: length.value],
            affinity_mask=process_mask.value,
            group=groups[0] if in_one_group else 0,
            pointer_size=ctypes.sizeof(ctypes.c_void_p),
        )
    except (OSError, AttributeError):
        return None
