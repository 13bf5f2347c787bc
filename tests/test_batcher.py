"""The dynamic batcher stacks concurrent steps, splits results back, and keeps shapes apart."""

import asyncio
import threading

import numpy as np
import pytest

from service.metrics import ServiceMetrics
from service.runtime.batcher import DynamicBatcher


class RecordingBackend:
    """A real computation (an affine map per row) that records the batch sizes it was called with."""

    name = "numpy"
    providers = ["CPU"]

    def __init__(self) -> None:
        self.calls: list[int] = []
        self.threads: set[str] = set()
        self.weight = np.random.default_rng().standard_normal((3, 3)).astype(np.float32)

    def run(self, inputs, keep=()):
        self.calls.append(inputs["x"].shape[0])
        self.threads.add(threading.current_thread().name)
        return {"y": inputs["x"] @ self.weight, "n": inputs["x"].sum(axis=(1, 2))}


async def test_concurrent_steps_are_stacked_and_split_back_in_order():
    backend = RecordingBackend()
    batcher = DynamicBatcher(backend, "m", "step", max_batch_size=8, max_queue_delay_seconds=0.05)
    rng = np.random.default_rng()
    inputs = [rng.standard_normal((1, 4, 3)).astype(np.float32) for _ in range(8)]
    outputs = await asyncio.gather(*(batcher.submit({"x": x}) for x in inputs))
    assert backend.calls == [8]
    for x, out in zip(inputs, outputs, strict=True):
        np.testing.assert_allclose(out["y"], x @ backend.weight, rtol=1e-6)
        np.testing.assert_allclose(out["n"], x.sum(axis=(1, 2)), rtol=1e-6)
    assert backend.threads and threading.main_thread().name not in backend.threads  # off the event loop
    await batcher.close()


async def test_batches_respect_max_batch_size_and_shape_signatures():
    backend = RecordingBackend()
    metrics = ServiceMetrics(collect_gpu=False)
    batcher = DynamicBatcher(backend, "m", "step", max_batch_size=4, max_queue_delay_seconds=0.05, metrics=metrics)
    rng = np.random.default_rng()
    short = [rng.standard_normal((1, 2, 3)).astype(np.float32) for _ in range(6)]
    long = [rng.standard_normal((1, 5, 3)).astype(np.float32) for _ in range(3)]
    results = await asyncio.gather(*(batcher.submit({"x": x}) for x in short + long))
    assert sorted(backend.calls) == [2, 3, 4]  # 6 short -> 4 + 2; 3 long apart
    for x, out in zip(short + long, results, strict=True):
        assert out["y"].shape == x.shape
    samples = {s.name: s.value for s in metrics.batch_size.collect()[0].samples if s.labels.get("model") == "m"}
    assert samples["rtserve_batch_size_count"] == 3 and samples["rtserve_batch_size_sum"] == 9
    await batcher.close()


async def test_a_failing_batch_fails_every_caller_with_the_error():
    class Broken(RecordingBackend):
        def run(self, inputs, keep=()):
            raise RuntimeError("graph exploded")

    batcher = DynamicBatcher(Broken(), "m", "step", max_batch_size=4, max_queue_delay_seconds=0.01)
    x = np.ones((1, 2, 3), dtype=np.float32)
    results = await asyncio.gather(batcher.submit({"x": x}), batcher.submit({"x": x}), return_exceptions=True)
    assert all(isinstance(r, RuntimeError) and "exploded" in str(r) for r in results)
    await batcher.close()


async def test_inputs_that_disagree_on_batch_are_refused():
    batcher = DynamicBatcher(RecordingBackend(), "m", "step", 4, 0.01)
    with pytest.raises(ValueError, match="batch axis"):
        await batcher.submit({"x": np.ones((1, 2, 3)), "z": np.ones((2, 1))})
    await batcher.close()


async def test_interleaved_shapes_are_batched_apart_without_comparing_arrays():
    backend = RecordingBackend()
    batcher = DynamicBatcher(backend, "m", "step", max_batch_size=8, max_queue_delay_seconds=0.05)
    rng = np.random.default_rng()
    inputs = [rng.standard_normal((1, 2 + index % 3, 3)).astype(np.float32) for index in range(12)]  # 2,3,4,2,..
    results = await asyncio.wait_for(asyncio.gather(*(batcher.submit({"x": x}) for x in inputs)), timeout=10)
    for x, out in zip(inputs, results, strict=True):
        np.testing.assert_allclose(out["y"], x @ backend.weight, rtol=1e-6)
    assert sorted(backend.calls) == [4, 4, 4]
    await batcher.close()


class SlowBackend(RecordingBackend):
    """Takes ``seconds`` per call, like a real model step."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def run(self, inputs, keep=()):
        import time

        time.sleep(self.seconds)
        return super().run(inputs, keep)


async def test_a_lone_request_after_batches_of_one_runs_at_once_whatever_the_queue_delay():
    import time

    batcher = DynamicBatcher(RecordingBackend(), "m", "step", max_batch_size=8, max_queue_delay_seconds=1.0)
    x = np.ones((1, 2, 3), dtype=np.float32)
    for _ in range(3):  # one caller at a time: never waits for company
        started = time.perf_counter()
        await batcher.submit({"x": x})
        assert time.perf_counter() - started < 0.2
    await batcher.close()


async def test_a_lone_request_after_a_larger_batch_waits_the_queue_delay_once():
    import time

    backend = RecordingBackend()
    batcher = DynamicBatcher(backend, "m", "step", max_batch_size=8, max_queue_delay_seconds=0.3)
    x = np.ones((1, 2, 3), dtype=np.float32)
    await asyncio.gather(*(batcher.submit({"x": x}) for _ in range(3)))  # a batch of 3 promises company
    started = time.perf_counter()
    await batcher.submit({"x": x})  # no one else comes: it waits for the company the batch of 3 promised
    waited = time.perf_counter() - started
    started = time.perf_counter()
    await batcher.submit({"x": x})  # the batch of 1 promised none
    assert waited >= 0.29 and time.perf_counter() - started < 0.2
    assert backend.calls == [3, 1, 1]
    await batcher.close()


async def test_the_batching_policy_decides_what_a_batch_holds():
    from service.runtime.batching import ContinuousBatching

    class OneAtATime(ContinuousBatching):
        def take(self, queued, limit):
            return [queued[0]]

    backend = RecordingBackend()
    batcher = DynamicBatcher(backend, "m", "step", 8, 0.0, policy=OneAtATime(0.0))
    x = np.ones((1, 2, 3), dtype=np.float32)
    await asyncio.gather(*(batcher.submit({"x": x}) for _ in range(4)))
    assert backend.calls == [1, 1, 1, 1]
    await batcher.close()


async def test_arrivals_during_a_running_batch_form_the_next_batch():
    backend = SlowBackend(0.2)
    batcher = DynamicBatcher(backend, "m", "step", max_batch_size=16, max_queue_delay_seconds=0.0)
    x = np.ones((1, 2, 3), dtype=np.float32)
    first = asyncio.ensure_future(batcher.submit({"x": x}))
    await asyncio.sleep(0.05)  # the first step is running: these five queue behind it
    rest = [asyncio.ensure_future(batcher.submit({"x": x})) for _ in range(5)]
    await asyncio.gather(first, *rest)
    assert backend.calls == [1, 5]
    await batcher.close()


async def test_the_queue_delay_waits_only_for_company_the_last_batch_promises():
    import time

    backend = SlowBackend(0.01)
    batcher = DynamicBatcher(backend, "m", "step", max_batch_size=16, max_queue_delay_seconds=0.3)
    x = np.ones((1, 2, 3), dtype=np.float32)
    await asyncio.gather(*(batcher.submit({"x": x}) for _ in range(4)))  # a batch of 4

    async def late():
        await asyncio.sleep(0.05)
        return await batcher.submit({"x": x})

    started = time.perf_counter()
    await asyncio.gather(batcher.submit({"x": x}), *(late() for _ in range(3)))
    assert backend.calls == [4, 4]  # the first waited for the three that the last batch promised
    assert time.perf_counter() - started < 0.25  # ... and not the whole delay: they came
    await batcher.close()


async def test_only_the_arrival_that_completes_the_promised_batch_wakes_the_waiting_worker():
    class CountingEvent(asyncio.Event):
        woke_waiting = 0  # set() calls that found the worker waiting on the event

        def set(self):
            CountingEvent.woke_waiting += bool(self._waiters)
            super().set()

    backend = SlowBackend(0.01)
    batcher = DynamicBatcher(backend, "m", "step", max_batch_size=16, max_queue_delay_seconds=5.0)
    batcher._wakeup = CountingEvent()
    x = np.ones((1, 2, 3), dtype=np.float32)
    await asyncio.gather(*(batcher.submit({"x": x}) for _ in range(4)))  # a batch of 4 promises company
    first = asyncio.ensure_future(batcher.submit({"x": x}))
    await asyncio.sleep(0.02)  # the worker woke for it, found one row of four and waits for the rest
    CountingEvent.woke_waiting = 0
    second = asyncio.ensure_future(batcher.submit({"x": x}))
    await asyncio.sleep(0.02)
    third = asyncio.ensure_future(batcher.submit({"x": x}))
    await asyncio.sleep(0.02)
    assert CountingEvent.woke_waiting == 0 and not first.done()  # two and three rows of four: it sleeps on
    await asyncio.wait_for(asyncio.gather(first, second, third, batcher.submit({"x": x})), 1.0)  # not the 5 s delay
    assert CountingEvent.woke_waiting == 1 and backend.calls == [4, 4]
    await batcher.close()


async def test_a_light_graphs_lone_request_runs_on_the_event_loop_and_is_recorded():
    backend = RecordingBackend()
    metrics = ServiceMetrics(collect_gpu=False)
    batcher = DynamicBatcher(backend, "m", "step", max_batch_size=8, max_queue_delay_seconds=0.05, metrics=metrics,
                             in_flight=lambda: 1)
    x = np.random.default_rng().standard_normal((1, 4, 3)).astype(np.float32)
    out = await batcher.submit({"x": x})
    np.testing.assert_allclose(out["y"], x @ backend.weight, rtol=1e-6)
    assert backend.threads == {threading.current_thread().name}  # the loop's own thread
    samples = {s.name: s.value for s in metrics.batch_size.collect()[0].samples if s.labels.get("model") == "m"}
    assert samples["rtserve_batch_size_count"] == 1 and samples["rtserve_batch_size_sum"] == 1
    await batcher.close()


async def test_with_other_requests_in_flight_calls_still_form_batches():
    backend = RecordingBackend()
    in_flight = {"requests": 8}
    batcher = DynamicBatcher(backend, "m", "step", max_batch_size=8, max_queue_delay_seconds=0.05,
                             in_flight=lambda: in_flight["requests"])
    rng = np.random.default_rng()
    inputs = [rng.standard_normal((1, 4, 3)).astype(np.float32) for _ in range(8)]
    await asyncio.gather(*(batcher.submit({"x": x}) for x in inputs))
    assert backend.calls == [8] and threading.main_thread().name not in backend.threads
    in_flight["requests"] = 1  # alone now, but promised company by the batch of 8: the queue, as before
    await batcher.submit({"x": inputs[0]})
    assert backend.calls == [8, 1] and threading.main_thread().name not in backend.threads
    await batcher.submit({"x": inputs[0]})  # after a batch of one, nothing promised: on the loop
    assert backend.calls == [8, 1, 1] and threading.main_thread().name in backend.threads
    await batcher.close()


@pytest.mark.parametrize("on_loop", [True, False])
async def test_a_light_graphs_batch_of_every_request_in_flight_runs_on_the_event_loop(on_loop):
    backend = RecordingBackend()
    metrics = ServiceMetrics(collect_gpu=False)
    in_flight = {"requests": 8}
    batcher = DynamicBatcher(backend, "m", "step", max_batch_size=8, max_queue_delay_seconds=0.05, metrics=metrics,
                             in_flight=lambda: in_flight["requests"], whole_batches_on_loop=on_loop)
    rng = np.random.default_rng()
    inputs = [rng.standard_normal((1, 4, 3)).astype(np.float32) for _ in range(8)]
    outputs = await asyncio.gather(*(batcher.submit({"x": x}) for x in inputs))
    for x, out in zip(inputs, outputs, strict=True):
        np.testing.assert_allclose(out["y"], x @ backend.weight, rtol=1e-6)
    loop_thread = threading.current_thread().name
    assert backend.calls == [8] and (loop_thread in backend.threads) == on_loop
    samples = {s.name: s.value for s in metrics.queue_seconds.collect()[0].samples if s.labels.get("model") == "m"}
    assert samples["rtserve_batch_queue_seconds_count"] == 8  # each caller's wait, as through the worker
    backend.threads.clear()
    in_flight["requests"] = 12  # four more requests in flight elsewhere: they may want the loop, the worker steps
    await asyncio.gather(*(batcher.submit({"x": x}) for x in inputs))
    assert backend.calls == [8, 8] and loop_thread not in backend.threads
    await batcher.close()


async def test_a_lone_request_waits_for_a_running_batch_instead_of_running_beside_it():
    release = threading.Event()

    class SlowBackend(RecordingBackend):
        def run(self, inputs, keep=()):
            if inputs["x"].shape[0] == 2:
                release.wait(5)
            return super().run(inputs, keep)

    backend = SlowBackend()
    alone = {"value": False}
    batcher = DynamicBatcher(backend, "m", "step", max_batch_size=8, max_queue_delay_seconds=0.0,
                             in_flight=lambda: 1 if alone["value"] else 2)
    x = np.ones((1, 4, 3), np.float32)
    first = asyncio.gather(batcher.submit({"x": x}), batcher.submit({"x": x}))
    await asyncio.sleep(0.05)  # the batch of two runs on the worker's thread
    alone["value"] = True
    late = asyncio.ensure_future(batcher.submit({"x": x}))
    await asyncio.sleep(0.05)
    assert backend.calls == [] and not late.done()  # the batch of two still runs; the late call queues behind it
    release.set()
    await first
    await late
    assert backend.calls == [2, 1]
    await batcher.close()


@pytest.mark.parametrize("flat_step", [True, False])
async def test_on_a_flat_step_device_two_cohorts_out_of_phase_join_into_one_batch(flat_step):
    """Cohorts A and B of 4 rows each, each submitting again 5 ms after its answer: B arrives while A's batch runs.
    A device whose step takes the same time at any batch size waits (within the queue delay) for A to come back and
    runs the two as one batch from then on; on a CPU (flat_step off) they keep alternating half batches."""
    backend = SlowBackend(0.02)
    batcher = DynamicBatcher(backend, "m", "step", max_batch_size=8, max_queue_delay_seconds=0.05,
                             flat_step=flat_step)
    rng = np.random.default_rng()

    async def cohort(delay: float) -> None:
        await asyncio.sleep(delay)
        for _ in range(6):
            await asyncio.gather(*(batcher.submit({"x": rng.standard_normal((1, 4, 3)).astype(np.float32)})
                                   for _ in range(4)))
            await asyncio.sleep(0.005)

    await asyncio.gather(cohort(0.0), cohort(0.008))
    await batcher.close()
    if flat_step:
        assert backend.calls[1:6] == [8] * 5, backend.calls
    else:
        assert max(backend.calls) == 4, backend.calls
