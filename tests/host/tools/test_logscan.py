"""obmm.tools.logscan on sample kernel logs, and /dev/kmsg record parsing on canned records."""
# ruff: noqa: E501  (kernel log samples are kept verbatim, long lines included)

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import pytest

from obmm.tools import logscan
from obmm.tools.logscan import AllowRule, Kind

BOOT = """\
[    0.000000] Linux version 6.1.0-57-amd64 (debian-kernel@lists.debian.org) #1 SMP PREEMPT_DYNAMIC Debian 6.1.192-3
[    0.000000] Command line: BOOT_IMAGE=/vmlinuz root=/dev/vda1 console=ttyS0 panic=-1
[    0.512345] RETBleed: WARNING: Spectre v2 mitigation leaves CPU vulnerable to RETBleed attacks, data leaks possible!
[    1.234567] obmm_testhook: loading out-of-tree module taints kernel.
[    1.234600] obmm_testhook: module verification failed: signature and/or required key missing - tainting kernel
[    1.240000] obmm_testhook: loaded
[    2.000000] traps: python3[321] general protection fault ip:7f0a1b2c3d4e sp:7ffd0 error:0 in libc.so.6[7f0a1b2c3000+155000]
[    2.100000] python3[322]: segfault at 0 ip 000055d0 sp 00007ffd error 6 in python3.11[55d0+1000]
[    3.000000] INFO: NMI handler (perf_event_nmi_handler) took too long to run: 2.345 msecs
"""

WARN = """\
[   10.100000] obmm_testhook: ready
[   10.200000] ------------[ cut here ]------------
[   10.200001] obmm_testhook: WARN requested by test
[   10.200010] WARNING: CPU: 1 PID: 412 at /build/kmod/obmm_testhook/obmm_testhook.c:58 testhook_write+0x7d/0xd0 [obmm_testhook]
[   10.200020] Modules linked in: obmm_testhook(OE) ext4 crc16 mbcache jbd2 virtio_blk
[   10.200030] CPU: 1 PID: 412 Comm: python3 Tainted: G           OE      6.1.0-57-amd64 #1  Debian 6.1.192-3
[   10.200040] Hardware name: QEMU Standard PC (i440FX + PIIX, 1996), BIOS 1.16.2-debian-1.16.2-1 04/01/2014
[   10.200050] RIP: 0010:testhook_write+0x7d/0xd0 [obmm_testhook]
[   10.200060] Code: 48 c7 c7 a0 20 5b c0 e8 f4 5c 9a d8 <0f> 0b 48 89 d8 5b 5d c3
[   10.200070] RSP: 0018:ffffb1d2c04cbe50 EFLAGS: 00010286
[   10.200080] Call Trace:
[   10.200081]  <TASK>
[   10.200082]  vfs_write+0xb5/0x290
[   10.200083]  ksys_write+0x6b/0xf0
[   10.200084]  do_syscall_64+0x58/0xc0
[   10.200085]  entry_SYSCALL_64_after_hwframe+0x64/0xce
[   10.200086]  </TASK>
[   10.200090] ---[ end trace 0000000000000000 ]---
[   10.300000] obmm_testhook: next test
"""

KERNEL_BUG = """\
[   20.000000] ------------[ cut here ]------------
[   20.000001] kernel BUG at mm/slub.c:379!
[   20.000002] invalid opcode: 0000 [#1] PREEMPT SMP NOPTI
[   20.000003] CPU: 0 PID: 88 Comm: kworker/0:2 Tainted: G           OE      6.1.0-57-amd64 #1
[   20.000004] RIP: 0010:__slab_free+0x2f0/0x310
[   20.000005] Call Trace:
[   20.000006]  <TASK>
[   20.000007]  kfree+0x1a0/0x2f0
[   20.000008]  </TASK>
[   20.000009] ---[ end trace 1b2c3d4e5f607182 ]---
[   20.000010] RIP: 0010:__slab_free+0x2f0/0x310
[   20.000011] Code: 0f 0b 0f 0b 66 90
"""

OOPS = """\
[   30.000000] BUG: kernel NULL pointer dereference, address: 0000000000000000
[   30.000001] #PF: supervisor write access in kernel mode
[   30.000002] #PF: error_code(0x0002) - not-present page
[   30.000003] PGD 0 P4D 0
[   30.000004] Oops: 0002 [#1] PREEMPT SMP NOPTI
[   30.000005] CPU: 1 PID: 413 Comm: sh Tainted: G        W  OE      6.1.0-57-amd64 #1
[   30.000006] RIP: 0010:testhook_oops+0x15/0x20 [obmm_testhook]
[   30.000007] Call Trace:
[   30.000008]  <TASK>
[   30.000009]  testhook_write+0x90/0xd0 [obmm_testhook]
[   30.000010]  </TASK>
[   30.000011] CR2: 0000000000000000
[   30.000012] ---[ end trace 0000000000000000 ]---
[   30.000013] RIP: 0010:testhook_oops+0x15/0x20 [obmm_testhook]
[   30.000014] note: sh[413] exited with irqs disabled
"""

KASAN = """\
[   40.000000] ==================================================================
[   40.000001] BUG: KASAN: slab-out-of-bounds in emu_copy+0x44/0x60 [obmm]
[   40.000002] Write of size 8 at addr ffff888003e1c140 by task python3/500
[   40.000003]
[   40.000004] CPU: 0 PID: 500 Comm: python3 Tainted: G           OE      6.1.0-57-amd64 #1
[   40.000005] Call Trace:
[   40.000006]  <TASK>
[   40.000007]  dump_stack_lvl+0x44/0x5c
[   40.000008]  kasan_report+0xb9/0xf0
[   40.000009]  </TASK>
[   40.000010]
[   40.000011] The buggy address belongs to the object at ffff888003e1c100
[   40.000012] ==================================================================
[   40.000013] Disabling lock debugging due to kernel taint
[   40.000014] obmm: still running
"""

LOCKDEP = """\
[   50.000000]
[   50.000001] ======================================================
[   50.000002] WARNING: possible circular locking dependency detected
[   50.000003] 6.1.0-57-amd64 #1 Tainted: G           OE
[   50.000004] ------------------------------------------------------
[   50.000005] python3/600 is trying to acquire lock:
[   50.000006] ffff888004a1b0d8 (&emu->region_lock){+.+.}-{3:3}, at: emu_import+0x3c/0x120 [obmm]
[   50.000007]
[   50.000008] but task is already holding lock:
[   50.000009] ffff888004a1b1e0 (&emu->fabric_lock){+.+.}-{3:3}, at: emu_fabric_sync+0x20/0x90 [obmm]
[   50.000010]
[   50.000011]  *** DEADLOCK ***
"""

RCU_STALL = """\
[   60.000000] rcu: INFO: rcu_preempt detected stalls on CPUs/tasks:
[   60.000001] rcu: \t1-...!: (0 ticks this GP) idle=2c4c/1/0x4000000000000000 softirq=1234/1234 fqs=0
[   60.000002] \t(detected by 0, t=21002 jiffies, g=4321, q=7 ncpus=2)
[   60.000003] Sending NMI from CPU 0 to CPUs 1:
"""

HUNG_TASK = """\
[  245.000000] INFO: task kworker/1:3:77 blocked for more than 120 seconds.
[  245.000001]       Tainted: G           OE      6.1.0-57-amd64 #1 Debian 6.1.192-3
[  245.000002] "echo 0 > /proc/sys/kernel/hung_task_timeout_secs" disables this message.
[  245.000003] task:kworker/1:3     state:D stack:0     pid:77    ppid:2      flags:0x00004000
[  245.000004] Call Trace:
[  245.000005]  <TASK>
[  245.000006]  __schedule+0x34d/0x9e0
[  245.000007]  </TASK>
"""

PANIC = """\
[   70.000000] Kernel panic - not syncing: obmm_testhook: panic requested by test
[   70.000001] CPU: 0 PID: 700 Comm: sh Tainted: G           OE      6.1.0-57-amd64 #1
[   70.000002] Call Trace:
[   70.000003]  <TASK>
[   70.000004]  panic+0x118/0x2f0
[   70.000005]  </TASK>
[   70.000006] Kernel Offset: 0x1a000000 from 0xffffffff81000000
[   70.000007] ---[ end Kernel panic - not syncing: obmm_testhook: panic requested by test ]---
"""


def kinds(text: str, **kwargs: object) -> list[str]:
    return [r.kind for r in logscan.scan(text, **kwargs)]  # type: ignore[arg-type]


def test_clean_boot_log_reports_nothing() -> None:
    # Holds a RETBleed advisory and a perf NMI note (default allow-list), a
    # user-space GP fault and segfault (not kernel bugs) and OE taint from
    # loading our own module.
    assert logscan.scan(BOOT) == []


def test_warn_block_from_cut_here_to_end_trace() -> None:
    (report,) = logscan.scan(BOOT + WARN)
    assert report.kind == Kind.WARN
    lines = (BOOT + WARN).splitlines()
    assert lines[report.line_no - 1].endswith("------------[ cut here ]------------")
    excerpt = report.excerpt.splitlines()
    assert excerpt[0].endswith("------------[ cut here ]------------")
    assert excerpt[1].endswith("obmm_testhook: WARN requested by test")
    assert excerpt[-1].endswith("---[ end trace 0000000000000000 ]---")
    assert len(excerpt) == 17
    assert report.title.startswith("WARNING: CPU: 1 PID: 412 at /build/kmod/obmm_testhook/")
    assert "next test" not in report.excerpt


def test_kernel_bug_with_cut_here_is_one_bug_report() -> None:
    (report,) = logscan.scan(KERNEL_BUG)
    assert report.kind == Kind.BUG
    assert report.title == "kernel BUG at mm/slub.c:379!"
    assert "invalid opcode: 0000 [#1]" in report.excerpt
    # The registers x86 repeats after the end marker are not a second report.
    assert report.excerpt.splitlines()[-1].endswith("---[ end trace 1b2c3d4e5f607182 ]---")


def test_oops_header_lines_merge_into_one_report() -> None:
    (report,) = logscan.scan(OOPS)
    assert report.kind == Kind.OOPS
    assert report.line_no == 1
    assert report.title == "BUG: kernel NULL pointer dereference, address: 0000000000000000"
    assert "Oops: 0002 [#1] PREEMPT SMP NOPTI" in report.excerpt
    assert report.excerpt.splitlines()[-1].endswith("---[ end trace 0000000000000000 ]---")


def test_kasan_block_spans_its_banners_and_absorbs_taint_note() -> None:
    (report,) = logscan.scan(KASAN)
    assert report.kind == Kind.KASAN
    excerpt = report.excerpt.splitlines()
    assert excerpt[0].endswith("=" * 66)
    assert excerpt[1].endswith("BUG: KASAN: slab-out-of-bounds in emu_copy+0x44/0x60 [obmm]")
    assert excerpt[-1].endswith("=" * 66)
    assert "The buggy address belongs to the object" in report.excerpt


def test_lockdep_report() -> None:
    (report,) = logscan.scan(LOCKDEP)
    assert report.kind == Kind.LOCKDEP
    assert report.line_no == 2  # the ===== banner above the header
    assert report.title == "WARNING: possible circular locking dependency detected"
    assert "*** DEADLOCK ***" in report.excerpt


@pytest.mark.parametrize(
    "header",
    [
        "WARNING: possible recursive locking detected",
        "WARNING: inconsistent lock state",
        "WARNING: suspicious RCU usage",
        "WARNING: bad unlock balance detected!",
        "INFO: trying to register non-static key.",
    ],
)
def test_other_lockdep_headers(header: str) -> None:
    assert kinds(f"[    5.0] {header}\n[    5.1] more detail\n") == [Kind.LOCKDEP]


def test_rcu_stall() -> None:
    (report,) = logscan.scan(RCU_STALL)
    assert report.kind == Kind.RCU_STALL
    assert "detected by 0, t=21002 jiffies" in report.excerpt
    assert kinds("[ 1.0] rcu: INFO: rcu_sched self-detected stall on CPU\n") == [Kind.RCU_STALL]


def test_hung_task() -> None:
    (report,) = logscan.scan(HUNG_TASK)
    assert report.kind == Kind.HUNG_TASK
    assert report.title == "INFO: task kworker/1:3:77 blocked for more than 120 seconds."
    assert "__schedule+0x34d/0x9e0" in report.excerpt


def test_soft_and_hard_lockup() -> None:
    soft = "[ 80.0] watchdog: BUG: soft lockup - CPU#1 stuck for 22s! [python3:123]\n"
    hard = "[ 81.0] NMI watchdog: Watchdog detected hard LOCKUP on cpu 1\n"
    assert kinds(soft) == [Kind.SOFT_LOCKUP]
    assert kinds(hard) == [Kind.HARD_LOCKUP]


def test_panic_block_ends_at_end_kernel_panic() -> None:
    (report,) = logscan.scan(PANIC)
    assert report.kind == Kind.PANIC
    assert report.title == "Kernel panic - not syncing: obmm_testhook: panic requested by test"
    assert report.excerpt.splitlines()[-1].endswith(
        "---[ end Kernel panic - not syncing: obmm_testhook: panic requested by test ]---"
    )


def test_oops_then_panic_are_two_reports_in_order() -> None:
    fatal = "[   30.000015] Kernel panic - not syncing: Fatal exception\n"
    assert kinds(OOPS + fatal) == [Kind.OOPS, Kind.PANIC]


def test_every_sample_together_in_order() -> None:
    log = BOOT + WARN + KERNEL_BUG + OOPS + KASAN + LOCKDEP + RCU_STALL + HUNG_TASK + PANIC
    assert kinds(log) == [
        Kind.WARN,
        Kind.BUG,
        Kind.OOPS,
        Kind.KASAN,
        Kind.LOCKDEP,
        Kind.RCU_STALL,
        Kind.HUNG_TASK,
        Kind.PANIC,
    ]


@pytest.mark.parametrize(
    ("line", "kind"),
    [
        ("UBSAN: array-index-out-of-bounds in drivers/x.c:12:3", Kind.UBSAN),
        ("BUG: KFENCE: use-after-free read in emu_free+0x10/0x20", Kind.KFENCE),
        ("BUG: sleeping function called from invalid context at mm/slab.h:723", Kind.BUG),
        ("BUG: scheduling while atomic: python3/12/0x00000002", Kind.BUG),
        (
            "general protection fault, probably for non-canonical address 0xdead: 0000 [#1]",
            Kind.OOPS,
        ),
        ("Unable to handle kernel paging request at virtual address dead000000000108", Kind.OOPS),
        ("Internal error: Oops: 0000000096000005 [#1] SMP", Kind.OOPS),
        ("kmemleak: 2 new suspected memory leaks (see /sys/kernel/debug/kmemleak)", Kind.KMEMLEAK),
        # Fail closed: headers nobody listed still count.
        ("WARNING: some future kernel check tripped", Kind.WARN),
        ("BUG: some future kernel bug class", Kind.BUG),
        ("INFO: some future debug report", Kind.UNKNOWN),
    ],
)
def test_single_line_headers(line: str, kind: str) -> None:
    assert kinds(f"[    9.000001] {line}\n") == [kind]


def test_stray_trace_without_known_header_fails_closed() -> None:
    log = "[ 1.0] something odd happened\n[ 1.1] Call Trace:\n[ 1.2]  <TASK>\n[ 1.3]  foo+0x1/0x2\n"
    (report,) = logscan.scan(log)
    assert report.kind == Kind.UNKNOWN
    assert report.line_no == 2
    assert report.title == "Call Trace:"


def test_unexplained_taint_fails_closed() -> None:
    log = "[ 1.0] CPU: 0 PID: 1 Comm: x Tainted: G        W  OE      6.1.0-57-amd64 #1\n"
    (report,) = logscan.scan(log)
    assert report.kind == Kind.TAINT
    assert kinds(log.replace("W  OE", "   OE")) == []
    assert kinds("[ 1.0] Disabling lock debugging due to kernel taint\n") == [Kind.TAINT]


def test_lost_records_marker_is_reported() -> None:
    line = logscan.lost_records_line(3, 1200)
    assert line == "obmm.logscan: 3 kernel log records lost before seq 1200"
    assert kinds(f"[ 1.0] {line}\n") == [Kind.LOST]


def test_allow_rule_drops_a_known_benign_report() -> None:
    rule = AllowRule(r"obmm_testhook: WARN requested by test", "the plumbing test asks for it")
    assert logscan.scan(WARN, allow=[rule]) == []
    # The rule only covers the header lines: a different WARN still fails.
    other = WARN.replace("obmm_testhook: WARN requested by test", "emu: region refcount underflow")
    assert kinds(other, allow=[rule]) == [Kind.WARN]


def test_without_default_allow_the_advisories_are_reported() -> None:
    assert kinds(BOOT, allow=()) == [Kind.WARN, Kind.UNKNOWN]


def test_allow_rule_needs_a_pattern_and_a_reason() -> None:
    with pytest.raises(ValueError, match="needs a reason"):
        AllowRule(r"foo", "")
    with pytest.raises(ValueError, match="must not be empty"):
        AllowRule("  ", "because")


def test_unterminated_block_is_bounded() -> None:
    body = "".join(f"[ 2.{i:06d}] filler line {i}\n" for i in range(200))
    (report,) = logscan.scan("[ 1.0] INFO: task x:1 blocked for more than 120 seconds.\n" + body)
    assert len(report.excerpt.splitlines()) == logscan.MAX_BLOCK_LINES


def test_raw_kmsg_text_without_timestamps() -> None:
    text = "------------[ cut here ]------------\nWARNING: CPU: 0 PID: 1 at x.c:1 f+0x0/0x1\n"
    (report,) = logscan.scan(text + "---[ end trace 0000000000000000 ]---\n")
    assert (report.kind, report.line_no) == (Kind.WARN, 1)


def test_format_reports_names_kind_and_line() -> None:
    text = logscan.format_reports(logscan.scan(PANIC))
    assert text.startswith("1 kernel log report(s):\n--- panic at log line 1: Kernel panic")


def test_taint_letters_from_proc_mask() -> None:
    # W (bit 9), O (bit 12), E (bit 13)
    assert logscan.taint_letters((1 << 9) | (1 << 12) | (1 << 13)) == "WOE"
    assert logscan.taint_letters(0) == ""


# /dev/kmsg records ------------------------------------------------------------


def test_parse_kmsg_record_with_continuation_lines() -> None:
    raw = b"6,339,5140900,-;NET: Registered PF_INET6 protocol family\n SUBSYSTEM=net\n DEVICE=+net:lo\n"
    rec = logscan.parse_kmsg_record(raw)
    assert (rec.level, rec.facility, rec.seq, rec.ts_usec, rec.flags) == (6, 0, 339, 5140900, "-")
    assert rec.message == "NET: Registered PF_INET6 protocol family"
    assert rec.continuation == ("SUBSYSTEM=net", "DEVICE=+net:lo")
    assert rec.format() == (
        "[    5.140900] NET: Registered PF_INET6 protocol family\n SUBSYSTEM=net\n DEVICE=+net:lo"
    )


def test_parse_kmsg_record_unescapes_and_keeps_extra_header_fields() -> None:
    # Newer kernels append fields (caller id) after flags; facility 1 = user.
    raw = b"12,1001,99000001,c,caller=T412;line one\\x0aline two \\x5c done\n"
    rec = logscan.parse_kmsg_record(raw)
    assert (rec.level, rec.facility, rec.flags) == (4, 1, "c")
    assert rec.message == "line one\nline two \\ done"
    assert rec.format().splitlines() == [
        "[   99.000001] line one",
        "[   99.000001] line two \\ done",
    ]


def test_parse_kmsg_record_rejects_garbage() -> None:
    with pytest.raises(ValueError, match="not a /dev/kmsg record"):
        logscan.parse_kmsg_record(b"hello world\n")


def test_kmsg_records_feed_the_scanner() -> None:
    records = [
        b"4,10,1000,-;------------[ cut here ]------------\n",
        b"4,11,1001,-;WARNING: CPU: 0 PID: 9 at x.c:3 f+0x0/0x1\n",
        b"4,12,1002,-;---[ end trace 0000000000000000 ]---\n",
    ]
    text = "".join(logscan.parse_kmsg_record(r).format() + "\n" for r in records)
    (report,) = logscan.scan(text)
    assert report.kind == Kind.WARN
    assert report.excerpt.splitlines()[0] == "[    0.001000] ------------[ cut here ]------------"


class FakeKmsg:
    """read() of /dev/kmsg: one record per call, then EAGAIN; OSError items are raised."""

    def __init__(self, *items: bytes | OSError) -> None:
        self.items = list(items)

    def __call__(self) -> bytes:
        if not self.items:
            raise BlockingIOError(errno.EAGAIN, "no more records")
        item = self.items.pop(0)
        if isinstance(item, OSError):
            raise item
        return item


def test_drain_records_reads_until_eagain_and_tracks_seq() -> None:
    fake = FakeKmsg(b"6,20,1000,-;first\n", b"6,21,1001,-;second\n")
    records, next_seq = logscan.drain_records(fake, None)
    assert [r.message for r in records] == ["first", "second"]
    assert next_seq == 22
    # Nothing new: no records, same position.
    assert logscan.drain_records(FakeKmsg(), next_seq) == ([], 22)


def test_drain_records_marks_overwritten_records_as_lost() -> None:
    fake = FakeKmsg(OSError(errno.EPIPE, "Broken pipe"), b"6,30,2000,-;after the gap\n")
    records, next_seq = logscan.drain_records(fake, 25)
    assert [r.message for r in records] == [
        "obmm.logscan: 5 kernel log records lost before seq 30",
        "after the gap",
    ]
    assert next_seq == 31
    text = "".join(r.format() + "\n" for r in records)
    assert kinds(text) == [Kind.LOST]


def test_drain_records_notices_a_seq_jump() -> None:
    records, _ = logscan.drain_records(FakeKmsg(b"6,40,3000,-;late\n"), 38)
    assert records[0].message == "obmm.logscan: 2 kernel log records lost before seq 40"


def test_drain_records_passes_other_errors_through() -> None:
    with pytest.raises(PermissionError):
        logscan.drain_records(FakeKmsg(PermissionError(errno.EPERM, "no")), None)


@pytest.mark.skipif(not os.access("/dev/kmsg", os.R_OK), reason="no readable /dev/kmsg")
def test_kmsg_watcher_on_the_real_device() -> None:
    try:
        watcher = logscan.KmsgWatcher()
    except OSError as exc:
        pytest.skip(f"/dev/kmsg not readable here: {exc}")
    with watcher:
        text = watcher.read_new()
        assert isinstance(text, str)


def test_parse_kmsg_records_splits_a_saved_buffer() -> None:
    buf = b"6,1,10,-;one\n SUBSYSTEM=x\n4,2,20,-;two\n"
    records = logscan.parse_kmsg_records(buf)
    assert [(r.seq, r.message, r.continuation) for r in records] == [
        (1, "one", ("SUBSYSTEM=x",)),
        (2, "two", ()),
    ]


def test_kmsg_watcher_starts_at_the_end(tmp_path: Path) -> None:
    kmsg = tmp_path / "kmsg"
    kmsg.write_bytes(b"4,1,100,-;WARNING: CPU: 0 PID: 1 at old.c:1 old+0x0/0x1\n")
    with logscan.KmsgWatcher(str(kmsg)) as watcher:
        assert watcher.read_new() == ""
        with kmsg.open("ab") as fh:
            fh.write(b"6,2,2000000,-;new message\n")
        assert watcher.read_new() == "[    2.000000] new message\n"
        assert watcher.read_new() == ""
    assert not logscan.write_marker("obmm-test: marker\n", str(kmsg))
    assert kmsg.read_bytes().count(b"\n") == 2  # the marker never lands in a plain file


# The guest conftest, run by a nested pytest against a stand-in /dev/kmsg file.

GUEST_TESTS = """
import os

KMSG = os.environ["OBMM_KMSG_PATH"]
_seq = [100]


def log(*lines):
    with open(KMSG, "ab") as fh:
        for line in lines:
            _seq[0] += 1
            fh.write(f"4,{_seq[0]},{_seq[0] * 1000},-;{line}\\n".encode())


# Logged while collecting: no test owns it, so the session check must.
log("BUG: scheduling while atomic: collector/1/0x00000002")


def test_clean():
    log("obmm: region 3 exported")


def test_warns():
    log(
        "------------[ cut here ]------------",
        "WARNING: CPU: 0 PID: 42 at emu.c:7 emu_export+0x1/0x2 [obmm]",
        "---[ end trace 0000000000000000 ]---",
    )


def test_takes_its_own_warn(kernel_log):
    log("WARNING: CPU: 0 PID: 43 at emu.c:9 emu_poke+0x1/0x2 [obmm]")
    assert [r.kind for r in kernel_log.take_reports()] == ["warn"]


import pytest


@pytest.mark.kernel_log_allow(r"emu_known_quirk", "documented quirk for this test")
def test_allowed():
    log("WARNING: CPU: 0 PID: 44 at emu.c:11 emu_known_quirk+0x1/0x2 [obmm]")


def test_taints(tmp_path):
    with open(os.environ["OBMM_TAINTED_PATH"], "w") as fh:
        fh.write(str(1 << 9) + "\\n")
"""


def test_guest_conftest_fails_the_test_that_splatted_and_the_session(tmp_path: Path) -> None:
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[3]
    suite = tmp_path / "suite"
    suite.mkdir()
    shutil.copy(repo / "tests" / "guest" / "conftest.py", suite / "conftest.py")
    (suite / "test_sample.py").write_text(GUEST_TESTS)
    kmsg = tmp_path / "kmsg"
    kmsg.write_bytes(b"6,1,1000,-;boot message\n")
    tainted = tmp_path / "tainted"
    tainted.write_text("12288\n")  # O and E: our own modules
    env = {
        **os.environ,
        "PYTHONPATH": str(repo / "pylib"),
        "OBMM_KMSG_PATH": str(kmsg),
        "OBMM_TAINTED_PATH": str(tainted),
    }
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(suite),
            "-q",
            str(suite),
        ],
        cwd=suite,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    out = proc.stdout
    assert proc.returncode == 1, out + proc.stderr
    assert "2 failed, 3 passed" in out
    assert "FAILED test_sample.py::test_warns" in out
    assert "FAILED test_sample.py::test_taints" in out
    assert "kernel log guard: splat during call" in out
    assert "--- warn at log line 1: WARNING: CPU: 0 PID: 42 at emu.c:7" in out
    assert "kernel taint gained W during call (tainted=512)" in out
    assert "kernel log between tests: FAILED" in out
    assert "--- bug at log line 1: BUG: scheduling while atomic: collector/1/0x00000002" in out


def test_line_numbers_count_newlines_only() -> None:
    log = "[ 1.0] login: \r[ 1.1] prompt\r\n[ 1.2] BUG: bad thing\r\n"
    (report,) = logscan.scan(log)
    assert (report.line_no, report.excerpt) == (2, "[ 1.2] BUG: bad thing")


COHERENCE = """\
[   20.000000] obmm: coherence: strict, eviction 0/1000 per line per 20 ms, seed 34
[   21.000000] obmm: coherence: stale read: node 1 mem_id 3 offset 0x40: this node's cached line has 0x0000000000000001 at byte 0, memory 0x0000000000000002; invalidate before reading: UPDATE_RANGE with cache_ops INVAL
[   21.500000] obmm: ready
[   22.000000] obmm: coherence: lost write: node 1 mem_id 3 offset 0x0: this node's cached line has 0x00000000000000bb at byte 0, memory 0x00000000000000aa; two nodes held this 64-byte line dirty
"""


def test_the_coherence_models_reports_are_one_line_each_and_the_load_line_is_not() -> None:
    reports = logscan.scan(COHERENCE)
    assert [(r.kind, r.line_no) for r in reports] == [(Kind.COHERENCE, 2), (Kind.COHERENCE, 4)]
    assert reports[0].title.startswith("obmm: coherence: stale read: node 1 mem_id 3 offset 0x40")
    assert reports[1].excerpt.endswith("two nodes held this 64-byte line dirty")


def test_a_coherence_report_inside_a_warn_block_is_still_its_own() -> None:
    reports = logscan.scan(WARN + COHERENCE.splitlines(keepends=True)[1])
    assert {r.kind for r in reports} == {Kind.WARN, Kind.COHERENCE}


def test_after_marker_is_the_log_after_the_last_marker_line() -> None:
    # kguard's per-test log, and a dead node's console (issue 36: one copy of the cut).
    log = "a\nobmm-cluster-test: t1\nb\nobmm-cluster-test: t1\nc\nd\n"
    assert logscan.after_marker(log, "obmm-cluster-test: t1") == "c\nd\n"
    assert logscan.after_marker(log, "obmm-cluster-test: t2") == log
    assert logscan.after_marker("x\nmark", "mark") == ""
