"""Group samplers: a step's G completions per prompt (`lmrl.rollout.protocol.GroupSampler`), picked once by
`factory.make_sampler` from the config.

- `groups`: `LocalGroups` (this process's engine) and what every sampler of groups shares: `GroupOptions`, the
  seeded shards of a step (`seeded_shards`), the run's `sampling_params`;
- `episodes`: `EpisodeGroups`, multi-turn episodes with tools or an environment;
- `server_ahead`: `ServerAhead`, vLLM servers sampling the next steps while the learner trains (async_steps);
- `ray`: `RayRollouts`, rollout-worker actors (placement=ray).
"""
