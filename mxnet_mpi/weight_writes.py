"""Weights and optimizer states written outside training, noted per rank.

Every rank updates its own copy of the weights with the same sums, so a
parameter set on some ranks only after its Trainer exists (``set_data``,
``load_parameters``, ``initialize(force_reinit=True)``) or optimizer states
loaded on some ranks only (``Trainer.load_states``) would make the copies
drift apart silently; so would a Module's ``set_params`` or
``load_optimizer_states`` after ``init_optimizer``. The patched MXNet calls
note such writes here; each step's batch sizes (a Module's periodic settings
comparison) carry whether this rank wrote any of its trainer's since the
last, and where any rank did, every rank compares hashes of the weights and
states (consistency.check_after_writes).
"""

from __future__ import annotations

_generation = 0


def note(obj) -> None:
    """`obj` (a Gluon Parameter, a Trainer for its optimizer states, or a
    Module) was written just now."""
    global _generation
    _generation += 1
    obj._mxmpi_written = _generation


class Watch:
    """What one trainer has seen of the writes (made when it is created, so its
    own set-up does not count)."""

    def __init__(self) -> None:
        self._seen = _generation
        #: of the last call: positions in `params` written, and whether the
        #: trainer (its optimizer states, or a whole Module) was
        self.params: set = set()
        self.states = False

    def written(self, trainer, params) -> bool:
        """Whether `trainer`'s states or any of `params` were written since the
        last call (which, in self.params and self.states); O(1) when nothing
        at all was written since."""
        self.params, self.states = set(), False
        if self._seen == _generation:
            return False
        seen, self._seen = self._seen, _generation
        self.params = {i for i, p in enumerate(params) if getattr(p, "_mxmpi_written", 0) > seen}
        self.states = getattr(trainer, "_mxmpi_written", 0) > seen
        return bool(self.params) or self.states
