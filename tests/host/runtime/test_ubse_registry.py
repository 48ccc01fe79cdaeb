"""Our UBSE's rules and registry without a node: UBSE's checks, codes, block rounding, owners.

The agents are faked (what each node's OBMM would do); every assertion is a behaviour UBSE has,
with the function that has it named in obmm.ubse.rules / obmm.ubse.registry.
"""

from __future__ import annotations

import errno
from collections.abc import Sequence
from typing import Any

import pytest

from obmm.ubse import codes, rules
from obmm.ubse.codes import UbseError
from obmm.ubse.registry import AgentError, Identity, Node, Registry

MIB = 1 << 20
ALICE = Identity(uid=1000, gid=1000, pid=10, username="alice")
BOB = Identity(uid=1001, gid=1001, pid=11, username="bob")
ROOT = Identity(uid=0, gid=0, pid=1, username="root")


class FakeAgents:
    """Each node's OBMM steps, recorded; `full` nodes have no memory to export."""

    def __init__(self) -> None:
        self.next_id = 100
        self.exported: dict[int, list[int]] = {}
        self.imported: dict[int, list[int]] = {}
        self.full: set[int] = set()
        self.import_fails: set[int] = set()
        self.calls: list[tuple[str, int]] = []

    def _ids(self, n: int) -> list[int]:
        ids = list(range(self.next_id, self.next_id + n))
        self.next_id += n
        return ids

    def export(self, slot: int, block: int, count: int) -> list[dict[str, Any]]:
        self.calls.append(("export", slot))
        if slot in self.full:
            raise AgentError(errno.ENOMEM, "pool exhausted")
        ids = self._ids(count)
        self.exported.setdefault(slot, []).extend(ids)
        return [{"mem_id": i, "length": block, "node_id": slot - 1} for i in ids]

    def unexport(self, slot: int, mem_ids: Sequence[int]) -> None:
        for m in mem_ids:
            self.exported[slot].remove(m)

    def import_(self, slot: int, handles: Sequence[dict[str, Any]]) -> list[int]:
        if slot in self.import_fails:
            raise AgentError(errno.EINVAL, "no decoder window")
        ids = self._ids(len(handles))
        self.imported.setdefault(slot, []).extend(ids)
        return ids

    def unimport(self, slot: int, mem_ids: Sequence[int]) -> None:
        for m in mem_ids:
            self.imported[slot].remove(m)


@pytest.fixture
def agents() -> FakeAgents:
    return FakeAgents()


def registry(agents: FakeAgents, nodes: int = 2, **config: Any) -> Registry:
    reg = Registry(agents, rules.Config(**config))
    for slot in range(1, nodes + 1):
        reg.register(Node(slot=slot, hostname=f"node{slot - 1}"))
    return reg


def code_of(call: Any) -> int:
    with pytest.raises(UbseError) as info:
        call()
    return info.value.code


# -- the client's checks (libubse_helper.cpp) ------------------------------------------------


@pytest.mark.parametrize(
    ("name", "code"),
    [
        ("ok.name:1-_", 0),
        ("x" * 47, 0),
        ("x" * 48, codes.INVALID_ARG),
        ("", codes.INVALID_ARG),
        ("has space", codes.INVALID_ARG),
        ("slash/no", codes.INVALID_ARG),
        (None, codes.NULL_POINTER),
    ],
)
def test_names_follow_ubse_name_rules(name: str | None, code: int) -> None:
    assert rules.name_code(name) == code


@pytest.mark.parametrize(
    ("size", "code"),
    [
        (4 * MIB, 0),
        (6 * MIB, 0),
        (4 * MIB - 2 * MIB, codes.OUT_OF_RANGE),
        (5 * MIB, codes.OUT_OF_RANGE),  # not a multiple of 2 MiB
        (0, codes.OUT_OF_RANGE),
    ],
)
def test_sizes_are_at_least_4_mib_and_2_mib_aligned(size: int, code: int) -> None:
    assert rules.shm_create_code("n", size, None, None) == code


def test_node_lists_hold_one_to_sixteen_slots() -> None:
    assert rules.shm_create_code("n", 4 * MIB, [], None) == codes.OUT_OF_RANGE
    assert rules.shm_create_code("n", 4 * MIB, None, list(range(17))) == codes.OUT_OF_RANGE
    assert rules.shm_create_code("n", 4 * MIB, list(range(16)), [1]) == 0


def test_the_name_is_checked_before_the_size() -> None:
    assert rules.shm_create_code("bad name", 1, None, None) == codes.INVALID_ARG


def test_a_lender_size_needs_only_4_mib() -> None:
    assert rules.shm_create_with_lender_code("n", None, 5 * MIB) == 0
    assert rules.shm_create_with_lender_code("n", None, 2 * MIB) == codes.OUT_OF_RANGE
    assert rules.shm_create_with_lender_code("n", None, None) == codes.OUT_OF_RANGE


@pytest.mark.parametrize(
    ("configured", "used"),
    [(None, 128), (4, 4), (1024, 1024), (4096, 4096), (2, 128), (5, 128), (8192, 128)],
)
def test_block_size_is_getblocksize_s(configured: int | None, used: int) -> None:
    assert rules.block_mib(configured) == used


def test_sizes_round_up_to_whole_blocks() -> None:
    assert rules.blocks_for(4 * MIB, 128 * MIB) == 1
    assert rules.blocks_for(128 * MIB, 128 * MIB) == 1
    assert rules.blocks_for(130 * MIB, 128 * MIB) == 2


# -- the registry ----------------------------------------------------------------------------


def test_create_exports_one_memid_per_block_on_the_provider(agents: FakeAgents) -> None:
    reg = registry(agents, block_mib=4)
    reg.create("shm", 10 * MIB, who=ALICE, provider=[2])
    assert len(agents.exported[2]) == 3  # 10 MiB in 4 MiB blocks
    desc = reg.get("shm", ALICE)
    assert (desc["mem_size"], desc["unit_size"], desc["export_slot"]) == (10 * MIB, 4 * MIB, 2)
    assert desc["imports"] == []


def test_a_name_in_use_is_1006(agents: FakeAgents) -> None:
    reg = registry(agents, block_mib=4)
    reg.create("shm", 4 * MIB, who=ALICE)
    assert code_of(lambda: reg.create("shm", 4 * MIB, who=ALICE)) == codes.EXISTED


def test_no_lender_is_1013(agents: FakeAgents) -> None:
    reg = registry(agents, block_mib=4, lenders=(1,))
    # the provider asked for may not lend; a provider no node is; every candidate full
    assert code_of(lambda: reg.create("a", 4 * MIB, who=ALICE, provider=[2])) == codes.ALLOCATE
    assert code_of(lambda: reg.create("b", 4 * MIB, who=ALICE, provider=[9])) == codes.ALLOCATE
    agents.full.add(1)
    assert code_of(lambda: reg.create("c", 4 * MIB, who=ALICE)) == codes.ALLOCATE
    # a region naming an unknown node: no lender reaches it
    assert code_of(lambda: reg.create("d", 4 * MIB, who=ALICE, region=[1, 7])) == codes.ALLOCATE


def test_a_full_node_sends_the_scheduler_to_the_next(agents: FakeAgents) -> None:
    reg = registry(agents, block_mib=4)
    agents.full.add(1)
    reg.create("shm", 4 * MIB, who=ALICE)
    assert reg.get("shm", ALICE)["export_slot"] == 2


def test_create_with_lender_exports_on_that_node(agents: FakeAgents) -> None:
    reg = registry(agents, block_mib=4)
    reg.create_with_lender("shm", 1, 5 * MIB, who=ALICE)
    assert len(agents.exported[1]) == 2
    assert code_of(lambda: reg.create_with_lender("x", 3, 4 * MIB, who=ALICE)) == codes.ALLOCATE


def test_attach_imports_on_the_attaching_node_and_lookup_sees_only_it(agents: FakeAgents) -> None:
    reg = registry(agents, nodes=3, block_mib=4)
    reg.create("shm", 8 * MIB, who=ALICE, provider=[1])
    code, desc = reg.attach("shm", 2, ALICE)
    assert code == 0
    assert [imp["slot"] for imp in desc["imports"]] == [2]
    assert desc["imports"][0]["mem_ids"] == agents.imported[2]
    assert len(agents.imported[2]) == 2
    # get shows every node's import: node 3 has none until it attaches
    assert [imp["slot"] for imp in reg.get("shm", ALICE)["imports"]] == [2]
    reg.attach("shm", 3, ALICE)
    assert [imp["slot"] for imp in reg.get("shm", ALICE)["imports"]] == [2, 3]


def test_a_repeated_attach_is_1006_with_the_descriptor(agents: FakeAgents) -> None:
    reg = registry(agents, block_mib=4)
    reg.create("shm", 4 * MIB, who=ALICE, provider=[1])
    _, first = reg.attach("shm", 2, ALICE)
    code, again = reg.attach("shm", 2, ALICE)
    assert code == codes.EXISTED
    assert again == first
    assert len(agents.imported[2]) == 1  # not imported twice


def test_attach_on_the_lender_uses_the_export_and_imports_nothing(agents: FakeAgents) -> None:
    reg = registry(agents, block_mib=4)
    reg.create("shm", 4 * MIB, who=ALICE, provider=[1])
    _, desc = reg.attach("shm", 1, ALICE)
    assert desc["imports"][0]["mem_ids"] == agents.exported[1]
    assert agents.imported == {}
    reg.detach("shm", 1, ALICE)
    assert agents.exported[1]  # the export stays until delete


def test_attach_refusals(agents: FakeAgents) -> None:
    reg = registry(agents, nodes=3, block_mib=4)
    reg.create("shm", 4 * MIB, who=ALICE, region=[1, 2], provider=[1])
    assert code_of(lambda: reg.attach("nope", 2, ALICE)) == codes.NOT_EXIST
    assert code_of(lambda: reg.attach("shm", 3, ALICE)) == codes.INTERNAL  # not in the region
    assert code_of(lambda: reg.attach("shm", 2, BOB)) == codes.AUTH_FAILED
    agents.import_fails.add(2)
    assert code_of(lambda: reg.attach("shm", 2, ALICE)) == codes.INTERNAL  # import failed
    assert reg.get("shm", ALICE)["imports"] == []


def test_root_may_use_anyones_and_uid_decides_without_a_username(agents: FakeAgents) -> None:
    reg = registry(agents, block_mib=4)
    reg.create("shm", 4 * MIB, who=ALICE, provider=[1])
    assert reg.attach("shm", 2, ROOT)[0] == 0
    nameless = Identity(uid=1000, gid=1, pid=2)
    reg.create("anon", 4 * MIB, who=nameless, provider=[1])
    assert reg.attach("anon", 2, Identity(uid=1000, gid=5, pid=3, username="x"))[0] == 0
    assert code_of(lambda: reg.get("anon", BOB)) == codes.AUTH_FAILED


def test_detach_of_a_node_that_has_not_attached_is_1015(agents: FakeAgents) -> None:
    reg = registry(agents, block_mib=4)
    reg.create("shm", 4 * MIB, who=ALICE, provider=[1])
    assert code_of(lambda: reg.detach("shm", 2, ALICE)) == codes.SHM_NO_ATTACH
    reg.attach("shm", 2, ALICE)
    assert code_of(lambda: reg.detach("shm", 2, BOB)) == codes.AUTH_FAILED
    reg.detach("shm", 2, ALICE)
    assert agents.imported[2] == []
    assert code_of(lambda: reg.detach("shm", 2, ALICE)) == codes.SHM_NO_ATTACH
    assert code_of(lambda: reg.detach("gone", 2, ALICE)) == codes.SHM_NO_ATTACH


def test_delete_while_attached_is_1024_then_it_unexports(agents: FakeAgents) -> None:
    reg = registry(agents, block_mib=4)
    reg.create("shm", 4 * MIB, who=ALICE, provider=[1])
    reg.attach("shm", 2, ALICE)
    assert code_of(lambda: reg.delete("shm", ALICE)) == codes.SHM_ATTACH_USING
    reg.detach("shm", 2, ALICE)
    assert code_of(lambda: reg.delete("shm", BOB)) == codes.AUTH_FAILED
    reg.delete("shm", ALICE)
    assert agents.exported[1] == []
    assert code_of(lambda: reg.delete("shm", ALICE)) == codes.NOT_EXIST
    assert code_of(lambda: reg.get("shm", ALICE)) == codes.NOT_EXIST


def test_list_shows_only_what_the_caller_may_see(agents: FakeAgents) -> None:
    reg = registry(agents, block_mib=4)
    reg.create("a", 4 * MIB, who=ALICE)
    reg.create("b", 4 * MIB, who=BOB)
    assert [d["name"] for d in reg.list(ALICE)] == ["a"]
    assert [d["name"] for d in reg.list(ROOT)] == ["a", "b"]


def test_lending_and_borrowing_count_whole_blocks(agents: FakeAgents) -> None:
    reg = registry(agents, block_mib=4)
    reg.create("shm", 6 * MIB, who=ALICE, provider=[1])
    reg.attach("shm", 2, ALICE)
    assert reg.lent_and_borrowed(1) == (8 * MIB, 0)
    assert reg.lent_and_borrowed(2) == (0, 8 * MIB)
