"""Multi-turn rollouts: tools a policy calls, the environments that answer it, and the loop between them.

- `section`: the ``tools (multi-turn)`` config keys and the environment factory they build (torch-free: `lmrl.cli`
  checks a config before any heavy import, so this package imports nothing on its own);
- `env`: the `Environment` protocol and `ToolEnv`, the environment of tool use;
- `toolbox`, `parsers`, `mcp`: tools (built-ins, user factories, MCP servers) and the call formats;
- `multiturn`: `run_episodes`, model turns from any engine with environment steps in between, one `RolloutBatch`
  row per trajectory (`lmrl.rollout.samplers.episodes` samples a step's groups with it).
"""
