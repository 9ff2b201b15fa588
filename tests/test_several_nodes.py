"""Several nodes work or are refused plainly: what reads a disk is decided on rank 0 and sent to every rank.

Two gloo processes play two nodes (LOCAL_WORLD_SIZE 1 < WORLD_SIZE 2), each in its own working directory, so a
relative path is a node-local disk: what rank 0 sees at `run/` is not what rank 1 sees.

  resume      --resume's checkpoint is rank 0's (rank 1's disk holds an older one, or none): every rank resumes
              the same step, its state read on rank 0
  reference   the KL reference's folder is rank 0's choice; missing on another node, one line on every rank (not
              a reference made of two models' shards)
  model       whether the model is fetched (or built) is decided on rank 0; a folder another node lacks is one
              line on every rank
  plan        a plan that does not fit stops rank 0 with its line and the other ranks quietly, exit 2
  serve       --user_serve across nodes listens on an address the others reach, or is refused naming --user_base_url
"""

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from config import Config
from plumbing.flags import ConfigError
from plumbing.serve import serve_host, server_command
from config import validate

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "MUARL_CPU_RANKS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
       "PYTHONPATH": str(REPO)}

TWO_NODES = textwrap.dedent('''
    import sys, types
    from pathlib import Path
    import torch, torch.distributed as dist
    from config import Config
    import muarl  # (all that a muarl.py rank imports: its exits are muarl's)
    from plumbing import checkpoint as ckpt, fsdp, models
    from plumbing.flags import run_cli

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    r = dist.get_rank()

    def said(key, f):
        try:
            print(f"rank {r} {key}: {f()}", flush=True)
        except (ValueError, OSError) as e:
            print(f"rank {r} {key} refused: {e}", flush=True)

    # resume: rank 0's disk holds step 2, rank 1's step 1; both write as one process would
    from torch.distributed.fsdp import fully_shard
    out = Path("run")
    mine = torch.nn.Linear(4, 4)
    sampler = muarl.TaskSampler(list(range(10)), 0)
    ckpt.save_checkpoint(out, 2 - r, mine, torch.optim.AdamW(mine.parameters()), sampler, {}, 1, 0)
    policy = fully_shard(torch.nn.Linear(4, 4))
    opt = torch.optim.AdamW(policy.parameters())
    found = fsdp.decide_on_rank0(lambda: ckpt.newest_checkpoint(out), 2)
    said("resumes", lambda: (found.name, ckpt.load_checkpoint(out, policy, opt, sampler, 2, found)[0]))

    # the reference: only rank 0's node has run/cold-start
    if r == 0:
        (out / "cold-start").mkdir()
    dist.barrier()
    cfg = Config(kl_coef=0.001, dtype="float32")
    said("reference", lambda: models.reference_for(cfg, out, "model", "cpu", sharded=True))

    # the model: rank 0 builds it on its own disk
    def build():
        Path("model").mkdir(exist_ok=True)
        print(f"rank {r} built the model", flush=True)
        return "model"
    said("model", lambda: models.build_or_load_model(cfg, "cpu", "float32", r, 2, True, build))

    # the plan: fake CUDA, a 32B model on two 80 GiB cards
    torch.cuda.is_available = lambda: True
    torch.cuda.current_device = lambda: 0
    torch.cuda.get_device_properties = lambda d=None: types.SimpleNamespace(total_memory=80 * 2**30)
    fsdp.host_memory = lambda: 2**41
    run_cli(lambda: fsdp.place(Config(model="Qwen/Qwen3-32B"), r, 2), f"rank {r} plan")  # muarl.py's exits
''')


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    """Each rank's lines of output and its exit code."""
    base = tmp_path_factory.mktemp("nodes")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(2):
        (base / f"node{r}").mkdir()
        env = {**ENV, "WORLD_SIZE": "2", "RANK": str(r), "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        procs.append(subprocess.Popen([sys.executable, "-c", TWO_NODES], cwd=base / f"node{r}", env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    logs = [p.communicate(timeout=300)[0] for p in procs]
    return [SimpleNamespace(lines=log.splitlines(), text=log, rc=p.returncode) for p, log in zip(procs, logs)]


def line(rank, key):
    return next((x for x in rank.lines if x.startswith(key)), "(none) " + rank.text[-2000:])


def test_every_rank_resumes_rank_0s_checkpoint(two_nodes):
    for r, node in enumerate(two_nodes):
        assert line(node, f"rank {r} resumes") == f"rank {r} resumes: ('step-000002', 2)"


def test_a_reference_another_node_lacks_is_one_line_on_every_rank(two_nodes):
    for r, node in enumerate(two_nodes):
        assert line(node, f"rank {r} reference").startswith(
            f"rank {r} reference refused: the KL reference run/cold-start, as rank 0 found it, is missing on another "
            "node's disk")


def test_the_model_is_built_on_rank_0_alone_and_a_folder_another_node_lacks_is_refused(two_nodes):
    assert "rank 0 built the model" in two_nodes[0].text and "built the model" not in two_nodes[1].text
    for r, node in enumerate(two_nodes):
        assert line(node, f"rank {r} model").startswith(f"rank {r} model refused: the model folder model, as rank 0")


def test_a_plan_that_does_not_fit_stops_rank_0_with_its_line_and_the_others_quietly(two_nodes):
    assert [node.rc for node in two_nodes] == [2, 2]
    assert line(two_nodes[0], "rank 0 plan").startswith("rank 0 plan: the memory plan does not fit on 2 x 80 GiB")
    assert "plan:" not in two_nodes[1].text


# --------------------------------------------------------------------------------------------------
# The served customer across nodes


def test_the_served_customer_listens_where_the_other_nodes_reach_it(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert serve_host("", 8) == "127.0.0.1"  # one node: loopback
    assert serve_host("10.0.0.5", 16) == "10.0.0.5"  # --user_host
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    assert serve_host("", 16) == "127.0.0.1"  # two nodes: the interface that routes to MASTER_ADDR (here, loopback)
    cmd = server_command("m", "customer", 8000, 4096, host="10.0.0.5")
    assert cmd[cmd.index("--host") + 1] == "10.0.0.5"


def test_the_served_customer_across_nodes_is_refused_naming_the_alternative(monkeypatch, tmp_path):
    (tmp_path / "config.json").write_text("{}")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    cfg = Config(model=str(tmp_path), user_serve=str(tmp_path), tasks_per_step=32)
    validate(cfg, 8)  # one node: served on loopback
    with pytest.raises(ConfigError, match="--user_serve across nodes.*--allow_insecure_http.*--user_base_url"):
        validate(cfg, 16)
    validate(Config(model=str(tmp_path), user_serve=str(tmp_path), allow_insecure_http=True), 16)
    with pytest.raises(ConfigError, match="--user_host 127.0.0.1 cannot be reached from the other nodes"):
        validate(Config(model=str(tmp_path), user_serve=str(tmp_path), allow_insecure_http=True,
                        user_host="127.0.0.1"), 16)
