"""The pinned peers from PyPI and crates.io: a peer that cannot be had is
reported with its reason while the others go on, and each one that is here
really serves malloc in a process it is preloaded into."""

from __future__ import annotations

from pathlib import Path

import pytest

from coralloc_bench import peers
from coralloc_bench.allocators import Allocator, select, verify
from coralloc_bench.util import repo_root
from conftest import libc_path


def _fails(peer: peers.Peer, cache: Path, install: bool, log: peers.Log) -> str:
    raise peers.PeerMissing("no way to get it here")


def _works(peer: peers.Peer, cache: Path, install: bool, log: peers.Log) -> str:
    return "/x/lib.so"


def test_a_missing_peer_is_reported_and_the_others_go_on(tmp_path: Path) -> None:
    ps = [peers.Peer("gone", "1.0", "nowhere", _fails), peers.Peer("here", "2.0", "x", _works)]
    found, missing = peers.obtain_all(tmp_path, False, lambda s: None, ps)
    assert missing == {"gone": "no way to get it here"}
    assert found["here"][1] == "/x/lib.so"


def test_no_cargo_is_a_reason(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(peers, "find_cargo", lambda: None)
    with pytest.raises(peers.PeerMissing, match="cargo is not installed"):
        peers.crate_source("snmalloc-sys", "0.7.6", tmp_path, lambda s: None)


def test_an_unbuilt_peer_is_not_built_without_install(tmp_path: Path) -> None:
    snmalloc = next(p for p in peers.PEERS if p.name == "snmalloc")
    with pytest.raises(peers.PeerMissing, match="not built yet"):
        snmalloc.obtain(snmalloc, tmp_path, False, lambda s: None)
    assert not any(tmp_path.iterdir())


def test_every_peer_is_pinned() -> None:
    assert [p.name for p in peers.PEERS] == ["mimalloc3", "snmalloc", "rpmalloc"]
    assert all(p.version[0].isdigit() for p in peers.PEERS)
    assert "==3.4.3" in peers.PEERS[0].package
    assert peers.PEERS[1].package.endswith("snmalloc-sys 0.7.6")
    assert peers.PEERS[2].package.endswith("rpmalloc-sys 0.2.3")


@pytest.mark.parametrize("name", peers.PEER_NAMES)
def test_each_peer_serves_malloc(name: str, probe: Path) -> None:
    """The peer as the runner finds it (already fetched or built: nothing is
    fetched here) passes alloc-probe: malloc, free, calloc and realloc come
    from its library."""
    peer = next(p for p in peers.PEERS if p.name == name)
    found, missing = peers.obtain_all(peers.default_cache(repo_root()), False,
                                      lambda s: None, [peer])
    if name in missing:
        pytest.skip(f"{name} is not here: {missing[name]}")
    a = Allocator(name, found[name][1], "crate")
    r = verify(a, probe)
    assert r.ok, r.reason
    assert Path(r.symbols["malloc"]).resolve() == Path(found[name][1]).resolve()


def test_an_alloc_given_by_path_runs_beside_allocs() -> None:
    found = {"system": Allocator("system", None, "system"),
             "mine": Allocator("mine", libc_path(), "user")}
    assert [a.name for a in select("system", found, ["mine"])] == ["system", "mine"]
