"""The node agent's OBMM steps (obmm.ubse.agent) against a fake device: all or none, the
failed step named, the undo newest first; a release stops at the first memid that fails."""

from __future__ import annotations

import errno
from types import SimpleNamespace
from typing import Any

import pytest

from obmm.ubse import agent
from obmm.ubse.registry import AgentError


class FakeObmm:
    """export/import_ give memids 1, 2, ... and fail with EBUSY at call `fail_at` (1-based)."""

    def __init__(self, fail_at: int = 0) -> None:
        self.fail_at, self.calls, self.undone = fail_at, 0, []

    def __enter__(self) -> FakeObmm:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def _next(self) -> int:
        self.calls += 1
        if self.calls == self.fail_at:
            raise OSError(errno.EBUSY, "busy")
        return self.calls

    def export(self, block: int) -> Any:
        return SimpleNamespace(mem_id=self._next())

    def import_(self, addr: int, length: int, **ids: int) -> Any:
        return SimpleNamespace(mem_id=self._next())

    def unexport(self, mem_id: int) -> None:
        self.undone.append(("unexport", mem_id))

    def unimport(self, mem_id: int) -> None:
        if mem_id == 2:
            raise OSError(errno.ENOENT, "gone")
        self.undone.append(("unimport", mem_id))


@pytest.fixture
def dev(monkeypatch: pytest.MonkeyPatch) -> FakeObmm:
    fake = FakeObmm()
    monkeypatch.setattr(agent.obmm, "Obmm", lambda: fake)
    monkeypatch.setattr(agent.identity.NodeIdentity, "local", classmethod(lambda cls: "me"))
    monkeypatch.setattr(agent.identity, "local_cna", lambda: 1)
    monkeypatch.setattr(agent.identity, "local_eid", lambda: 1)
    monkeypatch.setattr(agent.Handle, "from_export", lambda exp, me: SimpleNamespace(
        to_dict=lambda: {"mem_id": exp.mem_id}))  # fmt: skip
    handle = SimpleNamespace(node_id=1, uba=0, length=4096, scna=2, tokenid=0, seid=2)
    monkeypatch.setattr(agent.Handle, "from_dict", lambda doc: handle)
    monkeypatch.setattr(agent.decoder, "default_decoder", lambda: SimpleNamespace(
        resolve=lambda node, uba, length: 0x1000))  # fmt: skip
    return fake


def test_every_export_returns_its_handle(dev: FakeObmm) -> None:
    assert agent.export(4096, 3) == [{"mem_id": 1}, {"mem_id": 2}, {"mem_id": 3}]
    assert dev.undone == []


@pytest.mark.parametrize("step", ["export", "import"])
def test_a_failed_step_undoes_the_done_ones_newest_first_and_is_named(
    dev: FakeObmm, step: str
) -> None:
    dev.fail_at = 3
    with pytest.raises(AgentError) as info:
        if step == "export":
            agent.export(4096, 4)
        else:
            dev.unimport = dev.unexport  # type: ignore[method-assign]  # a clean undo
            agent.import_([{}] * 4)
    assert info.value.errno == errno.EBUSY
    assert str(info.value).startswith(f"{step} 3 of 4: ")
    assert dev.undone == [("unexport", 2), ("unexport", 1)]


def test_a_release_stops_at_the_memid_that_fails_and_names_it(dev: FakeObmm) -> None:
    with pytest.raises(AgentError) as info:
        agent.unimport([1, 2, 3])
    assert info.value.errno == errno.ENOENT and str(info.value).startswith("unimport 2: ")
    assert dev.undone == [("unimport", 1)]
