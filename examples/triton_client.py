"""A Triton client of a sequence forecaster, unchanged against NVIDIA Triton and against rtserve: only the URL differs.

    python examples/triton_client.py --url 127.0.0.1:8001            # Triton (../shared/peers/triton/serve.sh)
    python examples/triton_client.py --url 127.0.0.1:9001            # rtserve (RTSERVE_GRPC_PORT=9001 rtserve serve)
    python examples/triton_client.py --url 127.0.0.1:9000 --protocol http --sequences 3

It speaks KServe v2 with Triton's sequence extension through ``tritonclient`` only (``pip install
'tritonclient[grpc,http]'``) and reads everything else from the server:

1. the models there are (the repository index), and the first ready one whose one input is ``ROWS`` (FP32 rows of C
   variables), or ``--model``;
2. its metadata and configuration: the input's width, and whether the model has a batch axis (Triton's model in the
   peer harness: ``max_batch_size`` 32, so each piece goes as [1, T, C]; rtserve: none, so [T, C]);
3. per sequence (``--sequences`` of them, one correlation id each, their pieces interleaved on one gRPC stream, or one
   HTTP request after another): ``--pieces`` pieces of ``--rows`` rows, the first with START, the last with END;
4. it prints what each sequence's last answer holds: every output's name, datatype and shape, and the forecast's first
   row.

With ``--api-key`` it sends ``x-api-key`` (rtserve with RTSERVE_API_KEYS); Triton ignores it.
"""

from __future__ import annotations

import argparse
import queue
import sys

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

Client = grpcclient.InferenceServerClient | httpclient.InferenceServerClient


def pick_model(client: Client, protocol: str, headers: dict) -> str:
    """The first ready model whose one input is ROWS."""
    index = client.get_model_repository_index(headers=headers)
    entries = index if protocol == "http" else [
        {"name": m.name, "version": m.version, "state": m.state} for m in index.models]
    for entry in sorted(entries, key=lambda e: e["name"]):
        if entry.get("state") not in (None, "READY", ""):
            continue
        inputs = metadata(client, protocol, entry["name"], headers)["inputs"]
        if [i["name"] for i in inputs] == ["ROWS"]:
            return entry["name"]
    raise SystemExit("no ready model takes ROWS here; name one with --model")


def metadata(client: Client, protocol: str, model: str, headers: dict) -> dict:
    if protocol == "http":
        return client.get_model_metadata(model, headers=headers)
    return client.get_model_metadata(model, headers=headers, as_json=True)


def batch_axis(client: Client, protocol: str, model: str, headers: dict) -> bool:
    config = client.get_model_config(model, headers=headers, **({} if protocol == "http" else {"as_json": True}))
    return int(config.get("config", config).get("max_batch_size", 0)) > 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="127.0.0.1:8001", help="host:port of the server's gRPC (or HTTP) endpoint")
    parser.add_argument("--protocol", choices=("grpc", "http"), default="grpc")
    parser.add_argument("--model", default=None, help="default: the first ready model taking ROWS")
    parser.add_argument("--sequences", type=int, default=2)
    parser.add_argument("--pieces", type=int, default=6)
    parser.add_argument("--rows", type=int, default=24)
    parser.add_argument("--api-key", default=None)
    args = parser.parse_args(argv)
    module = grpcclient if args.protocol == "grpc" else httpclient
    headers = {"x-api-key": args.api_key} if args.api_key else {}
    client = module.InferenceServerClient(args.url)
    if not client.is_server_ready(headers=dict(headers)):
        raise SystemExit(f"{args.url} is not ready")
    server = client.get_server_metadata(headers=dict(headers))
    name = server["name"] if args.protocol == "http" else server.name
    model = args.model or pick_model(client, args.protocol, dict(headers))
    (rows_input,) = metadata(client, args.protocol, model, dict(headers))["inputs"]
    width = int(rows_input["shape"][-1])
    batched = batch_axis(client, args.protocol, model, dict(headers))
    print(f"{name} at {args.url}: model {model}, input ROWS {rows_input['datatype']} "
          f"{[int(d) for d in rows_input['shape']]}, "
          f"{'a batch axis' if batched else 'no batch axis'}")

    rng = np.random.default_rng(0)
    sequences = {1000 + s: (rng.standard_normal((args.pieces, args.rows, width)) * 3 + 10).astype(np.float32)
                 for s in range(args.sequences)}

    def request(sequence_id: int, step: int) -> dict:
        piece = sequences[sequence_id][step][None] if batched else sequences[sequence_id][step]
        tensor = module.InferInput("ROWS", list(piece.shape), "FP32")
        tensor.set_data_from_numpy(piece)
        return {"model_name": model, "inputs": [tensor], "sequence_id": sequence_id, "request_id": str(sequence_id),
                "sequence_start": step == 0, "sequence_end": step == args.pieces - 1}

    last = {}
    if args.protocol == "grpc":  # one stream, the sequences' pieces interleaved (Triton's way for sequences)
        answers: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error: answers.put((result, error)), headers=dict(headers))
        try:
            for step in range(args.pieces):
                for sequence_id in sequences:
                    client.async_stream_infer(**request(sequence_id, step))
            for _ in range(args.pieces * len(sequences)):
                result, error = answers.get(timeout=60)
                if error is not None:
                    raise SystemExit(f"error: {error}")
                last[int(result.get_response().id)] = result
        finally:
            client.stop_stream()
    else:
        for step in range(args.pieces):
            for sequence_id in sequences:
                last[sequence_id] = client.infer(**request(sequence_id, step), headers=dict(headers))
    for sequence_id, result in sorted(last.items()):
        outputs = result.get_response()["outputs"] if args.protocol == "http" else result.get_response(
            as_json=True)["outputs"]
        described = ", ".join(f"{o['name']} {o['datatype']} {[int(d) for d in o['shape']]}" for o in outputs)
        forecast = result.as_numpy("FORECAST")
        first = np.round(forecast.reshape(-1, forecast.shape[-1])[0].astype(np.float64), 3).tolist() \
            if forecast.size else None
        print(f"sequence {sequence_id}: {described}\n  forecast, first row: {first}")
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
