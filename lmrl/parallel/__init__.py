"""Scale-out on existing engines: torch.distributed (FSDP2 or DDP, launched by torchrun) for the trainers, Ray
for rollout workers.

`runtime` (process group, ranks, shards, metric reduction), `wrap` (FSDP2 ``fully_shard`` / DDP ``replicate``),
`checkpoint` (torch.distributed.checkpoint and the consolidated ``final/``), `launch` (``nproc=N`` re-executes
through ``torch.distributed.run``), `ray_rollout` (``placement=ray``: rollout-worker actors, ``async_steps``).
See docs/scale.md.
"""
