"""Private apt lists for a Debian suite and architecture the host's own lists do not serve
(another suite, or a foreign guest architecture's kernel packages).

``<cache>/apt/<suite>-<arch>/`` holds its own ``sources.list``, lists, archives and an empty
dpkg status; :func:`apt_config` writes it, refreshes it with ``apt-get update`` when older than
a day and returns the ``apt.conf`` that :mod:`obmm.testbed.builds.kheaders` takes as
``apt_config``.  The host's apt configuration is never modified.  Only the Debian mirror
(``$OBMM_DEBIAN_MIRROR``, default ``http://deb.debian.org/debian``) and its security archive
are contacted.  The kernel matrix (:mod:`obmm.testbed.stages.matrix`) and the arm64 guests'
kernel (:mod:`obmm.testbed.builds.image`) read them.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from obmm import envvars
from obmm.testbed import paths
from obmm.testbed.builds import kheaders

DEFAULT_MIRROR = "http://deb.debian.org/debian"
DEFAULT_SECURITY_MIRROR = "http://deb.debian.org/debian-security"
KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
#: Private apt lists older than this are refreshed (``apt-get update``) before use.
LISTS_MAX_AGE_S = 24 * 3600.0
STAMP = "last-update"


def apt_root(suite: str, arch: str, cache: Path | None = None) -> Path:
    return (cache or paths.cache_dir()) / "apt" / f"{suite}-{arch}"


def sources_list(suite: str, archs: Sequence[str], mirror: str, security: str) -> str:
    """One-line-style sources for ``suite`` (+ -updates, + -security), main only."""
    opts = f"[arch={','.join(archs)} signed-by={KEYRING}]"
    return (
        f"deb {opts} {mirror} {suite} main\n"
        f"deb {opts} {mirror} {suite}-updates main\n"
        f"deb {opts} {security} {suite}-security main\n"
    )


def apt_conf(root: Path, archs: Sequence[str], native: str) -> str:
    """An apt.conf that keeps every path apt writes or reads for package lists under ``root``."""
    lines = [
        f'Dir::State "{root}/state";',
        f'Dir::State::Lists "{root}/state/lists";',
        f'Dir::State::status "{root}/state/status";',
        f'Dir::Cache "{root}/cache";',
        f'Dir::Cache::Archives "{root}/cache/archives";',
        f'Dir::Etc::SourceList "{root}/sources.list";',
        f'Dir::Etc::SourceParts "{root}/sources.list.d";',
        f'Dir::Etc::Preferences "{root}/preferences";',
        f'Dir::Etc::PreferencesParts "{root}/preferences.d";',
        # The host's native arch stays native: linux-kbuild-* (host tools) is taken unqualified.
        f'APT::Architecture "{native}";',
        "APT::Architectures { " + " ".join(f'"{a}";' for a in archs) + " };",
        'Acquire::Languages "none";',
        'Acquire::Retries "3";',
    ]
    return "\n".join(lines) + "\n"


def apt_config(
    suite: str,
    arch: str,
    *,
    what: str,
    cache: Path | None = None,
    mirror: str | None = None,
    security: str | None = None,
    max_age: float = LISTS_MAX_AGE_S,
    native: str | None = None,
) -> Path:
    """Write the private apt tree of `suite`/`arch` and refresh its lists; return its apt.conf.
    `what` names the caller in an error."""
    root = apt_root(suite, arch, cache)
    native = native or kheaders.host_arch()
    archs = [native] if arch == native else [native, arch]
    mirror = mirror or envvars.DEBIAN_MIRROR.raw() or DEFAULT_MIRROR
    security = security or envvars.DEBIAN_SECURITY_MIRROR.raw() or DEFAULT_SECURITY_MIRROR
    for sub in ("state/lists/partial", "cache/archives/partial", "sources.list.d", "preferences.d"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    (root / "state" / "status").touch()
    (root / "preferences").touch()
    conf = root / "apt.conf"
    wanted = {
        conf: apt_conf(root, archs, native),
        root / "sources.list": sources_list(suite, archs, mirror, security),
    }
    changed = False
    for path, text in wanted.items():
        if not path.is_file() or path.read_text() != text:
            path.write_text(text)
            changed = True
    stamp = root / STAMP
    fresh = stamp.is_file() and time.time() - stamp.stat().st_mtime < max_age
    if changed or not fresh:
        update_lists(conf, what=f"{what}: apt-get update")
        stamp.write_text(time.strftime("%Y-%m-%dT%H:%M:%SZ\n", time.gmtime()))
    return conf


def update_lists(conf: Path, *, what: str) -> None:
    argv = ["apt-get", "-q", "update"]
    if os.geteuid() == 0:
        argv += ["-o", "APT::Sandbox::User=root"]
    env = {**os.environ, "APT_CONFIG": str(conf)}
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    # apt-get update exits 0 on some fetch failures; "W:"/"E:" lines say so.
    bad = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.startswith(("E:", "Err:"))]
    if proc.returncode != 0 or bad:
        detail = " | ".join((bad or proc.stderr.strip().splitlines() or ["no output"])[-4:])
        raise kheaders.KbuildError(
            f"{what} failed (exit {proc.returncode}): {detail}. "
            "Check access to deb.debian.org (or $OBMM_DEBIAN_MIRROR)."
        )
