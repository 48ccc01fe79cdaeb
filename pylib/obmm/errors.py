"""The one exception type of the bindings: operation, errno name and a hint."""

from __future__ import annotations

import errno as errno_mod
import os

from obmm.causes import causes

# errno.errorcode picks one name where Linux has aliases; use the one the
# kernel sources and the OBMM docs use.
_PREFERRED_NAMES = {
    errno_mod.EOPNOTSUPP: "EOPNOTSUPP",
    errno_mod.EAGAIN: "EAGAIN",
    errno_mod.EDEADLK: "EDEADLK",
}


def errno_name(err: int) -> str:
    """`EEXIST` for 17; `errno 4242` for numbers the platform does not name."""
    return _PREFERRED_NAMES.get(err) or errno_mod.errorcode.get(err, f"errno {err}")


class ObmmError(OSError):
    """An OBMM operation failed.

    str() reads like `IMPORT failed: EEXIST (the PA range overlaps ...)`;
    `.op`, `.errno`, `.errname`, `.hint` and `.detail` carry the parts.
    """

    def __init__(self, op: str, err: int, detail: str = "") -> None:
        self.op = op
        self.errname = errno_name(err)
        self.detail = detail
        self.hint = "; or ".join(causes(op, self.errname)) or os.strerror(err)
        super().__init__(err, self._message())

    def _message(self) -> str:
        message = f"{self.op} failed: {self.errname} ({self.hint})"
        if self.detail:
            message += f" [{self.detail}]"
        return message

    def __str__(self) -> str:
        return self._message()
