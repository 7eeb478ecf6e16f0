"""Four boards, one answer: each rank trains its own small classifier, the ensemble combines them.

    npudist launch --nproc-per-node 4 examples/edge_ensemble.py
    npudist launch --nproc-per-node 4 examples/edge_ensemble.py --serve --port 8000   # then POST /predict

On RK3588 boards give each rank its converted model with --rknn model.rknn (run through RKNN Lite);
everywhere else each rank runs its torch member on the detected accelerator. Members differ in their
seed and in the bootstrap sample of the training set they see, as in bagging.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import npudist
from npudist.infer import EnsembleServer, ensemble_predict, gather_floats, select_runner
from npudist.infer.combine import COMBINES


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, default=0, help="data seed; member r also uses seed + 1000 r")
    p.add_argument("--classes", type=int, default=4)
    p.add_argument("--features", type=int, default=8)
    p.add_argument("--train-samples", type=int, default=200)
    p.add_argument("--test-samples", type=int, default=2000)
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--combine", choices=COMBINES, default="mean_probs")
    p.add_argument("--rknn", help="this board's .rknn member model (RK3588 with rknn-toolkit-lite2 only)")
    p.add_argument("--dump", type=Path, help="write each member's and the ensemble's test predictions here")
    p.add_argument("--serve", action="store_true", help="after the evaluation, serve POST /predict on rank 0")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port (see --port-file)")
    p.add_argument("--port-file", type=Path, help="rank 0 writes the port it listens on here")
    p.add_argument("--allow-shutdown", action="store_true", help="POST /shutdown stops every rank")
    args = p.parse_args(argv)
    for name in ("classes", "features", "train_samples", "test_samples", "steps", "hidden"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.classes < 2:
        p.error("--classes must be at least 2")
    return args


def task(seed: int, n: int, features: int, classes: int, split: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Overlapping Gaussian classes around seeded centres, bent by a sine so no linear model is enough.

    The centres depend on ``seed`` only; ``split`` picks the draw (0 train, 1 test).
    """
    centres = torch.randn(classes, features, generator=torch.Generator().manual_seed(seed)) * 1.2
    g = torch.Generator().manual_seed(seed * 7919 + 1 + split)
    y = torch.randint(0, classes, (n,), generator=g)
    x = centres[y] + torch.randn(n, features, generator=g)
    return x + 0.5 * torch.sin(2 * x.roll(1, dims=1)), y


def member(args: argparse.Namespace, rank: int) -> nn.Module:
    """Train this rank's member on its own bootstrap sample, with its own initial weights."""
    x, y = task(args.seed, args.train_samples, args.features, args.classes, split=0)
    g = torch.Generator().manual_seed(args.seed + 1000 * rank)
    pick = torch.randint(0, len(x), (len(x),), generator=g)
    x, y = x[pick], y[pick]
    torch.manual_seed(args.seed + 1000 * rank)
    model = nn.Sequential(nn.Linear(args.features, args.hidden), nn.ReLU(),
                          nn.Linear(args.hidden, args.classes))
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    for _ in range(args.steps):
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return model.eval()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    ctx = npudist.init()
    try:
        runner = select_runner(member(args, ctx.rank), rknn_path=args.rknn)
        x_test, y_test = task(args.seed, args.test_samples, args.features, args.classes, split=1)
        mine = runner(x_test)
        accuracies = gather_floats(float((mine.argmax(-1) == y_test).float().mean()))
        result = ensemble_predict(runner, x_test, combine=args.combine, num_classes=args.classes)
        ensemble_acc = float((result.labels == y_test).float().mean())
        if args.dump:
            args.dump.mkdir(parents=True, exist_ok=True)
            torch.save({"logits": mine, "labels": y_test}, args.dump / f"member{ctx.rank}.pt")
            if ctx.is_main:
                torch.save({"labels": result.labels, "scores": result.scores}, args.dump / "ensemble.pt")
        if ctx.is_main:
            for r, acc in enumerate(accuracies):
                print(f"member rank={r} runner={runner.kind} accuracy={acc:.4f}")
            print(f"ensemble members={ctx.world_size} combine={args.combine} accuracy={ensemble_acc:.4f} "
                  f"best_member={max(accuracies):.4f} worst_member={min(accuracies):.4f}")
            print("latency " + json.dumps({k: round(v, 6) for k, v in result.latency().items()}), flush=True)
        if args.serve:
            from npudist.infer.http import serve

            server = EnsembleServer(runner, args.classes, input_features=args.features, combine=args.combine)

            def ready(port: int) -> None:
                if args.port_file:
                    args.port_file.write_text(str(port))
                print(f"serving on http://{args.host}:{port}/predict", flush=True)

            serve(server, args.host, args.port, allow_shutdown=args.allow_shutdown, on_ready=ready)
    finally:
        npudist.shutdown()


if __name__ == "__main__":
    main()
