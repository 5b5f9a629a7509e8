"""Scoring secrets under a trained model: log-perplexity, reference candidates, the canary report.

Log-perplexity (Carlini et al. 2019) of a sequence ``s_1..s_n`` after a context ``c`` is
``−Σ_i log2 p(s_i | c, s_1..s_{i−1})``, **in bits** (base 2, the base of exposure's
``log2``). A lower log-perplexity means the model finds the sequence likelier.

How each task's model is read (:mod:`fedsim.models`):

- ``char`` (:class:`~fedsim.models.CharLSTM`, or any model mapping ``[B, T]`` ids to ``[B, C]``
  logits of the next id): token ``s_i`` is predicted from the window of the last ``w`` tokens
  of ``c + s_1..s_{i−1}`` (fewer while that text is shorter than ``w``), one forward pass per
  position. Windows shared by many candidates (all of them at ``i = 1``) are run once. For a
  :class:`~fedsim.models.CharLSTM` (with ``nn.LSTM``) the context part of each window is run
  once and its LSTM state carried into every candidate's tokens: the same numbers up to
  rounding, ``Σ_i i`` instead of ``n·w`` LSTM steps per candidate (10,000 8-character
  candidates with the 2×256 LEAF model and ``w = 80``: seconds instead of minutes on one core).
- ``nwp`` (:class:`~fedsim.models.WordLSTM`, or any model mapping ``[B, T]`` ids to
  ``[B, T, C]`` per-position logits, position ``t`` predicting token ``t + 1``): one forward pass
  over ``c + s_1..s_{n−1}``; the outputs at positions ``|c|−1 .. |c|+n−2`` predict ``s_1..s_n``.
  ``c`` starts with BOS. The EOS after the secret is not scored.

Everything runs under ``torch.no_grad`` in batches on the model's device (CPU is fine).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from fedsim.attacks.canaries import CanarySet
from fedsim.attacks.stats import exposure, extrapolated_exposure, rank
from fedsim.attacks.views import check_seed
from fedsim.errors import FedsimError
from fedsim.models import CharLSTM

LN2 = math.log(2.0)
#: Reference candidates' stream of numpy.random.default_rng([seed, stream]) (analysis randomness).
_REFERENCES = 3


def _device(model: nn.Module) -> torch.device:
    p = next(iter(model.parameters()), None)
    return p.device if p is not None else torch.device("cpu")


def _next_logprob(model: nn.Module, windows: np.ndarray, batch_size: int) -> torch.Tensor:
    """``log p(· | window)`` (natural log, ``[U, C]``) of a char model for each row of ``windows``."""
    dev = _device(model)
    out = []
    for s in range(0, len(windows), batch_size):
        x = torch.from_numpy(np.ascontiguousarray(windows[s : s + batch_size])).to(dev)
        out.append(torch.log_softmax(model(x).float(), dim=-1).cpu())
    return torch.cat(out)


def _char_bits(model: nn.Module, seqs: np.ndarray, ctx: np.ndarray, window: int | None, batch: int) -> np.ndarray:
    k, n = seqs.shape
    full = np.concatenate([np.broadcast_to(ctx, (k, len(ctx))), seqs], axis=1)
    nats = torch.zeros(k, dtype=torch.float64)
    for i in range(n):
        end = len(ctx) + i
        start = 0 if window is None else max(0, end - window)
        uniq, inverse = np.unique(full[:, start:end], axis=0, return_inverse=True)
        logp = _next_logprob(model, uniq, batch)
        rows = torch.from_numpy(inverse.reshape(-1))
        nats -= logp[rows, torch.from_numpy(seqs[:, i])].double()
    return (nats / LN2).numpy()


def _lstm_next_logprob(model: CharLSTM, shared: np.ndarray, own: np.ndarray, batch: int) -> torch.Tensor:
    """:func:`_next_logprob` of a :class:`CharLSTM` for the windows ``shared + own[j]``: the
    shared part runs once (batch 1) and its LSTM state seeds every candidate's own tokens."""
    dev = _device(model)
    state = None
    h_last = None
    if len(shared):
        h, state = model.lstm(model.embed(torch.from_numpy(np.ascontiguousarray(shared[None])).to(dev)))
        h_last = h[:, -1, :]
    out = []
    for s in range(0, len(own), batch):
        rows = own[s : s + batch]
        if rows.shape[1] == 0:
            assert h_last is not None
            last = h_last.expand(len(rows), -1)
        else:
            init = None if state is None else tuple(t.expand(-1, len(rows), -1).contiguous() for t in state)
            h, _ = model.lstm(model.embed(torch.from_numpy(np.ascontiguousarray(rows)).to(dev)), init)
            last = h[:, -1, :]
        out.append(torch.log_softmax(model.head(last).float(), dim=-1).cpu())
    return torch.cat(out)


def _char_bits_lstm(model: CharLSTM, seqs: np.ndarray, ctx: np.ndarray, window: int | None, batch: int) -> np.ndarray:
    """:func:`_char_bits` for a :class:`CharLSTM` (the same numbers up to rounding): at position
    ``i`` the context part of the window is run once, so the cost is ``Σ_i i`` LSTM steps per
    candidate instead of ``n·w``."""
    k, n = seqs.shape
    nats = torch.zeros(k, dtype=torch.float64)
    for i in range(n):
        end = len(ctx) + i
        start = 0 if window is None else max(0, end - window)
        own = seqs[:, max(0, start - len(ctx)) : i]
        uniq, inverse = np.unique(own, axis=0, return_inverse=True)
        logp = _lstm_next_logprob(model, ctx[start:], uniq, batch)
        rows = torch.from_numpy(inverse.reshape(-1))
        nats -= logp[rows, torch.from_numpy(seqs[:, i])].double()
    return (nats / LN2).numpy()


def _nwp_bits(model: nn.Module, seqs: np.ndarray, ctx: np.ndarray, batch: int) -> np.ndarray:
    k, n = seqs.shape
    x_all = np.concatenate([np.broadcast_to(ctx, (k, len(ctx))), seqs[:, :-1]], axis=1)
    dev = _device(model)
    out = []
    for s in range(0, k, batch):
        x = torch.from_numpy(np.ascontiguousarray(x_all[s : s + batch])).to(dev)
        logits = model(x)[:, len(ctx) - 1 :, :].float()
        target = torch.from_numpy(seqs[s : s + batch]).to(dev)
        logp = torch.log_softmax(logits, dim=-1).gather(2, target.unsqueeze(2)).squeeze(2)
        out.append(-logp.double().sum(dim=1).cpu())
    return (torch.cat(out) / LN2).numpy()


def sequence_log_perplexity(
    model: nn.Module,
    data_task: str,
    tokens: Sequence[int] | Sequence[Sequence[int]] | np.ndarray,
    context: Sequence[int] | np.ndarray,
    *,
    window: int | None = None,
    batch_size: int = 256,
) -> np.ndarray:
    """Log-perplexity in bits, ``−Σ_i log2 p(s_i | context, s_<i)``, of each token sequence.

    Parameters
    ----------
    model : the trained model (a ``char`` or ``nwp`` model; see the module docstring). It is
        put in eval mode for the call and restored after.
    data_task : ``char`` or ``nwp`` (the dataset's ``task``).
    tokens : one sequence (``[n]``) or ``K`` sequences of equal length (``[K, n]``) of token ids.
    context : the ids before each sequence (char: at least one; nwp: starts with BOS).
    window : char only: the model's window ``w`` (windows are cut to the last ``w`` ids);
        None: no cut. Default None.
    batch_size : sequences (char: distinct windows) per forward pass. Default 256.

    Returns float64 ``[K]`` (``[1]`` for one sequence), in bits.
    """
    seqs = np.atleast_2d(np.asarray(tokens, dtype=np.int64))
    ctx = np.asarray(context, dtype=np.int64).reshape(-1)
    if seqs.ndim != 2 or seqs.shape[1] < 1:
        raise FedsimError(f"tokens must be one sequence or a [K, n] array with n ≥ 1, got shape {seqs.shape}")
    if data_task not in ("char", "nwp"):
        raise FedsimError(f"log-perplexity is defined for the 'char' and 'nwp' tasks, not {data_task!r}")
    if len(ctx) < 1:
        raise FedsimError("the context must hold at least one token (char: a prefix; nwp: BOS)")
    if batch_size < 1 or (window is not None and window < 1):
        raise FedsimError(f"batch_size and window must be ≥ 1, got {batch_size} and {window}")
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            if data_task == "char" and isinstance(model, CharLSTM) and type(model.lstm) is nn.LSTM:
                return _char_bits_lstm(model, seqs, ctx, window, batch_size)
            if data_task == "char":
                return _char_bits(model, seqs, ctx, window, batch_size)
            return _nwp_bits(model, seqs, ctx, batch_size)
    finally:
        model.train(was_training)


def reference_candidates(canaries: CanarySet, n: int, seed: int) -> np.ndarray:
    """``n`` random secrets from the canaries' secret space: int64 ``[n, secret_length]``, each token
    uniform over ``canaries.alphabet`` (independently; an inserted secret may be drawn, with
    probability ``n·2^−secret_space_bits``). Seeded with ``default_rng([seed, 3])`` (analysis
    randomness, not DP noise).

    Parameters
    ----------
    canaries : the canary set whose secret space to draw from.
    n : candidates to draw (≥ 1).
    seed : their seed.
    """
    if n < 1:
        raise FedsimError(f"the number of reference candidates must be ≥ 1, got {n}")
    rng = np.random.default_rng([check_seed(seed, "seed"), _REFERENCES])
    alphabet = np.asarray(canaries.alphabet, dtype=np.int64)
    return alphabet[rng.integers(0, len(alphabet), size=(n, canaries.secret_length))]


def _extrapolated(score: float, references: np.ndarray) -> float | None:
    """:func:`~fedsim.attacks.stats.extrapolated_exposure` in bits, or None where it is undefined
    (a non-finite score, or references that cannot be fitted, e.g. all equal)."""
    if not math.isfinite(score):
        return None
    try:
        return float(extrapolated_exposure(score, references).extrapolated)
    except FedsimError:
        return None


def canary_report(
    model: nn.Module, canaries: CanarySet, n_references: int = 10000, seed: int = 0, *, batch_size: int = 256
) -> dict[str, Any]:
    """Each canary's log-perplexity, rank and exposure against random reference secrets.

    Parameters
    ----------
    model : the trained model.
    canaries : the canary set that was inserted.
    n_references : reference candidates drawn from the secret space (:func:`reference_candidates`).
        Default 10000.
    seed : the references' seed. Default 0.
    batch_size : see :func:`sequence_log_perplexity`. Default 256.

    Returns a JSON-ready dict: ``unit`` (``"bits"``), ``n_references``, ``secret_space_bits``,
    ``references`` (mean, std, min of their log-perplexities), ``canaries`` (one entry each:
    ``name``, ``repetitions``, ``size``, ``num_train``, ``log_perplexity`` (bits), ``rank``
    (:func:`~fedsim.attacks.stats.rank` among the secret and the references, ties against it),
    ``exposure`` (``log2(n_references + 1) − log2 rank``, the exposure within the sample, at most
    ``log2(n_references + 1)`` bits) and ``extrapolated_exposure`` (the skew-normal estimate over
    the whole secret space, :func:`~fedsim.attacks.stats.extrapolated_exposure`; None where
    undefined)) and ``by_level`` (per ``(repetitions, size)`` cell: canaries, mean exposure, mean
    extrapolated exposure over the canaries that have one).
    """
    kw: dict[str, Any] = dict(window=canaries.window if canaries.task == "char" else None, batch_size=batch_size)
    refs = sequence_log_perplexity(
        model, canaries.task, reference_candidates(canaries, n_references, seed), canaries.context, **kw
    )
    secrets = np.asarray([c.secret for c in canaries.canaries], dtype=np.int64)
    mine = sequence_log_perplexity(model, canaries.task, secrets, canaries.context, **kw)
    rows = []
    for c, lp in zip(canaries.canaries, mine.tolist()):
        r = rank(lp, refs)  # among the secret and the references: 1..n_references + 1
        rows.append(
            dict(
                name=c.name,
                repetitions=c.repetitions,
                size=c.size,
                num_train=c.num_train,
                log_perplexity=lp,
                rank=r,
                exposure=exposure(r, n_references + 1),
                extrapolated_exposure=_extrapolated(lp, refs),
            )
        )
    return dict(
        unit="bits",
        n_references=n_references,
        secret_space_bits=canaries.secret_space_bits,
        references=dict(mean=float(refs.mean()), std=float(refs.std()), min=float(refs.min())),
        canaries=rows,
        by_level=_by_level(rows),
    )


def _by_level(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean exposures per ``(repetitions, size)`` cell, in order of first appearance."""
    cells: dict[tuple[int, int | None], list[dict[str, Any]]] = {}
    for row in rows:
        cells.setdefault((row["repetitions"], row["size"]), []).append(row)
    return [
        dict(
            repetitions=r,
            size=s,
            canaries=len(group),
            mean_exposure=float(np.mean([g["exposure"] for g in group])),
            mean_extrapolated_exposure=_mean([g["extrapolated_exposure"] for g in group]),
        )
        for (r, s), group in cells.items()
    ]


def _mean(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return float(np.mean(known)) if known else None
