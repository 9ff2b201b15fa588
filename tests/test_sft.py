"""Cold start: conversations render to the same (ids, mask) a rollout grows, and training lowers the loss."""

import json

import pytest
import torch

import chat
import sft
from domains import load_world
from demo.drills import copy_examples
from demo.tiny import build_tiny


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    world = load_world("synthetic", seed=0, n_train=40, n_test=10)
    tasks = world.tasks("train")[:12]
    model, tok = build_tiny(tmp_path_factory.mktemp("tiny"), texts=[world.rules] + [json.dumps(t.expert) for t in tasks],
                            hidden=64, layers=2, heads=2, kv_heads=1, intermediate=128)
    return world, tasks, model, tok


def test_mask_covers_exactly_the_assistant_turns(setup):
    world, tasks, _, tok = setup
    conv = sft.expert_conversations(tasks[:1])[0]
    (ids, mask), = sft.render_examples(tok, [dict(conv, tools=[])], {world.name: world})
    trained = tok.decode([i for i, m in zip(ids, mask) if m], skip_special_tokens=False)
    expected = "".join(tok.decode(chat.assistant_ids(tok, m), skip_special_tokens=False)
                       for m in conv["messages"] if m["role"] == "assistant")
    assert trained == expected
    eot = chat.end_of_turn_id(tok)
    n_assistant = sum(m["role"] == "assistant" for m in conv["messages"])
    assert sum(1 for i, m in zip(ids, mask) if m and i == eot) == n_assistant  # every turn's end-of-turn is trained
    # the rendered prompt is the rollout's prompt: same function, mask 0
    first = conv["messages"][0]["content"]
    p = chat.prompt_ids(tok, world.rules, [], first)
    assert ids[: len(p)] == p and mask[: len(p)] == [0] * len(p)


def test_training_lowers_the_loss(setup):
    world, tasks, model, tok = setup
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model on a busy 2-core machine runs fastest on one thread
    try:
        ex = sft.render_examples(tok, [dict(c, tools=[]) for c in sft.expert_conversations(tasks[:4])], {world.name: world})
        losses = sft.train(model, ex, epochs=6, batch_size=4, lr=3e-3, micro_batch_tokens=1024, warmup=2,
                           show_progress=False)
    finally:
        torch.set_num_threads(threads)
    assert len(losses) == 6 and all(l == l for l in losses)
    assert losses[-1] < losses[0] - 1.0


def test_bad_jsonl_line_is_reported(tmp_path):
    p = tmp_path / "convs.jsonl"
    p.write_text('{"messages": []}\n{not json\n')
    with pytest.raises(ValueError, match="convs.jsonl:2: not JSON"):
        sft.load_jsonl(p)


def test_copy_drills_train_exactly_the_repeat():
    import tempfile

    _, tok = build_tiny(tempfile.mkdtemp(), texts=["order #W123 lamp gift card"] * 10, hidden=32, layers=1, heads=1,
                        kv_heads=1, intermediate=64, vocab_size=300, split_digits=True)
    drills = copy_examples(tok, 50, seed=3, words=["lamp", "gift"])
    assert len(drills) == 50 and drills == copy_examples(tok, 50, seed=3, words=["lamp", "gift"])
    for ids, mask in drills:
        assert len(ids) == len(mask) and mask == sorted(mask)  # zeros, then ones: the loss is on the repeat only
        first = tok.decode([i for i, m in zip(ids, mask) if not m])
        second = tok.decode([i for i, m in zip(ids, mask) if m])
        assert first.endswith(" ||") and second.strip() == first[: -len(" ||")].strip()
