"""A run's start, after its inputs are checked and before its cold start: what muarl.build_run
delegates.

The log opened, the customer started (a served model is served now; the demo's is gated), the
configuration saved, the tau2 data's provenance logged, the policy loaded (or built by a Kit), the
untrained model evaluated, the optimizer made, and on --resume the newest checkpoint restored into
both. muarl.build_run wraps this in the guarantee that a start that fails here leaves the output
folder as it found it.
"""

from __future__ import annotations

import torch

from domains.tau2_data import provenance
from eval import run_eval
from plumbing import checkpoint as ckpt
from plumbing.flags import public, save_config
from plumbing.models import build_or_load_model, load_policy
from plumbing.preflight import prompt_warning
from plumbing.runlog import RunLog


def prepare(run, kit, found, device: str, gpu_shards: bool, build, sharded: bool) -> None:
    """The log, the customer started (a served model served now; the demo's is gated), the policy
    loaded or built, the untrained model evaluated, the optimizer (restored with the weights on
    --resume)."""
    cfg, rank = run.cfg, run.rank
    # one global step; no secrets
    run.log = RunLog(run.out / "log.jsonl", rank, cfg.logger, public(cfg))
    run.user.start(run.train_tasks + run.held_out, run.log)
    if rank == 0:
        save_config(run.out, cfg)  # a changed configuration keeps the previous file beside it
    for source in provenance(run.worlds):  # where the tau2 data came from, printed and logged
        print(f"[data] {source['domain']}: {source['path']} (sha256 {source['sha256']}; {source['revision']})")
        run.log({"phase": "data", **source})
    run.policy, run.tok, run.model_path = build_or_load_model(cfg, device, cfg.dtype, rank, run.world_size,
                                                              sharded, build)
    if rank == 0 and (warn := prompt_warning(run.tok, run.worlds, cfg.max_context, cfg.max_new_tokens,
                                             cfg.tools_in_prompt)):
        print(warn, flush=True)
    if run.fresh and rank == 0 and run.eval_tasks and cfg.sft_epochs and kit.eval_untrained and not gpu_shards:
        # (FSDP2 on a CPU: a whole copy from disk; FSDP2 on GPUs: none)
        run_eval(run, "untrained", model=load_policy(run.model_path)[0] if sharded else None, trials=1)
    # (under torchrun, load_sharded sharded the policy)
    if not sharded and cfg.activation_checkpointing:
        run.policy.gradient_checkpointing_enable()
    # fp32
    run.opt = torch.optim.AdamW(run.policy.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    run.start, state = ckpt.load_checkpoint(run.out, run.policy, run.opt, run.sampler, run.world_size, found) \
        if found else (0, {})
    run.results.update(state.get("results", {}))
    run.updates, run.log.global_step = state.get("updates", run.start), state.get("global_step", 0)
