"""The forecasting segment model: chunked streaming equals one call; the state stays bounded."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from models.forecast_stream import ForecastStream
from models.linear import LinearConfig, LinearForecaster
from models.rsa import RSAConfig, RSAForecaster
from models.rtransformer import RTransformerConfig, RTransformerForecaster
from models.vanilla import VanillaConfig, VanillaForecaster

LOOKBACK, HORIZON, N_VARS = 24, 6, 3
SHAPE = dict(n_vars=N_VARS, lookback=LOOKBACK, horizon=HORIZON, patch_len=4, stride=4, d_model=8, n_layers=1)


def forecasters():
    return {
        "rsa": RSAForecaster(RSAConfig(**SHAPE, n_heads=4, head_types=[1, 1, 1, 1, 0, 0], dilations=[2])),
        "rtransformer": RTransformerForecaster(RTransformerConfig(**SHAPE, n_heads=2, window=3)),
        "vanilla": VanillaForecaster(VanillaConfig(**SHAPE, n_heads=2)),
        "linear": LinearForecaster(LinearConfig(N_VARS, LOOKBACK, HORIZON)),
    }


def make_stream(family, seed=0):
    torch.manual_seed(seed)
    model = forecasters()[family]
    mean, std = torch.randn(N_VARS) * 5, torch.rand(N_VARS) + 0.5
    return ForecastStream(model, N_VARS, mean, std).double().eval()


@pytest.mark.parametrize("family", ["rsa", "rtransformer", "vanilla", "linear"])
def test_random_chunks_equal_one_call(family):
    stream = make_stream(family)
    rng = np.random.default_rng(3)
    series = torch.from_numpy(rng.normal(size=(2, 157, N_VARS)) * 3 + 10)  # batch of 2 sessions
    with torch.no_grad():
        whole_state, whole_out = stream.step(stream.init_state(2), {"values": series})
        state, start = stream.init_state(2), 0
        while start < series.shape[1]:
            size = int(rng.integers(1, 30))
            state, out = stream.step(state, {"values": series[:, start : start + size]})
            start += size
            # bounded: the state never grows with the stream
            assert state["window"].shape == (2, LOOKBACK, N_VARS) and state["rows_seen"].shape == (2,)
    torch.testing.assert_close(stream.readout(state, out), stream.readout(whole_state, whole_out), atol=1e-5, rtol=0)
    assert int(state["rows_seen"][0]) == 157
    # and the forecast is the forecaster on the standardized last L rows, mapped back to data units
    expected = stream.forecaster((series[:, -LOOKBACK:] - stream.mean) / stream.std) * stream.std + stream.mean
    torch.testing.assert_close(stream.readout(state, out), expected, atol=1e-10, rtol=0)


def test_not_ready_before_lookback_rows():
    stream = make_stream("rsa")
    with torch.no_grad():
        state, out = stream.step(stream.init_state(1), {"values": torch.randn(1, LOOKBACK - 1, N_VARS).double()})
        assert not bool(out["ready"][0]) and torch.isnan(stream.readout(state, out)).all()
        state, out = stream.step(state, {"values": torch.randn(1, 1, N_VARS).double()})
        assert bool(out["ready"][0]) and torch.isfinite(stream.readout(state, out)).all()


def test_state_spec_matches_state():
    stream = make_stream("vanilla").float()
    state = stream.init_state(3)
    for spec in stream.state_spec():
        tensor = state[spec.name]
        assert str(tensor.dtype).removeprefix("torch.") == spec.dtype
        assert tensor.shape[1:] == tuple(spec.shape[1:])


def test_train_and_eval_linear_cli_on_synthetic_series(tmp_path, capsys):
    # the user's path: rtserve train linear / rtserve eval, on a synthetic ETT-layout CSV (no shared data needed)
    from rtserve.cli import main

    rng = np.random.default_rng(0)
    rows = 14400
    t = np.arange(rows)
    values = np.stack([np.sin(2 * np.pi * t / 24 + k) + 0.1 * rng.normal(size=rows) for k in range(7)], axis=1)
    path = tmp_path / "series.csv"
    with open(path, "w") as handle:
        handle.write("date,HUFL,HULL,MUFL,MULL,LUFL,LULL,OT\n")
        for index in range(rows):
            handle.write(f"{index}," + ",".join(f"{v:.6f}" for v in values[index]) + "\n")
    out = tmp_path / "linear"
    assert main(["train", "linear", "--data", str(path), "--horizon", "12", "--lookback", "48", "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["eval", str(out), "--data", str(path), "--split", "test"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(result) >= {"mse", "mae"} and result["mse"] < 0.1
    assert main(["eval", str(out), "--data", str(path), "--split", "all"]) == 0
    result_all = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result_all["windows"] == rows - 48 - 12 + 1


class _Step(torch.nn.Module):
    """step() as plain tensors in, tensors out: what an exporter sees."""

    def __init__(self, stream):
        super().__init__()
        self.stream = stream

    def forward(self, window, rows_seen, values):
        state, out = self.stream.step({"window": window, "rows_seen": rows_seen}, {"values": values})
        return state["window"], state["rows_seen"], out["forecast"], out["ready"]


def test_step_exports_with_dynamic_batch_and_chunk():
    stream = make_stream("rsa").float()
    step = _Step(stream).eval()
    state = stream.init_state(2)
    batch, chunk = torch.export.Dim("batch", min=1, max=64), torch.export.Dim("chunk", min=1, max=512)
    exported = torch.export.export(
        step,
        (state["window"], state["rows_seen"], torch.randn(2, 5, N_VARS)),
        dynamic_shapes=({0: batch}, {0: batch}, {0: batch, 1: chunk}),
    ).module()
    window, rows_seen, values = torch.randn(3, LOOKBACK, N_VARS), torch.tensor([0, 30, 7]), torch.randn(3, 11, N_VARS)
    for got, want in zip(exported(window, rows_seen, values), step(window, rows_seen, values), strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
