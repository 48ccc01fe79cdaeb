"""Kernel log scanner: find WARN, BUG, oops, KASAN, lockdep, stalls and panics in a log.

A non-fatal splat leaves the guest alive and the test green unless someone
looks; this module looks.  ``scan(text)`` returns one Report per incident,
with the incident's block of lines as the excerpt, so a failing test can show
what the kernel said.  It fails closed: besides the known report headers, any
generic ``BUG:``/``WARNING:``/``INFO:`` line, a stray stack trace or end-trace
marker, lost log records and non-benign taint flags are reported too.  Known
benign lines are dropped only through an AllowRule with a stated reason.

``KmsgWatcher`` reads /dev/kmsg incrementally so a test fixture can mark the
log before a test and scan what the test produced.

Runs inside the guests: pure Python >= 3.9, no dependencies.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from re import Pattern

#: Longest excerpt for a report without an end marker (hung task, lockdep...).
MAX_BLOCK_LINES = 80
#: Lines after an end marker where stray register dumps still belong to that
#: report (x86 repeats RIP/Code/registers after "---[ end trace").
TAIL_LINES = 40
#: Taint flags that loading our own out-of-tree, unsigned modules sets.
BENIGN_TAINT = "OE"


class Kind:
    """Report kinds (plain strings, so they compare and print simply)."""

    WARN = "warn"
    BUG = "bug"
    OOPS = "oops"
    KASAN = "kasan"
    KFENCE = "kfence"
    UBSAN = "ubsan"
    LOCKDEP = "lockdep"
    RCU_STALL = "rcu_stall"
    HUNG_TASK = "hung_task"
    SOFT_LOCKUP = "soft_lockup"
    HARD_LOCKUP = "hard_lockup"
    PANIC = "panic"
    KMEMLEAK = "kmemleak"
    TAINT = "taint"
    LOST = "lost"
    COHERENCE = "coherence"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Report:
    """One incident: its kind, the 1-based line where its block starts, and the block."""

    kind: str
    line_no: int
    excerpt: str
    title: str  # the header line that identified the incident

    def __str__(self) -> str:
        return f"{self.kind} at log line {self.line_no}: {self.title}\n{self.excerpt}"


@dataclass(frozen=True)
class AllowRule:
    """A known-benign report: ``pattern`` matched against its header lines, and why."""

    pattern: str
    reason: str

    def __post_init__(self) -> None:
        # An empty pattern or reason would silently allow everything / nothing documented.
        if not self.pattern.strip():
            raise ValueError("AllowRule pattern must not be empty")
        if not self.reason.strip():
            raise ValueError(f"AllowRule {self.pattern!r} needs a reason")
        re.compile(self.pattern)


#: Informational lines that match a generic pattern but are not kernel bugs.
DEFAULT_ALLOW: tuple[AllowRule, ...] = (
    AllowRule(
        r"RETBleed: WARNING: Spectre v2 mitigation leaves CPU vulnerable",
        "CPU vulnerability advisory at boot (emulated CPU model), not a kernel bug",
    ),
    AllowRule(
        r"Spectre V2 : WARNING: Unprivileged eBPF is enabled",
        "CPU vulnerability advisory at boot, not a kernel bug",
    ),
    AllowRule(
        r"^INFO: NMI handler \(\w+\) took too long to run",
        "perf NMI timing note; routine on a slow emulated (TCG) CPU, not a bug",
    ),
)


@dataclass(frozen=True)
class _Header:
    kind: str
    regex: Pattern[str]
    family: str  # headers of one family inside an open block belong to that block
    end: Pattern[str] | None = None  # line that closes the block (inclusive)


_END_TRACE = re.compile(r"---\[ end trace")
_END_PANIC = re.compile(r"---\[ end Kernel panic")
_BANNER = re.compile(r"^={20,}\s*$")
_CUT_HERE = re.compile(r"-+\[ cut here \]-+")
#: Lines between a cut-here and the header it announces (WARN's own message may span some).
_CUT_HERE_WINDOW = 8

# Order matters: the first match names the kind, so specific before generic.
_HEADERS: tuple[_Header, ...] = (
    _Header(Kind.KASAN, re.compile(r"\bBUG: KASAN: "), "kasan", _BANNER),
    _Header(Kind.KFENCE, re.compile(r"\bBUG: KFENCE: "), "kfence", _BANNER),
    _Header(Kind.UBSAN, re.compile(r"\bUBSAN: "), "ubsan", _BANNER),
    _Header(Kind.SOFT_LOCKUP, re.compile(r"\bwatchdog: BUG: soft lockup"), "lockup"),
    _Header(Kind.HARD_LOCKUP, re.compile(r"[Ww]atchdog detected hard LOCKUP"), "lockup"),
    _Header(
        Kind.LOCKDEP,
        re.compile(
            r"\bWARNING: (possible circular locking dependency|possible recursive locking"
            r"|inconsistent lock state|suspicious RCU usage|bad unlock balance"
            r"|held lock freed|lock held when returning to user space"
            r"|possible irq lock inversion|.*-safe -> .*-unsafe lock order"
            r"|nested lock was not taken|bad contention detected)"
            r"|\bINFO: trying to register non-static key"
            r"|\bBUG: (looking up invalid subclass|key \S+ has not been registered|MAX_LOCK)"
        ),
        "lockdep",
    ),
    _Header(
        Kind.RCU_STALL,
        re.compile(
            r"\brcu: INFO: rcu_\w+ (self-)?detected (expedited )?stalls?"
            r"|\brcu_\w+ self-detected stall|\bdetected stalls on CPUs"
        ),
        "rcu",
    ),
    _Header(
        Kind.HUNG_TASK, re.compile(r"\bINFO: task .+ blocked for more than \d+ seconds"), "hung"
    ),
    _Header(Kind.PANIC, re.compile(r"\bKernel panic - not syncing"), "panic", _END_PANIC),
    _Header(
        Kind.OOPS,
        re.compile(
            r"\bBUG: unable to handle\b|\bBUG: kernel NULL pointer dereference"
            r"|^(?!.*\btraps: ).*\bgeneral protection fault"
            r"|\bOops: |\bUnable to handle kernel\b|\bInternal error: "
            r"|\binvalid opcode: \d+ \[#\d+\]"
        ),
        "oops",
        _END_TRACE,
    ),
    _Header(Kind.BUG, re.compile(r"\bkernel BUG at\b"), "oops", _END_TRACE),
    _Header(Kind.KMEMLEAK, re.compile(r"\bkmemleak: \d+ new suspected memory leaks"), "kmemleak"),
    _Header(Kind.WARN, re.compile(r"\bWARNING: CPU: \d+ PID: \d+ at\b"), "warn", _END_TRACE),
    _Header(Kind.BUG, re.compile(r"\bBUG: "), "bug", _END_TRACE),
    _Header(Kind.WARN, re.compile(r"\bWARNING: "), "warn", _END_TRACE),
    _Header(Kind.UNKNOWN, re.compile(r"^INFO: "), "info"),
    _Header(
        Kind.LOST,
        re.compile(r"\bobmm\.logscan: \d+ kernel log records? lost\b"),
        "lost",
    ),
    _Header(Kind.TAINT, re.compile(r"\bDisabling lock debugging due to kernel taint"), "taint"),
)

#: The emulator's `strict` coherence model found a node using an out-of-date line, or losing a
#: write (kmod/obmm_emu/cache.c, docs/coherence.md): one line, which says what would fix it.
_COHERENCE = re.compile(r"\bobmm: coherence: (stale read|lost write|discarded write): ")

#: Trace-shaped lines that only ever appear inside a report; outside one they mean
#: a report whose header we did not recognise.
_ORPHANS: tuple[Pattern[str], ...] = (
    re.compile(r"\bCall Trace:"),
    _END_TRACE,
    re.compile(r"\bRIP: [0-9a-f]{4}:"),
    re.compile(r"\bpc : \S+\+0x"),
)

_TAINTED = re.compile(r"\bTainted: ((?:[A-Z] *)+?)\s+(?=\S*\d)")

# dmesg "[   12.345678] ", an optional caller id "[T123] ", or a kmsg "<4>" priority.
_PREFIX = re.compile(r"^(?:<\d+>)?(?:\[\s*\d+\.\d+\]\s?)?(?:\[\s*[CT]\d+\]\s?)?")


def _message(line: str) -> str:
    return _PREFIX.sub("", line, count=1)


def _match_header(msg: str) -> _Header | None:
    for header in _HEADERS:
        if header.regex.search(msg):
            return header
    return None


def taint_flags(line: str) -> str:
    """The taint letters of a ``Tainted: G   W  OE`` line, without G/P filler; "" if none."""
    m = _TAINTED.search(line)
    if not m:
        return ""
    return "".join(c for c in m.group(1) if c.isalpha() and c != "G")


def taint_letters(mask: int) -> str:
    """Letters for a /proc/sys/kernel/tainted bit mask (kernel/panic.c taint_flags order)."""
    letters = "PFSRMBUDAWCIOELKXTN"
    return "".join(letters[bit] for bit in range(len(letters)) if mask & (1 << bit))


@dataclass
class _Block:
    start: int  # 0-based index of the first excerpt line
    kind: str | None  # None: a cut-here block waiting for its header
    family: str | None
    end: Pattern[str] | None
    title: str
    header_index: int


def new_taint(before: int, after: int) -> str:
    """Letters of taint bits set since `before` that our own modules do not explain (the
    verdict of every kernel-log guard, in a guest or over SSH)."""
    gained = taint_letters(after & ~before)
    return "".join(c for c in gained if c not in BENIGN_TAINT)


def _allowed_by(
    lines: Sequence[str], block: _Block, allow: Sequence[AllowRule]
) -> AllowRule | None:
    heads = [_message(line) for line in lines[block.start : block.header_index + 1]]
    return next((rule for rule in allow for head in heads if re.search(rule.pattern, head)), None)


def scan(
    text: str,
    *,
    allow: Iterable[AllowRule] = DEFAULT_ALLOW,
    benign_taint: str = BENIGN_TAINT,
    allowed: list[tuple[Report, AllowRule]] | None = None,
) -> list[Report]:
    """Reports of kernel trouble in ``text`` (dmesg, console log or /dev/kmsg output).  The
    reports a rule of ``allow`` excused go to ``allowed``, with that rule, when it is given."""
    rules = tuple(allow)
    # Split on "\n" only, so line numbers match grep and editors even when a
    # console log holds stray carriage returns.
    lines = [line.rstrip("\r") for line in text.split("\n")]
    if lines and not lines[-1]:
        lines.pop()
    reports: list[Report] = []
    block: _Block | None = None
    quiet_until = -1  # orphan trace lines before this index belong to the last report

    def close(last: int) -> None:
        nonlocal block
        if block is None:
            return
        if block.kind is None:  # a cut-here with no header after it: still a splat
            block.kind = Kind.WARN
        rule = _allowed_by(lines, block, rules)
        if rule is None or allowed is not None:
            excerpt = "\n".join(lines[block.start : last + 1])
            report = Report(block.kind, block.start + 1, excerpt, block.title)
            if rule is None:
                reports.append(report)
            elif allowed is not None:
                allowed.append((report, rule))
        block = None

    def open_block(i: int, header: _Header | None, msg: str) -> None:
        nonlocal block
        start = i
        # Include the "=====" banner or cut-here line printed just before a header.
        if header is not None and i > 0:
            prev = _message(lines[i - 1])
            if _BANNER.match(prev) or _CUT_HERE.search(prev):
                start = i - 1
        if header is None:
            block = _Block(start, None, None, _END_TRACE, msg.strip(), i)
        else:
            block = _Block(start, header.kind, header.family, header.end, msg.strip(), i)

    for i, line in enumerate(lines):
        msg = _message(line)
        if block is not None:
            if block.end is not None and i > block.header_index and block.end.search(msg):
                close(i)
                quiet_until = i + TAIL_LINES
                continue
            if i - block.start >= MAX_BLOCK_LINES:
                close(i - 1)
        if _CUT_HERE.search(msg):
            close(i - 1)
            open_block(i, None, msg)
            continue
        header = _match_header(msg)
        if header is not None:
            if block is not None and block.kind is None and i - block.start <= _CUT_HERE_WINDOW:
                # The header a cut-here announced (WARN, kernel BUG at ...).
                block.kind, block.family, block.end = header.kind, header.family, header.end
                block.title, block.header_index = msg.strip(), i
                continue
            if block is not None and header.family == block.family:
                continue  # e.g. "Oops:" after "BUG: kernel NULL pointer dereference"
            if block is not None and block.end is _BANNER:
                continue  # KASAN/UBSAN bodies run to their closing banner
            close(i - 1)
            open_block(i, header, msg)
            continue
        if block is not None or i < quiet_until:
            continue
        if any(p.search(msg) for p in _ORPHANS):
            open_block(i, _Header(Kind.UNKNOWN, _ORPHANS[0], "orphan"), msg)
            continue
        extra = "".join(c for c in taint_flags(msg) if c not in benign_taint)
        if extra:
            open_block(i, _Header(Kind.TAINT, _TAINTED, "taint"), msg)
    close(len(lines) - 1)
    for i, line in enumerate(lines):
        msg = _message(line)
        if _COHERENCE.search(msg):
            reports.append(Report(Kind.COHERENCE, i + 1, line, msg.strip()))
    # Taint is evidence of a splat; once the splat itself is reported it adds nothing.
    if any(r.kind != Kind.TAINT for r in reports):
        reports = [r for r in reports if r.kind != Kind.TAINT]
    return reports


def after_marker(text: str, marker: str) -> str:
    """The lines of a kernel log after the last line holding `marker` (all of `text` if no
    line does: the marker scrolled out of the buffer, or the node restarted)."""
    cut = text.rfind(marker)
    if cut < 0:
        return text
    end = text.find("\n", cut)
    return "" if end < 0 else text[end + 1 :]


def format_reports(reports: Sequence[Report]) -> str:
    """Human-readable text of reports, for a test failure message."""
    parts = [f"{len(reports)} kernel log report(s):"]
    for report in reports:
        parts.append(f"--- {report.kind} at log line {report.line_no}: {report.title}")
        parts.append(report.excerpt)
    return "\n".join(parts)


# ---------------------------------------------------------------------------
# /dev/kmsg


@dataclass(frozen=True)
class KmsgRecord:
    """One /dev/kmsg record: ``pri,seq,ts_usec,flags[,...];message`` plus continuation lines."""

    level: int
    facility: int
    seq: int
    ts_usec: int
    flags: str
    message: str  # unescaped; may hold several lines
    continuation: tuple[str, ...]  # " KEY=value" dictionary lines, leading space removed

    def format(self) -> str:
        """dmesg-style text: ``[  ts.usec] message``, continuation lines indented."""
        stamp = f"[{self.ts_usec // 1000000:5d}.{self.ts_usec % 1000000:06d}] "
        out = [stamp + part for part in self.message.split("\n")]
        out.extend(" " + c for c in self.continuation)
        return "\n".join(out)


_ESCAPE = re.compile(r"\\x([0-9a-fA-F]{2})")


def _unescape(text: str) -> str:
    # kmsg escapes non-printable bytes (newlines included) as \xNN.
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), text)


def parse_kmsg_record(raw: bytes | str) -> KmsgRecord:
    """Parse one record as read() returns it from /dev/kmsg."""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    head, sep, rest = text.partition(";")
    fields = head.split(",")
    if not sep or len(fields) < 4:
        raise ValueError(f"not a /dev/kmsg record: {text[:80]!r}")
    prefix = int(fields[0])
    lines = rest.rstrip("\n").split("\n")
    continuation = tuple(line[1:] for line in lines[1:] if line.startswith(" "))
    return KmsgRecord(
        level=prefix & 7,
        facility=prefix >> 3,
        seq=int(fields[1]),
        ts_usec=int(fields[2]),
        flags=fields[3],
        message=_unescape(lines[0]),
        continuation=continuation,
    )


def parse_kmsg_records(raw: bytes | str) -> list[KmsgRecord]:
    """Parse a buffer of records: /dev/kmsg gives one per read(), a saved copy gives many.

    A record starts at a line that does not begin with a space; the lines after
    it that do are its continuation lines.
    """
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    chunks: list[list[str]] = []
    for line in text.splitlines():
        if line.startswith(" ") and chunks:
            chunks[-1].append(line)
        elif line:
            chunks.append([line])
    return [parse_kmsg_record("\n".join(chunk)) for chunk in chunks]


def lost_records_line(count: int, before_seq: int) -> str:
    """The line KmsgWatcher inserts for records overwritten before it read them."""
    return f"obmm.logscan: {count} kernel log records lost before seq {before_seq}"


def drain_records(
    read_raw: Callable[[], bytes], next_seq: int | None
) -> tuple[list[KmsgRecord], int | None]:
    """Read records until EAGAIN; returns them and the sequence number expected next.

    ``read_raw`` is one read() of /dev/kmsg: a whole record, BlockingIOError
    when none is pending, or EPIPE when the ring buffer overwrote records we
    had not read yet.  Gaps (EPIPE, or a jump in seq) become a lost-records
    record so the scanner fails closed.
    """
    records: list[KmsgRecord] = []
    lost = False
    while True:
        try:
            raw = read_raw()
        except BlockingIOError:
            break
        except OSError as exc:
            if exc.errno == errno.EPIPE:  # the next read resumes after the gap
                lost = True
                continue
            raise
        if not raw:
            break
        for record in parse_kmsg_records(raw):
            if lost or (next_seq is not None and record.seq > next_seq):
                missing = record.seq - next_seq if next_seq is not None else 1
                line = lost_records_line(max(missing, 1), record.seq)
                records.append(KmsgRecord(4, 0, record.seq, record.ts_usec, "-", line, ()))
                lost = False
            next_seq = record.seq + 1
            records.append(record)
    return records, next_seq


class KmsgWatcher:
    """Incremental reader of /dev/kmsg: ``read_new()`` returns what arrived since last time.

    Opens non-blocking and seeks to the end, so only messages logged after
    construction (or after the previous read_new()) are returned.  Records
    that the ring buffer overwrote before we read them become a "records lost"
    line, which scan() reports: a gap could hide a splat.
    """

    #: read() of /dev/kmsg needs room for one whole record (at most ~8 KiB).
    _READ_SIZE = 16384

    def __init__(self, path: str = "/dev/kmsg") -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        self._next_seq: int | None = None
        try:
            os.lseek(self._fd, 0, os.SEEK_END)
        except OSError:
            os.close(self._fd)
            raise

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> KmsgWatcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def read_records(self) -> list[KmsgRecord]:
        """Records logged since the last call; a lost-records marker where some were missed."""
        records, self._next_seq = drain_records(self._read_raw, self._next_seq)
        return records

    def _read_raw(self) -> bytes:
        return os.read(self._fd, self._READ_SIZE)

    def read_new(self) -> str:
        """dmesg-style text of the messages logged since the last call."""
        return "".join(r.format() + "\n" for r in self.read_records())


def write_marker(text: str, path: str = "/dev/kmsg") -> bool:
    """Log ``text`` to the kernel log, so console readers see test boundaries; False if refused."""
    try:
        # Only the kernel turns plain text into a record; never scribble on a
        # saved log or a test's stand-in file.
        if not stat.S_ISCHR(os.stat(path).st_mode):
            return False
        fd = os.open(path, os.O_WRONLY)
    except OSError:
        return False
    try:
        os.write(fd, text.encode("utf-8", "replace")[:900])
        return True
    except OSError:
        return False  # rate-limited (printk.devkmsg=ratelimit) or refused
    finally:
        os.close(fd)
