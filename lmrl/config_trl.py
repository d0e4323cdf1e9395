"""TRL's and transformers' names for lmrl's keys: what each one is read as, refused with lmrl's equivalent, or has none.

A TRL user types ``learning_rate=2e-5 --bf16 --use_vllm``; lmrl reads them as ``lr``, ``precision=bf16`` and
``engine=vllm`` with a one-line note each (`ALIASES`, `ALIAS_VALUES`). A name whose meaning differs from every lmrl
key (``per_device_train_batch_size``: per device and per micro-batch; lmrl's ``batch_size`` is per optimizer step) is
refused with what to write instead (`REFUSED`), and a name lmrl has nothing for is said to be so (`NO_EQUIVALENT`),
never answered with a look-alike key ("Did you mean 'ptx_batch_size'?"). docs/guide.md has the table;
tests/config/test_trl_names.py checks that every field of TRL's SFTConfig, GRPOConfig and DPOConfig is in one of them.
"""

from __future__ import annotations

from typing import Any

ALIASES: dict[str, str] = {
    # transformers' TrainingArguments
    "learning_rate": "lr",
    "adam_epsilon": "adam_eps",
    "gradient_accumulation_steps": "grad_accum",
    "lr_scheduler_type": "lr_schedule",
    "logging_steps": "log_every",
    "eval_steps": "eval_every",
    "save_steps": "save_every",
    "save_total_limit": "keep_checkpoints",
    "overwrite_output_dir": "overwrite",
    "greater_is_better": "keep_best_mode",
    "bf16": "precision",
    "use_cpu": "device",
    # GRPOConfig
    "num_generations": "samples_per_prompt",
    "max_completion_length": "max_new_tokens",
    "beta": "kl_coef",
    "num_iterations": "ppo_epochs",
    "epsilon": "clip_low",
    "epsilon_high": "clip_high",
    "delta": "clip_delta",
    "scale_rewards": "adv_scale",
    "mask_truncated_completions": "mask_truncated",
    "entropy_coef_delta": "entropy_coef_step",
    "use_vllm": "engine",
    "vllm_enable_sleep_mode": "vllm_sleep",
    "vllm_max_model_length": "vllm_max_model_len",
    "vllm_importance_sampling_clip_max": "tis_cap",
    "vllm_importance_sampling_cap": "tis_cap",
    "num_completions_to_print": "num_samples",
    # DPOConfig
    "loss_type": "loss",
    "precompute_ref_log_probs": "precompute_ref",
    # SFTConfig (pretraining text)
    "dataset_text_field": "text_column",
}
"""TRL/transformers name -> lmrl key of the same meaning. Accepted where the config has the lmrl key and not the name
itself (``beta`` is DPO's own key, and ``kl_coef`` in ``lmrl rl``), and only in the configs of `ALIAS_CONFIGS`."""

ALIAS_CONFIGS: dict[str, tuple[str, ...]] = {"loss_type": ("DPOConfig",)}
"""Aliases that mean the lmrl key in some configs only (``loss`` of a reward model is not a DPO loss)."""

ALIAS_VALUES: dict[str, dict[Any, Any]] = {
    "lr_scheduler_type": {"constant_with_warmup": "constant", "cosine_with_min_lr": "cosine"},
    "bf16": {True: "bf16", False: "fp32"},
    "use_vllm": {True: "vllm", False: "hf"},
    "use_cpu": {True: "cpu", False: "auto"},
    "greater_is_better": {True: "max", False: "min"},
    "scale_rewards": {True: "group", False: "none"},
    "loss_type": {"sigmoid": "dpo", "bco_pair": "bco", ("sigmoid", "sft"): "dpo_nll"},
}
"""TRL's values for the aliases whose lmrl key takes other words (a list value of one item is that item)."""

AS_LMRL_DOES: dict[str, Any] = {
    "packing": False,
    "padding_free": False,
    "completion_only_loss": True,
    "assistant_only_loss": True,
    "eval_on_start": True,
    "shuffle_dataset": True,
}
"""TRL settings accepted with this one value, which is what lmrl always does (a note says it is ignored); any other
value is refused with `REFUSED`'s explanation."""

REFUSED: dict[str, str] = {
    "per_device_train_batch_size": (
        "lmrl's batch sizes count a whole optimizer step over all processes, not one device's micro-batch: "
        "batch_size=N is TRL's per_device_train_batch_size x gradient_accumulation_steps x processes (examples, "
        "pairs or windows), split into grad_accum micro-batches; in `lmrl rl` a step is prompts_per_step prompts x "
        "samples_per_prompt completions (TRL's per_device_train_batch_size x gradient_accumulation_steps x "
        "processes / num_generations prompts)"
    ),
    "per_device_eval_batch_size": (
        "lmrl sizes evaluation batches itself; eval_rows=N sets how many held-out rows are evaluated"
    ),
    "auto_find_batch_size": "lmrl does not search for a batch size; max_tokens_per_microbatch=N bounds each micro-batch",
    "num_train_epochs": (
        "lmrl counts optimizer steps: max_steps=N (one epoch is the number of training rows / batch_size steps)"
    ),
    "warmup_ratio": "lmrl's warmup is a number of steps: warmup_steps=N (TRL's warmup_ratio x max_steps)",
    "adam_beta1": "lmrl takes both betas as one key: adam_betas=[BETA1,BETA2] (default [0.9, 0.99])",
    "adam_beta2": "lmrl takes both betas as one key: adam_betas=[BETA1,BETA2] (default [0.9, 0.99])",
    "fp16": "lmrl has no fp16 mixed precision: precision=bf16 (bf16 autocast) or precision=fp32",
    "optim": "lmrl trains with AdamW (adam_betas, adam_eps, weight_decay)",
    "lr_scheduler_kwargs": "the schedule's keys are lmrl's own: min_lr_ratio=R (TRL's min_lr_rate), warmup_steps=N",
    "eval_strategy": "lmrl evaluates every eval_every=N steps (0: only at the start and end)",
    "save_strategy": "lmrl saves a checkpoint every save_every=N steps (0: only at the end)",
    "logging_strategy": "lmrl logs every log_every=N steps (and always the first and last)",
    "resume_from_checkpoint": "resume=true continues from the newest checkpoint in output_dir",
    "load_best_model_at_end": "keep_best=METRIC keeps best/: the model at the best evaluation of METRIC (eval/loss, ...)",
    "metric_for_best_model": "keep_best=METRIC, with lmrl's metric names (eval/loss, eval/accuracy, ...; docs/metrics.md)",
    "packing": (
        "lmrl packs by a token budget: max_tokens_per_microbatch=N puts rows into micro-batches of at most N tokens "
        "(positions restart per row), where TRL's packing concatenates rows into sequences of max_length; "
        "packing=false is lmrl's default"
    ),
    "padding_free": (
        "lmrl's packed micro-batches are padding-free: max_tokens_per_microbatch=N; padding_free=false is lmrl's default"
    ),
    "completion_only_loss": (
        "lmrl's SFT loss is on the completion only (assistant turns of `messages` rows: train_on=all|last); "
        "completion_only_loss=true is what it does"
    ),
    "assistant_only_loss": (
        "lmrl's SFT loss is on the assistant turns only (train_on=all|last); assistant_only_loss=true is what it does"
    ),
    "eval_on_start": "lmrl always evaluates at the start (and at the end, and every eval_every steps)",
    "shuffle_dataset": "lmrl always shuffles the training data (seed=N sets the order)",
    "truncation_mode": "lmrl keeps the start of an over-long row: overlong=truncate|drop|error",
    "loss_type": (
        "in `lmrl rl`, TRL's loss_type is lmrl's loss aggregation and algorithm: grpo -> loss_agg=seq_mean, "
        "dapo or bnpo -> loss_agg=token_mean, dr_grpo -> algorithm=dr_grpo (loss_agg=seq_sum_norm), cispo -> "
        "algorithm=cispo; lmrl's SFT loss is the NLL (TRL's nll); in `lmrl dpo` it is loss=NAME "
        "(sigmoid -> dpo, ipo, hinge, robust, bco_pair -> bco, [sigmoid,sft] -> dpo_nll)"
    ),
    "importance_sampling_level": (
        "sequence-level ratios (GSPO) are algorithm=gspo; lmrl's is_level is the level of the train-inference "
        "correction (tis_cap), not of the policy ratio"
    ),
    "label_smoothing": ("a DPO loss option in lmrl: loss=cdpo (or robust) loss_args.label_smoothing=EPS"),
    "off_policy_mask_threshold": (
        "offpolicy_mask_threshold=DELTA offpolicy_mask_rows=negative is DeepSeek-V3.2's rule as TRL applies it "
        "(lmrl's default offpolicy_mask_rows=all masks rows of either sign)"
    ),
    "use_adaptive_entropy": "setting entropy_target=NATS turns lmrl's adaptive entropy on (TRL's default target: 0.2)",
    "vllm_importance_sampling_correction": (
        "lmrl's train-inference correction is on while tis_cap is set (default 2.0): tis_cap=null turns it off"
    ),
    "vllm_importance_sampling_mode": (
        "two keys in lmrl: is_level=token|sequence and is_mode=truncate|mask (token_truncate -> is_level=token "
        "is_mode=truncate, sequence_mask -> is_level=sequence is_mode=mask, ...)"
    ),
    "vllm_importance_sampling_clip_min": (
        "is_low=C with is_mode=mask (lmrl's truncate mode caps the weight from above only)"
    ),
    "vllm_mode": (
        "vllm_server=null runs vLLM in the trainer's process (TRL's colocate), vllm_server=auto or HOST:PORT uses a "
        "`lmrl vllm-serve` process (TRL's server)"
    ),
    "vllm_server_base_url": "vllm_server=HOST:PORT, a `lmrl vllm-serve` process (not `trl vllm-serve`)",
    "vllm_server_host": "vllm_server=HOST:PORT, a `lmrl vllm-serve` process (not `trl vllm-serve`)",
    "vllm_server_port": "vllm_server=HOST:PORT, a `lmrl vllm-serve` process (not `trl vllm-serve`)",
    "vllm_tensor_parallel_size": "lmrl runs one vLLM per GPU; vllm_replicas=N starts N servers of one GPU each",
    "log_completions": "lmrl always writes completions to samples.jsonl: num_samples=N every sample_every=N steps",
    "max_tool_calling_iterations": (
        "max_turns=N counts assistant turns per episode, the answer included: N tool-calling turns are max_turns=N+1"
    ),
    "dataset_num_proc": "lmrl tokenizes in the trainer's process; no setting",
    "ref_model_sync_steps": "lmrl keeps the reference fixed (TR-DPO's reference updates are not implemented)",
}
"""TRL/transformers names refused with lmrl's equivalent (the meaning differs, or lmrl splits or merges the key)."""

NO_EQUIVALENT: frozenset[str] = frozenset(
    """
    accelerator_config activation_checkpointing activation_checkpointing_kwargs activation_offloading
    average_tokens_across_devices batch_eval_metrics bf16_full_eval cache_implementation cast_lm_head_to_fp32
    chat_template_kwargs chat_template_path data_seed dataloader_drop_last dataloader_in_order
    dataloader_multiprocessing_context dataloader_num_workers dataloader_persistent_workers dataloader_pin_memory
    dataloader_prefetch_factor dataset_kwargs ddp_backend ddp_broadcast_buffers ddp_bucket_cap_mb
    ddp_find_unused_parameters ddp_static_graph ddp_timeout debug deepspeed disable_dropout disable_tqdm discopop_tau do_eval
    do_predict do_train ds3_gather_for_generation enable_jit_checkpoint entropy_coef_max entropy_coef_min eos_token
    eval_accumulation_steps eval_delay eval_do_concat_batches eval_packing eval_use_gather_object f_alpha_divergence_coef
    f_divergence_type fp16_full_eval fsdp fsdp_config full_determinism generation_batch_size generation_kwargs
    gradient_checkpointing_kwargs hub_always_push hub_model_id hub_private_repo hub_revision hub_strategy hub_token
    ignore_data_skip include_for_metrics include_num_input_tokens_seen label_names label_smoothing_factor ld_alpha
    length_column_name liger_kernel_config local_rank log_completions_hub_repo log_level log_level_replica
    log_multimodal log_on_each_node log_unique_prompts logging_first_step logging_nan_inf_filter loss_weights min_p
    model_init_kwargs multi_objective_aggregation neftune_noise_alpha num_generations_eval optim_args
    optim_target_modules packing_strategy pad_to_multiple_of pad_token parallelism_config precompute_ref_batch_size
    prediction_loss_only project push_to_hub ref_model_mixup_alpha remove_unused_columns repetition_penalty
    restore_callback_states_from_checkpoint router_aux_loss_coef run_name sapo_temperature_neg sapo_temperature_pos
    save_on_each_node save_only_model skip_memory_metrics steps_per_generation sync_ref_model tf32 torch_compile
    torch_compile_backend torch_compile_mode torch_empty_cache_steps trackio_bucket_id trackio_space_id
    trackio_static_space_id train_sampling_strategy transformers_continuous_batching_config trust_remote_code
    use_bias_correction_kl use_cache use_liger_kernel use_transformers_continuous_batching use_transformers_paged
    use_weighting vespo_k_neg vespo_k_pos vespo_lambda_neg vespo_lambda_pos vllm_group_port vllm_model_impl
    vllm_structured_outputs_regex
    """.split()
)
"""TRL/transformers names with no lmrl counterpart: refused as such, with no look-alike suggestion."""

TRL_BOOLS: frozenset[str] = frozenset(
    """
    bf16 fp16 use_cpu use_vllm overwrite_output_dir greater_is_better load_best_model_at_end mask_truncated_completions
    vllm_enable_sleep_mode precompute_ref_log_probs packing padding_free completion_only_loss assistant_only_loss
    eval_on_start shuffle_dataset use_adaptive_entropy vllm_importance_sampling_correction log_completions
    auto_find_batch_size
    """.split()
)
"""The aliased or refused names that are switches in TRL: a bare ``--bf16`` on the command line is ``bf16=true``."""


def alias_value(alias: str, value: Any) -> Any:
    """``value`` of TRL's ``alias`` in the words of lmrl's key (``bf16=true`` -> ``bf16``), else as it is."""
    table = ALIAS_VALUES.get(alias)
    if not table:
        return value
    if isinstance(value, list):  # TRL's loss_type is a list: [sigmoid] or [sigmoid, sft]
        value = value[0] if len(value) == 1 else tuple(value)
    try:
        return table.get(value, value)
    except TypeError:  # a dict value: not hashable, and no TRL value
        return value
