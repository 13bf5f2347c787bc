"""benchmarks/piece_profile.py's attribution of py-spy samples to layers: per-piece work goes to its layer, the lease
keeper's renewals (on a clock, whatever the pieces) are counted apart, the other threads' samples are not the loop's."""

from tests.benchmark_scripts import load_benchmark

LOOP = "<module> (rtserve/cli.py:569);run (uvicorn/main.py:632);Runner.run (asyncio/runners.py:118)"
SAMPLES = [
    f"{LOOP};Leases._keep (service/sessions/lease.py:181);Leases.renew (service/sessions/lease.py:166);"
    "SessionStore._pipelined (service/sessions/store.py:130) 7",
    f"{LOOP};SessionFlow.apply (service/session_flow.py:116);Leases.take_for_piece (service/sessions/lease.py:140) 3",
    f"{LOOP};SessionFlow.apply (service/session_flow.py:110);piece_digest (service/sessions/digest.py:16) 5",
    f"{LOOP};CommitQueue._round_trip (service/sessions/commits.py:79);"
    "Pipeline.execute (redis/asyncio/client.py:2262) 2",
    "Thread._bootstrap (threading.py:1002);Thread.run (threading.py:982);"
    "OnnxBackend.run (service/runtime/backends.py:160) 40",
]


def test_the_keeper_is_counted_apart_and_a_piece_s_lock_is_its_own_layer(tmp_path):
    profile = load_benchmark("piece_profile")
    path = tmp_path / "spy.txt"
    path.write_text("\n".join(SAMPLES) + "\n")  # py-spy's raw format: a stack, outermost first, and its count
    layers = profile.read_samples(path)
    assert layers == {profile.KEEPER: 7, "leases (a piece's lock)": 3, "digest": 5,
                      "Redis client (redis-py, hiredis)": 2}


PERF_REPORT = """\
# To display the perf.data header info, please use --header/--header-only options.
#
# Samples: 1K of event 'cpu-clock:ppp'
#
#       Samples      Pid:Command     Shared Object
# ............  ...............  ................................
#
           563      253:python     libpython3.11.so.1.0
           410      269:python     onnxruntime_pybind11_state.cpython-311-x86_64-linux-gnu.so
            45      249:redis-server  redis-server
            12      250:bio_close_file  [kernel.kallsyms]
             9      253:python     [kernel.kallsyms]
"""


def test_perf_s_samples_go_to_the_event_loop_the_other_threads_and_redis_by_shared_object():
    profile = load_benchmark("piece_profile")
    rows = profile.read_perf_report(PERF_REPORT, loop_thread=253, redis_threads={249, 250})
    assert rows == {
        ("the event loop's thread", "libpython3.11.so.1.0"): 563,
        ("the event loop's thread", "[kernel.kallsyms]"): 9,
        ("the service's other threads (the graph's)", "onnxruntime_pybind11_state"): 410,
        ("Redis", "redis-server"): 45,
        ("Redis", "[kernel.kallsyms]"): 12,  # a thread of Redis's own
    }
