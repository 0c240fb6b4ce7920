"""Start-up speed-up for the test suite's own processes (not shipped).

The suite starts a few hundred fresh Python processes (ranks of jobs that
must exit, abort or launch, ps-lite nodes, examples), and each spends most of
its start-up importing MXNet. tests/mpirun.mpi_env puts this directory on
PYTHONPATH, so this module runs at interpreter start in those processes only;
an installed mxnet-mpi never sees it (tests/test_install.py clears PYTHONPATH).

Two costs go:
- MXNet generates Python source for each of its ~2,500 operator wrappers at
  import and compiles it with exec(). Here the compiled code is kept in a
  cache beside the interpreter (sys.prefix), keyed by a hash of the source
  with the operator's handle (an address, different in every process) put
  back as a constant after loading. An entry is stored only after checking
  that it equals what compiling the real source gives, so the cache can miss
  but never hand out different code.
- scipy.stats, scipy.sparse and requests, imported by MXNet at start-up and
  used by few tests, load on first use (importlib.util.LazyLoader).
"""

import builtins
import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import marshal
import os
import re
import sys
import types

# Modules whose exec() calls go through the cache; it is saved once `mxnet`
# has finished importing, since later modules generate wrappers too.
_EXEC_MODULES = {"mxnet.ndarray.register", "mxnet.symbol.register"}
_LAZY = {"scipy.stats", "scipy.sparse", "requests"}
_PATH = os.path.join(sys.prefix, "mxnet-opcache-%s-%d.marshal"
                     % (sys.implementation.cache_tag, marshal.version))
# The one handle literal in each generated wrapper.
_HANDLE = re.compile(r"(\n    return _(?:imperative_invoke|symbol_creator)\()(\d+)(, )")

_cache = None
_unsaved = 0
hits = 0   # wrappers served from the cache in this process (tests/test_fast_start.py)


def _load() -> dict:
    global _cache
    if _cache is None:
        try:
            with open(_PATH, "rb") as f:
                _cache = marshal.loads(f.read())
        except Exception:  # missing, or written by another Python: start afresh
            _cache = {}
    return _cache


def _swap(code: types.CodeType, old: int, new: int) -> types.CodeType:
    consts = tuple(_swap(c, old, new) if isinstance(c, types.CodeType)
                   else (new if type(c) is int and c == old else c) for c in code.co_consts)
    return code.replace(co_consts=consts)


def _compiled(source: str):
    """`source` compiled, from the cache where possible (else the source)."""
    global _unsaved, hits
    found = _HANDLE.findall(source)
    # Same digit count as the handle, so the code's position table is unchanged.
    placeholder = "9" * len(found[0][1]) if len(found) == 1 else ""
    if len(placeholder) < 6 or placeholder in source:
        return source
    handle = int(found[0][1])
    template = _HANDLE.sub(r"\g<1>%s\g<3>" % placeholder, source)
    key = hashlib.blake2b(template.encode(), digest_size=16).digest()
    cache = _load()
    code = cache.get(key)
    if code is None:
        code = compile(template, "<string>", "exec")
        direct = compile(source, "<string>", "exec")
        if _swap(code, int(placeholder), handle) == direct:
            cache[key] = code
            _unsaved += 1
        return direct
    hits += 1
    return _swap(code, int(placeholder), handle)


def _exec(source, globals=None, locals=None):
    if globals is None:  # as the builtin: the caller's namespaces
        frame = sys._getframe(1)
        globals = frame.f_globals
        if locals is None:
            locals = frame.f_locals
    if isinstance(source, str):
        source = _compiled(source)
    return builtins.exec(source, globals, locals)


def _save() -> None:
    global _unsaved
    if not _unsaved:
        return
    tmp = "%s.%d.tmp" % (_PATH, os.getpid())
    try:  # readers see the old file or the new one, never a partial one
        with open(tmp, "wb") as f:
            f.write(marshal.dumps(_cache))
        os.replace(tmp, _PATH)
        _unsaved = 0
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader) -> None:
        self.inner = inner

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module) -> None:
        module.__spec__.loader = module.__loader__ = self.inner   # as if never wrapped
        if module.__name__ in _EXEC_MODULES:
            module.__dict__["exec"] = _exec
        self.inner.exec_module(module)
        if module.__name__ == "mxnet":
            _save()


class _Lazy(importlib.util._LazyModule):
    """LazyLoader's module, except that reading ``__spec__`` does not load it:
    the import system reads it when the module is imported a second time."""

    def __getattribute__(self, attr):
        if attr == "__spec__":
            return object.__getattribute__(self, attr)
        return super().__getattribute__(attr)


class _LazyLoader(importlib.util.LazyLoader):
    def exec_module(self, module) -> None:
        super().exec_module(module)
        module.__class__ = _Lazy


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "mxnet" and name not in _EXEC_MODULES and name not in _LAZY:
            return None
        # the spec the other finders give (mxnet-mpi's start-up hook wraps mxnet's)
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if finder is not self and find else None
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        if name in _LAZY:
            spec.loader = _LazyLoader(spec.loader)
        else:
            spec.loader = _Loader(spec.loader)
        return spec


if os.environ.get("MXNET_MPI_TEST_FAST_START", "1") != "0":
    sys.meta_path.insert(0, _Finder())
