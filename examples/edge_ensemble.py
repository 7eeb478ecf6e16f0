"""Four boards, one answer: each rank trains its own small classifier, the ensemble combines them.

    npudist launch --nproc-per-node 4 examples/edge_ensemble.py
    npudist launch --nproc-per-node 4 examples/edge_ensemble.py --serve --port 8000   # then POST /predict
    npudist launch --nnodes 4 --node-rank I --master-addr 192.168.1.101 --nproc-per-node 1 \
        examples/edge_ensemble.py --serve --host 0.0.0.0 --member-host auto    # one board lost: degraded answers
    .venv-rknn/bin/python -m npudist launch --nproc-per-node 4 examples/edge_ensemble.py --rknn-sim fp16 \
        --rknn-sim int8      # each member also through rknn-toolkit2's rk3588 simulator (make rknn-env)

On RK3588 boards give each rank its converted model with --rknn model.rknn (run through RKNN Lite);
everywhere else each rank runs its torch member on the detected accelerator. Members differ in their
seed and in the bootstrap sample of the training set they see, as in bagging.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import npudist
import npudist.telemetry
from npudist.infer import EnsembleResult, EnsembleServer, Runner, ensemble_predict, gather_floats, select_runner
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
    p.add_argument("--rknn-sim", action="append", choices=("fp16", "int8"), default=[],
                   help="also convert each member with rknn-toolkit2 (rk3588) and run the ensemble again through "
                        "the toolkit's simulator; repeat for both; needs the toolkit's env (make rknn-env)")
    p.add_argument("--rknn-dir", type=Path, default=Path("runs/edge-rknn"),
                   help="where --rknn-sim writes each member's .rknn, ONNX and calibration set")
    p.add_argument("--rknn-batch", type=int, default=50, help="the batch the .rknn models are built for")
    p.add_argument("--dump", type=Path, help="write each member's and the ensemble's test predictions here")
    p.add_argument("--serve", action="store_true", help="after the evaluation, serve POST /predict on rank 0")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port (see --port-file)")
    p.add_argument("--port-file", type=Path, help="rank 0 writes the port it listens on here")
    p.add_argument("--allow-shutdown", action="store_true", help="POST /shutdown stops every rank")
    p.add_argument("--member-host", metavar="HOST",
                   help="serve each rank's member at HOST (auto: the address its process group uses) and have rank 0 "
                        "ask each member on its own: a lost board then degrades the answers instead of failing "
                        "them; without it every request is one collective over all ranks")
    p.add_argument("--deadline", type=float, default=5.0, help="with --member-host: seconds to wait for the members")
    p.add_argument("--min-members", type=int, help="with --member-host: answers needed (default: half, rounded up)")
    args = p.parse_args(argv)
    for name in ("classes", "features", "train_samples", "test_samples", "steps", "hidden", "rknn_batch"):
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


def member_model(rank: int = 0, **options: object) -> nn.Module:
    """Member ``rank`` with the example's defaults, for `npudist edge convert examples/edge_ensemble.py:member_model
    --arg rank=R` (other --arg KEY=VALUE override the defaults, e.g. steps=50)."""
    return member(parse_args(_argv(options)), rank)


def calibration_set(rank: int = 0, **options: object) -> torch.Tensor:
    """The training inputs member ``rank`` saw: the int8 calibration set for its conversion."""
    args = parse_args(_argv(options))
    x, _ = task(args.seed, args.train_samples, args.features, args.classes, split=0)
    pick = torch.randint(0, len(x), (len(x),), generator=torch.Generator().manual_seed(args.seed + 1000 * rank))
    return x[pick]


def held_out_set(rank: int = 0, **options: object) -> torch.Tensor:
    """The test inputs (the same for every member): the samples the conversion's accuracy is measured on."""
    args = parse_args(_argv(options))
    return task(args.seed, args.test_samples, args.features, args.classes, split=1)[0]


def _argv(options: dict[str, object]) -> list[str]:
    return [item for key, value in options.items() for item in (f"--{key.replace('_', '-')}", str(value))]


def evaluate(runner: Runner, args: argparse.Namespace, rank: int, label: str, x_test: torch.Tensor,
             y_test: torch.Tensor) -> tuple[list[float], float, EnsembleResult]:
    """Every member's accuracy and the ensemble's, printed by rank 0 (one collective each)."""
    mine = runner(x_test)
    accuracies = gather_floats(float((mine.argmax(-1) == y_test).float().mean()))
    result = ensemble_predict(runner, x_test, combine=args.combine, num_classes=args.classes)
    ensemble_acc = float((result.labels == y_test).float().mean())
    if args.dump:
        args.dump.mkdir(parents=True, exist_ok=True)
        torch.save({"logits": mine, "labels": y_test}, args.dump / f"{label}member{rank}.pt")
        if rank == 0:
            torch.save({"labels": result.labels, "scores": result.scores}, args.dump / f"{label}ensemble.pt")
    if rank == 0:
        name = f"{runner.kind}:{label}" if label else runner.kind
        for r, acc in enumerate(accuracies):
            print(f"member rank={r} runner={name} accuracy={acc:.4f} core_mask={runner.core_mask}")
        print(f"ensemble members={len(accuracies)} combine={args.combine} accuracy={ensemble_acc:.4f} "
              f"best_member={max(accuracies):.4f} worst_member={min(accuracies):.4f} runner={name}")
        print("latency " + json.dumps({k: round(v, 6) for k, v in result.latency().items()}), flush=True)
    return accuracies, ensemble_acc, result


def rknn_member(model: nn.Module, args: argparse.Namespace, rank: int, dtype: str) -> Runner:
    """This rank's member converted for rk3588 and loaded in rknn-toolkit2's simulator."""
    from npudist.edge import convert
    from npudist.infer import RKNNSimulatorRunner

    x_train = calibration_set(rank, **_options(args))
    result = convert(model, args.rknn_dir / f"member{rank}.{dtype}.rknn", input_shape=(args.rknn_batch,
                     args.features), dtype=dtype, calibration=lambda: x_train,
                     held_out=lambda: held_out_set(rank, **_options(args)))
    return RKNNSimulatorRunner(str(result.rknn))


def _options(args: argparse.Namespace) -> dict[str, object]:
    return {k: getattr(args, k) for k in ("seed", "classes", "features", "train_samples", "test_samples",
                                          "steps", "hidden")}


def table(rows: list[tuple[str, list[float], float]]) -> str:
    """The README's side-by-side table: accuracy per member and for the ensemble, one row per runtime."""
    members = len(rows[0][1])
    head = "| runtime | " + " | ".join(f"member {r}" for r in range(members)) + " | best member | ensemble | " \
        "ensemble - best |"
    lines = [head, "|" + "---|" * (members + 4)]
    for name, accs, ens in rows:
        lines.append(f"| {name} | " + " | ".join(f"{a:.4f}" for a in accs) +
                     f" | {max(accs):.4f} | {ens:.4f} | {ens - max(accs):+.4f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    ctx = npudist.init()
    try:
        model = member(args, ctx.rank)
        runner = select_runner(model, rknn_path=args.rknn)
        x_test, y_test = task(args.seed, args.test_samples, args.features, args.classes, split=1)
        accs, ens, _ = evaluate(runner, args, ctx.rank, "", x_test, y_test)
        rows = [(f"{runner.kind} fp32" if runner.kind == "torch" else runner.kind, accs, ens)]
        for dtype in args.rknn_sim:
            runner = rknn_member(model, args, ctx.rank, dtype)
            accs, ens, _ = evaluate(runner, args, ctx.rank, dtype, x_test, y_test)
            rows.append((f"RKNN {dtype} (rk3588 simulator)", accs, ens))
        if ctx.is_main and args.rknn_sim:
            print(table(rows), flush=True)
        if args.serve:
            from npudist.infer.http import serve

            server = EnsembleServer(runner, args.classes, input_features=args.features, combine=args.combine)
            telemetry = None
            if os.environ.get("NPUDIST_METRICS_PORT"):  # `npudist launch --metrics-port P`: rank r on P + r
                from npudist.telemetry.job.edge_metrics import EdgeCollector

                telemetry = npudist.telemetry.serve_rank_metrics(ctx, device_source=None)
                telemetry.registry.register(EdgeCollector(telemetry.health, telemetry.training.labels,
                                                          lambda: server.stats))

            def ready(port: int) -> None:
                if args.port_file:
                    args.port_file.write_text(str(port))
                print(f"serving on http://{args.host}:{port}/predict", flush=True)

            try:
                serve(server, args.host, args.port, allow_shutdown=args.allow_shutdown, on_ready=ready,
                      member_host=args.member_host, deadline_s=args.deadline, min_members=args.min_members)
            finally:
                if telemetry is not None:
                    telemetry.close()
    finally:
        npudist.shutdown()


if __name__ == "__main__":
    main()
