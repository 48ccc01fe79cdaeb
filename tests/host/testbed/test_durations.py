"""Recorded test durations and a suite's share for one of several runs at once
(obmm.testbed.suite.durations: the guest suite's shards, the cluster suite's OBMM_CLUSTER_SHARD)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from obmm.testbed.suite import durations


def test_parse_shard() -> None:
    assert durations.parse_shard("") is None
    assert durations.parse_shard("1/2") == (1, 2)
    assert durations.parse_shard("2/2") == (2, 2)
    for bad in ("0/2", "3/2", "2", "a/b", "1/0", "/2"):
        with pytest.raises(ValueError, match="I/N"):
            durations.parse_shard(bad)


def test_the_parts_take_each_test_once_and_follow_the_weights() -> None:
    ids = [f"tests/cluster/test_{f}.py::t{i}" for f in "abcd" for i in range(3)]
    weights = {n: (15.0 if "test_a" in n else 5.0) for n in ids}  # a: 45 s, b-d: 15 s each
    parts = [durations.shard(ids, i, 2, weights) for i in (1, 2)]
    assert sorted(parts[0] + parts[1]) == sorted(ids)
    # Not by count (6 and 6): the heavy file is a part of its own, the other three the other.
    assert {len(p) for p in parts} == {3, 9}
    assert [durations.shard(ids, i, 2, weights) for i in (1, 2)] == parts  # same in every run
    # More parts than tests: the extra parts are empty, none is lost.
    assert durations.shard(ids[:1], 1, 3, {}) == ids[:1]
    assert durations.shard(ids[:1], 3, 3, {}) == []


def test_save_merges_and_load_forgives(tmp_path: Path) -> None:
    path = tmp_path / "x-durations.json"
    assert durations.load(path) == {}
    path.write_text("not json")
    assert durations.load(path) == {}
    durations.save(path, {"a": 1.0, "b": 2.0})
    durations.save(path, {"b": 3.0, "c": 4.0})
    assert durations.load(path) == {"a": 1.0, "b": 3.0, "c": 4.0}
    assert json.loads(path.read_text()) == {"a": 1.0, "b": 3.0, "c": 4.0}


def test_runs_saving_at_once_lose_none_of_each_others_times(tmp_path: Path) -> None:
    path = tmp_path / "x-durations.json"
    threads = [
        threading.Thread(target=durations.save, args=(path, {f"t{k}-{i}": 1.0 for i in range(50)}))
        for k in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(durations.load(path)) == 8 * 50
