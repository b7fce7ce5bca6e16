"""One sequence's speculation: its drafter chain and its policy state.

Engine, scheduler, replay and the llama-cpp-python adapter drive drafting only
through this object:

    sp = Speculation(seq_id, chain, policy)
    sp.begin(prompt)                         once, before the first plan
    opts = sp.plan(history, sampled, room)   what could be verified this step
    draft = sp.commit(k)                     the k tokens chosen (planner.py)
    sp.settle(emitted, n_accepted)           after the verify step
    sp.end()                                 when the sequence finishes or is cancelled

Invariants: `plan` and `commit` alternate with `settle` (one verify step each);
only a committed draft is reported to the chain as verified (`accept`), and
every proposal of the step is scored against the emitted tokens by the policy.
`history` excludes `sampled`, as in the Drafter protocol.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from .acceptance import AcceptanceStats, OptionsTable
from .cost import MAX_DRAFT
from .drafters import EMPTY, DrafterChain
from .own_budget import OwnBudget
from .shadow import Shadows


@dataclass
class DraftOptions:
    """What one sequence can verify this step.

    proposals: (drafter, draft) pairs the chain produced (each draft capped at `room`).
    expected:  E[tokens emitted | K] for K = 0..len(expected)-1, best drafter per K;
               None for the fixed policy (verify the first proposal whole).
    pick:      index into proposals of the drafter used at each K (pick[0] = -1).
    scale:     the factor `expected`'s extra tokens (E - 1) were shrunk by
               (DraftTrust.shrink; 1.0: as the statistics give them).
    at:        the address of `expected`'s first value where it views the sequence's
               OptionsTable (the planner's C search reads it there), else 0.
    """

    proposals: list[tuple[object, np.ndarray]] = field(default_factory=list)
    expected: np.ndarray | None = None
    pick: np.ndarray | None = None
    scale: float = 1.0
    at: int = 0

    @property
    def k_max(self) -> int:
        if self.expected is not None:
            return len(self.expected) - 1
        return len(self.proposals[0][1]) if self.proposals else 0

    @property
    def fixed(self) -> bool:
        return self.expected is None


NO_OPTIONS = DraftOptions()


class Speculation:
    """Drafting for one sequence (one request, one server slot)."""

    def __init__(self, seq_id: int, chain: DrafterChain, policy, own: Sequence = ()):
        self.seq_id, self.chain, self.policy = seq_id, chain, policy
        self.own = tuple(own)  # this sequence's own drafters (a client's prediction), asked first
        # the credit that caps the own drafters' lengths (CostPolicy; own_budget.py)
        self.budget = OwnBudget(sum(len(getattr(d, "pred", ())) for d in own)) if own else None
        # this sequence's acceptance per (drafter, copying) (CostPolicy)
        self.stats: dict[tuple[str, bool], AcceptanceStats] = {}
        self.copying = False  # the previous step verified a draft and accepted all of it
        self.shadows = Shadows()  # declined proposals followed along the output (CostPolicy)
        self.options = NO_OPTIONS
        self.committed: tuple[str, int] | None = None  # (drafter name, length) verified this step
        self.draft_n = 0
        self.draft_n_accepted = 0
        self.own_n = 0  # of draft_n / draft_n_accepted: the tokens the own drafters drafted
        self.own_n_accepted = 0
        # the policy's table of this step's options (DraftOptions.expected and .pick are
        # views of it: valid until `settle`)
        self.table = OptionsTable()

    def begin(self, prompt: np.ndarray, buffer: np.ndarray | None = None) -> None:
        """Before the first plan (again after a context shift). `buffer`: the array whose
        prefix every later `plan`'s history with it as numpy base is (DrafterChain.begin)."""
        self.copying = False
        self.shadows.drop()
        self.chain.begin(self.seq_id, prompt, buffer)
        for d in self.own:
            d.begin(self.seq_id, prompt)

    def _watched(self, history: np.ndarray, sampled: int, room: int) -> list | None:
        """None where this step asks the policy for proposals in full: unless the policy
        rests this sequence (`policy.rest_of`, rest.py), where only one with drafters of its
        own (a prediction) does, or one that is following a copy (`copying`: its last draft
        was accepted whole). Otherwise, while its Rest is `watching`, the chain's watch
        (`DrafterChain.watch`: one lookup): its proposal, the step's only one, and the step
        then counts as an active one (`Rest.wake`); [] where it finds nothing (the step
        proposes nothing)."""
        rest = self.policy.rest_of(self.seq_id)
        if rest is None or rest.active or self.own:
            return None
        if self.copying:
            rest.wake()
            return None
        found = (self.chain.watch(self.seq_id, history, sampled, min(room, MAX_DRAFT))
                 if rest.watching else [])
        if found:
            rest.wake()
        return found

    def plan(self, history: np.ndarray, sampled: int, room: int) -> DraftOptions:
        """Proposals for this step and their expected tokens (nothing committed yet);
        NO_OPTIONS without room or when this step proposes nothing (`_watched`)."""
        self.committed = None
        self.options = NO_OPTIONS
        if room > 0:
            found = self._watched(history, sampled, room)
            if found is None or found:
                self.options = self.policy.options(self, history, sampled, room, found)
        return self.options

    def commit(self, k: int) -> np.ndarray:
        """Choose the draft of length k (0: none) from this step's options."""
        opts = self.options
        if k <= 0 or not opts.proposals:
            return EMPTY
        idx = 0 if opts.fixed else int(opts.pick[k])
        drafter, draft = opts.proposals[idx]
        draft = self.chain.commit(self.seq_id, drafter, draft[:k])
        self.committed = (drafter.name, len(draft))
        return draft

    def settle(self, emitted: list[int], n_accepted: int) -> None:
        """After the verify step: `emitted` = the accepted draft tokens + the target's token."""
        if self.committed is not None:
            self.chain.accept(self.seq_id, n_accepted)
            self.draft_n += self.committed[1]
            self.draft_n_accepted += n_accepted
            if any(d.name == self.committed[0] for d in self.own):
                self.own_n += self.committed[1]
                self.own_n_accepted += n_accepted
        self.policy.observe(self, emitted, n_accepted)
        self.options, self.committed = NO_OPTIONS, None

    def end(self) -> None:
        self.shadows.drop()
        self.chain.end(self.seq_id)
        for d in self.own:
            d.end(self.seq_id)
        self.options, self.committed = NO_OPTIONS, None
