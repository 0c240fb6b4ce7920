"""The public names of horovod.mxnet (or of mxnet_mpi.horovod) and the
parameter names of each callable among them, as one JSON line on stdout:

  python hvd_signatures.py [--horovod]

{name: [parameter, ...]} for every name of dir() without a leading "_"
(a class: its __init__'s, self included; a name that is not callable, or whose
signature cannot be read: null). tests/test_horovod_api.py compares the real
Horovod's listing (live, or as tools/record_horovod_golden.py recorded it)
with mxnet_mpi.horovod.
"""

import inspect
import json
import sys

if "--horovod" in sys.argv:
    import horovod.mxnet as H
else:
    import mxnet_mpi.horovod as H

out = {}
for n in dir(H):
    if n.startswith("_"):
        continue
    f = getattr(H, n)
    f = f.__init__ if isinstance(f, type) else f
    try:
        out[n] = list(inspect.signature(f).parameters) if callable(f) else None
    except (TypeError, ValueError):
        out[n] = None
print(json.dumps(out, sort_keys=True))
