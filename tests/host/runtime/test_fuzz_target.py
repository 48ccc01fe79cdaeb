"""The fuzzer's readers of node state (obmm.fuzz.target), on text a node would show.

The model check reads these after every operation (tests/guest/test_fuzz.py runs them on a
node); what they make of the text is checked here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from obmm.fuzz import target

IOMEM = """\
00000000-00000fff : Reserved
00001000-0009fbff : System RAM
  01000000-01ffffff : Kernel code
30000000-3000ffff : MEMID_notanid
40000000-7fffffff : PCI Bus 0000:00
  60000000-601fffff : UBMEM window
1000000000-10001fffff : DIRECT_IMPORT_UBMEM
  1000000000-10001fffff : MEMID_7
1000200000-10003fffff : PREIMPORT_UBMEM
1000400000-10005fffff : System RAM (Remote)
  1000400000-10005fffff : MEMID_9
1000600000-10007fffff : DIRECT_IMPORT_UBMEM
"""


def test_one_read_of_iomem_gives_every_view_the_check_compares() -> None:
    """Imports' MEMID_ ids, DIRECT_IMPORT_UBMEM count, declared preimport ranges, and every
    other line (indentation kept: a moved resource is a change) from one text."""
    view = target.parse_iomem(IOMEM)
    assert view.memids == {7, 9}
    assert view.direct == 2
    assert view.preimports == {(0x1000200000, 0x200000)}
    assert view.others == [
        "00000000-00000fff : Reserved",
        "00001000-0009fbff : System RAM",
        "  01000000-01ffffff : Kernel code",
        "30000000-3000ffff : MEMID_notanid",
        "40000000-7fffffff : PCI Bus 0000:00",
        "  60000000-601fffff : UBMEM window",
    ]


def test_an_empty_iomem_has_nothing() -> None:
    view = target.parse_iomem("")
    assert (view.memids, view.direct, view.preimports, view.others) == (set(), 0, set(), [])


def test_read_text_reads_past_one_chunk(tmp_path: Path) -> None:
    path = tmp_path / "big"
    text = "".join(f"{i:08x}-{i:08x} : line\n" for i in range(10000))
    path.write_text(text)
    assert target.read_text(path) == text
    (tmp_path / "n").write_text("0x200000\n")
    assert target.read_int(tmp_path / "n") == 0x200000


def test_the_pool_sums_every_obmm_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, used, total in (("obmm-0", 0x1000, 0x10000), ("obmm-1", 0x2000, 0x20000)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "used").write_text(f"{used}\n")
        (tmp_path / name / "total").write_text(f"{total}\n")
    (tmp_path / "other").mkdir()
    monkeypatch.setattr(target, "MEMPOOL", tmp_path)
    assert (target.pool_used(), target.pool_total()) == (0x3000, 0x30000)
    monkeypatch.setattr(target, "MEMPOOL", tmp_path / "absent")
    assert (target.pool_used(), target.pool_total()) == (0, 0)


def test_module_calls_report_an_errno_instead_of_raising(tmp_path: Path) -> None:
    """rmmod and insmod are the system calls themselves (no program started per reload): a
    refusal is an errno, what Module.rmmod/insmod turn into their outcome."""
    assert target.delete_module("obmm_fuzz_no_such_module") != 0
    bogus = tmp_path / "bogus.ko"
    bogus.write_bytes(b"not an ELF module")
    assert target.finit_module(bogus, "node_id=0") != 0


def test_files_in_lists_files_sorted_and_follows_links(tmp_path: Path) -> None:
    """The sysfs operation reads every file of a directory: subdirectories left out, a link
    to a file kept, a directory that is gone has none."""
    (tmp_path / "b").write_text("1\n")
    (tmp_path / "a").write_text("2\n")
    (tmp_path / "power").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "a")
    (tmp_path / "subsystem").symlink_to(tmp_path / "power")
    assert target.files_in(tmp_path) == [str(tmp_path / n) for n in ("a", "b", "link")]
    assert target.files_in(tmp_path / "absent") == []
    assert target.files_in(tmp_path / "a") == []


def _counting_opens(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    opened: list[str] = []
    real = target.os.open

    def counting(path: object, flags: int, *args: int) -> int:
        opened.append(str(path))
        return real(path, flags, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(target.os, "open", counting)
    return opened


def test_a_kept_file_is_read_afresh_from_one_descriptor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model check's files stay open: each read shows what the file holds now."""
    opened = _counting_opens(monkeypatch)
    path = tmp_path / "refcnt"
    path.write_text("1\n")
    assert target.read_kept_int(path) == 1
    path.write_text("22\n")
    assert target.read_kept_int(path) == 22
    big = "x" * 200_000
    path.write_text(big)
    assert target.read_kept(path) == big.encode()
    assert opened == [str(path)]


def test_a_kept_descriptor_that_fails_is_opened_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a module reload the old sysfs or /proc descriptor fails (ENODEV, EIO): the file
    is opened again and what it holds now returned."""
    import errno

    path = tmp_path / "revoked"
    path.write_text("3 4\n")
    assert target.read_kept(path) == b"3 4\n"
    opened = _counting_opens(monkeypatch)
    real_pread = target.os.pread
    failed: list[int] = []

    def stale_once(fd: int, n: int, offset: int) -> bytes:
        if not failed:
            failed.append(fd)
            raise OSError(errno.ENODEV, "gone")
        return real_pread(fd, n, offset)

    closed: list[int] = []
    real_close = target.os.close

    def counting_close(fd: int) -> None:
        closed.append(fd)
        real_close(fd)

    monkeypatch.setattr(target.os, "pread", stale_once)
    monkeypatch.setattr(target.os, "close", counting_close)
    path.write_text("5\n")
    assert target.read_kept(path) == b"5\n"
    assert opened == [str(path)]
    assert closed == failed  # the stale descriptor, and only it, was closed


def test_a_kept_file_that_is_absent_raises_and_another_process_opens_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(FileNotFoundError):
        target.read_kept(tmp_path / "absent")
    path = tmp_path / "maps"
    path.write_text("a\n")
    target.read_kept(path)
    opened = _counting_opens(monkeypatch)
    pid = target.os.getpid()
    monkeypatch.setattr(target.os, "getpid", lambda: pid + 1)  # a forked child
    assert target.read_kept(path) == b"a\n"
    assert opened == [str(path)]  # /proc/self of the child is not the parent's


def test_close_kept_closes_and_the_next_read_opens_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "used"
    path.write_text("7\n")
    assert target.read_kept_int(path) == 7
    target.close_kept()
    opened = _counting_opens(monkeypatch)
    assert target.read_kept_int(path) == 7
    assert opened == [str(path)]
    target.close_kept()
