"""The run's page (plumbing/view.py): written by a run, self-contained, and right in a real browser.

A short CPU run (the demo's tiny model, the scripted customer, the shop world: seconds) writes view.html; headless
Chromium opens it with #selftest, which draws every recorded episode token by token and works the filters, and
writes what it counted into <pre id="selftest">. What each part pins:

  the run        view.html and view-tokens.jsonl exist; the page loads nothing (no URL, a policy forbidding
                 requests); the token record is the exact stream the loss saw, with the trainer's log-probs
  the browser    no script error; each recorded episode's lit tokens == its trained tokens, as the episode log
                 records them; a filter changes what is shown
  bad input      an older run's folder, a truncated log, an episode without tokens: a page that says what is
                 missing; a page that cannot be made is one printed line, never a traceback
  sanity flags   a trained token inside the customer's text is counted

Without Chromium (Debian's `chromium`) the browser test skips with the reason; CI installs it (.ci/run).
"""

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from conftest import needs_tau2
from demo import train as demo_train
from plumbing import runlog, view

# 2 GRPO steps of 2 tasks x 2 episodes, an evaluation after each, no cold start: a few seconds on a CPU
TINY = ["--model", "tiny", "--domains", "shop", "--tiny_hidden", "64", "--tiny_layers", "2", "--threads", "1",
        "--tasks_per_step", "2", "--copy_warmup", "0", "--group_size", "2", "--max_new_tokens", "24", "--max_turns",
        "6", "--eval_tasks", "2", "--sft_epochs", "0", "--steps", "2", "--eval_every", "1"]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("view") / "run"
    demo_train.main(TINY + ["--out_dir", str(out)])
    torch.set_num_threads(n)
    return out


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def browse(page: Path, tmp_path: Path) -> dict:
    """Open `page#selftest` in headless Chromium; what its self-test wrote."""
    if CHROMIUM is None:
        pytest.skip("chromium not installed (apt-get install chromium): the page is not checked in a browser")
    args = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            f"--user-data-dir={tmp_path / 'chromium'}", "--virtual-time-budget=5000", "--dump-dom",
            page.resolve().as_uri() + "#selftest"]
    dom = subprocess.run(args, capture_output=True, text=True, timeout=120, errors="replace").stdout
    found = re.search(r'<pre id="selftest"[^>]*>([^<]*)</pre>', dom)
    assert found and found.group(1).strip(), f"the self-test wrote nothing: {dom[-2000:]}"
    return json.loads(found.group(1).replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">")
                      .replace("&quot;", '"'))


# --------------------------------------------------------------------------------------------------
# The run


def test_a_run_writes_one_self_contained_page(run):
    page = (run / "view.html").read_text()
    assert "__DATA__" not in page and "Content-Security-Policy" in page and "default-src 'none'" in page
    # nothing to fetch: no src or href attribute, no URL but the SVG namespace
    assert not re.search(r"\b(src|href)\s*=", page)
    assert set(re.findall(r"https?://[^\s\"'<>]+", page)) <= {"http://www.w3.org/2000/svg"}
    # the data once, and the page little more than its data
    assert page.count('<script id="data"') == 1 and len(page) < len(json.dumps(view.collect(run))) + 60_000


def test_the_token_record_is_the_stream_the_loss_saw(run):
    groups = jsonl(run / "view-tokens.jsonl")
    assert sorted({g["step"] for g in groups}) == [0, 1]  # every step, 1-2 groups each
    for g in groups:
        assert 1 <= sum(x["step"] == g["step"] for x in groups) <= 2 and len(g["episodes"]) == 2
        for e in g["episodes"]:
            assert len(e["mask"]) == len(e["ids"]) and e["trained"] == e["mask"].count("1") > 0
            assert len(e["lp"]) == len(e["tlp"]) == e["trained"]
            assert all(str(i) in g["vocab"] for i in e["ids"])
            # one update per batch, shared weights: the trainer scores each trained token as the sampler did
            assert max(abs(a - b) for a, b in zip(e["lp"], e["tlp"])) < 1e-3
            # the spans tile the stream; trained tokens only in the agent's
            assert e["spans"][0][1] == 0 and e["spans"][-1][2] == len(e["ids"])
            assert sum(e["mask"][s:t].count("1") for who, s, t in e["spans"] if who != "agent") == 0
    # a resume cuts this log back with the others: the checkpoint's manifest lists it
    manifest = json.loads(next((run / "checkpoints").glob("step-*/manifest.json")).read_text())
    assert "view-tokens.jsonl" in manifest["logs"]


def test_the_page_in_a_real_browser(run, tmp_path):
    got = browse(run / "view.html", tmp_path)
    assert got["errors"] == []
    # a trained token's hover: both log-probs, the sampler's and the trainer's, and its advantage
    assert re.search(r"sampler logp +-?\d+\.\d+\ntrainer logp +-?\d+\.\d+", got["tip"]) and "advantage" in got["tip"]
    # each recorded episode: lit tokens == trained tokens, as the episode log (episodes-rank0.jsonl) records them
    logged = {(r["step"], str(r["seed"])): r["trained_tokens"] for r in jsonl(run / "episodes-rank0.jsonl")
              if r.get("phase") != "eval"}
    assert len(got["lit"]) == sum(len(g["episodes"]) for g in jsonl(run / "view-tokens.jsonl")) > 0
    for e in got["lit"]:
        assert e["lit"] == e["trained"] == logged[(e["step"], e["seed"])] > 0, e
    # the filters change what is shown: one step of two, a stop reason no episode has, a reward
    c = got["counts"]
    assert c["training"] == 8 and c["training_step"] == 4
    assert c["evaluation"] == 6 and c["compare"] == 2 and c["groups"] == 4
    assert c["training_reward0"] == sum(r["reward"] == 0 for r in jsonl(run / "episodes-rank0.jsonl")
                                        if r.get("phase") != "eval")


# --------------------------------------------------------------------------------------------------
# Bad input: the page is still written, and says what is missing


def test_an_older_run_a_truncated_log_and_an_episode_without_tokens(run, tmp_path, capsys):
    old = tmp_path / "old"
    old.mkdir()
    shutil.copy(run / "log.jsonl", old)
    text = (run / "episodes-rank0.jsonl").read_text()
    nan = '{"phase": "eval", "name": "x", "task_id": "shop/t", "reward": NaN, "info": {"completion": Infinity}}\n'
    # NaN (as Python's json writes it), then a run killed mid-line
    (old / "episodes-rank0.jsonl").write_text(nan + text[: len(text) - 40])
    page = view.write(old)
    data = view.collect(old)
    assert page == old / "view.html" and page.is_file()
    assert "view-tokens.jsonl is missing" in data["notes"]
    assert any("unreadable line" in n for n in data["notes"])
    assert data["groups"] == [] and data["train"] and data["evals"]
    blob = re.search(r'<script id="data" type="application/json">(.*?)</script>', page.read_text(), re.S).group(1)
    assert json.loads(blob, parse_constant=lambda c: pytest.fail(f"not JSON: {c}"))["evals"][0]["reward"] is None
    # an episode with no tokens (a message-level agent's): drawn as such, noted
    record = jsonl(run / "view-tokens.jsonl")[0]
    for e in record["episodes"]:
        e.update(ids=[], mask="", lp=[], tlp=[], spans=[], trained=0)
    (old / "view-tokens.jsonl").write_text(json.dumps(record) + "\n")
    assert any("without tokens" in n for n in view.collect(old)["notes"])
    assert view.write(old) == page


def test_a_page_that_cannot_be_made_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(view, "collect", lambda *a: 1 / 0)
    assert view.write(tmp_path) is None
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "view: " in out and "ZeroDivisionError" in out and "Traceback" not in out
    assert not (tmp_path / "view.html").exists()


def test_an_empty_folder_still_gets_a_page_in_the_browser(tmp_path):
    page = view.write(tmp_path)
    assert page is not None and {"log.jsonl is missing", "episodes-rank0.jsonl is missing"} <= set(
        view.collect(tmp_path)["notes"])
    got = browse(page, tmp_path)
    assert got["errors"] == [] and got["lit"] == []


def test_a_trained_token_in_the_customers_text_is_flagged(run, tmp_path):
    record = jsonl(run / "view-tokens.jsonl")[0]
    e = record["episodes"][0]
    _, s, t = next(sp for sp in e["spans"] if sp[0] == "user")
    e["mask"] = e["mask"][:s] + "1" + e["mask"][s + 1:]
    os.makedirs(tmp_path / "r")
    (tmp_path / "r" / "view-tokens.jsonl").write_text(json.dumps(record) + "\n")
    flags = view.collect(tmp_path / "r")["flags"]
    assert flags["trained tokens inside customer, tool or prompt text"] == 1
    assert flags["mask and trained-token count disagree"] == 1


# --------------------------------------------------------------------------------------------------
# Every reward explained: a database mismatch names the rows and the fields that differ


def test_a_database_mismatch_names_the_fields_that_differ():
    from domains import load_world

    world = load_world("shop", seed=0, n_train=0, n_test=5)
    task = next(t for t in world.tasks("test") if t.actions)
    reward, info = world.score(task, world.new_env(task))  # the agent did nothing
    assert reward == 0.0 and info["db_rows"] and {r["row"] for r in info["db_rows"]} <= set(info["db_diff"])
    for r in info["db_rows"]:
        assert r["expected"] != r["agent"] and set(r["expected"]) == set(r["agent"])  # only the differing fields
    reward, info = world.score(task, world.replay(task.actions))  # the gold actions: nothing differs
    assert reward == 1.0 and info["db_rows"] == []


@needs_tau2
def test_telecom_names_the_rows_of_the_company_and_of_the_phone():
    from domains import load_world

    world = load_world("telecom")
    task = next(t for t in world.tasks("all") if t.actions)  # (its gold actions fix the company and the phone)
    reward, info = world.score(task, world.new_env(task))
    assert reward == 0.0 and not info["db_match"]
    assert {r["row"].split("/")[0] for r in info["db_rows"]} & {"phone"} and len(info["db_rows"]) <= 5


def test_eval_writes_its_page_beside_its_transcripts(tmp_path, capsys):
    from eval import main

    out = tmp_path / "ev" / "transcripts.jsonl"
    main(["--agent", "oracle", "--domains", "shop", "--eval_tasks", "3", "--out", str(out)])
    data = view.collect(out.parent, out)
    assert (out.parent / "view.html").is_file() and data["notes"] == []
    assert len({e["task_id"] for e in data["evals"]}) == 3
    assert all(e["reward"] == 1.0 and e["messages"] for e in data["evals"])


def test_a_resumed_run_records_each_step_once(tmp_path):
    # the token record is a run log: a resume cuts it back to the checkpoint's step, as it does log.jsonl
    out = tmp_path / "run"
    args = TINY[: TINY.index("--steps")] + ["--out_dir", str(out), "--eval", "false", "--save_every", "1"]
    demo_train.main(args + ["--steps", "1"])
    with open(out / "view-tokens.jsonl", "a") as f:
        f.write('{"step": 1, "group": 0, "episo')  # a step killed while its record was written
    demo_train.main(args + ["--steps", "2", "--resume", "true"])
    steps = [(g["step"], g["group"]) for g in jsonl(out / "view-tokens.jsonl")]
    assert sorted({s for s, _ in steps}) == [0, 1] and len(steps) == len(set(steps))
    assert (out / "view.html").is_file() and view.collect(out)["notes"] == []


def test_the_page_keeps_to_its_size_bound(run, tmp_path, monkeypatch):
    record = jsonl(run / "view-tokens.jsonl")[0]
    (tmp_path / "view-tokens.jsonl").write_text("".join(json.dumps({**record, "step": s}) + "\n" for s in range(6)))
    monkeypatch.setattr(view, "TOKEN_BUDGET", 2.5 * len(json.dumps(record)))  # room for about two steps
    data = view.collect(tmp_path)
    steps = [g["step"] for g in data["groups"]]
    assert steps[0] == 0 and steps[-1] == 5 and len(steps) < 6  # thinned evenly, the first and the last kept
    assert any(f"token records of {len(steps)} of 6 steps kept" in n for n in data["notes"])


def test_the_sample_is_the_first_group_and_the_first_that_teaches():
    eps = list(range(8))  # (pick reads only the advantages)
    flat, teaches, per_token = [0.0, 0.0], [0.7, -0.7], [[0.0, 0.25, 0.0], [0.0, 0.0, 0.0]]
    assert runlog.page_groups(eps, flat + flat + teaches + teaches, 2) == [0, 1, 4, 5]
    assert runlog.page_groups(eps, teaches + teaches + flat + flat, 2) == [0, 1]  # the first teaches: one group
    assert runlog.page_groups(eps, flat + per_token + flat + flat, 2) == [0, 1, 2, 3]  # a per-turn bonus teaches too
    assert runlog.page_groups(eps[:4], flat + flat, 2) == [0, 1]


def test_the_page_is_rebuilt_from_the_command_line(run, tmp_path):
    import sys

    shutil.copytree(run, tmp_path / "copy", ignore=shutil.ignore_patterns("*.pt", "*.safetensors", "view.html"))
    r = subprocess.run([sys.executable, "-m", "plumbing.view", str(tmp_path / "copy")], capture_output=True, text=True,
                       cwd=Path(__file__).resolve().parent.parent, timeout=120)
    assert r.returncode == 0 and "open it in a browser" in r.stdout and (tmp_path / "copy" / "view.html").is_file()
    bad = subprocess.run([sys.executable, "-m", "plumbing.view", str(tmp_path / "nowhere")], capture_output=True,
                         text=True, cwd=Path(__file__).resolve().parent.parent, timeout=120)
    assert bad.returncode == 2 and "usage" in bad.stderr and "Traceback" not in bad.stderr


def test_long_evaluations_keep_the_first_and_the_last_conversations(tmp_path, monkeypatch):
    msgs = [{"role": "user", "content": "x" * 1000}]
    lines = [{"phase": "eval", "name": name, "task_id": f"shop/t{i}", "reward": 1.0, "messages": msgs}
             for name in ("cold start", "GRPO step 10", "GRPO step 20", "GRPO (30 steps)") for i in range(3)]
    (tmp_path / "episodes-rank0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    monkeypatch.setattr(view, "EVAL_BUDGET", 3 * 3 * 1100)  # room for three evaluations' messages
    data = view.collect(tmp_path)
    kept = {e["name"] for e in data["evals"] if e["messages"]}
    assert kept == {"cold start", "GRPO step 10", "GRPO (30 steps)"} and len(data["evals"]) == 12
    assert any("GRPO step 20" in n and "size bound" in n for n in data["notes"])
