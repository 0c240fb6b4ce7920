"""The training step that overlap.py, preempt.py and cluster.py time: a gluoncv
model (hybridized, static memory) on one fixed batch of random images."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Workload:
    """A model, its batch and loss, and the parameters that get gradients."""

    net: object
    x: object
    y: object
    loss_fn: object
    params: list

    def forward_backward(self) -> None:
        """One recorded forward and backward pass (queued on MXNet's engine)."""
        from mxnet import autograd
        with autograd.record():
            loss = self.loss_fn(self.net(self.x), self.y)
        loss.backward()


def gluoncv_workload(model: str, batch: int, image_size: int, classes: int = 100,
                     **hybridize_flags) -> Workload:
    """`model` from gluoncv's model zoo, initialised and run once (shapes known);
    `hybridize_flags` go to CachedOp (e.g. backward_bulk_size)."""
    import mxnet as mx
    from gluoncv.model_zoo import get_model
    from mxnet import gluon

    net = get_model(model, classes=classes)
    net.initialize(mx.init.Xavier())
    net.hybridize(static_alloc=True, static_shape=True, **hybridize_flags)
    x = mx.nd.random.uniform(shape=(batch, 3, image_size, image_size))
    y = mx.nd.array([i % classes for i in range(batch)])
    net(x).wait_to_read()
    params = [p for p in net.collect_params().values() if p.grad_req != "null"]
    return Workload(net, x, y, gluon.loss.SoftmaxCrossEntropyLoss(), params)
