import uuid

import numpy as np
import pytest

from service.state_store import StateStore, StateStoreUnavailable
from service.tensor_codec import decode_tensors, encode_tensors


def _random_state(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        "memory": rng.standard_normal((2, 4, 8)).astype(np.float32),
        "memory_half": rng.standard_normal((3, 5)).astype(np.float16),
        "kv_sum": rng.standard_normal((1, 2, 3, 4)).astype(np.float64),
        "token_ids": rng.integers(0, 30_000, size=(1, 17), dtype=np.int64),
        "rows_seen": np.asarray(rng.integers(0, 1000), dtype=np.int32),  # 0-d
        "pending_text": np.frombuffer("naïve café ".encode(), dtype=np.uint8).copy(),
        "mask": rng.random((2, 9)) > 0.5,
        "empty": np.zeros((0, 384), dtype=np.float32),
    }


def test_codec_round_trip_keeps_dtype_shape_and_values():
    state = _random_state(np.random.default_rng())
    decoded = decode_tensors(encode_tensors(state, {"model": "rmt"}))
    assert set(decoded) == set(state)
    for name, array in state.items():
        assert decoded[name].dtype == array.dtype, name
        assert decoded[name].shape == array.shape, name
        np.testing.assert_array_equal(decoded[name], array)


def test_codec_bytes_are_not_pickle():
    payload = encode_tensors({"x": np.arange(3, dtype=np.int64)})
    header_length = int.from_bytes(payload[:8], "little")
    assert payload[8:9] == b"{" and b'"dtype":"I64"' in payload[8 : 8 + header_length]
    assert not payload.startswith(b"\x80")  # the pickle protocol marker


async def test_encoded_state_survives_a_round_trip_through_real_redis(store: StateStore):
    """The bytes sessions store (``encode_tensors``) come back from a real Redis decodable and unchanged."""
    state = _random_state(np.random.default_rng())
    key = store.key(uuid.uuid4().hex, "state")
    payload = encode_tensors(state, {"model": "rmt"})
    assert await store.client.set(key, payload, ex=60)
    stored = await store.client.get(key)
    assert stored == payload
    loaded = decode_tensors(stored)
    for name, array in state.items():
        assert loaded[name].dtype == array.dtype and loaded[name].shape == array.shape
        np.testing.assert_array_equal(loaded[name], array)
    assert await store.client.delete(key) == 1


def test_keys_are_namespaced_and_cluster_safe(key_prefix: str, redis_url: str):
    store = StateStore.from_url(redis_url, prefix=key_prefix)
    assert store.key("abc", "state") == f"{key_prefix}:{{abc}}:state"


async def test_unreachable_redis_raises_a_clear_error():
    store = StateStore.from_url("redis://127.0.0.1:1/0", timeout_seconds=0.5)
    with pytest.raises(StateStoreUnavailable, match=r"Redis at redis://127\.0\.0\.1:1/0 is unreachable"):
        await store.ping()
    with pytest.raises(StateStoreUnavailable):
        await store.check_writable()  # the write /readyz makes
    await store.close()


async def test_error_message_hides_credentials():
    store = StateStore.from_url("redis://user:secret@127.0.0.1:1/0", timeout_seconds=0.5)
    with pytest.raises(StateStoreUnavailable) as caught:
        await store.ping()
    assert "secret" not in str(caught.value)
    await store.close()
