"""Training and evaluation recipe of the forecasters: ``rtserve train {rsa,rtransformer,vanilla,linear}``
and ``rtserve eval <checkpoint>``.

    rtserve train rsa --train train.csv --dev dev.csv --columns load,temp --targets load \
        --lookback 48 --horizon 12 --out runs/load
    rtserve eval runs/load --data test.csv
    rtserve train rsa --data ../shared/data/ETT-small/ETTh1.csv --out runs/rsa-h24   # the Informer protocol

Data: a user's CSV files (``--train``, ``--dev``; the family's reader, models.data.files.read_series):
any numeric columns, a chosen target set, every window of L + H rows of each file; the scaler is
fitted on the training file. Or ETTh1 under the Informer protocol (models/data/ett.py). The
families are channel-independent: every column is a series of its own through one shared model,
so the columns beside the targets are more training series, not inputs to the targets' forecasts.
Neural families train with AdamW on the MSE of standardized values over every column, keep the
epoch with the lowest validation MSE of the targets (never the test split) and save it with
save_checkpoint; ``linear`` is the closed-form channel-independent ridge baseline, its penalty
chosen on the validation split.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn
from tqdm import tqdm

from models.checkpoint import load_checkpoint, save_checkpoint
from models.data.ett import Scaler, load_split, windows, windows_to_score
from models.data.files import SeriesTable
from models.families import families, family
from models.linear import LinearConfig, LinearForecaster
from models.rsa import RSAConfig
from models.rtransformer import RTransformerConfig
from models.serving.forecasters import columns_and_targets, load_stream
from models.training.common import command_parser, hardware, seed_everything
from models.vanilla import VanillaConfig

DEFAULT_DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "ETT-small" / "ETTh1.csv"

@torch.no_grad()
def evaluate(model: nn.Module, x: np.ndarray, y: np.ndarray, batch_size: int = 512,
             targets: Sequence[int] | None = None) -> dict[str, float]:
    """MSE and MAE over all windows, horizon steps and ``targets`` (column indices; default every column),
    on standardized values."""
    model.eval()
    squared, absolute, count = 0.0, 0.0, 0
    for start in range(0, len(x), batch_size):
        xb = torch.as_tensor(np.ascontiguousarray(x[start : start + batch_size]), dtype=torch.float32)
        yb = torch.as_tensor(np.ascontiguousarray(y[start : start + batch_size]), dtype=torch.float32)
        error = (model(xb) - yb).double()  # (B, H, C)
        if targets is not None:
            error = error[:, :, list(targets)]  # (B, H, K)
        squared += float((error**2).sum())
        absolute += float(error.abs().sum())
        count += error.numel()
    return {"mse": squared / count, "mae": absolute / count, "windows": int(len(x))}


def ridge_fit(x: np.ndarray, y: np.ndarray, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """Channel-independent ridge on window minus last value: weight (H, L), bias (H,)."""
    lookback, horizon = x.shape[1], y.shape[1]
    xs = x.transpose(0, 2, 1).reshape(-1, lookback)  # (N*C, L)
    ys = y.transpose(0, 2, 1).reshape(-1, horizon)  # (N*C, H)
    last = xs[:, -1:]
    design = np.hstack([xs - last, np.ones((len(xs), 1))])  # bias column, not penalized
    penalty = alpha * np.eye(lookback + 1)
    penalty[-1, -1] = 0.0
    solution = np.linalg.solve(design.T @ design + penalty, design.T @ (ys - last))  # (L+1, H)
    return solution[:-1].T, solution[-1]


def _parser(prog: str) -> argparse.ArgumentParser:
    parser = command_parser(
        prog, "Train a forecaster: on CSV series (--train, --dev) or on ETTh1 (--data, Informer protocol).")
    parser.add_argument("family", choices=sorted(f.name for f in families() if f.recipe == __name__),
                        help=argparse.SUPPRESS)  # `rtserve train <family>` names it
    parser.add_argument("--data", default=str(DEFAULT_DATA), help="ETT-layout CSV (date column, then variables), "
                        "split by the Informer protocol; unused with --train")
    parser.add_argument("--train", help="CSV with a header row, one row a time step, oldest first")
    parser.add_argument("--dev", help="CSV with the same columns: the epoch (or ridge penalty) kept scores best here")
    parser.add_argument("--columns", help="comma-separated columns the model reads (default: every column whose "
                        "first row is a number)")
    parser.add_argument("--targets", help="comma-separated columns it forecasts, among --columns (default: all)")
    parser.add_argument("--horizon", type=int, default=24, help="H, rows to forecast")
    parser.add_argument("--lookback", type=int, default=96, help="L, rows of history")
    parser.add_argument("--seed", type=int, default=0, help="random seed (initialisation, data order)")
    parser.add_argument("--epochs", type=int, default=20, help="passes over the training data")
    parser.add_argument("--patience", type=int, default=5, help="stop after this many epochs without val gain")
    parser.add_argument("--batch-size", type=int, default=128, help="windows per batch (each column a series)")
    parser.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (AdamW)")
    parser.add_argument("--weight-decay", type=float, default=1e-4)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the machine is shared)")
    parser.add_argument("--out", required=True, help="checkpoint folder to write")
    parser.add_argument("--d-model", type=int, default=32)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--d-ff", type=int, default=64)
    parser.add_argument("--patch-len", type=int, default=8)
    parser.add_argument("--stride", type=int, default=8)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--head-types", default="1,1,1,1,0,0", help="rsa: k1..k6 per layer")
    parser.add_argument("--dilations", default="3", help="rsa: dilating factors (tokens), comma-separated")
    parser.add_argument("--gate-init", type=float, default=0.0, help="rsa: initial mu, gate = sigmoid(mu)")
    parser.add_argument("--window", type=int, default=3, help="rtransformer: LocalRNN window M (tokens)")
    parser.add_argument(
        "--init-linear",
        choices=("ridge", "zero", "default"),
        default="default",
        help="direct linear path at init: the train-split ridge fit, zeros, or PyTorch's default",
    )
    parser.add_argument("--alphas", default="0.1,1,10,100,1000,10000", help="linear: ridge penalties tried on val")
    return parser


def _config(args: argparse.Namespace, n_vars: int) -> Any:
    common = dict(n_vars=n_vars, lookback=args.lookback, horizon=args.horizon)
    shape = dict(
        patch_len=args.patch_len,
        stride=args.stride,
        d_model=args.d_model,
        n_layers=args.layers,
        n_heads=args.heads,
        d_ff=args.d_ff,
        dropout=args.dropout,
    )
    if args.family == "rsa":
        head_types = [int(v) for v in args.head_types.split(",")]
        dilations = [int(v) for v in args.dilations.split(",")]
        return RSAConfig(**common, **shape, head_types=head_types, dilations=dilations, gate_init=args.gate_init)
    if args.family == "rtransformer":
        return RTransformerConfig(**common, **shape, window=args.window)
    return VanillaConfig(**common, **shape)


def _names(value: str | None) -> list[str] | None:
    return [name.strip() for name in value.split(",") if name.strip()] if value else None


def read_files(args: argparse.Namespace) -> tuple[SeriesTable, SeriesTable]:
    """The ``--train`` and ``--dev`` series (the family's reader): the dev file has the training file's columns,
    and each holds at least one window."""
    read = family(args.family).part("reader")
    train = read(args.train, _names(args.columns), _names(args.targets))
    dev = read(args.dev, train.columns, train.targets)
    for series in (train, dev):
        series.check_length(args.lookback, args.horizon)
    return train, dev


def train_main(argv: Sequence[str]) -> int:
    parser = _parser(f"rtserve train {argv[0]}" if argv and not argv[0].startswith("-") else "rtserve train")
    args = parser.parse_args(list(argv))
    if (args.train is None) != (args.dev is None):
        parser.error("give --train FILE and --dev FILE (CSV), or neither for --data (ETTh1, Informer protocol)")
    if args.train is None and (args.columns or args.targets):
        parser.error("--columns and --targets choose among the columns of --train and --dev")
    torch.set_num_threads(args.threads)
    seed_everything(args.seed)
    splits: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    if args.train is not None:
        train_series, dev_series = read_files(args)
        scaler = Scaler.fit(train_series.values)
        names, targets = train_series.columns, train_series.targets
        for split, series in (("train", train_series), ("val", dev_series)):
            splits[split] = windows(scaler.transform(series.values), args.lookback, args.horizon)
        protocol = "files"
    else:
        x, y, scaler, names = load_split(args.data, "train", args.lookback, args.horizon)
        splits["train"], targets, protocol = (x, y), names, "informer"
        for split in ("val", "test"):
            splits[split] = load_split(args.data, split, args.lookback, args.horizon, scaler)[:2]
    x_train, y_train = splits["train"]
    x_val, y_val = splits["val"]
    target_indices = [names.index(name) for name in targets]
    n_vars = len(names)
    started = time.perf_counter()
    recipe: dict[str, Any] = {"argv": ["rtserve", "train", *argv], "hardware": hardware(args.threads)}

    if args.family == "linear":
        best: tuple[float, float, Any] | None = None
        for alpha in (float(v) for v in args.alphas.split(",")):
            model = LinearForecaster(LinearConfig(n_vars, args.lookback, args.horizon, alpha))
            weight, bias = ridge_fit(x_train, y_train, alpha)
            model.linear.weight.data = torch.tensor(weight, dtype=torch.float32)
            model.linear.bias.data = torch.tensor(bias, dtype=torch.float32)
            score = evaluate(model, x_val, y_val, targets=target_indices)["mse"]
            if best is None or score < best[0]:
                best = (score, alpha, model)
        assert best is not None
        model, config = best[2], best[2].config
        recipe["alpha"] = best[1]
    else:
        config = _config(args, n_vars)
        model = family(args.family).build_model(config)
        if args.init_linear == "ridge":
            weight, bias = ridge_fit(x_train, y_train, 1.0)
            model.linear.weight.data = torch.tensor(weight, dtype=torch.float32)
            model.linear.bias.data = torch.tensor(bias, dtype=torch.float32)
        elif args.init_linear == "zero":
            nn.init.zeros_(model.linear.weight)
            nn.init.zeros_(model.linear.bias)
        model, history = _fit(model, args, x_train, y_train, x_val, y_val, target_indices)
        recipe["history"] = history

    train_seconds = time.perf_counter() - started
    metrics = {split: evaluate(model, x, y, targets=target_indices) for split, (x, y) in splits.items()
               if split != "train"}
    recipe["train_seconds"] = round(train_seconds, 1)
    parameters = sum(p.numel() for p in model.parameters())
    extras = {
        "task": "forecast",
        "scaler": scaler.as_dict(),
        "variables": names,
        "targets": targets,
        "protocol": protocol,  # "files": every window of a --data file is scored; "informer": its test split
        "lookback": args.lookback,
        "horizon": args.horizon,
        "seed": args.seed,
        "parameters": parameters,
        "metrics": metrics,
        "recipe": recipe,
    }
    save_checkpoint(args.out, args.family, config, model.state_dict(), extras)
    print(
        json.dumps(
            {
                "out": args.out,
                "family": args.family,
                "parameters": parameters,
                **metrics,
                "train_seconds": recipe["train_seconds"],
            }
        )
    )
    return 0


def _fit(
    model: nn.Module,
    args: argparse.Namespace,
    x_train: np.ndarray,
    y_train: np.ndarray,
    x_val: np.ndarray,
    y_val: np.ndarray,
    targets: Sequence[int] | None = None,
) -> tuple[nn.Module, list[dict[str, float]]]:
    """AdamW on MSE (every column) with a cosine schedule; returns the epoch with the lowest val MSE of the
    ``targets``."""
    x = torch.as_tensor(np.ascontiguousarray(x_train), dtype=torch.float32)
    y = torch.as_tensor(np.ascontiguousarray(y_train), dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    steps_per_epoch = math.ceil(len(x) / args.batch_size)
    total = steps_per_epoch * args.epochs
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5 * (1 + math.cos(math.pi * step / total)))
    generator = torch.Generator().manual_seed(args.seed)
    best_state = {k: v.clone() for k, v in model.state_dict().items()}
    best_val = evaluate(model, x_val, y_val, targets=targets)["mse"]
    history = [{"epoch": 0, "val_mse": best_val}]
    stale = 0
    for epoch in range(1, args.epochs + 1):
        model.train()
        order = torch.randperm(len(x), generator=generator)
        bar = tqdm(
            range(steps_per_epoch), desc=f"{args.family} epoch {epoch}/{args.epochs}", file=sys.stderr, mininterval=5.0
        )
        running = 0.0
        for index in bar:
            batch = order[index * args.batch_size : (index + 1) * args.batch_size]
            loss = nn.functional.mse_loss(model(x[batch]), y[batch])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            running += loss.item()
            bar.set_postfix(loss=f"{running / (index + 1):.4f}")
        val = evaluate(model, x_val, y_val, targets=targets)["mse"]
        history.append({"epoch": epoch, "train_mse": running / steps_per_epoch, "val_mse": val})
        print(f"epoch {epoch}: train {running / steps_per_epoch:.4f} val {val:.4f}", file=sys.stderr)
        if val < best_val:
            best_val, stale = val, 0
            best_state = {k: v.clone() for k, v in model.state_dict().items()}
        else:
            stale += 1
            if stale >= args.patience:
                break
    model.load_state_dict(best_state)
    return model, history


def eval_main(argv: Sequence[str]) -> int:
    parser = command_parser(
        "rtserve eval", "Score a forecaster checkpoint: every window of a CSV file (a model trained on --train "
        "files), or a split of ETTh1 (Informer protocol).")
    parser.add_argument("checkpoint", help="checkpoint folder (config.json + model.safetensors)")
    parser.add_argument("--data", default=str(DEFAULT_DATA), help="CSV with the model's columns")
    parser.add_argument("--split", default="test", choices=("train", "val", "test", "all"),
                        help="Informer protocol: the split scored (a model trained on files scores the whole file)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(list(argv))
    torch.set_num_threads(args.threads)
    folder = Path(args.checkpoint)
    if not (folder / "config.json").exists():
        raise SystemExit(f"rtserve eval: {folder} has no config.json; pass the checkpoint folder it was exported from")
    checkpoint = load_checkpoint(folder)
    model = family(checkpoint.family).build_model(checkpoint.config)
    model.load_state_dict(checkpoint.state_dict)
    lookback, horizon = int(checkpoint.extras["lookback"]), int(checkpoint.extras["horizon"])
    scaler = Scaler.from_dict(checkpoint.extras["scaler"])
    columns, targets = columns_and_targets(checkpoint)
    read = family(checkpoint.family).part("reader")
    x, y, split = windows_to_score(args.data, args.split, checkpoint.extras, scaler, read)
    result = {
        "checkpoint": str(folder),
        "family": checkpoint.family,
        "data": args.data,
        "split": split,
        "lookback": lookback,
        "horizon": horizon,
        "targets": targets,
        **evaluate(model, x, y, targets=[columns.index(name) for name in targets]),
    }
    print(json.dumps(result))
    return 0


def plot_main(argv: Sequence[str]) -> int:
    """Rolling H-step forecasts against actuals on the test split: one forecast every H rows.

    ``python -m models.training.forecasters plot <checkpoint>... --out docs/forecast_etth1.png``
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    parser = argparse.ArgumentParser(prog="python -m models.training.forecasters plot")
    parser.add_argument("checkpoints", nargs="+", help="checkpoint folders; the first sets L and H")
    parser.add_argument("--data", default=str(DEFAULT_DATA))
    parser.add_argument("--variables", default="OT,HUFL", help="comma-separated variable names to draw")
    parser.add_argument("--start", type=int, default=0, help="first test window")
    parser.add_argument("--forecasts", type=int, default=14, help="consecutive forecasts to draw")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(list(argv))
    streams = [(Path(folder).name, load_stream(load_checkpoint(folder))) for folder in args.checkpoints]
    lookback, horizon = streams[0][1].lookback, streams[0][1].horizon
    checkpoint = load_checkpoint(args.checkpoints[0])
    names = checkpoint.extras["variables"]
    scaler = Scaler.from_dict(checkpoint.extras["scaler"])
    x, y, _, _ = load_split(args.data, "test", lookback, horizon, scaler)
    picks = [args.start + k * horizon for k in range(args.forecasts)]
    variables = args.variables.split(",")
    figure, axes = plt.subplots(len(variables), 1, figsize=(12, 3.2 * len(variables)), squeeze=False)
    truth = np.concatenate([y[p] for p in picks])  # (forecasts*H, C), standardized
    steps = np.arange(len(truth))
    with torch.no_grad():
        predictions = {}
        for label, stream in streams:
            xb = torch.as_tensor(np.ascontiguousarray(x[picks]), dtype=torch.float32)
            predictions[label] = stream.forecaster(xb).numpy().reshape(-1, len(names))
    for row, variable in enumerate(variables):
        axis = axes[row, 0]
        column = names.index(variable)
        axis.plot(steps, truth[:, column], color="black", linewidth=1.5, label="actual")
        for label, prediction in predictions.items():
            axis.plot(steps, prediction[:, column], linewidth=1.0, label=label)
        for boundary in range(0, len(truth), horizon):
            axis.axvline(boundary, color="grey", linewidth=0.3)
        axis.set_ylabel(f"{variable} (standardized)")
        axis.legend(loc="upper right", fontsize=8)
    axes[-1, 0].set_xlabel(
        f"hours into the ETTh1 test split from window {args.start} (a new {horizon}-h forecast "
        f"from the last {lookback} h at each grey line)"
    )
    figure.tight_layout()
    figure.savefig(args.out, dpi=110)
    print(args.out)
    return 0


if __name__ == "__main__":
    commands = {"train": train_main, "eval": eval_main, "plot": plot_main}
    if len(sys.argv) < 2 or sys.argv[1] not in commands:
        raise SystemExit(f"usage: python -m models.training.forecasters {{{','.join(commands)}}} ...")
    sys.exit(commands[sys.argv[1]](sys.argv[2:]))
