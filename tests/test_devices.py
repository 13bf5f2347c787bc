"""Device and precision settings: resolved per model, checked at startup, reported by /models.

No GPU is on the CI machines: ``auto`` must resolve to the CPU here, and a model configured for
CUDA must stop the service with a message that says what to change — never load on the CPU
quietly. The CUDA code paths themselves (moving tensors, the CUDA provider) cannot run here.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from service import devices
from service.devices import DeviceConfigError, check_backend_precision, resolve_device
from service.settings import Settings
from tests.service_helpers import make_client

ROOT = Path(__file__).resolve().parents[1]


def _onnx_sees_a_gpu() -> bool:
    return devices.cuda_device_count("onnx")[0] > 0


def test_device_and_precision_settings_accept_their_words_and_name_a_bad_value():
    settings = Settings(device="CUDA:1", model_devices={"a": "cpu", "b": "cuda"}, precision="BF16",
                        model_precisions={"a": "fp16"})
    assert settings.device == "cuda:1" and settings.model_devices == {"a": "cpu", "b": "cuda"}
    assert settings.precision == "bf16" and settings.model_precisions == {"a": "fp16"}
    for field, bad, named in [("device", "gpu", "'gpu'"), ("model_devices", {"a": "cuda:x"}, "'cuda:x'"),
                              ("precision", "fp8", "'fp8'"), ("model_precisions", {"a": "int8"}, "'int8'"),
                              ("model_max_batch_sizes", {"a": 0}, "model 'a'")]:
        with pytest.raises(ValidationError, match=named):
            Settings(**{field: bad})


def test_device_settings_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("RTSERVE_DEVICE", "cpu")
    monkeypatch.setenv("RTSERVE_MODEL_DEVICES", '{"srformer-news": "cuda:1"}')
    monkeypatch.setenv("RTSERVE_MODEL_PRECISIONS", '{"srformer-news": "bf16"}')
    settings = Settings()
    assert settings.device_for("srformer-news") == "cuda:1" and settings.device_for("rsa-etth1-h24") == "cpu"
    assert settings.precision_for("srformer-news") == "bf16" and settings.precision_for("rsa-etth1-h24") == "fp32"


def test_batch_size_is_per_device_with_a_per_model_override():
    settings = Settings(max_batch_size=16, max_batch_size_cuda=512, model_max_batch_sizes={"big": 1024})
    assert settings.batch_size_for("small", "cpu") == 16
    assert settings.batch_size_for("small", "cuda:0") == 512
    assert settings.batch_size_for("big", "cpu") == 1024 and settings.batch_size_for("big", "cuda:1") == 1024


def test_auto_resolves_to_the_cpu_without_a_gpu_and_cpu_is_always_cpu(monkeypatch):
    assert resolve_device("cpu", "onnx") == "cpu" and resolve_device("cpu", "torch") == "cpu"
    monkeypatch.setattr(devices, "cuda_device_count", lambda backend: (0, "no GPU here"))
    assert resolve_device("auto", "onnx") == "cpu" and resolve_device("auto", "torch") == "cpu"
    monkeypatch.setattr(devices, "cuda_device_count", lambda backend: (2, ""))
    assert resolve_device("auto", "onnx") == "cuda:0"
    assert resolve_device("cuda", "torch") == "cuda:0" and resolve_device("cuda:1", "torch") == "cuda:1"


def test_auto_on_the_onnx_backend_never_imports_torch():
    code = ("import sys; from service.devices import resolve_device; "
            "print(resolve_device('auto', 'onnx'), 'torch' in sys.modules)")
    answer = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    device, imported = answer.stdout.split()
    assert imported == "False" and device in ("cpu", "cuda:0")


def test_cuda_asked_for_and_absent_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(devices, "cuda_device_count", lambda backend: (0, "torch.cuda.is_available() is False"))
    with pytest.raises(DeviceConfigError) as error:
        resolve_device("cuda", "torch", "rmt-hyperpartisan")
    message = str(error.value)
    assert "rmt-hyperpartisan" in message and "cuda:0" in message and "torch.cuda.is_available() is False" in message
    assert "RTSERVE_DEVICE=cpu" in message and "RTSERVE_MODEL_DEVICES" in message
    monkeypatch.setattr(devices, "cuda_device_count", lambda backend: (1, ""))
    with pytest.raises(DeviceConfigError, match="only 1 CUDA device"):
        resolve_device("cuda:1", "onnx", "m")


@pytest.mark.skipif(_onnx_sees_a_gpu(), reason="this host has a GPU the onnx backend can use")
def test_the_real_onnx_check_names_the_missing_cuda_provider():
    with pytest.raises(DeviceConfigError, match="CUDAExecutionProvider|NVML sees no GPU"):
        resolve_device("cuda", "onnx", "m")


def test_a_precision_the_backend_cannot_run_is_a_startup_error():
    assert check_backend_precision("onnx", "fp16") == "fp16"
    assert check_backend_precision("torch", "bf16") == "bf16"
    with pytest.raises(DeviceConfigError, match="bf16 on the onnx backend.*torch backend"):
        check_backend_precision("onnx", "bf16", "rsa-etth1-h24")
    with pytest.raises(DeviceConfigError, match="fp16 on the torchscript backend"):
        check_backend_precision("torchscript", "fp16")


@pytest.fixture(scope="module")
def repository(forecast_repository):
    return forecast_repository


def test_models_reports_device_precision_providers_and_batch_size(repository, redis_url, key_prefix):
    with make_client(repository[0], redis_url, key_prefix, device="cpu", max_batch_size=8,
                     model_precisions={"rsa-tiny": "fp16"}) as client:
        (model,) = client.get("/models").json()
        assert model["device"] == "cpu" and model["precision"] == "fp16" and model["max_batch_size"] == 8
        assert model["providers"] == ["CPUExecutionProvider"]
        rows = [[float(i % 7 + j) for j in range(7)] for i in range(40)]
        answer = client.post("/forecast", json={"rows": rows})
        assert answer.status_code == 200, answer.text
    with make_client(repository[0], redis_url, key_prefix, model_backends={"rsa-tiny": "torch"},
                     precision="bf16") as client:
        (model,) = client.get("/models").json()
        assert (model["backend"], model["device"], model["precision"], model["providers"]) == (
            "torch", "cpu", "bf16", ["CPU"])


@pytest.mark.skipif(_onnx_sees_a_gpu(), reason="this host has a GPU the onnx backend can use")
def test_startup_fails_when_a_model_is_configured_for_an_absent_gpu(repository, redis_url, key_prefix):
    client = make_client(repository[0], redis_url, key_prefix, model_devices={"rsa-tiny": "cuda"})
    with pytest.raises(DeviceConfigError, match="model rsa-tiny is configured for cuda:0"):
        with client:
            pass


def test_rtserve_serve_exits_non_zero_with_the_message(tmp_path, redis_url):
    entry = tmp_path / "repository" / "some-model" / "1"
    entry.mkdir(parents=True)
    (entry / "manifest.json").write_text(json.dumps({"name": "some-model", "version": "1"}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RTSERVE_")}
    env.update(RTSERVE_MODEL_REPOSITORY=str(tmp_path / "repository"), RTSERVE_REDIS_URL=redis_url,
               RTSERVE_DEVICE="cuda:63", PYTHONPATH=str(ROOT))  # no host has 64 GPUs
    process = subprocess.run([sys.executable, "-m", "rtserve.cli", "serve", "--port", "0"], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=60)
    assert process.returncode != 0
    assert "model some-model is configured for cuda:63" in process.stdout + process.stderr
