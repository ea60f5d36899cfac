"""The default thread count, worked out from fake OS answers: sysfs/procfs trees in a temp dir, packed Windows
buffers and macOS sysctls. Nothing here depends on the machine running the tests."""

from __future__ import annotations

import struct
import sys
from pathlib import Path

import pytest

from engine.costs import cpus
from engine.costs.cpus import MAX_THREADS, Core, System, WindowsAnswers, cpu_report, parse_processor_cores

# --- Linux ------------------------------------------------------------------------------------------------------


def write(root: Path, relative: str, text: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n", encoding="ascii")


def cpu_list(cpus: list[int]) -> str:
    return ",".join(map(str, cpus))


def linux_machine(root: Path, cores: list[list[int]], siblings_file: str | None = "core_cpus_list") -> Path:
    """A sysfs tree for ``cores`` (each the logical CPUs of one core), package 0; no hybrid, no cgroup."""
    for core_id, core in enumerate(cores):
        for cpu in core:
            topology = f"sys/devices/system/cpu/cpu{cpu}/topology"
            if siblings_file:
                write(root, f"{topology}/{siblings_file}", cpu_list(core))
            write(root, f"{topology}/physical_package_id", "0")
            write(root, f"{topology}/core_id", str(core_id))
    every_cpu = sorted(cpu for core in cores for cpu in core)
    write(root, "sys/devices/system/cpu/online", f"0-{every_cpu[-1]}")
    return root


def linux(root: Path, affinity: range | list[int] | set[int], cpu_count: int | None = None) -> System:
    return System("linux", root=root, affinity=frozenset(affinity), cpu_count=cpu_count or len(affinity))


def smt_desktop(root: Path, n_cores: int) -> Path:
    """n_cores cores with two threads each, numbered as Linux does: siblings i and i + n_cores."""
    return linux_machine(root, [[i, i + n_cores] for i in range(n_cores)])


def meteor_lake(root: Path) -> Path:
    """6 P-cores with HT (0-11: siblings 0&1, 2&3, ...), 8 E-cores (12-19), 2 LP-E cores (20-21)."""
    linux_machine(root, [[2 * i, 2 * i + 1] for i in range(6)] + [[cpu] for cpu in range(12, 22)])
    write(root, "sys/devices/cpu_core/cpus", "0-11")
    write(root, "sys/devices/cpu_atom/cpus", "12-21")
    return root


def test_a_two_core_vm_gets_two_threads(tmp_path):
    report = cpu_report(linux(linux_machine(tmp_path, [[0], [1]]), {0, 1}))
    assert (report.threads, report.cores, report.logical, report.quota) == (2, 2, 2, None)
    assert report.reason == "2 threads: 2 cores"


def test_smt_siblings_count_as_one_core(tmp_path):
    report = cpu_report(linux(smt_desktop(tmp_path, 8), range(16)))
    assert (report.threads, report.cores, report.logical) == (8, 8, 16)
    assert report.reason == "8 threads: 8 cores"


def test_a_12_core_24_thread_desktop_is_capped_at_8(tmp_path):
    report = cpu_report(linux(smt_desktop(tmp_path, 12), range(24)))
    assert (report.threads, report.cores) == (MAX_THREADS, 12)
    assert report.reason == "8 threads: 12 cores (capped at 8)"


def test_older_kernels_thread_siblings_list_is_read(tmp_path):
    root = linux_machine(tmp_path, [[0, 2], [1, 3]], siblings_file="thread_siblings_list")
    assert cpu_report(linux(root, range(4))).threads == 2


def test_without_sibling_lists_package_and_core_ids_pair_the_threads(tmp_path):
    # Two packages whose cores reuse the same core_id: four cores, eight threads.
    for cpu in range(8):
        write(tmp_path, f"sys/devices/system/cpu/cpu{cpu}/topology/physical_package_id", str(cpu // 4))
        write(tmp_path, f"sys/devices/system/cpu/cpu{cpu}/topology/core_id", str(cpu % 2))
    assert cpu_report(linux(tmp_path, range(8))).cores == 4


def test_a_hybrid_laptop_uses_its_performance_cores_only(tmp_path):
    report = cpu_report(linux(meteor_lake(tmp_path), range(22)))
    assert (report.threads, report.cores, report.efficiency_cores_left_out) == (6, 6, 10)
    assert report.reason == "6 threads: 6 performance cores (10 efficiency cores left out)"


def test_a_process_pinned_to_efficiency_cores_uses_them(tmp_path):
    report = cpu_report(linux(meteor_lake(tmp_path), range(12, 20), cpu_count=22))
    assert (report.threads, report.cores, report.efficiency_cores_left_out) == (8, 8, 0)
    assert cpu_report(linux(meteor_lake(tmp_path), {20, 21}, cpu_count=22)).threads == 2


def test_one_usable_performance_core_beats_any_number_of_efficiency_cores(tmp_path):
    report = cpu_report(linux(meteor_lake(tmp_path), {1, 12, 13, 14}, cpu_count=22))
    assert (report.threads, report.efficiency_cores_left_out) == (1, 3)


def test_an_affinity_mask_of_one_cpu_gives_one_thread(tmp_path):
    report = cpu_report(linux(linux_machine(tmp_path, [[0], [1]]), {1}, cpu_count=2))
    assert (report.threads, report.logical) == (1, 1)
    assert report.reason == "1 thread: this process is allowed 1 CPU"


def test_a_core_counts_when_one_of_its_threads_is_usable(tmp_path):
    report = cpu_report(linux(smt_desktop(tmp_path, 8), {0, 1, 9}, cpu_count=16))  # cores 0 and 1
    assert (report.threads, report.logical) == (2, 3)
    assert report.reason == "2 threads: 2 cores (this process is allowed 3 of 16 CPUs)"


def test_a_missing_sysfs_falls_back_to_the_affinity_count(tmp_path):
    report = cpu_report(linux(tmp_path, {0, 1, 2}, cpu_count=4))
    assert (report.threads, report.cores) == (3, 3)
    assert report.reason == "3 threads: 3 CPUs (this process is allowed 3 of 4 CPUs)"


def test_an_unreadable_topology_falls_back_to_the_affinity_count(tmp_path):
    root = smt_desktop(tmp_path, 2)
    write(root, "sys/devices/system/cpu/cpu3/topology/core_cpus_list", "garbage")
    (root / "sys/devices/system/cpu/cpu3/topology/core_id").unlink()
    assert cpu_report(linux(root, range(4))).threads == 4


def test_without_affinity_or_sysfs_the_cpu_count_is_used(tmp_path):
    assert cpu_report(System("linux", root=tmp_path, affinity=None, cpu_count=6)).threads == 6
    assert cpu_report(System("linux", root=tmp_path)).threads == 1


# --- Linux cgroups ------------------------------------------------------------------------------------------------


def four_cores_in(root: Path, cgroup_lines: str) -> System:
    linux_machine(root, [[0], [1], [2], [3]])
    write(root, "proc/self/cgroup", cgroup_lines)
    return linux(root, range(4))


def test_a_cgroup_v2_quota_of_one_and_a_half_cpus_gives_one_thread(tmp_path):
    system = four_cores_in(tmp_path, "0::/user.slice/app.scope")
    write(tmp_path, "sys/fs/cgroup/user.slice/app.scope/cpu.max", "150000 100000")
    report = cpu_report(system)
    assert (report.threads, report.cores, report.quota) == (1, 4, 1.5)
    assert report.reason == "1 thread: this process may use 1.5 CPUs (cgroup quota)"


def test_a_parent_cgroups_smaller_quota_wins(tmp_path):
    system = four_cores_in(tmp_path, "0::/batch/job/step")
    write(tmp_path, "sys/fs/cgroup/batch/job/step/cpu.max", "max 100000")
    write(tmp_path, "sys/fs/cgroup/batch/job/cpu.max", "300000 100000")
    write(tmp_path, "sys/fs/cgroup/batch/cpu.max", "200000 100000")
    assert (cpu_report(system).threads, cpu_report(system).quota) == (2, 2.0)


def test_a_cgroup_v2_without_a_quota_leaves_the_cores(tmp_path):
    system = four_cores_in(tmp_path, "0::/user.slice")
    write(tmp_path, "sys/fs/cgroup/user.slice/cpu.max", "max 100000")
    assert (cpu_report(system).threads, cpu_report(system).quota) == (4, None)


def test_a_cgroup_v1_cpu_quota_limits_the_threads(tmp_path):
    system = four_cores_in(tmp_path, "4:memory:/app\n3:cpu,cpuacct:/app\n0::/")
    write(tmp_path, "sys/fs/cgroup/cpu,cpuacct/app/cpu.cfs_quota_us", "300000")
    write(tmp_path, "sys/fs/cgroup/cpu,cpuacct/app/cpu.cfs_period_us", "100000")
    report = cpu_report(system)
    assert (report.threads, report.quota) == (3, 3.0)
    assert report.reason == "3 threads: this process may use 3 CPUs (cgroup quota)"


def test_a_cgroup_v1_quota_of_minus_one_is_no_quota(tmp_path):
    system = four_cores_in(tmp_path, "2:cpu:/app")
    write(tmp_path, "sys/fs/cgroup/cpu/app/cpu.cfs_quota_us", "-1")
    write(tmp_path, "sys/fs/cgroup/cpu/app/cpu.cfs_period_us", "100000")
    assert cpu_report(system).threads == 4


def test_a_containers_v1_quota_is_found_at_its_mount_when_the_host_path_is_hidden(tmp_path):
    system = four_cores_in(tmp_path, "3:cpu,cpuacct:/docker/0123abcd")
    write(tmp_path, "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "50000")
    write(tmp_path, "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000")
    report = cpu_report(system)
    assert (report.threads, report.quota) == (1, 0.5)
    assert report.reason == "1 thread: this process may use 0.5 CPUs (cgroup quota)"


def test_an_unreadable_quota_is_no_quota(tmp_path):
    system = four_cores_in(tmp_path, "0::/app\nnot a cgroup line")
    write(tmp_path, "sys/fs/cgroup/app/cpu.max", "lots 0")
    assert cpu_report(system).threads == 4


# --- Windows ------------------------------------------------------------------------------------------------------


def core_record(cpus: list[int], efficiency_class: int = 0, group: int = 0) -> bytes:
    """One SYSTEM_LOGICAL_PROCESSOR_INFORMATION_EX record (RelationProcessorCore) as 64-bit Windows lays it out."""
    smt = 1 if len(cpus) > 1 else 0  # LTP_PC_SMT
    mask = sum(1 << cpu for cpu in cpus)
    body = struct.pack("<BB20xH", smt, efficiency_class, 1) + struct.pack("<QH6x", mask, group)
    return struct.pack("<II", 0, 8 + len(body)) + body


def windows(buffer: bytes, mask: int = 0, group: int = 0, cpu_count: int = 8) -> System:
    answers = WindowsAnswers(buffer, affinity_mask=mask, group=group)
    return System("win32", cpu_count=cpu_count, windows=lambda: answers)


HYBRID_2P_4E = b"".join(
    [core_record([0, 1], efficiency_class=1), core_record([2, 3], efficiency_class=1)]
    + [core_record([cpu]) for cpu in range(4, 8)]
)
SMT_4_CORES = b"".join(core_record([2 * i, 2 * i + 1]) for i in range(4))


def test_a_windows_record_is_48_bytes_like_the_real_ones():
    assert len(core_record([0, 1])) == 48


def test_windows_hybrid_uses_the_highest_efficiency_class():
    report = cpu_report(windows(HYBRID_2P_4E, mask=0xFF))
    assert (report.threads, report.logical, report.efficiency_cores_left_out) == (2, 8, 4)
    assert report.reason == "2 threads: 2 performance cores (4 efficiency cores left out)"


def test_windows_smt_cores_count_once():
    report = cpu_report(windows(SMT_4_CORES, mask=0xFF))
    assert (report.threads, report.cores, report.efficiency_cores_left_out) == (4, 4, 0)


def test_a_windows_affinity_mask_restricts_to_one_core():
    report = cpu_report(windows(SMT_4_CORES, mask=0b0011))
    assert (report.threads, report.logical) == (1, 2)
    assert report.reason == "1 thread: 1 core (this process is allowed 2 of 8 CPUs)"


def test_a_windows_mask_of_zero_means_every_cpu():
    assert cpu_report(windows(SMT_4_CORES, mask=0)).threads == 4


def test_a_windows_mask_names_cpus_of_its_processor_group():
    buffer = core_record([0]) + core_record([1]) + core_record([0], group=1) + core_record([1], group=1)
    assert parse_processor_cores(buffer) == [Core(frozenset({c})) for c in (0, 1, 64, 65)]
    assert cpu_report(windows(buffer, mask=0b10, group=1, cpu_count=4)).threads == 1


def test_windows_records_of_other_relationships_are_skipped():
    cache_record = struct.pack("<II", 2, 48) + bytes(40)  # RelationCache
    assert len(parse_processor_cores(cache_record + SMT_4_CORES)) == 4


def test_a_32_bit_windows_buffer_is_parsed_with_4_byte_masks():
    body = struct.pack("<BB20xH", 1, 0, 1) + struct.pack("<IH6x", 0b11, 0)
    record = struct.pack("<II", 0, 8 + len(body)) + body
    assert parse_processor_cores(record * 2, pointer_size=4) == [Core(frozenset({0, 1}))] * 2


def test_a_truncated_windows_buffer_falls_back_to_the_cpu_count():
    with pytest.raises(ValueError):
        parse_processor_cores(SMT_4_CORES[:-10])
    report = cpu_report(windows(SMT_4_CORES[:-10], cpu_count=6))
    assert (report.threads, report.reason) == (6, "6 threads: 6 CPUs")


def test_no_windows_answers_falls_back_to_the_cpu_count():
    assert cpu_report(System("win32", cpu_count=12)).threads == MAX_THREADS


# --- macOS --------------------------------------------------------------------------------------------------------


def macos(answers: dict[str, int], cpu_count: int = 8) -> System:
    return System("darwin", cpu_count=cpu_count, sysctl=answers.get)


def test_apple_silicon_uses_its_performance_cores():
    m3_pro = {"hw.logicalcpu": 12, "hw.physicalcpu": 12, "hw.perflevel0.physicalcpu": 6}
    report = cpu_report(macos(m3_pro))
    assert (report.threads, report.logical, report.efficiency_cores_left_out) == (6, 12, 6)
    assert report.reason == "6 threads: 6 performance cores (6 efficiency cores left out)"


def test_an_intel_mac_without_perflevels_uses_its_physical_cores():
    report = cpu_report(macos({"hw.logicalcpu": 8, "hw.physicalcpu": 4}))
    assert (report.threads, report.reason) == (4, "4 threads: 4 cores")


def test_a_mac_that_answers_nothing_falls_back_to_the_cpu_count():
    assert cpu_report(macos({}, cpu_count=3)).threads == 3


# --- Elsewhere, and the real machine ------------------------------------------------------------------------------


def test_an_unknown_platform_uses_the_cpu_count():
    assert cpu_report(System("freebsd14", cpu_count=4)).threads == 4


@pytest.mark.skipif(sys.platform in ("win32", "darwin"), reason="checks that the other OSes' calls are skipped")
def test_the_windows_and_macos_calls_do_nothing_elsewhere():
    assert cpus._windows_answers() is None
    assert cpus._macos_sysctl("hw.physicalcpu") is None


def test_this_machine_gets_between_1_and_8_threads():
    assert 1 <= cpus.default_threads() <= MAX_THREADS
