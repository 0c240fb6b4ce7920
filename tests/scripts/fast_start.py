"""tests/site's start-up speed-up, seen from inside a test process: every
generated operator wrapper is the code MXNet itself compiles, and the lazily
loaded modules work when used."""

import ctypes
import json
import sys
import types

import mxnet as mx
import mxnet.ndarray.register as nd_register
import mxnet.symbol.register as sym_register
from mxnet.base import _LIB, c_str, check_call

site = sys.modules["sitecustomize"]
lazy_at_start = sorted(n for n in site._LAZY if type(sys.modules.get(n)).__name__ == "_Lazy")


def function_code(source: str) -> types.CodeType:
    [code] = [c for c in compile(source, "<string>", "exec").co_consts
              if isinstance(c, types.CodeType)]
    return code


compared, differ = 0, []
for name in mx.operator.get_all_registered_operators():
    handle = ctypes.c_void_p()
    check_call(_LIB.NNGetOpHandle(c_str(name), ctypes.byref(handle)))
    for namespace, generate in ((mx.nd, nd_register._generate_ndarray_function_code),
                                (mx.sym, sym_register._generate_symbol_function_code)):
        func = getattr(namespace, name, None)
        if func is None or func.__name__ != name:
            continue
        compared += 1
        if func.__code__ != function_code(generate(handle, name, name)[0]):
            differ.append("%s.%s" % (namespace.__name__, name))

import scipy.sparse  # noqa: E402
from scipy import stats  # noqa: E402

csr = mx.nd.sparse.array(scipy.sparse.csr_matrix([[0.0, 2.0], [3.0, 0.0]]))
print("RESULT " + json.dumps({
    "site": site.__file__, "hits": site.hits, "compared": compared, "differ": differ,
    "lazy_at_start": lazy_at_start, "cdf0": float(stats.norm.cdf(0.0)),
    "csr": [csr.stype, csr.asnumpy().tolist()],
    "sum": float(mx.nd.broadcast_add(mx.nd.ones((2,)), mx.nd.ones((1,))).sum().asscalar()),
}))
