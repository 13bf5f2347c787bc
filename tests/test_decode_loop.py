"""The decode loop: searches of different documents share steps, join and leave at any step, and each
ends exactly as it would alone; a search that leaves costs no copy of the others' inputs; the fixed
inputs it asks the backend to keep on the device are never changed under it."""

import asyncio

import numpy as np

from models.decoding import BeamSearch, GreedySearch
from service.runtime.decode_loop import DecodeLoop

VOCAB = 23
GRAPH = {
    "name": "decode_step",
    "inputs": [{"name": "token", "shape": ["batch"]}, {"name": "t", "shape": ["batch"]},
               {"name": "source", "shape": ["batch", "source"]}, {"name": "mask", "shape": ["batch", "source"]},
               {"name": "history", "shape": ["batch", "steps"]}, {"name": "self_mask", "shape": ["batch", "steps"]}],
    "outputs": [{"name": "logp"}, {"name": "next_history"}, {"name": "next_self_mask"}],
    "state_outputs": {"history": "next_history", "self_mask": "next_self_mask"},
    "axis_masks": {"source": "mask", "steps": "self_mask"},
}


class ToyDecoder:
    """A decode graph in numpy whose every row depends on all of its own inputs and nothing else: a row
    mixed up with another, or reading another's padding, changes its tokens. Values are small integers,
    so sums are exact whatever the padding."""

    name = "numpy"
    providers = ["CPU"]

    def __init__(self) -> None:
        self.calls: list[dict[str, np.ndarray]] = []
        self.keeps: list[frozenset[str]] = []
        self.dropped = 0

    def run(self, inputs, keep=()):
        self.calls.append(dict(inputs))
        self.keeps.append(frozenset(keep))
        source = (inputs["source"] * inputs["mask"]).sum(axis=1)
        history = (inputs["history"] * inputs["self_mask"]).sum(axis=1)
        key = 0.37 * source + 0.11 * history + 0.05 * inputs["token"] + 0.013 * inputs["t"]
        logp = np.sin(key[:, None] * np.arange(1, VOCAB + 1)[None, :])
        return {"logp": logp, "next_history": np.concatenate([inputs["history"], inputs["token"][:, None] % 5.0], 1),
                "next_self_mask": np.concatenate([inputs["self_mask"], np.ones((len(logp), 1), bool)], 1)}

    def drop_kept(self):
        self.dropped += 1


def document(rng, length, rows):
    source = rng.integers(0, 9, (1, length)).astype(np.float64)
    fixed = {"source": np.repeat(source, rows, 0), "mask": np.ones((rows, length), bool)}
    state = {"history": np.zeros((rows, 0)), "self_mask": np.zeros((rows, 0), bool)}
    return fixed, state


def search(limit, beams):
    vocab = np.arange(VOCAB)
    return (GreedySearch(0, 1, vocab, limit, 2) if beams == 1 else BeamSearch(0, 1, vocab, limit, 2, beams))


async def decode_all(loop, specs, documents, late_after_calls=None, backend=None):
    """Every search at once; with ``late_after_calls`` the second half starts after that many steps."""
    async def late(index):
        while len(backend.calls) < late_after_calls:
            await asyncio.sleep(0)
        return await loop.generate(search(*specs[index]), *documents[index])

    half = len(specs) // 2 if late_after_calls else len(specs)
    runs = [loop.generate(search(*specs[i]), *documents[i]) for i in range(half)]
    runs += [late(i) for i in range(half, len(specs))]
    return await asyncio.gather(*runs)


async def test_searches_join_and_leave_mid_batch_and_each_equals_its_solo_run():
    rng = np.random.default_rng(7)
    # (limit, beams), source lengths: different lengths, beams and ends; more rows than one batch holds
    specs = [(int(rng.integers(4, 30)), int(rng.choice([1, 1, 2, 3]))) for _ in range(14)]
    documents = [document(rng, int(rng.integers(2, 40)), beams) for _, beams in specs]
    solo = []
    for spec, doc in zip(specs, documents, strict=True):
        alone = DecodeLoop(ToyDecoder(), "m", GRAPH, max_batch_size=8)
        solo.append(await alone.generate(search(*spec), *doc))
        await alone.close()
    backend = ToyDecoder()
    loop = DecodeLoop(backend, "m", GRAPH, max_batch_size=8)
    together = await decode_all(loop, specs, documents, late_after_calls=5, backend=backend)
    assert together == solo
    rows = [len(call["token"]) for call in backend.calls]
    assert max(rows) == 8 and len(rows) < sum(len(ids) for ids in solo)
    assert len({call["source"].shape[1] for call in backend.calls}) > 1  # the padding was cut as long ones left
    await loop.close()


async def test_the_batching_policy_decides_which_searches_join():
    from service.runtime.batching import ContinuousBatching

    class OneSearchAtATime(ContinuousBatching):
        def admit(self, waiting, resident_rows, limit):
            return 0 if resident_rows else min(1, len(waiting))

    rng = np.random.default_rng(5)
    specs = [(int(rng.integers(4, 12)), 1) for _ in range(3)]
    documents = [document(rng, int(rng.integers(2, 20)), 1) for _ in specs]
    shared = DecodeLoop(ToyDecoder(), "m", GRAPH, max_batch_size=8)
    backend = ToyDecoder()
    apart = DecodeLoop(backend, "m", GRAPH, max_batch_size=8, policy=OneSearchAtATime(0.0))
    assert await decode_all(apart, specs, documents) == await decode_all(shared, specs, documents)
    assert {len(call["token"]) for call in backend.calls} == {1}  # never two searches in one step
    await shared.close()
    await apart.close()


async def test_a_search_that_leaves_costs_no_copy_of_the_others_inputs():
    rng = np.random.default_rng(3)
    specs = [(limit, 1) for limit in (6, 9, 12, 15, 18, 21)]
    documents = [document(rng, 16, 1) for _ in specs]  # one source length: no padding to cut
    backend = ToyDecoder()
    loop = DecodeLoop(backend, "m", GRAPH, max_batch_size=8)
    await decode_all(loop, specs, documents)
    leaves = [(before, after) for before, after in zip(backend.calls, backend.calls[1:], strict=False)
              if len(after["token"]) < len(before["token"])]
    assert len(leaves) >= 4  # the searches end at different steps
    for before, after in leaves:  # the rows that stay are where they were: the same memory
        assert np.shares_memory(before["source"], after["source"])
    await loop.close()


async def test_kept_inputs_are_the_fixed_ones_and_an_array_passed_again_is_unchanged():
    """What lets a GPU backend copy a document's fixed inputs to the device once per re-form: the loop names
    them in ``keep``, and an array object it passes again holds the values it held when first passed."""
    rng = np.random.default_rng(11)
    specs = [(int(rng.integers(4, 25)), int(rng.choice([1, 2]))) for _ in range(10)]
    documents = [document(rng, int(rng.integers(2, 30)), beams) for _, beams in specs]
    backend = ToyDecoder()
    loop = DecodeLoop(backend, "m", GRAPH, max_batch_size=8)
    seen: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # id -> (the array, its values when first passed)

    original_run = backend.run

    def checking(inputs, keep=()):
        for name in keep:
            array = inputs[name]
            if id(array) in seen and seen[id(array)][0] is array:
                assert np.array_equal(array, seen[id(array)][1]), f"{name} changed in place, then passed again"
            else:
                seen[id(array)] = (array, array.copy())
        return original_run(inputs, keep)

    backend.run = checking
    await decode_all(loop, specs, documents, late_after_calls=4, backend=backend)
    assert all(keep == {"source", "mask"} for keep in backend.keeps)
    passed_again = sum(a["source"] is b["source"] for a, b in zip(backend.calls, backend.calls[1:], strict=False))
    reformed = len(backend.calls) - 1 - passed_again
    assert passed_again > 3 * reformed > 0  # mostly the same arrays, new ones at each re-form
    assert backend.dropped >= 1  # the batch emptied at the end: its device copies freed
    await loop.close()
