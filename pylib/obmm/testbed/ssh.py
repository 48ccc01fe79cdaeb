"""SSH to a guest, with paramiko's traps designed around.

* Both output streams are drained while the command runs (select on the channel), so a command
  writing megabytes never deadlocks on a full window.
* Every wait has a wall-clock deadline that is enforced by closing the channel; a bare
  ``recv_exit_status()`` (which ignores timeouts) is never called.
* Connecting retries while sshd starts ("Error reading SSH protocol banner"), up to a deadline,
  and gives up at once when the guest's QEMU has exited.
* Distinct errors: :class:`GuestGone` (the VM died), :class:`CommandTimeout`,
  :class:`CommandFailed` (non-zero exit, only with ``check=True``).
"""

from __future__ import annotations

import base64
import logging
import os
import select
import socket
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import paramiko

from obmm.testbed.errors import TestbedError

log = logging.getLogger(__name__)

CONNECT_ATTEMPT_TIMEOUT_S = 10.0
# The first login attempts give up fast: while a booting guest's NIC is not up yet, user-mode
# networking holds the host side of the connection open and the guest only sees the SYN again
# at TCP's retransmission (1 s, 3 s, 7 s later); a fresh connection is quicker.  Each timed-out
# attempt doubles the bound, up to CONNECT_ATTEMPT_TIMEOUT_S, so a slow login still gets in.
FIRST_ATTEMPT_TIMEOUT_S = 1.0
# Short: a fast-boot node is up seconds after QEMU starts.
RETRY_INTERVAL_S = 0.25
KEEPALIVE_S = 15
LOST_GRACE_S = 2.0


class SshError(TestbedError, RuntimeError):
    """Base of the errors this module raises."""


class GuestGone(SshError):
    """The guest stopped answering or its QEMU exited."""


class ConnectTimeout(SshError):
    """sshd did not accept a login before the deadline."""


class CommandTimeout(SshError):
    """A command overran its deadline; the channel was closed.  Carries the partial output."""

    def __init__(self, message: str, stdout: bytes = b"", stderr: bytes = b"") -> None:
        super().__init__(message)
        self.stdout = stdout
        self.stderr = stderr


# A command's status when its node (or the connection) died under it: ssh(1)'s.  A Result's
# exit_status is -1 then; the CLI verbs exit with this.
EXIT_GUEST_GONE = 255


@dataclass(frozen=True)
class Result:
    command: str
    exit_status: int
    stdout: bytes
    stderr: bytes
    duration: float

    @property
    def out(self) -> str:
        return self.stdout.decode(errors="replace")

    @property
    def err(self) -> str:
        return self.stderr.decode(errors="replace")

    @property
    def ok(self) -> bool:
        return self.exit_status == 0


class CommandFailed(SshError):
    def __init__(self, result: Result) -> None:
        tail = (result.err or result.out).strip()[-2000:]
        super().__init__(
            f"command failed with exit status {result.exit_status}: {result.command}\n{tail}"
        )
        self.result = result


def _quiet_paramiko() -> None:
    # paramiko logs every failed banner read while sshd boots as an ERROR with a traceback;
    # this wrapper turns failures into exceptions, so its log is only wanted when debugging.
    if not log.isEnabledFor(logging.DEBUG):
        logging.getLogger("paramiko.transport").setLevel(logging.CRITICAL)


def _always_alive() -> bool:
    return True


@dataclass(frozen=True)
class Target:
    """Where and how to log in."""

    host: str
    port: int
    key_file: Path
    user: str = "root"
    # "ssh-ed25519 AAAA..." recorded when the image was built; None accepts any key
    # (the hardware stage, where the operator's known_hosts is the authority).
    host_key: str | None = None


class _PinnedKeyPolicy(paramiko.MissingHostKeyPolicy):
    """Accept exactly the host key recorded at image build."""

    def __init__(self, expected: str | None) -> None:
        self.expected = expected

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        if self.expected is None:
            return
        kind, _, blob = self.expected.partition(" ")
        if key.get_name() != kind or key.asbytes() != base64.b64decode(blob.split()[0]):
            raise paramiko.SSHException(
                f"host key mismatch for {hostname}: got {key.get_name()}, expected the key "
                "recorded in the image manifest"
            )


class Connection:
    """A logged-in SSH session to one guest."""

    def __init__(
        self,
        target: Target,
        *,
        alive: Callable[[], bool] = _always_alive,
        name: str = "guest",
    ) -> None:
        self.target = target
        self.alive = alive
        self.name = name
        self._client: paramiko.SSHClient | None = None

    # -- connection -------------------------------------------------------------------------

    def connect(self, deadline: float, *, first_attempt: float | None = None) -> None:
        """Log in, retrying while sshd starts, until `deadline` (a time.monotonic() value).
        `first_attempt`: the first try's bound, when sshd is known to listen already."""
        _quiet_paramiko()
        attempt = 0
        bound = first_attempt or FIRST_ATTEMPT_TIMEOUT_S
        last_error: BaseException | None = None
        while True:
            attempt += 1
            if not self.alive():
                raise GuestGone(f"{self.name}: QEMU exited before sshd answered")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ConnectTimeout(
                    f"{self.name}: no ssh login on {self.target.host}:{self.target.port} "
                    f"after {attempt - 1} attempts: {last_error}"
                )
            client = paramiko.SSHClient()
            client.set_missing_host_key_policy(_PinnedKeyPolicy(self.target.host_key))
            per_try = max(1.0, min(bound, remaining))
            tried_at = time.monotonic()
            try:
                client.connect(
                    self.target.host,
                    port=self.target.port,
                    username=self.target.user,
                    key_filename=str(self.target.key_file),
                    timeout=per_try,
                    banner_timeout=per_try,
                    auth_timeout=per_try,
                    look_for_keys=False,
                    allow_agent=False,
                )
            except (paramiko.SSHException, OSError, EOFError) as exc:
                client.close()
                last_error = exc
                # An attempt that used up its bound (banner, auth or connect: paramiko words
                # each differently) gets twice the time next.
                if time.monotonic() - tried_at >= 0.9 * per_try:
                    bound = min(CONNECT_ATTEMPT_TIMEOUT_S, 2 * bound)
                log.debug("%s: ssh attempt %d: %s", self.name, attempt, exc)
                time.sleep(min(RETRY_INTERVAL_S, max(0.0, deadline - time.monotonic())))
                continue
            transport = client.get_transport()
            if transport is not None:
                transport.set_keepalive(KEEPALIVE_S)
            self._client = client
            log.debug("%s: ssh up after %d attempts", self.name, attempt)
            return

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _transport(self) -> paramiko.Transport:
        client = self._client
        transport = client.get_transport() if client is not None else None
        if transport is None or not transport.is_active():
            if not self.alive():
                raise GuestGone(f"{self.name}: QEMU exited")
            raise GuestGone(f"{self.name}: ssh connection lost")
        return transport

    # -- commands ---------------------------------------------------------------------------

    def run(
        self,
        command: str,
        *,
        timeout: float,
        check: bool = False,
        stdin: bytes | None = None,
        on_stdout: Callable[[bytes], None] | None = None,
        on_stderr: Callable[[bytes], None] | None = None,
    ) -> Result:
        """Run `command` in the guest; its exit status, stdout and stderr come back.

        The deadline (`timeout` seconds of wall clock) is enforced: when it passes the channel
        is closed and CommandTimeout raised.  If the guest dies meanwhile, GuestGone is raised
        within about a second.
        """
        start = time.monotonic()
        deadline = start + timeout
        try:
            chan = self._transport().open_session(timeout=min(timeout, 30.0))
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise self._lost(exc) from exc
        out: list[bytes] = []
        err: list[bytes] = []
        try:
            chan.exec_command(command)
            if stdin is not None:
                chan.sendall(stdin)
            chan.shutdown_write()
            # fileno() makes a pipe that becomes readable on stdout *or* stderr data.
            fd = chan.fileno()
            while True:
                got = False
                while chan.recv_ready():
                    data = chan.recv(65536)
                    if not data:
                        break
                    got = True
                    out.append(data)
                    if on_stdout is not None:
                        on_stdout(data)
                while chan.recv_stderr_ready():
                    data = chan.recv_stderr(65536)
                    if not data:
                        break
                    got = True
                    err.append(data)
                    if on_stderr is not None:
                        on_stderr(data)
                drained = not chan.recv_ready() and not chan.recv_stderr_ready()
                if chan.exit_status_ready() and drained and (chan.eof_received or chan.closed):
                    break
                if got:
                    continue
                if chan.closed and not chan.exit_status_ready():
                    # Closed without an exit status: the transport died under us.
                    raise self._lost(None)
                now = time.monotonic()
                if now >= deadline:
                    raise CommandTimeout(
                        f"{self.name}: command exceeded its {timeout:.0f} s deadline: {command}",
                        b"".join(out),
                        b"".join(err),
                    )
                if not self.alive():
                    raise GuestGone(f"{self.name}: QEMU exited while running: {command}")
                if not self._transport().is_active():
                    raise self._lost(None)
                select.select([fd], [], [], min(0.5, deadline - now))
            status = chan.exit_status
            if status == -1 and (not self.alive() or not self._transport().is_active()):
                # paramiko reports -1 when the transport died under the channel.
                raise self._lost(None)
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise self._lost(exc) from exc
        finally:
            chan.close()
        result = Result(command, status, b"".join(out), b"".join(err), time.monotonic() - start)
        if check and not result.ok:
            raise CommandFailed(result)
        return result

    def _lost(self, exc: BaseException | None) -> GuestGone:
        why = f": {exc}" if exc else ""
        # A panicking guest drops the connection a moment before its QEMU has exited.
        deadline = time.monotonic() + LOST_GRACE_S
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        if not self.alive():
            return GuestGone(f"{self.name}: QEMU exited{why}")
        return GuestGone(f"{self.name}: ssh connection lost{why}")

    # -- files ------------------------------------------------------------------------------

    def put(self, local: Path, remote: str, *, timeout: float = 300.0) -> None:
        """Copy a file or a directory tree (recursively) to `remote` in the guest."""

        def put(sftp: paramiko.SFTPClient) -> None:
            dest = PurePosixPath(remote)
            try:
                if stat.S_ISDIR(sftp.stat(remote).st_mode or 0):
                    dest = dest / local.name  # like cp: into an existing directory
            except OSError:
                pass
            _put(sftp, local, dest)

        self._sftp_do(put, timeout)

    def get(self, remote: str, local: Path, *, timeout: float = 300.0) -> None:
        self._sftp_do(lambda sftp: sftp.get(remote, str(local)), timeout)

    def _sftp_do(self, fn: Callable[[paramiko.SFTPClient], object], timeout: float) -> None:
        try:
            sftp = paramiko.SFTPClient.from_transport(self._transport())
            if sftp is None:
                raise GuestGone(f"{self.name}: cannot open sftp")
            with sftp:
                channel = sftp.get_channel()
                if channel is not None:
                    # Per-operation inactivity limit: a dead guest does not block a copy forever.
                    channel.settimeout(timeout)
                fn(sftp)
        except socket.timeout as exc:
            raise CommandTimeout(f"{self.name}: sftp stalled for {timeout:.0f} s") from exc
        except (EOFError, paramiko.SSHException) as exc:
            raise self._lost(exc) from exc


def _put(sftp: paramiko.SFTPClient, local: Path, remote: PurePosixPath) -> None:
    if local.is_dir():
        _mkdirs(sftp, remote)
        for child in sorted(local.iterdir()):
            if child.name == "__pycache__" or child.name.endswith(".pyc"):
                continue
            _put(sftp, child, remote / child.name)
    else:
        sftp.put(str(local), str(remote))
        mode = os.stat(local).st_mode
        sftp.chmod(str(remote), stat.S_IMODE(mode))


def _mkdirs(sftp: paramiko.SFTPClient, path: PurePosixPath) -> None:
    try:
        sftp.stat(str(path))
        return
    except OSError:
        pass
    if path.parent != path:
        _mkdirs(sftp, path.parent)
    sftp.mkdir(str(path))
