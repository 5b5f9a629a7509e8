"""Local SGD steps replayed as CUDA graphs, for models whose steps are many small kernels.

On a GPU, a recurrent model's training step is hundreds of small kernels (one set per time step
and layer, forward and backward), each queued by the host. The host's share then sets the pace:
on an H100, a W1 step (LEAF's character LSTM, batch 8 × 80 characters) keeps the host busy for
about 8.6 ms, and neither queueing batch copies without waiting nor running users on separate
streams shortens a round (``benchmarks/gpu_streams.py``). A CUDA graph records the step's kernels
once and replays them with one call.

:class:`StepGraphs` keeps one graph per batch shape for one model, loss and learning rate. The
step it records is :func:`sgd_step`, the same function eager training runs, so a replay runs the
same kernels on the same values. Capturing a shape first runs the step eagerly a few times on a
side stream (which sets up cuDNN's and cuBLAS's state), then puts the parameters and buffers
back exactly as they were. The model's parameters keep their storage (users are loaded with
:func:`fedsim.parameters.load_flat_`, which copies in place), so one graph serves every user the
worker trains, round after round; each batch is copied into the graph's input tensors before
its replay.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from fedsim.models import recurrent

__all__ = ["StepGraphs", "graphs_for", "sgd_step"]

Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def sgd_step(
    params: Sequence[torch.Tensor], loss_of: Loss, xb: torch.Tensor, yb: torch.Tensor, lr: float
) -> torch.Tensor:
    """One plain SGD step on ``params``: ``p ← p − lr·∇loss_of(xb, yb)``; returns the loss, detached.

    Parameters
    ----------
    params : the model's parameters (updated in place; a parameter without a gradient is left as is).
    loss_of : the batch's mean training loss, computed through the model.
    xb, yb : the batch's inputs and targets, on the parameters' device.
    lr : the step size.
    """
    for p in params:
        p.grad = None
    loss = loss_of(xb, yb)
    loss.backward()
    with torch.no_grad():
        for p in params:
            if p.grad is not None:
                p.add_(p.grad, alpha=-lr)
    return loss.detach()


class StepGraphs:
    """:func:`sgd_step` of one model, loss and step size, captured once per batch shape and replayed.

    Parameters
    ----------
    model : the worker's model, on a CUDA device. Its parameters must keep their storage while
        this object is used (load new values with :func:`fedsim.parameters.load_flat_`).
    loss_of : the batch's mean training loss through ``model`` (``loss(model(x), y)``); it must
        not read values back to the host or draw random numbers (a graph would freeze them).
    lr : the SGD step size.
    warmup : eager steps run on a side stream before a shape is captured, their parameter changes
        undone. Default 2.
    """

    def __init__(self, model: nn.Module, loss_of: Loss, lr: float, warmup: int = 2) -> None:
        device = next(model.parameters()).device
        if device.type != "cuda":
            raise ValueError(f"CUDA graphs need a model on a CUDA device, not {device}")
        self._setup(model, loss_of, lr, warmup)

    def _setup(self, model: nn.Module, loss_of: Loss, lr: float, warmup: int) -> None:
        self.params = list(model.parameters())
        self.device = self.params[0].device
        # what a step may change: the parameters, and buffers such as a normalisation's statistics
        self.state = self.params + list(model.buffers())
        self.loss_of, self.lr, self.warmup = loss_of, float(lr), int(warmup)
        self.data: Any = None  # the dataset whose loss ``loss_of`` computes (set by graphs_for)
        self.failed: str | None = None  # why capturing failed (steps are eager from then on)
        self._graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    @property
    def captured(self) -> int:
        """How many batch shapes have a graph."""
        return len(self._graphs)

    def step(self, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        """Run :func:`sgd_step` on the batch ``(xb, yb)`` (on the host or the device) by replaying
        the graph of its shape, capturing it first if it is new. Returns the loss (a copy on the
        device, queued: reading it waits for the step).

        If capturing fails where the eager step does not, the reason is kept in :attr:`failed`, a
        warning says it once, and this and every later step run eagerly (the same step, one
        kernel at a time). A batch whose eager step raises raises here too."""
        if self.failed is None:
            key = (tuple(xb.shape), xb.dtype, tuple(yb.shape), yb.dtype)
            entry = self._graphs.get(key)
            if entry is None:
                entry = self._capture(xb, yb)
            if entry is not None:
                self._graphs[key] = entry
                graph, x_in, y_in, loss = entry
                x_in.copy_(_staged(xb), non_blocking=True)
                y_in.copy_(_staged(yb), non_blocking=True)
                graph.replay()
                return loss.clone()
        return sgd_step(self.params, self.loss_of, xb.to(self.device), yb.to(self.device), self.lr)

    def _capture(
        self, xb: torch.Tensor, yb: torch.Tensor
    ) -> tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """The graph of one step on batches shaped like ``(xb, yb)`` with its input tensors and
        its loss; None (and :attr:`failed` set) if capturing raised. If the eager warm-up step
        raises (the batch itself fails), that error is raised. Either way the model's state is
        the same afterwards as before."""
        x_in = torch.empty(xb.shape, dtype=xb.dtype, device=self.device)
        y_in = torch.empty(yb.shape, dtype=yb.dtype, device=self.device)
        x_in.copy_(xb)
        y_in.copy_(yb)
        here = torch.cuda.current_stream(self.device)
        with torch.no_grad():
            kept = [t.detach().clone() for t in self.state]
        side = torch.cuda.Stream(self.device)
        side.wait_stream(here)
        try:
            with torch.cuda.stream(side):
                for _ in range(self.warmup):
                    sgd_step(self.params, self.loss_of, x_in, y_in, self.lr)
        except Exception:
            # the batch's own failure (eager training raises on it too): this user fails, as it
            # would eagerly, and the graphs stay on for the others
            torch.cuda.synchronize(self.device)
            self._restore(kept)
            raise
        here.wait_stream(side)
        self._restore(kept)  # the warm-up steps leave no trace
        for p in self.params:
            p.grad = None  # the graph's backward writes fresh gradient tensors of its own
        try:
            graph = torch.cuda.CUDAGraph()
            # thread_local: another thread's CUDA calls during the capture (the noise of the next
            # round, prepared and copied to the device in the background) neither fail nor end up
            # in the graph; only this thread's must be capturable
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                loss = sgd_step(self.params, self.loss_of, x_in, y_in, self.lr)
        except Exception as e:  # the step runs eagerly but cannot be captured: eager steps from now on
            self.failed = f"{type(e).__name__}: {e}"
            warnings.warn(
                f"sim.cuda_graphs: capturing a local step failed ({self.failed}); training eagerly", stacklevel=3
            )
            torch.cuda.synchronize(self.device)
            self._restore(kept)
            return None
        return graph, x_in, y_in, loss

    def _restore(self, kept: list[torch.Tensor]) -> None:
        with torch.no_grad():
            for t, k in zip(self.state, kept):
                t.copy_(k)

    def release(self) -> None:
        """Drop the graphs and the gradient tensors they wrote."""
        self._graphs.clear()
        for p in self.params:
            p.grad = None


def _staged(t: torch.Tensor) -> torch.Tensor:
    """``t`` in page-locked host memory (so a copy from it is queued, not waited for), or ``t``
    itself when it is already on a device."""
    return t.pin_memory() if t.device.type == "cpu" else t


def graphs_for(model: nn.Module, data: Any, lr: float, enabled: bool) -> StepGraphs | None:
    """The model's :class:`StepGraphs` for ``data``'s training loss at step size ``lr``, where
    capturing helps and is safe, else None.

    It helps and is safe where ``enabled`` (``sim.cuda_graphs = "auto"``), the model is on a CUDA
    device, recurrent (its steps are many small kernels; a convolutional model's are few and
    large), and without dropout (a graph would replay random draws differently from eager
    steps). The graphs are kept for the model's lifetime, so a worker captures each batch shape
    once for all its rounds; they are rebuilt if ``data`` or ``lr`` changes."""
    if not enabled:
        return None
    dev = next(model.parameters()).device
    if dev.type != "cuda" or not recurrent(model):
        return None
    if any(isinstance(m, nn.modules.dropout._DropoutNd) for m in model.modules()):
        return None
    if any(getattr(m, "dropout", 0) for m in model.modules() if isinstance(m, nn.RNNBase)):
        return None
    kept = _KEPT.get(model)
    if kept is not None and kept.data is data and kept.lr == float(lr):
        return kept
    if kept is not None:
        kept.release()
    lossf, ref = data.loss, weakref.ref(model)

    def loss_of(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        m = ref()
        assert m is not None  # the graphs die with the model
        return lossf(m(x), y)

    graphs = StepGraphs(model, loss_of, lr)
    graphs.data = data
    _KEPT[model] = graphs
    return graphs


#: each model's :class:`StepGraphs`, kept beside the model rather than on it (a copy of the model,
#: such as the step-by-step LSTM's twin, must not copy its graphs); an entry goes with its model,
#: which nothing in it refers to
_KEPT: weakref.WeakKeyDictionary[nn.Module, StepGraphs] = weakref.WeakKeyDictionary()
