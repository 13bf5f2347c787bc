"""With the ONNX backend the service never imports torch: one request of each task, in a fresh process."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SERVE_ONE_OF_EACH = """
import json, sys
from fastapi.testclient import TestClient
from service.app import create_app
from service.settings import Settings

settings = Settings(model_repository=sys.argv[1], redis_url=sys.argv[2], redis_key_prefix=sys.argv[3], backend="onnx")
text = "The senator said on Monday that the bill would pass the house. Critics disagreed. " * 4
statuses = {}
with TestClient(create_app(settings)) as client:
    statuses["classify"] = client.post("/classify", json={"text": text}).status_code
    statuses["summarize"] = client.post("/summarize", json={"text": text, "max_length": 8}).status_code
    rows = [[float(i % 7 + j) for j in range(7)] for i in range(40)]
    statuses["forecast"] = client.post("/forecast", json={"rows": rows}).status_code
    session = client.post("/sessions", json={"task": "classify"}).json()["id"]
    statuses["segment"] = client.post(f"/sessions/{session}/segments", json={"seq": 1, "text": text}).status_code
    statuses["finish"] = client.post(f"/sessions/{session}/finish").status_code
print(json.dumps({"statuses": statuses, "torch": "torch" in sys.modules}))
"""


def test_the_onnx_service_answers_every_task_without_importing_torch(every_task_repository, redis_url, key_prefix):
    done = subprocess.run([sys.executable, "-c", SERVE_ONE_OF_EACH, str(every_task_repository), redis_url, key_prefix],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(report["statuses"].values()) == {200}, report
    assert report["torch"] is False
