"""What an optimizer does to the summed gradients, as text the ranks can compare.

With our stores every rank applies its own optimizer to the same summed
gradients. Ranks whose optimizers differ (a learning rate computed from the
rank, ``set_learning_rate`` or a scheduler on one rank only, another
optimizer, momentum or weight decay) would drift apart with no error, where
MXNet's ``dist_sync`` applies one optimizer on its servers. Each step's
batch-size collective therefore carries a digest of this text
(batch_sizes.py): a difference ends the step on every rank, with each rank's
settings in its message.

The text holds the optimizer's class and every public setting whose value is a
plain scalar (learning rate ``lr``, ``wd``, ``momentum``, ``beta1``,
``clip_gradient``, ...), its ``lr_mult``/``wd_mult`` tables, the per-parameter
multipliers of Gluon parameters, and the scheduler's class and settings
(never called: a scheduler may count its calls; for MXNet's own schedulers,
their settings without their progress, and the rate a copy gives for the next
update, so that asking a scheduler ahead of the optimizer, to log the next
rate, is no difference; another class's whole state, private values and the
schedulers it holds included, where its rate may live). numpy's scalars count
as the numbers they hold. Lists of scalars count as settings (a
MultiFactorScheduler's ``step``: with only its scalars compared, ranks with
different lists met only once a change of rate had been applied).
So does ``aggregate_num``, how many parameters one op updates: LAMB's
grouped update rounds differently from its one-by-one update. Left out: what
the ranks may hold differently without changing the update (``rescale_grad``,
which the batch-size rule sets from the agreed sum; update counters).
"""

from __future__ import annotations

import copy
import hashlib
import logging

import numpy as np

#: Attributes that are not settings of the update, or that the stores set alike.
SKIPPED = frozenset({"rescale_grad", "num_update", "begin_num_update"})
# numpy's scalars too: a rate read from a float32 table is one (np.float64
# is a float, np.float32 and np.int64 are not), and was left out
_SCALARS = (bool, int, float, str, type(None), np.number, np.bool_)


def _plain(value) -> bool:
    """A scalar, or a list or tuple of plain values: text that is the same
    on every rank for the same setting (an object's text may hold its address)."""
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    return isinstance(value, _SCALARS)


def _text(value) -> str:
    """repr of a plain value, numpy's scalars as the Python numbers they hold
    (their repr drops digits: float32 0.1 and 0.1000001 both print 0.1)."""
    if isinstance(value, (list, tuple)):
        inner = ", ".join(map(_text, value))
        return "[%s]" % inner if isinstance(value, list) else "(%s%s)" % (
            inner, "," if len(value) == 1 else "")
    return repr(value.item() if isinstance(value, np.generic) else value)


def _scalars(obj) -> list:
    """`obj`'s public plain values as "name=value"."""
    return ["%s=%s" % (k, _text(v)) for k, v in sorted(vars(obj).items())
            if not k.startswith("_") and k not in SKIPPED and _plain(v)]


# How much of a scheduler of the user's own is read each step: containers up
# to this many items (a history kept in one would grow the text step by step),
# schedulers held in it up to this depth.
_MOST_ITEMS = 1024
_DEEPEST = 4


def _state(value, depth: int = 0) -> str | None:
    """A scheduler's state as text, never calling it: plain values, numpy
    arrays (a digest), lists, tuples and dicts of them, and the schedulers it
    holds (a warm-up wrapper's, gluoncv's LRSequential's), each with every
    value, private ones included, where its rate may live. None for what is
    not read (an object of another kind, a file, a large container)."""
    from mxnet.lr_scheduler import LRScheduler
    if isinstance(value, _SCALARS):
        return _text(value)
    if depth >= _DEEPEST:
        return None
    if isinstance(value, np.ndarray):
        if value.size > _MOST_ITEMS * 64 or value.dtype == object:
            return None
        return "array(%s, %s, %s)" % (value.shape, value.dtype, hashlib.blake2b(
            np.ascontiguousarray(value).tobytes(), digest_size=8).hexdigest())
    if isinstance(value, (list, tuple)) and len(value) <= _MOST_ITEMS:
        return "[%s]" % ", ".join("%s" % _state(v, depth + 1) for v in value)
    if isinstance(value, dict) and len(value) <= _MOST_ITEMS:
        return "{%s}" % ", ".join("%s: %s" % (_text(k) if _plain(k) else type(k).__name__,
                                              _state(v, depth + 1))
                                  for k, v in sorted(value.items(), key=lambda kv: repr(kv[0])))
    if isinstance(value, LRScheduler):
        return _fields_state(value, vars(value), depth)
    return None


def _fields_state(obj, fields: dict, depth: int) -> str:
    """`obj`'s class and the state (_state) of each of `fields` it holds."""
    return "%s(%s)" % (type(obj).__name__, ", ".join(
        "%s=%s" % (k, text) for k, v in sorted(fields.items()) if k not in SKIPPED
        for text in [_state(v, depth + 1)] if text is not None))


def _callable_fields(scheduler) -> dict:
    """What the rate of a scheduler that is no LRScheduler (MXNet takes any
    callable) may come from: its attributes, and for a function what it
    closes over, its defaults and the module's plain values it reads."""
    fields = dict(getattr(scheduler, "__dict__", {}))
    for attr in ("__defaults__", "__kwdefaults__"):
        if getattr(scheduler, attr, None):
            fields[attr] = getattr(scheduler, attr)
    cells = getattr(scheduler, "__closure__", None) or ()
    if cells:
        fields["__closure__"] = [_cell(c) for c in cells]
    code, names = getattr(scheduler, "__code__", None), getattr(scheduler, "__globals__", {})
    for n in (code.co_names if code is not None else ()):
        if n in names and isinstance(names[n], _SCALARS):
            fields["global " + n] = names[n]
    return fields


# MXNet's own schedulers keep their progress in these: a call ahead of the
# optimizer's (logging the next step's rate) moves them early, though the
# rate of the next update is the same.
_PROGRESS = frozenset({"base_lr", "count", "cur_step_ind"})
_OWN_SCHEDULERS = ("FactorScheduler", "MultiFactorScheduler", "PolyScheduler",
                   "CosineScheduler")


def _scheduler(scheduler, next_update: int | None = None) -> str:
    """A scheduler's class and settings. MXNet's own compare their settings and
    the rate of the `next_update` (from a copy: the scheduler is never
    called), not their progress. Another class (a subclass of MXNet's
    included: it may compute its rate otherwise, print, or hold what cannot
    be copied) is never called or copied: its state is compared (_state),
    private values and the schedulers it holds included, where a rate moved
    by each rank's own loss may live."""
    name = type(scheduler).__name__
    own = type(scheduler).__module__ == "mxnet.lr_scheduler" and name in _OWN_SCHEDULERS
    if not own:
        text = _state(scheduler)
        return text if text is not None else _fields_state(scheduler,
                                                           _callable_fields(scheduler), 0)
    fields = [f for f in _scalars(scheduler) if f.split("=", 1)[0] not in _PROGRESS]
    if next_update is not None:
        fields.append("lr at update %d=%s" % (next_update, _next_rate(scheduler, next_update)))
    return "%s(%s)" % (name, ", ".join(fields))


def _cell(cell):
    """A closure cell's value (None where it is still empty)."""
    try:
        return cell.cell_contents
    except ValueError:
        return None


def _next_rate(scheduler, update: int) -> str:
    """The rate a copy of `scheduler` gives for `update`, as text, without its
    log line ("Change learning rate to ...": the scheduler itself logs it at
    the update)."""
    disabled = logging.root.manager.disable
    logging.disable(max(disabled, logging.INFO))
    try:
        return _text(copy.deepcopy(scheduler)(update))
    finally:
        logging.disable(disabled)


def describe(optimizer, scale: float | None = None, scale_name: str = "trainer scale") -> str:
    """The settings of `optimizer` that shape its updates, as one line; with
    a Trainer's `scale` (its rescale_grad at construction, which the
    batch-size rule divides by the mean batch size), or another scale named
    `scale_name`."""
    if optimizer is None:
        return ""
    fields = [type(optimizer).__name__] + _scalars(optimizer)
    if scale is not None:
        fields.append("%s=%s" % (scale_name, _text(scale)))
    for table in ("lr_mult", "wd_mult"):
        value = getattr(optimizer, table, None)
        if value:
            fields.append("%s=%s" % (table, _text(sorted(value.items(), key=repr))))
    # Gluon's parameters by index, in the Trainer's order (the same on every rank)
    params = getattr(optimizer, "param_dict", None) or {}
    mults = [(i, p.lr_mult, p.wd_mult) for i, p in params.items()
             if p.lr_mult != 1.0 or p.wd_mult != 1.0]
    if mults:
        fields.append("parameter multipliers (index, lr_mult, wd_mult)=%s" % _text(mults))
    scheduler = getattr(optimizer, "lr_scheduler", None)
    if scheduler is not None:
        # MXNet's Optimizer asks its scheduler for num_update + 1 at the next update
        fields.append("lr_scheduler=" + _scheduler(
            scheduler, int(getattr(optimizer, "num_update", 0)) + 1))
    return ", ".join(fields)


def describe_params(name: str, params: dict) -> str:
    """The settings of an optimizer still to be created from `name` and
    `params` (Module.init_optimizer): the plain ones, a scheduler by its
    settings, and other values by their type (an object's text may hold its
    address)."""
    from mxnet.lr_scheduler import LRScheduler

    fields = [name.lower()]
    for k, v in sorted(params.items()):
        if k in SKIPPED:
            continue
        if _plain(v):
            fields.append("%s=%s" % (k, _text(v)))
        elif isinstance(v, LRScheduler):
            fields.append("%s=%s" % (k, _scheduler(v)))
        else:
            fields.append("%s=%s" % (k, type(v).__name__))
    return ", ".join(fields)


# Values an optimizer advances as it updates (MXNet's Nadam: m_schedule, at
# each update call): not settings, though the texts carry them; where only
# they differ, some rank loaded other states.
_ADVANCED = {"m_schedule": "Nadam"}


def without_progress(text: str) -> str:
    """`text` (describe's) without the values an optimizer advances as it
    updates (_ADVANCED)."""
    return ", ".join(f for f in text.split(", ") if f.split("=", 1)[0] not in _ADVANCED)


def advice(text: str) -> str:
    """Why `text` (describe's) differs between ranks whose texts differ only
    in values an optimizer advances as it updates."""
    for name, owner in _ADVANCED.items():
        if ", %s=" % name in text:
            return (" Only %s's %s differs, which is not a setting but what its updates "
                    "advanced: some rank loaded optimizer states (load_states) that the "
                    "others did not; load the same states on every rank" % (owner, name))
    return ""


def digest(text: str, bits: int) -> int:
    """A `bits`-bit digest of `text`; 0 for no text."""
    if not text:
        return 0
    h = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") & ((1 << bits) - 1)
