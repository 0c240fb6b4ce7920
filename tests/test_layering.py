"""The package's import graph stays layered: no cycles, and no module imports
from a layer above its own (lazy imports inside functions included). A new
module must be given its layer here."""

from __future__ import annotations

import ast

from mpirun import ROOT

PACKAGE = ROOT / "mxnet_mpi"

# Lowest first: settings, errors and the transport defaults; the native library and the MPI world;
# collectives and what builds on them alone; the embedding modes; the stores;
# what is built on the stores (framework patches, hybrid stores, launcher,
# runner, Horovod API, SyncBatchNorm) and the package itself.
LAYERS = [
    {"errors", "settings", "custom_function", "shm_segments", "transport", "routes", "report",
     "launch_watch", "pslite_roles", "optimizer_settings", "weight_writes", "rank_children",
     "optimizer_fixes"},
    {"_native", "timeline", "world", "peer_wait"},
    {"collectives", "staging", "batch_sizes", "keys", "ops", "joining", "deferred", "param_order",
     "device_meeting", "module_states",
     "server_keys", "stale_grads"},
    {"modes", "trainer_plan"},
    {"kvstore", "store_calls", "store_glue", "stores", "consistency"},
    {"mxnet_patches", "hybrid", "hybrid_routing", "hybrid_dense", "hybrid_sparse",
     "pslite_client", "launch", "runner", "horovod", "horovod_state", "horovod_collectives",
     "horovod_training", "syncbn", "__init__", "__main__"},
    {"testing", "testing.netns"},   # test support, above what it tests
]
LAYER = {m: i for i, layer in enumerate(LAYERS) for m in layer}


def module_name(path) -> str:
    """'world' for mxnet_mpi/world.py, 'testing.netns' for mxnet_mpi/testing/netns.py."""
    rel = path.relative_to(PACKAGE).with_suffix("")
    return ".".join(rel.parts) if rel.name != "__init__" or len(rel.parts) == 1 else \
        ".".join(rel.parts[:-1])


def imports_of(path) -> set:
    """Package modules that `path` imports, anywhere in it (`import mxnet_mpi.x`,
    `from mxnet_mpi import x`, `from . import x`, `from .x import y`)."""
    here = module_name(path).split(".")[:-1] if path.parent != PACKAGE else []
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for a in node.names:
                parts = a.name.split(".")
                if parts[0] == "mxnet_mpi":
                    found.add(".".join(parts[1:]) or "__init__")
            continue
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level >= 1:
            base = here[:len(here) - (node.level - 1)] if node.level > 1 else here
        elif node.module and node.module.split(".")[0] == "mxnet_mpi":
            base = []
        else:
            continue
        mod = node.module.split(".") if node.module else []
        if node.level == 0:
            mod = mod[1:]
        target = base + mod
        if target:
            found.add(".".join(target))
        else:
            found.update(a.name for a in node.names)
    return {m for m in found if m in MODULES}


MODULES = {module_name(p) for p in PACKAGE.rglob("*.py")}


def graph() -> dict:
    return {module_name(p): imports_of(p) for p in PACKAGE.rglob("*.py")}


def test_every_module_has_a_layer():
    assert set(graph()) - set(LAYER) == set(), "give new modules a layer in LAYERS"


def test_no_import_from_a_layer_above():
    bad = ["%s (layer %d) imports %s (layer %d)" % (m, LAYER[m], d, LAYER[d])
           for m, deps in sorted(graph().items()) for d in sorted(deps) if LAYER[d] > LAYER[m]]
    assert bad == []


def test_no_import_cycles():
    g = graph()
    state: dict = {}

    def visit(m, path):
        if state.get(m) == "done":
            return
        assert state.get(m) != "open", "import cycle: " + " -> ".join(path + [m])
        state[m] = "open"
        for d in sorted(g[m]):
            visit(d, path + [m])
        state[m] = "done"

    for m in sorted(g):
        visit(m, [])
