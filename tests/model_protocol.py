#!/usr/bin/env python3
"""An exhaustive explorer of the remote-free protocol's steps (a model of
the protocol in page/page.c, reclaim.c and heap/heap.c, not of the C code).

A page of R blocks, all in use and parked in its owner's full queue (state
USE). Remote freers each free one block; the purger reclaims orphans; the
owner either takes its pages back (collect) or destroys the heap. Every
interleaving of the named steps is explored (depth-first over states,
each step atomic as the CAS or lock it stands for), and each final or
intermediate state is checked against the invariants:

  - no purge of a span that is no longer the page's (a released span may
    hold a new page's live blocks: one on the same descriptor with more
    blocks, whose count other threads' frees bring to this page's
    `reserved` without the orphan lock);
  - no page stranded: at the end, a page still in the full queue has a
    live block, or a notice still to come;
  - every block freed is accounted for (free lists + thread_free + used).

A second model, of parked pages (page/page.c, "Parked pages"): an empty
page its owner keeps is parked (its free chain given to thread_free,
counted as every block; listed under the orphan lock with LISTED set in
the word, or, still listed, parked again with one CAS that needs LISTED
and sets RENEWED); the owner takes it back, uses it and parks it again,
in rounds, then idles; the purger looks at it at any moment (claim,
renewal, or unlisting of a page held, in one CAS). Invariants: no purge
of a page the owner uses (the fix `take_before_use`: the owner takes
thread_free before it touches the page, which is why only pages no fast
path reaches are parked); no claim of a page used since it was listed or
renewed (`renew_on_repark`); no page left parked and unlisted once the
owner idles (`listed_in_word`: the owner's CAS needs LISTED, which the
purger clears in the CAS that finds the page held; read apart from the
CAS, as orphan_listed, the purger may unlist the page between the read
and the CAS).

A third model, of a page set aside (src/page/page.c, "Aside pages";
docs/experiments/2026-11-28-idle-owner-pages-larson.md): a page behind
the first of its class queue, its blocks freed partly by its owner (on
its own lists, `used` written by the free fast path with plain stores)
and partly by another thread, is claimed by the purger once `used`
equals the count on thread_free, with no call from the owner. The owner
may come back, pop a block and set the page aside again. Invariants:
no claim of a page with a live block or one its owner pops from; a page
its idle owner left aside with every block free is claimed. Fixes:
`unaside_before_use`, `aside_in_word`, `used_after_acquire`,
`renew_on_reaside` (a page set aside again while listed gets RENEWED,
which only the purger clears: a claim CAS from a word read before the
owner came back fails, where the word alone, back to what it was, would
let it through), `push_keeps_renewed` (a remote free's push keeps
RENEWED: the freer of a block the owner took off thread_free, popped and
handed over again brings the count back to what the purger read)
(AsideModel).

`--without FIX` explores the protocol with one fix taken out, to show the
explorer finds the defect it guards against (the test runs both ways:
with every fix, no violation; without each fix, a violation)."""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, replace
from typing import Callable, Iterator, Optional

NONE, USE, FREEING, NEVER = "NONE", "USE", "FREEING", "NEVER"
FIXES = ("claim_listed", "wait_notice", "take_before_use", "renew_on_repark", "listed_in_word",
         "unaside_before_use", "aside_in_word", "used_after_acquire", "renew_on_reaside",
         "push_keeps_renewed")


@dataclass(frozen=True)
class State:
    tf_count: int = 0  # blocks on thread_free
    delay: str = USE
    reclaimed: bool = False
    busy: bool = False
    used: int = 0  # the owner's count of blocks not on its free lists
    free_lists: int = 0  # blocks on the owner's free lists
    in_full: bool = True
    delayed_listed: bool = False
    on_stack: bool = False  # on the heap's delayed_pages stack
    orphan_listed: bool = False
    span: str = "page"  # page, free, reused
    pcs: tuple[int, ...] = ()  # each thread's step
    notes: tuple[bool, ...] = ()  # per freer: must notify
    popped: bool = False  # the owner popped the page off delayed_pages
    purger_candidate: bool = False
    purger_claimed: bool = False
    error: str = ""


Step = Callable[[State, int], Optional[State]]  # None: not enabled now


def set_pc(s: State, t: int, pc: int, **kw: object) -> State:
    pcs = list(s.pcs)
    pcs[t] = pc
    return replace(s, pcs=tuple(pcs), **kw)


class Model:
    def __init__(self, blocks: int, freers: int, owner: str, fixes: set[str]) -> None:
        self.blocks, self.freers, self.owner, self.fixes = blocks, freers, owner, fixes
        # threads: freers 0..F-1, then the owner, then the purger
        self.owner_t, self.purger_t = freers, freers + 1

    def initial(self) -> State:
        return State(used=self.blocks, pcs=(0,) * (self.freers + 2),
                     notes=(False,) * self.freers)

    # ---- a remote freer: push (CAS), list the page, leave FREEING -------------
    def freer(self, s: State, t: int) -> Optional[State]:
        pc = s.pcs[t]
        if pc == 0:  # the push's CAS (the orphan lock is held around it)
            if s.reclaimed or s.busy:
                return set_pc(s, t, 3, error="a free found RECLAIMED: double free reported")
            count = s.tf_count + 1
            notify = s.delay == USE
            notes = list(s.notes)
            notes[t] = notify
            s2 = replace(s, tf_count=count, delay=FREEING if notify else s.delay,
                         notes=tuple(notes))
            if count == s.used and s.free_lists + s.used == self.blocks and count == self.blocks:
                s2 = replace(s2, orphan_listed=True)
            return set_pc(s2, t, 1 if notify else 3)
        if pc == 1:  # push the page on delayed_pages
            return set_pc(s, t, 2, delayed_listed=True, on_stack=True)
        if pc == 2:  # FREEING -> NONE
            return set_pc(s, t, 3, delay=NONE)
        return None

    # ---- the owner ------------------------------------------------------------
    def take_list(self, s: State) -> State:
        """Owner: take thread_free (or reset a reclaimed page)."""
        if s.reclaimed:
            return replace(s, reclaimed=False, tf_count=0, used=0, free_lists=0)
        n = s.tf_count
        orphan = s.orphan_listed and n == self.blocks
        return replace(s, tf_count=0, used=s.used - n, free_lists=s.free_lists + n,
                       orphan_listed=False if orphan else s.orphan_listed)

    def release(self, s: State, t: int, pc: int) -> Optional[State]:
        """The span goes back: orphan forgotten, thread_free sealed (once
        the purge in progress, if any, is over)."""
        if s.busy:
            return None
        return set_pc(s, t, pc, span="free", in_full=False, tf_count=0)

    def new_page_frees(self, s: State, t: int) -> State:
        """A new page on the span, on the same descriptor, with more blocks
        than this one: other threads' frees of some of them bring its count
        to this page's `reserved` without the orphan lock (they do not free
        its last block), its other blocks live."""
        return set_pc(s, t, 9, span="reused", tf_count=self.blocks)

    def owner_collect(self, s: State, t: int) -> Optional[State]:
        pc = s.pcs[t]
        if pc == 0:  # pop delayed_pages when something is there
            if not s.on_stack:
                # nothing to take: done once every freer is done
                if all(p == 3 for p in s.pcs[: self.freers]):
                    return set_pc(s, t, 9)
                return None
            return set_pc(s, t, 1, on_stack=False, popped=True)
        if pc == 1:  # wait for the notifier to leave FREEING (the fix)
            if "wait_notice" in self.fixes and s.delay == FREEING:
                return None
            return set_pc(s, t, 2, delayed_listed=False)
        if pc == 2:  # collect: take the list
            if s.busy:
                return None
            s2 = self.take_list(s)
            if s.tf_count == self.blocks and not s.reclaimed:
                return set_pc(s2, t, 5)  # all of them: coral_orphan_take_back
            return self.after_take(s2, t)
        if pc == 5:  # take_back waits for the orphan lock (a purger between steps holds it)
            if s.pcs[self.purger_t] == 1:
                return None
            return self.after_take(s, t)
        if pc == 3:
            return self.release(s, t, 4)
        if pc == 4:  # a new page on the span
            return self.new_page_frees(s, t)
        return None

    def after_take(self, s2: State, t: int) -> State:
        """Owner, its list taken: retire an empty page, else back to its queue."""
        if s2.used == 0:
            pending = s2.delay == FREEING or s2.delayed_listed
            if pending:  # retire returns: a notice is to come
                return set_pc(s2, t, 0)
            return set_pc(s2, t, 3)
        return set_pc(s2, t, 0, in_full=False)  # back to its class queue

    def owner_destroy(self, s: State, t: int) -> Optional[State]:
        pc = s.pcs[t]
        if pc == 0:  # every page to NEVER (waits while FREEING)
            # A program destroys a heap once no other thread frees its blocks
            # (a free after the destroy is the program's double free).
            if any(p != 3 for p in s.pcs[: self.freers]) or s.delay == FREEING:
                return None
            return set_pc(s, t, 1, delay=NEVER)
        if pc == 1:  # orphan_forget: the unlocked look, then release
            return self.release(replace(s, orphan_listed=False) if s.orphan_listed else s, t, 2)
        if pc == 2:
            return self.new_page_frees(s, t)
        return None

    # ---- the purger -----------------------------------------------------------
    def purger(self, s: State, t: int) -> Optional[State]:
        pc = s.pcs[t]
        if pc == 0:  # unlist (under the orphan lock), if listed
            if not s.orphan_listed:
                if s.pcs[self.owner_t] == 9 and all(p == 3 for p in s.pcs[: self.freers]):
                    return set_pc(s, t, 9)
                return None
            if "claim_listed" in self.fixes:  # the claim, then the unlisting: one lock hold
                if s.tf_count == self.blocks and not s.reclaimed:
                    return set_pc(s, t, 2, tf_count=0, reclaimed=True, busy=True,
                                  purger_claimed=True, orphan_listed=False)
                return set_pc(s, t, 9, orphan_listed=False)
            return set_pc(s, t, 1, orphan_listed=False, purger_candidate=True)
        if pc == 1:  # claim: one CAS that needs every block on thread_free
            if s.tf_count == self.blocks and not s.reclaimed:
                return set_pc(s, t, 2, tf_count=0, reclaimed=True, busy=True, purger_claimed=True)
            return set_pc(s, t, 9)
        if pc == 2:  # purge the span
            if s.span != "page":
                return set_pc(s, t, 3, error="the purger purged a span a new page lives on")
            return set_pc(s, t, 3)
        if pc == 3:  # clear BUSY
            return set_pc(s, t, 9, busy=False)
        return None

    def step(self, s: State, t: int) -> Optional[State]:
        if t < self.freers:
            return self.freer(s, t)
        if t == self.owner_t:
            return (self.owner_collect if self.owner == "collect" else self.owner_destroy)(s, t)
        return self.purger(s, t)

    def final_check(self, s: State) -> str:
        if s.error:
            return s.error
        if s.span == "page" and s.in_full and s.used == 0 and not s.delayed_listed \
                and s.delay != FREEING:
            return "an empty page is stranded in the full queue"
        if s.span == "page" and s.tf_count + s.used + s.free_lists != self.blocks + 0 \
                and not s.reclaimed and s.used + s.free_lists != self.blocks:
            return "blocks lost"
        return ""

    done_pcs: tuple[int, ...] = (3, 9)  # the steps a thread ends at

    def successors(self, s: State) -> list[State]:
        return [n for n in (self.step(s, t) for t in range(len(s.pcs))) if n is not None]

    def explore(self) -> tuple[int, Optional[str]]:
        seen: set[State] = set()
        stack = [self.initial()]
        while stack:
            s = stack.pop()
            if s in seen:
                continue
            seen.add(s)
            if s.error:
                return len(seen), s.error
            nexts = self.successors(s)
            stack.extend(nexts)
            if not nexts:
                why = self.final_check(s)
                if why:
                    return len(seen), why
                if any(p not in self.done_pcs for p in s.pcs):
                    return len(seen), f"deadlock at {s.pcs}"
        return len(seen), None


@dataclass(frozen=True)
class PState:
    """The parked page's word and listing, the orphan lock, the two
    threads' steps, and ghosts for the checks."""
    word: str = "held"  # held (NULL, 0), parked (chain, R), claimed (+BUSY), reclaimed
    listed_bit: bool = False  # LISTED in the word
    renewed: bool = False  # RENEWED in the word
    listed: bool = False  # on the orphan list
    lock: str = ""  # who holds the orphan lock: "", "owner", "purger"
    snap: tuple[str, bool, bool] = ("", False, False)  # the word the owner's CAS expects
    pcs: tuple[int, ...] = (0, 0)
    parks_left: int = 0  # parks the owner makes yet (then it idles)
    looks_left: int = 0  # looks the purger makes yet
    in_use: bool = False  # the owner allocates from the page
    touched: bool = False  # ghost: taken back since listed or last renewed
    error: str = ""


def pset(s: PState, t: int, pc: int, **kw: object) -> PState:
    pcs = list(s.pcs)
    pcs[t] = pc
    return replace(s, pcs=tuple(pcs), **kw)


class ParkModel(Model):
    """An empty page in its owner's class queue (not first): the owner parks
    it, takes it back and uses it, frees it and parks it again (`parks`
    parks in all), then idles; the purger looks at it (`looks` times) at
    any moment, as if the delay were past each time. The steps of
    page/page.c's coral_page_park, thread_free_collect and reclaim.c's
    orphan_look, each as atomic as the CAS or lock hold it stands for.
    Invariants: no purge of a page the owner uses; no claim of a page its
    owner took back since it was listed or renewed (so no page is purged
    sooner than a delay after its last use); LISTED only on a listed page;
    at the end, a page the owner left parked is listed (the purger will
    return it with no call from the owner). Threads: 0 the owner, 1 the
    purger; pc 9 is done."""

    def __init__(self, parks: int, looks: int, fixes: set[str]) -> None:
        super().__init__(1, 0, "park", fixes)
        self.parks, self.looks = parks, looks
        self.owner_t, self.purger_t = 0, 1

    def initial(self) -> PState:  # type: ignore[override]
        return PState(parks_left=self.parks, looks_left=self.looks)

    def word(self, s: PState) -> tuple[str, bool, bool]:
        return (s.word, s.listed_bit, s.renewed)

    def owner_steps(self, s: PState, t: int) -> Optional[PState]:
        pc = s.pcs[t]
        if pc == 0:  # park: read the word; listed (as the fix reads it: LISTED) -> one CAS
            listed = s.listed_bit if "listed_in_word" in self.fixes else s.listed
            return pset(s, t, 1 if listed else 2, snap=self.word(s))
        if pc == 1:  # the CAS, keeping LISTED, setting RENEWED (the fix)
            same = self.word(s) == s.snap if "listed_in_word" in self.fixes \
                else s.word == "held"
            if not same:
                return pset(s, t, 0)  # the CAS failed: read again
            return self.parked(pset(s, t, 5, word="parked",
                                    renewed="renew_on_repark" in self.fixes))
        if pc == 2:  # take the orphan lock
            if s.lock:
                return None
            return pset(s, t, 3, lock="owner")
        if pc == 3:  # the CAS setting LISTED, and the listing (since now)
            return pset(s, t, 4, word="parked", listed_bit=True, renewed=False, listed=True,
                        touched=False)
        if pc == 4:  # unlock
            return self.parked(pset(s, t, 5, lock=""))
        if pc == 5:  # come back: take thread_free first (the fix), or use the lists at once
            if "take_before_use" not in self.fixes:
                return pset(s, t, 8, in_use=True, touched=True)
            if s.word == "parked":  # the take's CAS, LISTED kept
                return pset(s, t, 8, word="held", renewed=False, in_use=True, touched=True)
            return pset(s, t, 6)  # claimed: page_take_reclaimed
        if pc == 6:  # wait for BUSY to clear, then take the page, zero
            if s.word == "claimed":
                return None
            return pset(s, t, 8, word="held", in_use=True)
        if pc == 8:  # the page's blocks freed again: park once more
            return pset(s, t, 0, in_use=False)
        return None

    def parked(self, s: PState) -> PState:
        """After a park: come back to the page, or idle for good."""
        left = s.parks_left - 1
        return replace(s, parks_left=left, pcs=(5 if left > 0 else 9, s.pcs[1]))

    def purger(self, s: PState, t: int) -> Optional[PState]:  # type: ignore[override]
        pc = s.pcs[t]
        if pc == 0:  # a look: take the orphan lock
            if s.looks_left == 0 or not s.listed:
                return pset(s, t, 9) if s.pcs[self.owner_t] == 9 or s.looks_left == 0 else None
            if s.lock:
                return None
            return pset(s, t, 1, lock="purger", looks_left=s.looks_left - 1)
        if pc == 1:  # orphan_look: one CAS, whatever it finds
            if not s.listed:
                return pset(s, t, 4)
            if s.word == "parked" and s.renewed:  # renewed: listed again as the newest
                return pset(s, t, 4, renewed=False, touched=False)
            if s.word == "parked":  # claimed, unlisted
                if s.touched:
                    return pset(s, t, 4, error="the purger claimed a page its owner used "
                                "within the delay")
                return pset(s, t, 2, word="claimed", listed_bit=False, renewed=False,
                            listed=False)
            return pset(s, t, 4, listed_bit=False, listed=False)  # held: unlisted
        if pc == 2:  # unlock, then purge the span
            return pset(s, t, 3, lock="")
        if pc == 3:  # purge, then clear BUSY
            if s.in_use:
                return pset(s, t, 9, error="the purger purged a page its owner uses")
            return pset(s, t, 0, word="reclaimed")
        if pc == 4:  # unlock
            return pset(s, t, 0, lock="")
        return None

    def step(self, s: PState, t: int) -> Optional[PState]:  # type: ignore[override]
        n = self.owner_steps(s, t) if t == self.owner_t else self.purger(s, t)
        if n is not None and n.listed_bit and not n.listed and not n.error:
            return replace(n, error="LISTED set on a page not listed")
        return n

    def final_check(self, s: PState) -> str:  # type: ignore[override]
        if s.error:
            return s.error
        if s.word == "parked" and not s.listed:
            return "a parked page left unlisted: the idle owner's page never goes back"
        if s.lock:
            return "the orphan lock left held"
        return ""


@dataclass(frozen=True)
class AState:
    """A page set aside (behind the first of its class queue) whose blocks
    may all become free while its owner idles, some freed by the owner
    (on its own lists), the rest by another thread (on thread_free)."""
    count: int = 0  # blocks on thread_free
    aside: bool = False  # ASIDE in the word
    claim: str = ""  # "", "busy" (claimed, being purged), "done" (purged)
    hist: tuple[int, ...] = ()  # every value the owner wrote to `used`, oldest first
    sync: int = 0  # index in hist of the owner's last write before it set ASIDE (release)
    own: int = 0  # blocks on the owner's lists
    owner_live: int = 0  # live blocks the owner will free (locally) or keep
    handed: int = 0  # live blocks the owner handed to the freer, which frees them remotely
    in_use: bool = False  # the owner pops from the page (it made it first)
    renewed: bool = False  # RENEWED in the word
    snap: tuple[int, bool, str, bool] = (0, False, "", False)  # the word the purger read
    seen: int = -1  # the purger's read of `used`
    snap_sync: int = 0  # sync when the purger read the word (what its acquire ordered)
    looks_left: int = 0  # looks the purger makes before the others are done
    pcs: tuple[int, ...] = ()
    error: str = ""


class AsideModel(Model):
    """A page of 3 blocks that was first (its owner popped all 3 and freed
    one: used went 0, 1, 2, 3, 2) is set aside; the owner may free its
    live block (the free fast path: `used` written with a plain store, no
    atomic), come back to the page (make it first and pop) or idle; a
    freer frees the other live block remotely; the purger looks at the
    page at any moment: reads the word (acquire), then `used` (any value
    the owner wrote since the write its acquire synchronizes with: a plain
    read may see a stale one), and claims the page when `used` equals the
    count, with one CAS that needs the word it read. The owner, back, pops
    a block (it keeps it live) and may set the page aside again. Invariants: no claim
    of a page with a live block or one its owner pops from; at the end, a
    page its idle owner left aside with every block free is claimed. Fixes:
    `unaside_before_use` (the owner clears ASIDE with an RMW on the word
    before it touches the page's lists other than to free a live block),
    `aside_in_word` (ASIDE is in the word the claim's CAS compares, not a
    flag read beside it), `used_after_acquire` (`used` is read after the
    acquire load of the word that saw ASIDE, which the owner set with
    release after its last write to `used` on its slow path),
    `renew_on_reaside` (setting it aside again sets RENEWED, which the
    purger clears with a CAS: in the C code it unlists the page then, and
    the next remote free lists it again, a later look here; the claim
    needs it clear), `push_keeps_renewed` (a remote free's push keeps
    RENEWED: the owner, back, may take the freer's block off thread_free,
    pop it and hand it to the freer again, which frees it after the page is
    set aside again: the count is then the one the purger read).
    Threads: 0 the owner, 1 the freer, 2 the purger; pc 9 is done (the
    freer's 8 too, once it holds no block to free)."""

    def __init__(self, looks: int, fixes: set[str]) -> None:
        super().__init__(3, 1, "aside", fixes)
        self.looks, self.done_pcs = looks, (8, 9)
        self.owner_t, self.freer_t, self.purger_t = 0, 1, 2

    def initial(self) -> AState:  # type: ignore[override]
        return AState(hist=(0, 1, 2, 3, 2), sync=4, own=1, owner_live=1, looks_left=self.looks,
                      pcs=(0, 0, 0))

    def used(self, s: AState) -> int:
        return s.hist[-1]

    def live(self, s: AState) -> int:
        return self.used(s) - s.count  # every block in `used` and not on thread_free

    def write_used(self, s: AState, value: int) -> tuple[int, ...]:
        return s.hist + (value,)

    def owner_steps(self, s: AState, t: int) -> Optional[AState]:
        pc = s.pcs[t]
        if pc == 0:  # set aside: fetch_or ASIDE, release
            return aset(s, t, 1, aside=True, sync=len(s.hist) - 1)
        if pc == 1:  # free the live block it holds (fast path), come back, or idle
            return None  # (the choices are in owner_choices)
        if pc == 2:  # come back: clear ASIDE (and RENEWED) with an RMW (the fix), or use the lists
            if "unaside_before_use" not in self.fixes:
                return aset(s, t, 4)
            if s.claim:
                return aset(s, t, 3, aside=False, renewed=False)
            return aset(s, t, 4, aside=False, renewed=False)
        if pc == 3:  # claimed: wait for BUSY to clear, then the page is empty and zero
            if s.claim == "busy":
                return None
            return aset(s, t, 9, claim="", count=0, own=0, hist=self.write_used(s, 0),
                        in_use=True)
        if pc == 4:  # first again: pop a block from its lists (taking thread_free when dry)
            if s.own == 0:
                s = replace(s, own=s.count, count=0, hist=self.write_used(s, self.used(s) - s.count))
            if s.own == 0:
                return aset(s, t, 9, in_use=True)
            return aset(s, t, 5, own=s.own - 1, hist=self.write_used(s, self.used(s) + 1),
                        in_use=True, owner_live=s.owner_live + 1)
        return None

    def owner_choices(self, s: AState, t: int) -> list[AState]:
        if s.pcs[t] not in (1, 5):
            n = self.owner_steps(s, t)
            return [n] if n is not None else []
        if s.pcs[t] == 5:  # popped: keep using it, pop again, hand a block to the freer,
            # or set it aside again (release)
            out = [aset(s, t, 9), aset(s, t, 4),
                   aset(s, t, 9, aside=True, in_use=False, sync=len(s.hist) - 1,
                        renewed="renew_on_reaside" in self.fixes)]
            if s.owner_live > 0 and s.handed == 0:
                out.append(replace(s, owner_live=s.owner_live - 1, handed=1))
            return out
        out = [aset(s, t, 2), aset(s, t, 9)]  # come back; idle for good
        if s.owner_live > 0:  # the free fast path: push, used - 1 (plain store)
            out.append(replace(s, owner_live=s.owner_live - 1, own=s.own + 1,
                               hist=self.write_used(s, self.used(s) - 1)))
        return out

    def freer_steps(self, s: AState, t: int) -> Optional[AState]:
        if s.pcs[t] == 8 and s.handed:  # a block the owner handed over: freed
            if s.claim:
                return aset(s, t, 9, error="a remote free found the page claimed")
            return aset(s, t, 9, count=s.count + 1, handed=0,
                        renewed=s.renewed and "push_keeps_renewed" in self.fixes)
        if s.pcs[t] != 0:
            return None
        if s.claim:
            return aset(s, t, 9, error="a remote free found the page claimed")
        return aset(s, t, 8, count=s.count + 1)  # the push's CAS

    def purger_choices(self, s: AState, t: int) -> list[AState]:
        pc = s.pcs[t]
        done = s.pcs[self.owner_t] == 9 and (s.pcs[self.freer_t] == 9 or
                                              (s.pcs[self.freer_t] == 8 and not s.handed))
        if pc == 0:  # read the word (acquire); a last look once the others are done
            if s.claim or (not done and s.looks_left == 0):
                return [aset(s, t, 9)] if done or s.claim else []
            return [aset(s, t, 1, snap=(s.count, s.aside, s.claim, s.renewed), snap_sync=s.sync,
                         looks_left=s.looks_left - (0 if done else 1))]
        if pc == 1:  # read `used`: any value since the write the acquire ordered (or any)
            if not s.snap[1]:
                return [aset(s, t, 0)]
            if s.snap[3]:  # RENEWED: one CAS clears it, then a look anew
                if (s.count, s.aside, s.claim, s.renewed) == s.snap:
                    return [aset(s, t, 0, renewed=False)]
                return [aset(s, t, 0)]
            if done:  # (the last look: the owner's stores are visible by then)
                return [aset(s, t, 2, seen=self.used(s))]
            first = s.snap_sync if "used_after_acquire" in self.fixes else 0
            return [aset(s, t, 2, seen=v) for v in sorted(set(s.hist[first:]))]
        if pc == 2:  # the claim: one CAS that needs the word read
            if s.seen != s.snap[0]:
                return [aset(s, t, 0)]
            word = (s.count, s.aside, s.claim, s.renewed)
            same = word == s.snap if "aside_in_word" in self.fixes \
                else (s.count, s.claim, s.renewed) == (s.snap[0], s.snap[2], s.snap[3])
            if not same:
                return [aset(s, t, 0)]
            if self.live(s) > 0 or s.in_use:
                return [aset(s, t, 9, error="the purger claimed a page with a live block "
                             "or one its owner uses")]
            return [aset(s, t, 3, claim="busy")]
        if pc == 3:  # purge, then clear BUSY
            if s.in_use:
                return [aset(s, t, 9, error="the purger purged a page its owner uses")]
            return [aset(s, t, 9, claim="done")]
        return []

    def successors(self, s: AState) -> list[AState]:  # type: ignore[override]
        out = self.owner_choices(s, self.owner_t)
        n = self.freer_steps(s, self.freer_t)
        if n is not None:
            out.append(n)
        return out + self.purger_choices(s, self.purger_t)

    def final_check(self, s: AState) -> str:  # type: ignore[override]
        if s.error:
            return s.error
        if s.aside and not s.claim and self.live(s) == 0 and not s.in_use:
            return "a page its idle owner left aside, every block free, is never claimed"
        return ""


def aset(s: AState, t: int, pc: int, **kw: object) -> AState:
    pcs = list(s.pcs)
    pcs[t] = pc
    return replace(s, pcs=tuple(pcs), **kw)


def scenarios(fixes: set[str]) -> Iterator[tuple[str, Model]]:
    for blocks, freers in ((1, 1), (2, 2)):
        for owner in ("collect", "destroy"):
            yield f"{owner}, {blocks} blocks, {freers} freers", Model(blocks, freers, owner, fixes)
    for parks, looks in ((1, 2), (2, 3), (3, 3)):
        yield f"park, {parks} parks, {looks} looks", ParkModel(parks, looks, fixes)
    for looks in (1, 2):
        yield f"aside, {looks} looks", AsideModel(looks, fixes)


def violations(fixes: set[str]) -> list[str]:
    found = []
    total = 0
    for name, model in scenarios(fixes):
        n, why = model.explore()
        total += n
        print(f"  {name}: {n} states, {why or 'no violation'}")
        if why:
            found.append(why)
    print(f"  {total} states explored; {len(found)} scenario(s) with a violation")
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--without", choices=FIXES, help="explore with this fix taken out")
    ap.add_argument("--check", action="store_true",
                    help="the test: no violation with every fix, one without each fix")
    args = ap.parse_args()
    if not args.check:
        fixes = set(FIXES) - ({args.without} if args.without else set())
        return 1 if violations(fixes) else 0
    print("with every fix:")
    ok = not violations(set(FIXES))
    for fix in FIXES:
        print(f"without {fix}:")
        if not violations(set(FIXES) - {fix}):
            print(f"FAILED: taking out {fix} shows no violation: the model cannot see it")
            ok = False
    print("protocol model: passed" if ok else "protocol model: FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
