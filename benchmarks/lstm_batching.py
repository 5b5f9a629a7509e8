"""Can recurrent users be batched on CPU? A grouped-weights LSTM against ``nn.LSTM`` user by user.

W1's shape (LEAF's character LSTM: embedding 8, two LSTM layers of 256, 80 characters, batch 8)
for ``U`` = 20 users, each with its own weights (as in a round: users diverge after their first
local step). One forward and backward pass of one batch per user, timed two ways in the same
process on one thread:

- ``sequential``: ``nn.LSTM`` user by user (what fedsim's in-process engine and the floor do;
  on CPU, torch runs it as one fused oneDNN kernel per layer);
- ``batched``: the users' weights stacked, one LSTM over users × batch written from ``bmm`` and
  element-wise gates (the only way to give every user its own recurrent weights in one call),
  the input projection of all time steps in one ``einsum``.

The batched losses are first checked equal to the sequential ones (so the timing compares the
same computation). Usage: ``python benchmarks/lstm_batching.py [--users 20] [--reps 4]``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--users", type=int, default=20)
    ap.add_argument("--reps", type=int, default=4)
    args = ap.parse_args()
    torch.set_num_threads(1)
    U, B, L, E, H, V = args.users, 8, 80, 8, 256, 80
    torch.manual_seed(0)
    models = [
        (torch.nn.Embedding(V, E), torch.nn.LSTM(E, H, num_layers=2, batch_first=True), torch.nn.Linear(H, V))
        for _ in range(U)
    ]
    x, y = torch.randint(0, V, (U, B, L)), torch.randint(0, V, (U, B))

    def sequential() -> torch.Tensor:
        losses = []
        for u, (emb, lstm, head) in enumerate(models):
            h, _ = lstm(emb(x[u]))
            lo = torch.nn.functional.cross_entropy(head(h[:, -1]), y[u])
            torch.autograd.grad(lo, [*emb.parameters(), *lstm.parameters(), *head.parameters()])
            losses.append(lo.detach())
        return torch.stack(losses)

    def stack(get):
        return torch.stack([get(m) for m in models]).detach().requires_grad_(True)

    w_emb = stack(lambda m: m[0].weight)
    layers = [
        [
            stack(lambda m, n=n, k=k: getattr(m[1], f"{n}_l{k}"))
            for n in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
        ]
        for k in range(2)
    ]
    w_head, b_head = stack(lambda m: m[2].weight), stack(lambda m: m[2].bias)

    def batched() -> torch.Tensor:
        inp = torch.stack([w_emb[u][x[u]] for u in range(U)])  # (U, B, L, E)
        for w_ih, w_hh, b_ih, b_hh in layers:
            proj = torch.einsum("ubli,ugi->ublg", inp, w_ih) + (b_ih + b_hh)[:, None, None, :]
            h, c, outs = torch.zeros(U, B, H), torch.zeros(U, B, H), []
            w_hh_t = w_hh.transpose(1, 2)
            for t in range(L):
                i, f, g, o = (proj[:, :, t] + torch.bmm(h, w_hh_t)).chunk(4, -1)
                c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
                h = torch.sigmoid(o) * torch.tanh(c)
                outs.append(h)
            inp = torch.stack(outs, 2)
        logits = torch.baddbmm(b_head[:, None, :], inp[:, :, -1], w_head.transpose(1, 2))
        per_user = torch.nn.functional.cross_entropy(logits.reshape(U * B, V), y.reshape(-1), reduction="none")
        losses = per_user.view(U, B).mean(1)
        torch.autograd.grad(losses.sum(), [w_emb, *[w for k in layers for w in k], w_head, b_head])
        return losses.detach()

    a, b = sequential(), batched()
    assert torch.allclose(a, b, rtol=1e-4, atol=1e-5), (a, b)
    times: dict[str, list[float]] = {"sequential": [], "batched": []}
    for _ in range(args.reps):
        for name, fn in (("sequential", sequential), ("batched", batched)):
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    s, b2 = statistics.median(times["sequential"]), statistics.median(times["batched"])
    print(f"{U} users, one batch fwd+bwd: sequential nn.LSTM {s:.3f} s, batched {b2:.3f} s, ratio {b2 / s:.2f}")


if __name__ == "__main__":
    main()
