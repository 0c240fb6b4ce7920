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
(read, never called: a scheduler may count its calls). Lists of scalars count
as settings (a MultiFactorScheduler's ``step``: with only its scalars compared,
ranks with different lists met only once a change of rate had been applied).
So does ``aggregate_num``, how many parameters one op updates: LAMB's
grouped update rounds differently from its one-by-one update. Left out: what
the ranks may hold differently without changing the update (``rescale_grad``,
which the batch-size rule sets from the agreed sum; update counters).
"""

from __future__ import annotations

import hashlib

#: Attributes that are not settings of the update, or that the stores set alike.
SKIPPED = frozenset({"rescale_grad", "num_update", "begin_num_update"})
_SCALARS = (bool, int, float, str, type(None))


def _plain(value) -> bool:
    """A scalar, or a list or tuple of plain values: text that is the same
    on every rank for the same setting (an object's text may hold its address)."""
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    return isinstance(value, _SCALARS)


def _scalars(obj) -> list:
    return ["%s=%r" % (k, v) for k, v in sorted(vars(obj).items())
            if not k.startswith("_") and k not in SKIPPED and _plain(v)]


def _scheduler(scheduler) -> str:
    return "%s(%s)" % (type(scheduler).__name__, ", ".join(_scalars(scheduler)))


def describe(optimizer, scale: float | None = None, scale_name: str = "trainer scale") -> str:
    """The settings of `optimizer` that shape its updates, as one line; with
    a Trainer's `scale` (its rescale_grad at construction, which the
    batch-size rule divides by the mean batch size), or another scale named
    `scale_name`."""
    if optimizer is None:
        return ""
    fields = [type(optimizer).__name__] + _scalars(optimizer)
    if scale is not None:
        fields.append("%s=%r" % (scale_name, scale))
    for table in ("lr_mult", "wd_mult"):
        value = getattr(optimizer, table, None)
        if value:
            fields.append("%s=%r" % (table, sorted(value.items(), key=repr)))
    # Gluon's parameters by index, in the Trainer's order (the same on every rank)
    params = getattr(optimizer, "param_dict", None) or {}
    mults = [(i, p.lr_mult, p.wd_mult) for i, p in params.items()
             if p.lr_mult != 1.0 or p.wd_mult != 1.0]
    if mults:
        fields.append("parameter multipliers (index, lr_mult, wd_mult)=%r" % mults)
    scheduler = getattr(optimizer, "lr_scheduler", None)
    if scheduler is not None:
        fields.append("lr_scheduler=" + _scheduler(scheduler))
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
            fields.append("%s=%r" % (k, v))
        elif isinstance(v, LRScheduler):
            fields.append("%s=%s" % (k, _scheduler(v)))
        else:
            fields.append("%s=%s" % (k, type(v).__name__))
    return ", ".join(fields)


def digest(text: str, bits: int) -> int:
    """A `bits`-bit digest of `text`; 0 for no text."""
    if not text:
        return 0
    h = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") & ((1 << bits) - 1)
