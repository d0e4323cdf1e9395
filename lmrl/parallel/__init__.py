"""Scale-out infrastructure on torch.distributed (FSDP2 or DDP, launched by torchrun); Ray rollout workers are
`lmrl.rollout.samplers.ray`.

`runtime` (process group, ranks, shards, metric reduction), `wrap` (FSDP2 ``fully_shard`` / DDP ``replicate``),
`launch` (``nproc=N`` re-executes through ``torch.distributed.run``), `shards` (a step's seeded sampling shards).
Multi-process checkpoints are trainer code: `lmrl.trainers.dist_checkpoint`.
See docs/scale.md.
"""
