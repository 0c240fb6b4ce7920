"""Mend MXNet 1.9 optimizer updates that give wrong weights.

LAMB with ``multi_precision=True`` on float16 weights, updating one weight
at a time (``MXNET_OPTIMIZER_AGGREGATION_SIZE=1``, which mxnet_mpi sets in a
job of several ranks so each weight is updated as soon as its own gradient is
reduced; and always in the Module API's per-device updates), calls
``mp_lamb_update_phase2``, which writes the float16 weight but never the
float32 master copy: every step starts again from the master copy's first
value, and training goes nowhere, silently. The grouped update
(``multi_mp_lamb_update``) is right. Here the one-at-a-time update runs
LAMB's float32 update on the master copy and writes the float16 weight from
it, which is what the grouped update computes.

MXNet's own stores get the mended update too: it is the optimizer's, not the
store's.
"""

from __future__ import annotations

import functools

import mxnet as mx

_applied = False


def _mended_lamb(orig):
    @functools.wraps(orig)
    def _update_impl(self, index, weight, grad, state, multi_precision=False):
        # a list of several with one at a time: MXNet's own assertion answers
        one_at_a_time = not isinstance(index, (tuple, list)) or (
            self.aggregate_num <= 1 and len(index) == 1)
        if not (multi_precision and one_at_a_time):
            return orig(self, index, weight, grad, state, multi_precision=multi_precision)
        if isinstance(index, (tuple, list)):
            index, weight, grad, state = index[0], weight[0], grad[0], state[0]
        master, mean_var = state
        orig(self, index, master, grad.astype(master.dtype), mean_var, multi_precision=False)
        weight[:] = master.astype(weight.dtype)
        return None
    return _update_impl


def apply() -> None:
    """Install the mended updates (idempotent)."""
    global _applied
    if _applied:
        return
    lamb = mx.optimizer.LAMB
    lamb._update_impl = _mended_lamb(lamb._update_impl)
    _applied = True
