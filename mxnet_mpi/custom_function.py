"""``mxnet.autograd.Function`` with its gradients written as requested.

MXNet 1.9.1's ``Function`` writes the gradients that ``backward`` returns in a
loop that stops at the first input needing none (``return`` where it meant
``continue``) and never adds for ``grad_req='add'`` (it compares the request,
an integer, with the string ``'add'``). So a function on an input without a
gradient (data, a frozen layer's output, a frozen parameter) silently gave
zero gradients to every input after it, and gradient accumulation got none.
This class records the same custom-function node, with that loop mended.
"""

from __future__ import annotations

import traceback
from ctypes import CFUNCTYPE, POINTER, byref, c_int, c_void_p, cast

import mxnet as mx
from mxnet import autograd
from mxnet.base import _LIB, MXCallbackList, NDArrayHandle, c_array, c_handle_array, check_call

# MXNet's OpReqType
_NULL, _WRITE, _INPLACE, _ADD = 0, 1, 2, 3


class Function(autograd.Function):
    """Subclass like ``mxnet.autograd.Function``: ``forward(*inputs)`` and
    ``backward(*output_grads)``, returning one gradient per input."""

    def _write_grads(self, num_ograds: int, num_igrads: int, ptrs, reqs) -> bool:
        try:
            ograds = [mx.nd.NDArray(cast(p, NDArrayHandle), writable=False)
                      for p in ptrs[:num_ograds]]
            igrads = [mx.nd.NDArray(cast(p, NDArrayHandle), writable=True)
                      for p in ptrs[num_ograds:num_ograds + num_igrads]]
            rets = self.backward(*ograds)
            if isinstance(rets, mx.nd.NDArray):
                rets = (rets,)
            if len(rets) != len(igrads):
                raise ValueError("%s.backward returned %d gradients for %d inputs" % (
                    type(self).__name__, len(rets), len(igrads)))
            for i, (igrad, ret) in enumerate(zip(igrads, rets)):
                if reqs[i] in (_WRITE, _INPLACE):
                    igrad[:] = ret
                elif reqs[i] == _ADD:
                    igrad[:] += ret
        except Exception:  # noqa: BLE001  (a C callback: report, then fail the node)
            print("Error in %s.backward: %s" % (type(self).__name__, traceback.format_exc()))
            return False
        return True

    def __call__(self, *inputs):
        if self._used:
            raise RuntimeError("each Function instance can only be called once")
        self._used = True
        recording = autograd.set_recording(False)
        try:
            outputs = self.forward(*inputs)
        finally:
            autograd.set_recording(recording)
        if not recording:
            return outputs
        outs = (outputs,) if isinstance(outputs, mx.nd.NDArray) else outputs
        key = autograd.Function._registry.inc()

        def backward_entry(num_ograds, num_igrads, ptrs, reqs, _is_train, _state):
            return self._write_grads(num_ograds, num_igrads, ptrs, reqs)

        def delete_entry(_state):
            autograd.Function._registry.ref_holder.pop(key, None)
            return True

        callbacks = [cast(f, CFUNCTYPE(c_int)) for f in (
            autograd.Function._bwd_functype(backward_entry),
            autograd.Function._del_functype(delete_entry))]
        context = MXCallbackList(c_int(len(callbacks)),
                                 cast(c_array(CFUNCTYPE(c_int), callbacks),
                                      POINTER(CFUNCTYPE(c_int))),
                                 cast(c_array(c_void_p, [None] * len(callbacks)),
                                      POINTER(c_void_p)))
        autograd.Function._registry.ref_holder[key] = context
        check_call(_LIB.MXCustomFunctionRecord(c_int(len(inputs)), c_handle_array(inputs),
                                               c_int(len(outs)), c_handle_array(outs),
                                               byref(context)))
        return outputs
